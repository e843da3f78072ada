"""Emitted launch files: golden files (regenerate with PLANNER_UPDATE_GOLDEN=1 after a reviewed
change), determinism, and the rules each emitter enforces."""

import json
import os
from pathlib import Path

import pytest

import planner
from planner.space import framework_training, overlaps
from planner.specs import Layout, TrainingSpec

GOLDEN = Path(__file__).parent / "golden"

CASES = {
    "llama3-70b-64xh100-vpp": ("llama3-70b", "dgx-h100", 8, 1024, 8192,
                               Layout(tp=8, pp=4, dp=2, zero_stage=1, vpp=5, sequence_parallel=True, recompute="selective"),
                               ["megatron"]),
    "llama3-70b-64xh100-titan": ("llama3-70b", "dgx-h100", 8, 1024, 8192,
                                 Layout(tp=8, pp=4, dp=2, zero_stage=0, vpp=5, sequence_parallel=True, recompute="op"),
                                 ["torchtitan"]),
    "gpt3-175b-128xa100-uneven": ("gpt3-175b", "dgx-a100-80g", 16, 1536, 2048,
                                  Layout(tp=8, pp=8, dp=2, zero_stage=1, first_stage_layers=9, last_stage_layers=9,
                                         recompute="full"),
                                  ["megatron"]),
    "llama3-8b-8xh100-fsdp": ("llama3-8b", "dgx-h100", 1, 64, 8192, Layout(dp=8, zero_stage=3, recompute="selective"),
                              ["megatron", "deepspeed"]),
    "llama3-8b-8xh100-fsdp-op": ("llama3-8b", "dgx-h100", 1, 64, 8192, Layout(dp=8, zero_stage=3, recompute="op"),
                                 ["torchtitan"]),
    "llama2-7b-16xa100-pp": ("llama2-7b", "dgx-a100-80g", 2, 256, 4096,
                             Layout(tp=2, pp=2, dp=4, zero_stage=1, recompute="full"),
                             ["megatron", "deepspeed"]),
    "llama2-7b-16xa100-partial": ("llama2-7b", "dgx-a100-80g", 2, 256, 4096,
                                  Layout(tp=2, pp=2, dp=4, zero_stage=1, recompute="full", recompute_num_layers=4),
                                  ["megatron"]),
}


def _plan(case, framework="megatron"):
    """The case's layout with the overlaps a search for `framework` gives it (planner.space.overlaps)."""
    mref, cref, nodes, gbs, seq, layout, _ = CASES[case]
    training = framework_training(TrainingSpec(global_batch_size=gbs, seq_length=seq), framework)
    layout = layout.model_copy(update=overlaps(framework, layout.pp, layout.zero_stage, layout.vpp,
                                               layout.sequence_parallel, training))
    return planner.evaluate(planner.load_model(mref), planner.load_cluster(cref, nodes=nodes), training, layout)


@pytest.mark.parametrize("case,framework", [(c, f) for c, v in CASES.items() for f in v[-1]])
def test_golden_files(case, framework, tmp_path):
    files = getattr(_plan(case, framework), f"to_{framework}")()
    written = files.write(tmp_path)
    folder = GOLDEN / case / framework
    if os.environ.get("PLANNER_UPDATE_GOLDEN"):
        folder.mkdir(parents=True, exist_ok=True)
        for p in written:
            (folder / p.name).write_text(p.read_text())
    assert sorted(p.name for p in written) == sorted(p.name for p in folder.iterdir())
    for p in written:
        assert p.read_text() == (folder / p.name).read_text(), f"{case}/{framework}/{p.name} changed"


def test_emitters_are_deterministic(tmp_path):
    a = _plan("llama3-8b-8xh100-fsdp").to_megatron().files
    b = _plan("llama3-8b-8xh100-fsdp").to_megatron().files
    assert a == b


def test_megatron_args_carry_the_layout():
    p = _plan("gpt3-175b-128xa100-uneven")
    args = p.to_megatron().args
    flag = {a: args[i + 1] for i, a in enumerate(args[:-1]) if a.startswith("--") and not args[i + 1].startswith("--")}
    assert (flag["--tensor-model-parallel-size"], flag["--pipeline-model-parallel-size"]) == ("8", "8")
    assert (flag["--decoder-first-pipeline-num-layers"], flag["--decoder-last-pipeline-num-layers"]) == ("9", "9")
    assert flag["--recompute-method"] == "uniform" and flag["--recompute-num-layers"] == "1"
    assert "--use-distributed-optimizer" in args
    assert p.to_megatron().env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}  # TP on Ampere


def test_megatron_fsdp_never_sets_cuda_device_max_connections():
    p = _plan("llama3-8b-8xh100-fsdp")
    assert p.to_megatron().env == {}
    assert "optim_grads_params" in p.to_megatron().args


def test_blackwell_needs_no_cuda_device_max_connections():
    p = planner.evaluate(planner.load_model("llama3-70b"), planner.load_cluster("dgx-b200", nodes=2),
                         TrainingSpec(global_batch_size=64, seq_length=4096), Layout(tp=8, dp=2, zero_stage=1))
    assert p.to_megatron().env == {}


def test_deepspeed_batch_rule():
    cfg = _plan("llama2-7b-16xa100-pp", "deepspeed").to_deepspeed().config
    # train_batch_size = micro x GAS x DP with DP = world / (tp * pp) = 16 / 4
    assert cfg["train_batch_size"] == cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * 4 == 256
    assert json.loads(_plan("llama2-7b-16xa100-pp", "deepspeed").to_deepspeed().files["ds_config.json"]) == cfg


@pytest.mark.parametrize("layout,fragment", [
    (Layout(tp=8, pp=4, dp=1, cp=2, zero_stage=1), "cp(2) > 1"),
    (Layout(tp=8, pp=4, dp=2, vpp=2, zero_stage=1), "vpp(2) > 1"),
    (Layout(tp=8, pp=4, dp=2, zero_stage=2), "ZeRO-2 cannot run with pipeline parallelism"),
])
def test_deepspeed_refuses_what_it_cannot_run(layout, fragment):
    p = planner.evaluate(planner.load_model("llama3-70b"), planner.load_cluster("dgx-h100", nodes=8),
                         TrainingSpec(global_batch_size=64, seq_length=4096), layout)
    with pytest.raises(planner.PlannerError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        p.to_deepspeed()


def test_partial_recompute_only_for_megatron():
    p = _plan("llama2-7b-16xa100-partial")
    args = p.to_megatron().args
    assert args[args.index("--recompute-method") + 1] == "block" and args[args.index("--recompute-num-layers") + 1] == "4"
    with pytest.raises(planner.PlannerError, match="recomputing 4 layers per stage"):
        p.to_deepspeed()


def test_torchtitan_overrides():
    args = _plan("llama3-70b-64xh100-titan", "torchtitan").to_torchtitan().args
    flag = {a: args[i + 1] for i, a in enumerate(args[:-1]) if a.startswith("--") and not args[i + 1].startswith("--")}
    assert flag["--parallelism.pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert flag["--parallelism.pipeline_parallel_layers_per_stage"] == "4"  # 80 / (4 x 5)
    assert flag["--training.local_batch_size"] == "512"  # 1024 / dp 2
    assert args[-1] == "activation-checkpoint:selective"
    with pytest.raises(planner.PlannerError, match="ZeRO-1 does not exist"):
        _plan("llama2-7b-16xa100-pp").to_torchtitan()


def test_selective_means_each_frameworks_own_policy():
    """torchtitan's 'selective' is its per-op policy (Recompute.OP), Megatron's and Megatron-DeepSpeed's
    the attention core (Recompute.SELECTIVE): each emitter writes its own and refuses the other."""
    op, core = _plan("llama3-8b-8xh100-fsdp-op", "torchtitan"), _plan("llama3-8b-8xh100-fsdp", "torchtitan")
    assert op.to_torchtitan().args[-1] == "activation-checkpoint:selective"
    assert 'mode = "selective"' in op.to_torchtitan().files["job.toml"]
    with pytest.raises(planner.PlannerError, match="torchtitan: its selective checkpointing is per-op"):
        core.to_torchtitan()
    with pytest.raises(planner.PlannerError, match="Megatron: recompute 'op' is torchtitan's"):
        op.to_megatron()
    with pytest.raises(planner.PlannerError, match="DeepSpeed: recompute 'op' is torchtitan's"):
        op.to_deepspeed()
    core = _plan("llama3-8b-8xh100-fsdp")  # the same layout priced on Megatron's optimizer
    assert core.to_megatron().args[core.to_megatron().args.index("--recompute-granularity") + 1] == "selective"


def test_pipeline_layout_string():
    """Megatron's layout grammar: stages split by '|', 't' per decoder layer, E first, L last."""
    from planner.emit.megatron import pipeline_layout_string
    assert pipeline_layout_string((2, 3, 3, 0)) == "Ett|ttt|ttt|L"
    assert pipeline_layout_string((1,)) == "EtL"


def test_explicit_split_is_priced_and_emitted():
    """Llama-3-70B (80 layers) over pp 4 as 18 / 21 / 21 / 20: the ledger and the stage times follow
    the split, and Megatron gets --pipeline-model-parallel-layout instead of the even-split flags."""
    m, c = planner.load_model("llama3-70b"), planner.load_cluster("dgx-h100", nodes=8)
    t = TrainingSpec(global_batch_size=64, seq_length=4096)
    p = planner.evaluate(m, c, t, Layout(tp=8, pp=4, dp=2, zero_stage=1, sequence_parallel=True,
                                         pipeline_layers=(18, 21, 21, 20)))
    assert [s.layers for s in p.memory.stages] == [18, 21, 21, 20]
    assert [s.layers for s in p.time.pipeline.stages] == [18, 21, 21, 20]
    args = p.to_megatron().args
    assert args[args.index("--pipeline-model-parallel-layout") + 1] == "E" + "t" * 18 + "|" + "t" * 21 + "|" \
        + "t" * 21 + "|" + "t" * 20 + "L"
    assert "--num-virtual-stages-per-pipeline-rank" not in args and "--decoder-first-pipeline-num-layers" not in args


@pytest.mark.parametrize("split,fragment", [((20, 20, 20), "needs pp(4)*vpp(1) = 4"), ((20, 20, 20, 21), "sum to 81"),
                                            ((40, 40, 0, 0), "rank 2 would hold no decoder layer")])
def test_explicit_split_rules(split, fragment):
    m, c = planner.load_model("llama3-70b"), planner.load_cluster("dgx-h100", nodes=8)
    with pytest.raises(planner.InvalidLayout, match=fragment.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        planner.evaluate(m, c, TrainingSpec(global_batch_size=64, seq_length=4096),
                         Layout(tp=8, pp=4, dp=2, zero_stage=1, pipeline_layers=split))


@pytest.mark.parametrize("precision,grad_dtype,flag,accum", [
    ("bf16", "bf16", "--grad-reduce-in-bf16", "bf16"), ("bf16", "fp32", None, "fp32"),
    ("fp16", "fp32", "--accumulate-allreduce-grads-in-fp32", "fp32"), ("fp16", "bf16", None, "fp16")])
def test_gradient_buffer_flags_match_the_priced_bytes(precision, grad_dtype, flag, accum):
    """Megatron keeps fp32 main grads under --bf16 unless --grad-reduce-in-bf16, and 2-byte grads
    under --fp16 unless --accumulate-allreduce-grads-in-fp32 (validate_args); DeepSpeed accumulates
    in the model dtype unless data_types.grad_accum_dtype says otherwise. The ledger's bytes follow."""
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100", nodes=1)
    t = TrainingSpec(global_batch_size=16, seq_length=4096, precision=precision, grad_dtype=grad_dtype)
    p = planner.evaluate(m, c, t, Layout(dp=8, zero_stage=1))
    args = p.to_megatron().args
    for f in ("--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32"):
        assert (f in args) == (f == flag)
    ds = planner.evaluate(m, c, framework_training(t, "deepspeed"), Layout(dp=8, zero_stage=1))
    assert ds.to_deepspeed().config["data_types"]["grad_accum_dtype"] == accum
    per_param = 2 if grad_dtype == "bf16" else 4
    for plan_ in (p, ds):  # DeepSpeed's BF16_Optimizer keeps an FP32 gradient buffer of the whole model too
        assert plan_.memory.stages[0].get("gradients") == pytest.approx(per_param * m.num_params)


def test_torchtitan_local_batch_is_the_plans_micro_batch_without_a_pipeline():
    """torchtitan's training.local_batch_size is what a data-parallel rank runs in one gradient-accumulation step,
    accumulated global / (local x dp) times; with a pipeline that step's batch is split into
    pipeline_parallel_microbatch_size micro-batches [torchtitan 0.3 trainer.py: gradient_accumulation_steps]. So
    Llama-3-8B on 8 H100 at GBS 64, dp 8, micro-batch 2 runs local batch 2 (4 accumulation steps, the 4
    micro-batches the plan prices), not 8 (one micro-batch of 8, four times the activations priced)."""
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100", nodes=1)
    t = framework_training(TrainingSpec(global_batch_size=64, seq_length=4096), "torchtitan")
    p = planner.evaluate(m, c, t, Layout(dp=8, zero_stage=3, micro_batch_size=2, recompute="op"))
    files = p.to_torchtitan()
    args = list(files.args)
    assert args[args.index("--training.local_batch_size") + 1] == "2"
    assert args[args.index("--training.global_batch_size") + 1] == "64"
    assert "local_batch_size = 2" in files.files["job.toml"]


def test_torchtitan_builds_qwen3s_dense_flavour(tmp_path):
    """Qwen3-8B (Q/K norms, untied) is torchtitan 0.3's qwen3 flavour 8B, which has no pretraining config function:
    planner_job.py trains it in qwen3_14b's trainer config, and torchtitan parses it into the Hugging Face
    config's shape (36 layers, dim 4096, 32 / 8 heads of 128, vocabulary 151,936) with its Q/K norms."""
    pytest.importorskip("torchtitan")
    from titan_checks import parsed_by_torchtitan

    from planner.torchtitan_engine import registry_flavour, unbuilt_features

    m = planner.load_model("qwen3-8b")
    assert registry_flavour(m) == ("qwen3", None, "8B") and unbuilt_features(m) == ()
    assert registry_flavour(m.model_copy(update={"qk_norm": False})) is None  # a llama3 model: its own registry
    t = framework_training(TrainingSpec(global_batch_size=64, seq_length=2048), "torchtitan")
    p = planner.evaluate(m, planner.load_cluster("gb200-nvl72", nodes=1), t,
                         Layout(dp=4, zero_stage=3, micro_batch_size=16, recompute="op"))
    files = p.to_torchtitan()
    assert set(files.files) == {"train.sh", "planner_job.py"}  # no 0.2-style TOML: its qwen3 keys are not checked
    assert 'model_registry("8B")' in files.files["planner_job.py"] and "qwen3_14b()" in files.files["planner_job.py"]
    d = parsed_by_torchtitan(p, tmp_path)
    assert (d["num_layers"], d["dim"], d["n_heads"], d["n_kv_heads"], d["head_dim"], d["vocab_size"]) == (
        36, 4096, 32, 8, 128, 151936)
    assert d["qk_norm"] and not d["weight_tying"]
