"""Optimizer CPU offload (TrainingSpec.optimizer_offload), Megatron's, DeepSpeed's and FSDP2's: host
and GPU bytes, the step's host-link and CPU time, host memory as a search constraint, the refusals
and the launch flags.

Every expected number is worked out here from the cited mechanism (HybridDeviceOptimizer in
Megatron-LM@d98e8a6 megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py; ZeRO-Offload in
deepspeed 0.19.8 runtime/zero/stage_1_and_2.py; FSDP2's CPUOffloadPolicy in torch 2.13
distributed/fsdp/_fully_shard/ as torchtitan 0.3 turns it on) and the catalog's cited host figures,
not read back from the code."""

import pytest

import planner
from planner.cli import main as cli_main
from planner.errors import PlannerError
from planner.search import plan
from planner.specs import HostSpec, Layout, ModelSpec, TrainingSpec

H100 = dict(hbm=3.35e12 * 0.89, link=52e9, host_bw=563.2e9, gpus=8)  # dgx-h100.yaml: S5, S26, HOST1, HOST3
STREAM = 0.6  # the share of peak host bandwidth CPU Adam is assumed to sustain (cost.HOST_STREAM_EFFICIENCY)


def small_llama(layers=8):
    return ModelSpec(name="t", family="llama", num_layers=layers, hidden_size=1024, num_attention_heads=8,
                     num_kv_heads=8, ffn_hidden_size=2816, vocab_size=32000)


LAYER = 4 * 1024**2 + 3 * 1024 * 2816 + 2 * 1024  # Q, K, V, O; gate, up, down; two norms
EMBED = 32000 * 1024


def test_the_offloaded_share_leaves_the_gpu_and_pins_16_bytes_per_element_on_the_host():
    """Llama-3-8B, dp 8, ZeRO-1, half the shard offloaded: the GPU keeps 12 B x 0.5 of its shard
    (TE FusedAdam's FP32 copy, m, v), the host pins 16 B x 0.5 (FP32 copy, m, v and the FP32 gradient);
    weights and gradients stay where they were."""
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100")
    lay = Layout(dp=8, zero_stage=1)
    base = planner.evaluate(m, c, TrainingSpec(global_batch_size=64, seq_length=4096), lay)
    half = planner.evaluate(m, c, TrainingSpec(global_batch_size=64, seq_length=4096, optimizer_offload=0.5), lay)
    shard = m.num_params / 8
    assert half.memory.stages[0].get("optimizer") == pytest.approx(12 * 0.5 * shard, rel=1e-9)
    assert base.memory.stages[0].get("optimizer") == pytest.approx(12 * shard, rel=1e-9)
    assert half.memory.host == pytest.approx((16 * 0.5 * shard,), rel=1e-9)
    for item in ("weights", "gradients"):
        assert half.memory.stages[0].get(item) == base.memory.stages[0].get(item)
    assert half.memory.host_capacity == pytest.approx((2048 * 2**30 - 64 * 2**30) / 8)  # 2 TB less 64 GiB, 8 GPUs
    assert base.memory.host == ()


@pytest.mark.parametrize("f", [1.0, 0.5, 0.01])
def test_offloaded_step_is_the_longest_chain_of_copies_cpu_adam_and_the_gpu_step(f):
    """Per element of the rank's shard: D2H and H2D move 4 B each over the host link (FP32 gradient
    out, FP32 copy back, converted on the GPU); torch's fused CPU AdamW moves 28 B of host memory
    (reads p, g, m, v; writes p, m, v), the node's 8 ranks sharing its bandwidth; the GPU share
    moves 2 x 12 + 8 B of HBM. With the overlap the step takes max(D2H, CPU, GPU + H2D): CPU Adam
    at f = 1 and 0.5, the GPU's own step and the copy back at f = 0.01."""
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100")
    p = planner.evaluate(m, c, TrainingSpec(global_batch_size=64, seq_length=4096, optimizer_offload=f),
                         Layout(dp=8, zero_stage=1))
    psi = m.num_params / 8
    d2h = h2d = 4 * f * psi / H100["link"]
    cpu = 28 * f * psi * H100["gpus"] / (H100["host_bw"] * STREAM)
    gpu = (1 - f) * psi * 32 / H100["hbm"]
    want = max(d2h, cpu, gpu + h2d)
    assert p.time.breakdown()["optimizer"] == pytest.approx(want, rel=1e-9)
    assert (want == cpu) == (f >= 0.5)


def test_host_memory_caps_the_layers_of_a_rank():
    """Eight layers on two pipeline ranks, the whole shard offloaded. Without a host limit the
    fastest split gives the first rank more layers (the last one runs the LM head); with 1.43 GB of
    host memory per GPU the first rank can pin 4 layers and the embedding, (4 x 12.85M + 32.8M) x 16 B
    = 1.33 GB, but not 5 (1.54 GB): the search moves to 4 | 4 and says nothing else fits better."""
    m = small_llama()
    c = planner.load_cluster("dgx-h100", nodes=1, gpus_per_node=2, nvlink_domain_size=2)
    t = TrainingSpec(global_batch_size=16, seq_length=4096, optimizer_offload=1.0)
    kw = dict(top_k=1, structural=False, pp=2, tp=1, vpp=1, framework="megatron")
    free = plan(m, c, t, **kw).best
    assert free.layout.pipeline_layers[0] == 5
    assert free.memory.host[0] == pytest.approx(16 * (5 * LAYER + EMBED), rel=1e-6)
    tight = c.model_copy(update={"host": HostSpec(memory=2 * 1.43e9 + 1e9, memory_bandwidth=563.2e9,
                                                  link_bandwidth=52e9, cores=112, reserve=1e9)})
    r = plan(m, tight, t, **kw)
    assert r.status == "optimal"
    assert r.best.layout.pipeline_layers in (None, (4, 4))
    assert r.best.memory.host[0] == pytest.approx(16 * (4 * LAYER + EMBED), rel=1e-6)
    assert max(r.best.memory.host) <= 1.43e9 and r.best.fits
    over = planner.evaluate(m, tight, t, free.layout)
    assert not over.fits and any("host memory" in w for w in over.warnings)


def test_seventy_billion_on_one_node_fits_only_offloaded():
    """Llama-3-70B on one DGX H100 (GBS 64 x 4K): no layout fits its 16 B/param on 8 GPUs; with the
    optimizer on the host the search finds one (the weights and FP32 gradients, 6 B/param, stay)."""
    m, c = planner.load_model("llama3-70b"), planner.load_cluster("dgx-h100")
    none = plan(m, c, TrainingSpec(global_batch_size=64, seq_length=4096), top_k=1, structural=False)
    assert none.status == "infeasible"
    assert "with the optimizer offloaded to the host (optimizer_offload=1)" in none.infeasibility.message
    r = plan(m, c, TrainingSpec(global_batch_size=64, seq_length=4096, optimizer_offload=1.0), top_k=1, structural=False)
    assert r.status == "optimal" and r.best.layout.zero_stage == 1
    assert max(r.best.memory.host) <= r.best.memory.host_capacity
    assert r.best.memory.peak_stage.get("optimizer") == 0


def test_offload_refusals_name_the_rule():
    with pytest.raises(ValueError, match="optimizer_offload.*FP32 Adam states"):
        TrainingSpec(global_batch_size=8, seq_length=1024, optimizer_offload=0.5, optimizer_states="bf16")
    with pytest.raises(ValueError, match="optimizer_offload.*delayed"):
        TrainingSpec(global_batch_size=8, seq_length=1024, optimizer_offload=0.5, fp8="tensorwise", fp8_param_gather=True)
    with pytest.raises(ValueError, match="optimizer_offload"):
        TrainingSpec(global_batch_size=8, seq_length=1024, optimizer_offload=1.5)
    m = planner.load_model("llama3-8b")
    t = TrainingSpec(global_batch_size=64, seq_length=4096, optimizer_offload=1.0)
    with pytest.raises(PlannerError, match="cluster 'mi300x' has no host spec"):
        planner.evaluate(m, planner.load_cluster("mi300x"), t, Layout(dp=8, zero_stage=1))
    with pytest.raises(PlannerError, match="distributed optimizer"):
        planner.evaluate(m, planner.load_cluster("dgx-h100"), t, Layout(dp=8, zero_stage=0))
    p = planner.evaluate(m, planner.load_cluster("dgx-h100"), t, Layout(dp=8, zero_stage=1))
    with pytest.raises(PlannerError, match="ZeRO-1 does not exist there"):
        p.to_torchtitan()  # Megatron's offloaded distributed optimizer, not FSDP2's
    with pytest.raises(PlannerError, match="priced with the megatron optimizer engine"):
        p.to_deepspeed()  # Megatron's bytes and times, not ZeRO-Offload's


def test_megatron_flags_and_threads_follow_the_plan():
    p = planner.evaluate(planner.load_model("llama3-8b"), planner.load_cluster("gb200-nvl72", nodes=2),
                         TrainingSpec(global_batch_size=64, seq_length=4096, optimizer_offload=0.25),
                         Layout(dp=8, zero_stage=1))
    files = p.to_megatron()
    a = list(files.args)
    assert "--optimizer-cpu-offload" in a and "--use-precision-aware-optimizer" in a
    assert a[a.index("--optimizer-offload-fraction") + 1] == "0.25"
    assert "--overlap-cpu-optimizer-d2h-h2d" in a
    assert files.env["OMP_NUM_THREADS"] == "36"  # 144 Grace cores per tray over its 4 GPUs
    assert "OMP_NUM_THREADS=36" in files.files["train.sh"]
    off = planner.evaluate(planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100"),
                           TrainingSpec(global_batch_size=64, seq_length=4096), Layout(dp=8, zero_stage=1)).to_megatron()
    assert "--optimizer-cpu-offload" not in off.args and "OMP_NUM_THREADS" not in off.env


def test_cli_offers_offload_as_a_choice_and_refuses_bad_fractions(capsys):
    argv = ["plan", "llama3-70b", "dgx-h100", "--nodes", "1", "--global-batch-size", "64", "--seq-length", "4096",
            "--optimizer-offload", "0,1", "--optimizer-states", "fp32,bf16"]
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    assert "optimizer_offload=1" in out and "optimizer_states=fp32" in out
    assert cli_main(["evaluate", "llama3-8b", "dgx-h100", "--global-batch-size", "64", "--seq-length", "4096",
                     "--optimizer-offload", "2", "--dp", "8"]) == 2
    assert "--optimizer-offload" in capsys.readouterr().err
    assert cli_main(["evaluate", "llama3-8b", "dgx-h100", "--global-batch-size", "64", "--seq-length", "4096",
                     "--optimizer-offload", "0,1", "--dp", "8"]) == 2


def test_choices_skip_the_combinations_that_are_not_a_workload():
    """BF16 Adam states with offload is not what Megatron runs: plan_choices leaves that combination
    out and says so, instead of pricing an unvalidated copy."""
    from planner.choices import plan_choices

    r, results = plan_choices(planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100"),
                              TrainingSpec(global_batch_size=64, seq_length=4096),
                              {"optimizer_states": ["fp32", "bf16"], "optimizer_offload": [0.0, 1.0]},
                              top_k=1, structural=False)
    assert ("bf16", 1.0) not in results and len(results) == 3
    assert any("optimizer_states=bf16/optimizer_offload=1.0 refused" in e for e in r.explanation)


def test_infeasible_for_host_memory_says_so():
    """Llama-3-70B on one GB200 tray with the whole shard offloaded: the GPUs could hold the weights and
    gradients, but 16 B x 70.6B / 4 = 282 GB per GPU exceeds the tray's 960 GB less 64 GiB over 4 GPUs
    (207.5 GiB); the answer names host memory, not the GPU, and two trays fit."""
    m = planner.load_model("llama3-70b")
    c = planner.load_cluster("gb200-nvl72", nodes=1, nvlink_domain_size=4)
    r = plan(m, c, TrainingSpec(global_batch_size=16, seq_length=4096, optimizer_offload=1.0), structural=False)
    assert r.status == "infeasible"
    assert "nothing fits in host memory" in r.infeasibility.message and "207.5 GiB" in r.infeasibility.message
    assert r.infeasibility.min_gpus_that_fit == 8


def test_explain_says_what_offload_frees_and_what_sets_its_time():
    """12 B x 8.8B elements of the 70B plan's stage-0 shard leave the GPU (tp 4, pp 2: about a quarter
    of the model's half), and on DGX H100 the CPU Adam step, 28 B per element at 0.6 x 563 GB/s shared
    by 8 ranks, is the slowest chain."""
    from planner.explain import explain

    lines = explain(planner.load_model("llama3-70b"), planner.load_cluster("dgx-h100"),
                    TrainingSpec(global_batch_size=64, seq_length=4096, optimizer_offload=1.0), sensitivities=False)
    line = next(x for x in lines if x.startswith("Optimizer offload"))
    assert "set by the CPU Adam step" in line and "of 248.0 GiB of host memory per GPU" in line


def test_review_page_names_the_host_memory_the_plan_pins():
    from planner.review import review_html

    r = plan(planner.load_model("llama3-70b"), planner.load_cluster("dgx-h100"),
             TrainingSpec(global_batch_size=64, seq_length=4096, optimizer_offload=1.0), top_k=1, structural=False)
    page = review_html(r, [])
    assert "Optimizer offload 1: up to" in page and "of 248.0 GiB" in page


def test_explain_prices_offload_where_memory_binds():
    """Llama-3-70B on 16 H100 (GBS 64 x 4K): memory binds (full recompute), and explain prices the same
    job with the optimizer on the host: it frees enough memory to stop recomputing, faster."""
    from planner.explain import explain

    lines = explain(planner.load_model("llama3-70b"), planner.load_cluster("dgx-h100", nodes=2),
                    TrainingSpec(global_batch_size=64, seq_length=4096))
    line = next(x for x in lines if x.startswith("Sensitivity, optimizer offloaded to the host"))
    assert "rc=none" in line and "tokens/s +" in line


# ---- DeepSpeed's ZeRO-Offload (deepspeed 0.19.8 runtime/zero/stage_1_and_2.py, cpu_offload) ----

DS_OFFLOAD = dict(global_batch_size=64, seq_length=4096, grad_dtype="fp32", optimizer_impl="deepspeed",
                  optimizer_offload=1.0)


@pytest.mark.parametrize("zero", [1, 2])
def test_zero_offload_bytes_on_gpu_and_host_from_deepspeeds_buffers(zero):
    """Llama-3-8B, dp 8, BF16 weights with FP32 accumulation. The host pins the FP32 master partition,
    the FP32 gradient partition, DeepSpeedCPUAdam's m and v and the 16-bit copy of the partition
    (4 + 4 + 8 + 2 = 18 B per partition element) plus a 16-bit staging buffer the size of the largest
    parameter (the 128256 x 4096 embedding); the GPU keeps no Adam state, the same-size 16-bit staging
    buffer, and its gradients (ZeRO-1: each parameter's FP32 grad_accum, the whole model; ZeRO-2: the
    FP32 partition). BF16_Optimizer is not built with the optimizer offloaded (engine.py:
    _do_optimizer_sanity_check), so ZeRO-1's reduce bucket is the ZeRO optimizer's, FP32 at stage 1."""
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100")
    p = planner.evaluate(m, c, TrainingSpec(**DS_OFFLOAD), Layout(dp=8, zero_stage=zero))
    n, embed = m.num_params, 128256 * 4096
    st = p.memory.stages[0]
    assert p.memory.host == pytest.approx((18 * n / 8 + 2 * embed,), rel=1e-9)
    assert st.get("optimizer") == 0
    assert st.get("offload_grad_buffer") == pytest.approx(2 * embed, rel=1e-9)
    assert st.get("gradients") == pytest.approx(4 * n if zero == 1 else 4 * n / 8, rel=1e-9)
    assert st.get("zero_buckets") == 500_000_000 * (4 if zero == 1 else 2)  # overlap_comm off: one bucket
    assert st.get("bf16_grads") == 0
    from planner.deepspeed_engine import Wrapper, wrapper
    assert wrapper(p.training, p.layout) == Wrapper.ZERO


def test_zero_offload_step_is_copy_then_cpu_adam_then_copy_back():
    """The boundary's FP32 gradient partition to the host (4 B per element over the 52 GB/s host link),
    DeepSpeedCPUAdam (28 B of host memory per element) and the FP32-to-16-bit copy on the host (6 B),
    the node's eight ranks sharing 0.6 of its 563.2 GB/s, then the 16-bit partition back (2 B): one
    after the other (step() waits for the copies, steps, then copies back)."""
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100")
    p = planner.evaluate(m, c, TrainingSpec(**DS_OFFLOAD), Layout(dp=8, zero_stage=1))
    psi = m.num_params / 8
    d2h, cpu, h2d = 4 * psi / H100["link"], 34 * psi / (H100["host_bw"] * STREAM / 8), 2 * psi / H100["link"]
    assert p.time.update.optimizer == pytest.approx(d2h + cpu + h2d, rel=1e-9)
    assert p.time.update.optimizer == pytest.approx(0.924, abs=0.001)


def test_zero_offload_rules_name_the_field():
    with pytest.raises(ValueError, match="'optimizer_offload': DeepSpeed's ZeRO offload is priced for the whole"):
        TrainingSpec(**{**DS_OFFLOAD, "optimizer_offload": 0.5})
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100")
    bf16 = TrainingSpec(**{**DS_OFFLOAD, "grad_dtype": "bf16"})  # ZeRO-1/2's compact FP32 path is not what runs
    for zero in (1, 2):
        with pytest.raises(PlannerError, match=r"ZeRO-3 optimizer with 16-bit gradient accumulation \(zero_stage 3; "
                                               r"ZeRO-1/2's offload is priced with FP32 accumulation"):
            planner.evaluate(m, c, bf16, Layout(dp=8, zero_stage=zero))
    megatron = TrainingSpec(global_batch_size=64, seq_length=4096, optimizer_offload=1.0)
    with pytest.raises(PlannerError, match=r"distributed optimizer \(zero_stage 1\), got zero_stage 3"):
        planner.evaluate(m, c, megatron, Layout(dp=8, zero_stage=3))
    # an unset engine becomes DeepSpeed's under framework='deepspeed': its rules apply then, so 16-bit
    # accumulation offloads at ZeRO-3 only, with or without a pipeline to choose
    r = plan(m, c, TrainingSpec(global_batch_size=64, seq_length=4096, grad_dtype="bf16", optimizer_offload=1.0),
             framework="deepspeed", top_k=3, structural=False)
    assert r.status == "optimal" and {p.layout.zero_stage for p in [r.best, *r.alternatives]} == {3}


def test_zero_offload_search_and_launch_files():
    """The search keeps the stages DeepSpeed offloads and host memory; the ds_config
    offloads to pinned CPU memory, Megatron-DeepSpeed builds DeepSpeedCPUAdam (--cpu-optimizer) and the
    launcher binds each rank to its share of the cores."""
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100")
    r = plan(m, c, TrainingSpec(global_batch_size=64, seq_length=4096, optimizer_offload=1.0), framework="deepspeed",
             top_k=3, structural=False)
    assert r.status == "optimal" and {p.layout.zero_stage for p in [r.best, *r.alternatives]} <= {1, 2, 3}
    assert r.best.memory.peak_stage.get("optimizer") == 0 and r.best.memory.host_fits
    files = r.best.to_deepspeed()
    assert files.config["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert "--cpu-optimizer" in files.args
    assert "--bind_cores_to_rank" in files.files["launch.sh"]
    plain = planner.evaluate(m, c, TrainingSpec(**{**DS_OFFLOAD, "optimizer_offload": 0.0}), Layout(dp=8, zero_stage=1))
    assert "offload_optimizer" not in plain.to_deepspeed().config["zero_optimization"]
    assert "--cpu-optimizer" not in plain.to_deepspeed().args


def test_zero3_offload_keeps_only_the_16_bit_partition_on_the_gpu():
    """ZeRO-3 with the optimizer on the CPU (deepspeed 0.19.8 runtime/zero/stage3.py, self.device the
    CPU): the gradient partition buffer (FP32 accumulation: 4 B), the FP32 master (4), the FP32
    gradient (4) and DeepSpeedCPUAdam's m and v (8) are pinned on the host, 20 B per partition element,
    plus the 16-bit conversion of one sub-group (sub_group_size 1e9, 2 B) made by the blocking copy
    back; the GPU keeps the 16-bit partition and no gradient or Adam state. Llama-3-8B over dp 8: the
    partition is 8,030,261,248 / 8 = 1,003,782,656 elements, so the sub-group is 1e9 of them."""
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100")
    p = planner.evaluate(m, c, TrainingSpec(**DS_OFFLOAD), Layout(dp=8, zero_stage=3))
    psi = 8_030_261_248 / 8
    assert m.num_params == 8_030_261_248
    assert p.memory.host == pytest.approx((20 * psi + 2 * 1e9,), rel=1e-12)
    st = p.memory.stages[0]
    assert (st.get("optimizer"), st.get("gradients"), st.get("offload_grad_buffer")) == (0, 0, 0)
    assert st.get("weights") == pytest.approx(2 * psi, rel=1e-12)
    assert st.get("zero_buckets") == 500_000_000 * 2  # one bucket of the 16-bit gradients
    kept = planner.evaluate(m, c, TrainingSpec(**{**DS_OFFLOAD, "optimizer_offload": 0.0}), Layout(dp=8, zero_stage=3))
    assert kept.memory.stages[0].get("optimizer") == pytest.approx(12 * psi, rel=1e-12)  # what offload frees
    assert kept.memory.stages[0].get("gradients") == pytest.approx(4 * psi, rel=1e-12)


def test_zero3_offload_crosses_the_host_link_every_micro_batch():
    """Each micro-batch's backward sends the reduced FP32 gradient partition to the host buffer and
    brings it (or the running sum) back to the GPU: 2 x 4 B per partition element on the 52 GB/s
    host link, on the reduce stream beside the collectives (DGX H100's dp_overlap is 0, so exposed);
    m = 64 / 8 = 8 micro-batches. The step then copies the FP32 gradient to the host (4 B), runs
    DeepSpeedCPUAdam (28 B) and the FP32-to-16-bit conversion (6 B) at 0.6 x 563.2 GB/s shared by
    eight ranks, and copies the 16-bit partition back (2 B), one after the other."""
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100")
    lay = Layout(dp=8, zero_stage=3)
    off = planner.evaluate(m, c, TrainingSpec(**DS_OFFLOAD), lay)
    kept = planner.evaluate(m, c, TrainingSpec(**{**DS_OFFLOAD, "optimizer_offload": 0.0}), lay)
    psi, link = 8_030_261_248 / 8, H100["link"]
    assert off.time.update.dp_exposed - kept.time.update.dp_exposed == pytest.approx(8 * 8 * psi / link, rel=1e-9)
    cpu = 34 * psi / (H100["host_bw"] * STREAM / 8)
    assert off.time.update.optimizer == pytest.approx(4 * psi / link + cpu + 2 * psi / link, rel=1e-9)
    files = off.to_deepspeed()
    assert files.config["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert files.config["zero_optimization"]["stage"] == 3 and "--cpu-optimizer" in files.args


def test_zero3_offload_in_16_bit_accumulation():
    """DeepSpeed's default accumulation dtype is the model's: ZeRO-3's host gradient partition is then
    16-bit (2 + 16 = 18 B per element, plus the 1e9-element sub-group's conversion) and each
    micro-batch moves 2 x 2 B per element; the step is the same (the boundary copy casts to FP32 on
    the GPU first). The ds_config says grad_accum_dtype bf16, and DeepSpeed's check accepts it."""
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100")
    lay, psi, link = Layout(dp=8, zero_stage=3), 8_030_261_248 / 8, H100["link"]
    t16 = TrainingSpec(**{**DS_OFFLOAD, "grad_dtype": "bf16"})
    off = planner.evaluate(m, c, t16, lay)
    kept = planner.evaluate(m, c, t16.model_copy(update={"optimizer_offload": 0.0}), lay)
    assert off.memory.host == pytest.approx((18 * psi + 2 * 1e9,), rel=1e-12)
    assert off.time.update.dp_exposed - kept.time.update.dp_exposed == pytest.approx(8 * 4 * psi / link, rel=1e-9)
    cpu = 34 * psi / (H100["host_bw"] * STREAM / 8)
    assert off.time.update.optimizer == pytest.approx(6 * psi / link + cpu, rel=1e-9)
    assert off.to_deepspeed().config["data_types"] == {"grad_accum_dtype": "bf16"}
    pytest.importorskip("deepspeed")
    from planner.check import check_deepspeed
    assert check_deepspeed(off.to_deepspeed().config, 8).ok


def test_explain_counts_what_zero3_offload_frees_and_its_copies():
    """What the ledger frees at ZeRO-3 offload is the FP32 gradient partition too, 12 + 4 = 16 B x
    1,003,782,656 partition elements = 15.0 GiB (not Adam's 12 B alone), and the micro-batches' copies,
    8 B per element each over the 52 GB/s host link, are named as DP time."""
    import re

    from planner.explain import explain
    from planner.specs import num_microbatches

    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100")
    t = TrainingSpec(**DS_OFFLOAD)
    lines = explain(m, c, t, framework="deepspeed", sensitivities=False, zero_stage=3, tp=1)
    line = next(x for x in lines if x.startswith("Optimizer offload"))
    assert "15.0 GiB per GPU freed" in line
    best = plan(m, c, t, framework="deepspeed", structural=False, zero_stage=3, tp=1).best
    copies = float(re.search(r"host add ([0-9.]+) s of exposed DP time", line).group(1))
    assert copies == pytest.approx(num_microbatches(t, best.layout) * 8 * 8_030_261_248 / 8 / H100["link"], abs=0.006)


def test_deepspeeds_engine_builds_its_zero_optimizer_for_the_offloaded_config():
    """DeepSpeed's own config parser and _do_optimizer_sanity_check on the emitted ds_config: the ZeRO
    optimizer (not BF16_Optimizer) at stage 1 with FP32 accumulation, CPU offload on."""
    pytest.importorskip("deepspeed")
    from planner.check import check_deepspeed
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100")
    for zero in (1, 2, 3):
        p = planner.evaluate(m, c, TrainingSpec(**DS_OFFLOAD), Layout(dp=8, zero_stage=zero))
        r = check_deepspeed(p.to_deepspeed().config, 8)
        assert r.ok and r.details["optimizer_wrapper"] == "zero_optimization", r.line()


def test_calibrate_reads_zero_offload_from_deepspeeds_printed_config():
    from planner.calibration import deepspeed_setup
    from planner.logs import LogError
    zero_config = ("stage=2 contiguous_gradients=True offload_param=None offload_optimizer="
                   "DeepSpeedZeroOffloadOptimizerConfig(device='cpu', nvme_path=None, buffer_count=4, pin_memory=True)")
    cfg = {"zero_optimization_stage": "2", "world_size": "8", "train_batch_size": "64", "grad_accum_dtype": "fp32",
           "zero_config": zero_config}
    t, lay = deepspeed_setup(cfg, TrainingSpec(global_batch_size=8, seq_length=4096), Layout(dp=1), "ds.log")
    assert (t.optimizer_offload, t.optimizer_impl, t.grad_dtype, lay.zero_stage) == (1.0, "deepspeed", "fp32", 2)
    t3, lay3 = deepspeed_setup({**cfg, "zero_optimization_stage": "3", "zero_config": zero_config.replace("stage=2", "stage=3")},
                               TrainingSpec(global_batch_size=8, seq_length=4096), Layout(dp=1), "ds.log")
    assert (t3.optimizer_offload, lay3.zero_stage) == (1.0, 3)  # ZeRO-3's offload: priced as it runs
    none = deepspeed_setup({**cfg, "zero_config": "stage=2 offload_optimizer=None", "grad_accum_dtype": "None"},
                           TrainingSpec(global_batch_size=8, seq_length=4096), Layout(dp=1), "ds.log")[0]
    assert (none.optimizer_offload, none.grad_dtype) == (0.0, "bf16")  # None: the model's dtype
    with pytest.raises(LogError, match="offloads the optimizer to 'nvme'"):
        deepspeed_setup({**cfg, "zero_config": zero_config.replace("'cpu'", "'nvme'")},
                        TrainingSpec(global_batch_size=8, seq_length=4096), Layout(dp=1), "ds.log")
    t16, lay16 = deepspeed_setup({**cfg, "grad_accum_dtype": "bf16"}, TrainingSpec(global_batch_size=8, seq_length=4096),
                                 Layout(dp=1), "ds.log")  # read as run; ZeRO-2 offload in 16 bits is then refused
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100")
    with pytest.raises(PlannerError, match="FP32 accumulation"):
        planner.evaluate(m, c, t16, lay16.model_copy(update={"dp": 8}))


def test_choice_rows_name_their_workload(capsys):
    # at 1024 x 8192 tokens the runners-up of the offloaded optimum include a layout that is faster kept on
    # the GPU: the rows come from two workloads and say which
    assert cli_main(["plan", "llama3-8b", "dgx-h100", "--nodes", "1", "--framework", "deepspeed",
                     "--optimizer-offload", "0,1"]) == 0
    out = capsys.readouterr().out
    assert "[offload=1]" in out and "[offload=0]" in out


def test_a_16_bit_accumulation_choice_offloads_at_zero3_only():
    """--optimizer-offload 0,1 under DeepSpeed with 16-bit accumulation: both are workloads DeepSpeed
    runs as priced, the offloaded one at ZeRO-3 only (ZeRO-1/2's offload is priced with FP32
    accumulation); each is planned and proven."""
    from planner.choices import plan_choices
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100")
    t = TrainingSpec(global_batch_size=64, seq_length=4096, grad_dtype="bf16")
    r, results = plan_choices(m, c, t, {"optimizer_offload": [0.0, 1.0]}, framework="deepspeed", top_k=1,
                              structural=False)
    assert set(results) == {(0.0,), (1.0,)} and not r.refused_choices
    assert results[(1.0,)].best.layout.zero_stage == 3


@pytest.mark.parametrize("framework, cluster, field, values, rule", [
    ("deepspeed", "dgx-h100", "fp8", [None, "delayed"], "DeepSpeed's launch config runs no FP8 linears"),
    ("torchtitan", "dgx-h100", "optimizer_states", ["fp32", "bf16"], "precision-aware optimizer"),
    ("megatron", "dgx-a100-80g", "fp8", [None, "delayed"], "needs compute capability 9.x"),  # A100: no FP8 tensor cores
])
def test_a_choice_the_target_or_cluster_would_not_run_is_refused_by_name(framework, cluster, field, values, rule):
    """A choice one of whose values the framework's launch config or the GPU does not run: the other
    values are planned and the refused one is named with its rule, instead of the whole call failing."""
    from planner.choices import plan_choices
    m, c = planner.load_model("llama3-8b"), planner.load_cluster(cluster)
    r, results = plan_choices(m, c, TrainingSpec(global_batch_size=64, seq_length=4096), {field: values},
                              framework=framework, top_k=1, structural=False)
    assert list(results) == [(values[0],)] and r.best is not None
    assert len(r.refused_choices) == 1 and rule in r.refused_choices[0]


# FSDP2's CPU offload (torchtitan's training.enable_cpu_offload)

def _fsdp2(gbs=16, offload=1.0):
    return TrainingSpec(global_batch_size=gbs, seq_length=8192, optimizer_impl="fsdp2", kernels="unfused",
                        optimizer_offload=offload)


def test_fsdp2_offload_moves_the_whole_shard_to_the_host_at_16_bytes_per_element():
    """Llama-3-8B (8,030,261,248 parameters, Meta's model card) fully sharded over 8 GPUs: with
    CPUOffloadPolicy the GPU keeps none of the shard -- no FP32 weight, gradient or AdamW state -- and
    the host holds 4 + 4 + 4 + 4 B per element (FP32 parameter, FP32 gradient, exp_avg, exp_avg_sq);
    the gathered BF16 units and the activations do not move."""
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100")
    lay = Layout(dp=8, zero_stage=3, micro_batch_size=2, recompute="op")
    base = planner.evaluate(m, c, _fsdp2(offload=0.0), lay)
    off = planner.evaluate(m, c, _fsdp2(), lay)
    shard = 8_030_261_248 / 8
    assert base.memory.stages[0].get("weights") == pytest.approx(4 * shard, rel=1e-9)
    for item in ("weights", "gradients", "optimizer"):
        assert off.memory.stages[0].get(item) == 0
    assert off.memory.host == pytest.approx((16 * shard,), rel=1e-9)
    assert base.memory.stages[0].total - off.memory.stages[0].total == pytest.approx((4 + 4 + 8) * shard, rel=1e-9)


@pytest.mark.parametrize("gbs", [8, 16])
def test_fsdp2_offload_copies_every_unshard_and_every_gradient_and_steps_on_the_host(gbs):
    """One shard (tp 8, dp 1: FSDP2 still wraps every unit, so nothing is gathered but every copy is
    made), calibration.dp_overlap 0 so nothing hides. Each micro-batch copies the FP32 shard to the GPU
    for the forward and again for the backward, except the [norm, output] unit, which stays gathered
    (4 B x (2 psi - output)), and the reduced FP32 gradient back (4 B x psi) over the 52 GB/s host link;
    a second micro-batch adds its gradient on the CPU (read 4 + 4, write 4). The step: clipping on the
    host (read, then read and write: 12 B) and torch's fused AdamW (28 B), the node's 8 ranks sharing
    0.6 of its 563.2 GB/s."""
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100")
    c = c.model_copy(update={"calibration": c.calibration.model_copy(update={"dp_overlap": 0.0})})
    p = planner.evaluate(m, c, _fsdp2(gbs), Layout(tp=8, dp=1, zero_stage=3, micro_batch_size=8,
                                                   sequence_parallel=True))
    psi = 8_030_261_248 / 8  # TP slices; every weight matrix, embedding and output split 8 ways
    out = 128_256 * 4096 / 8 + 4096  # the output layer's slice, and the final norm (replicated)
    share = H100["host_bw"] * STREAM / H100["gpus"]
    copies = 4 * (2 * psi - out) / H100["link"] + 4 * psi / H100["link"]
    micro = gbs // 8
    want = copies + (micro - 1) * (copies + 12 * psi / share)
    assert p.time.dp_exposed == pytest.approx(want, rel=0.01)
    assert p.time.optimizer == pytest.approx(40 * psi / share, rel=0.01)


def test_fsdp2_offload_rules_name_the_field():
    with pytest.raises(ValueError, match="'optimizer_offload': FSDP2's CPU offload keeps the whole shard"):
        _fsdp2(offload=0.5)
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100")
    with pytest.raises(PlannerError, match="FSDP2's fully sharded parameters"):
        planner.evaluate(m, c, _fsdp2(), Layout(dp=8, zero_stage=0))
    with pytest.raises(PlannerError, match="without pipeline parallelism"):
        planner.evaluate(m, c, _fsdp2(), Layout(dp=4, pp=2, zero_stage=3))


def test_fsdp2_offload_search_and_launch_files(tmp_path):
    """framework='torchtitan' plans the offload as FSDP2's, fully sharded without PP, and its launch
    files turn it on (--training.enable_cpu_offload, enable_cpu_offload = true); torchtitan's own
    config manager accepts the overrides."""
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100")
    r = plan(m, c, TrainingSpec(global_batch_size=16, seq_length=8192, optimizer_offload=1.0), framework="torchtitan",
             top_k=3)
    assert r.best.training.optimizer_impl == "fsdp2"
    assert all(p.layout.zero_stage == 3 and p.layout.pp == 1 for p in (r.best, *r.alternatives))
    assert r.best.memory.peak_stage.get("optimizer") == 0
    files = r.best.to_torchtitan()
    assert "--training.enable_cpu_offload" in files.args
    assert "enable_cpu_offload = true" in files.files["job.toml"]
    pytest.importorskip("torchtitan")
    from planner.check import check_torchtitan
    from planner.emit.torchtitan import torchtitan_config_name

    module, config = torchtitan_config_name(r.best)
    check = check_torchtitan(list(files.args), r.best.num_gpus, module=module, config=config)
    assert check.ok, check.line()


def test_cli_evaluates_fsdp2_with_torchtitans_kernels(capsys):
    """--optimizer-impl fsdp2 prices torchtitan's compiled PyTorch kernels without a --kernels flag
    (evaluate has none), offloaded or not."""
    for extra in ([], ["--optimizer-offload", "1"]):
        code = cli_main(["evaluate", "llama3-8b", "dgx-h100", "--nodes", "1", "--global-batch-size", "16",
                         "--seq-length", "8192", "--optimizer-impl", "fsdp2", "--tp", "1", "--pp", "1", "--zero", "3",
                         "--micro-batch-size", "2", "--recompute", "op", "--time-limit", "20"] + extra)
        assert code == 0, capsys.readouterr()
    assert "FSDP2 shard: 16 B per element" in capsys.readouterr().out


def test_torchtitan_offload_choice_fits_seventy_billion_on_one_node():
    """A choice search for torchtitan (its engine and kernels set by the framework, not the user) keeps
    each combination's unset fields unset, so torchtitan's own rules apply to each: Llama-3-70B on one
    DGX H100 (GBS 64 x 4K) is proven not to fit with the shard on the GPU -- 16 B x 70.6B / 8 = 141 GB
    a GPU -- and fits with FSDP2's CPU offload."""
    from planner.choices import plan_choices

    m, c = planner.load_model("llama3-70b"), planner.load_cluster("dgx-h100")
    r, each = plan_choices(m, c, TrainingSpec(global_batch_size=64, seq_length=4096), {"optimizer_offload": [0.0, 1.0]},
                           time_limit_s=60, framework="torchtitan")
    assert each[(0.0,)].status == "infeasible"
    assert each[(1.0,)].status == "optimal"
    assert r.best.training.optimizer_offload == 1 and r.best.training.optimizer_impl == "fsdp2"
    assert r.best.training.kernels == "unfused"
