"""DeepSpeed's engine as the planner prices it (planner.deepspeed_engine), each term by hand from
the deepspeed 0.19.8 source: the reduce buckets zero/stage_1_and_2.py (setup_buckets) and
zero/stage3.py allocate, BF16_Optimizer's all-reduce after the backward, gradients on the wire in
the model dtype (engine.py communication_data_type), and what a search for DeepSpeed emits."""

from __future__ import annotations

import pytest

import planner
from planner.cost import dp_time
from planner.errors import InvalidLayout, PlannerError
from planner.plans import evaluate
from planner.specs import Layout, TrainingSpec

GB = 500_000_000  # reduce_bucket_size as emitted, elements


def _ds(**kw) -> TrainingSpec:
    return TrainingSpec(global_batch_size=64, seq_length=4096, optimizer_impl="deepspeed", **kw)


def _bucket(p) -> float:
    return p.memory.peak_stage.get("zero_buckets")


@pytest.mark.parametrize("training,layout,expected", [
    # ZeRO-2, overlap_comm: two contiguous buckets of 500M BF16 elements (double buffering)
    (_ds(), Layout(dp=16, zero_stage=2, overlap_grad_reduce=True), 2 * GB * 2),
    (_ds(), Layout(dp=16, zero_stage=2), GB * 2),  # one without overlap_comm
    (_ds(), Layout(dp=16, zero_stage=3), GB * 2),  # stage 3: one bucket, allocated at start
    (_ds(), Layout(dp=16, zero_stage=1), 0.0),  # BF16 + FP32 accumulation at ZeRO-1: BF16_Optimizer, no bucket
    (_ds(grad_dtype="bf16"), Layout(dp=16, zero_stage=1, overlap_grad_reduce=True), 2 * GB * 2),
    # FP16 weights accumulating FP32 gradients at ZeRO-1: the stage-1 buckets hold the FP32 accumulator
    (_ds(precision="fp16"), Layout(dp=16, zero_stage=1, overlap_grad_reduce=True), 2 * GB * 4),
])
def test_reduce_buckets_are_what_deepspeed_allocates(training, layout, expected):
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100", nodes=2)
    p = evaluate(m, c, training, layout)
    assert _bucket(p) == expected
    megatron = evaluate(m, c, training.model_copy(update={"optimizer_impl": None}), layout)
    assert _bucket(megatron) == 0
    gather = p.memory.peak_stage.get("zero3_gather") - megatron.memory.peak_stage.get("zero3_gather")  # ZeRO-3: below
    lp = p.memory.peak_stage.get("bf16_grads")  # BF16_Optimizer's BF16 gradients: below
    assert lp == (2 * m.num_params if training.grad_dtype == "fp32" and layout.zero_stage == 1
                  and training.precision == "bf16" else 0)
    # the loss: Megatron-DeepSpeed's 10 B a logit (the BF16 logits, their FP32 copy and the shifted copy its
    # exp overwrites) against megatron-core's 6 (the logits and one FP32 copy), over 4096 x 128,256 logits
    loss = (10 - 6) * 4096 * 128_256
    assert p.peak_memory_bytes - megatron.peak_memory_bytes == pytest.approx(expected + gather + lp + loss)  # nothing else


@pytest.mark.parametrize("model,per_layer,kept", [
    ("llama3-8b", 4096 * (4096 + 2048) + 4096**2 + 3 * 4096 * 14336 + 2 * 4096, 3),  # 218,112,000
    ("llama3-70b", 8192 * (8192 + 2048) + 8192**2 + 3 * 8192 * 28672 + 2 * 8192, 1),  # 855,654,400
    ("gpt3-1.3b", 4 * 2048**2 + 4 * 2048 + 2 * 2048 * 8192 + 8192 + 2048 + 4 * 2048, 10),  # 50,358,272
])
def test_zero3_keeps_what_its_reuse_distance_keeps(model, per_layer, kept):
    """DeepSpeed ZeRO-3 releases a gathered weight only if its next use is more than
    stage3_max_reuse_distance = 1e9 parameters away in the forward-and-backward module trace; layer j
    is next used by its backward, 2 (L - 1 - j) layers later, so at the turn to backward the last
    floor(1e9 / 2P) + 1 layers are still gathered, plus the 50M-parameter prefetch bucket. P by hand
    (Llama: QKV with GQA, out-proj, SwiGLU, two RMSNorms; GPT: QKV, out-proj and the MLP with biases,
    two LayerNorms): Llama-3-8B 3 layers, Llama-3-70B 1, GPT-3 1.3B 10."""
    assert int(1e9 // (2 * per_layer)) + 1 == kept
    m, c = planner.load_model(model), planner.load_cluster("dgx-h100", nodes=2)
    p = evaluate(m, c, _ds(), Layout(dp=16, zero_stage=3, recompute="full"))
    assert p.memory.peak_stage.get("zero3_gather") == pytest.approx((kept * per_layer + 50_000_000) * 2, rel=1e-9)
    zero = p.to_deepspeed().config["zero_optimization"]
    assert (zero["stage3_max_reuse_distance"], zero["stage3_prefetch_bucket_size"], zero["stage3_max_live_parameters"]) \
        == (1_000_000_000, 50_000_000, 1_000_000_000)


def test_the_config_allocates_the_buckets_it_is_priced_with():
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100", nodes=2)
    p = evaluate(m, c, _ds(), Layout(dp=16, zero_stage=2, overlap_grad_reduce=True))
    zero = p.to_deepspeed().config["zero_optimization"]
    assert zero["reduce_bucket_size"] == GB and zero["contiguous_gradients"] and zero["overlap_comm"]
    off = evaluate(m, c, _ds(), Layout(dp=16, zero_stage=2)).to_deepspeed().config["zero_optimization"]
    assert not off["overlap_comm"]


def _flat_h100():
    """One DGX H100 with a flat bus-bandwidth curve: each collective over its 8 GPUs costs
    25 us + f S / 370 GB/s, f = 7/8 for a reduce-scatter or all-gather, 2 x 7/8 for an all-reduce
    (no NVLS gain) [nccl-tests PERFORMANCE.md]."""
    c = planner.load_cluster("dgx-h100", nodes=1)
    nvl = c.nvlink.model_copy(update={"busbw_curve": [(2**20, 370e9), (2**33, 370e9)], "allreduce_busbw": 370e9})
    return c.model_copy(update={"nvlink": nvl})


def _rs(nbytes):
    return 25e-6 + 7 / 8 * nbytes / 370e9


def test_bf16_optimizer_all_reduces_bf16_gradients_after_the_backward():
    """ZeRO-1, BF16 weights, FP32 accumulation: DeepSpeed's BF16_Optimizer all-reduces the whole
    gradient in BF16 (its communication dtype) after the last backward, then all-gathers the BF16
    weights; Megatron reduce-scatters the FP32 main grads (4 B). Same bus bytes, by hand."""
    m, c = planner.load_model("llama3-8b"), _flat_h100()
    psi = m.num_params
    tr = TrainingSpec(global_batch_size=8, seq_length=4096)
    ar = 25e-6 + 2 * 7 / 8 * psi * 2 / 370e9
    ds = dp_time(m, c, tr.model_copy(update={"optimizer_impl": "deepspeed"}), Layout(dp=8, zero_stage=1))
    assert ds == pytest.approx(ar + _rs(psi * 2), rel=1e-9)
    assert dp_time(m, c, tr, Layout(dp=8, zero_stage=1)) == pytest.approx(_rs(psi * 4) + _rs(psi * 2), rel=1e-9)


def test_zero2_reduces_in_the_model_dtype_in_500m_buckets():
    """ZeRO-2 under DeepSpeed, Llama-2-7B (6,738,415,616 params): each of m = 32 / 8 = 4 micro-batches
    reduce-scatters its gradients in BF16 although it accumulates FP32 (2 B on the wire); with
    overlap_comm only the last of ceil(psi / 500M) = 14 buckets, psi - 13 x 500M = 238,415,616
    parameters, is exposed in each (Megatron's 40M buckets would leave 18,415,616)."""
    m, c = planner.load_model("llama2-7b"), _flat_h100()
    psi = m.num_params
    tr = TrainingSpec(global_batch_size=32, seq_length=4096, optimizer_impl="deepspeed")
    assert dp_time(m, c, tr, Layout(dp=8, zero_stage=2)) == pytest.approx(4 * _rs(psi * 2) + _rs(psi * 2), rel=1e-9)
    last = psi - 13 * GB
    assert last == 238_415_616
    t = dp_time(m, c, tr, Layout(dp=8, zero_stage=2, overlap_grad_reduce=True))
    assert t == pytest.approx(4 * _rs(last * 2) + _rs(psi * 2), rel=1e-9)


def test_what_deepspeed_would_not_run_is_refused():
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100", nodes=2)
    with pytest.raises(InvalidLayout, match="DeepSpeed without ZeRO cannot train BF16 weights"):
        evaluate(m, c, _ds(), Layout(dp=16, zero_stage=0))
    with pytest.raises(InvalidLayout, match="refuses FP16 weights with FP32 gradient accumulation"):
        evaluate(m, c, _ds(precision="fp16"), Layout(dp=16, zero_stage=0))
    evaluate(m, c, _ds(precision="fp16", grad_dtype="bf16"), Layout(dp=16, zero_stage=0))  # FP16_Optimizer runs
    with pytest.raises(InvalidLayout, match="BF16_Optimizer at zero_stage 1 with pp.1. reduces the gradients after"):
        evaluate(m, c, _ds(), Layout(dp=16, zero_stage=1, overlap_grad_reduce=True))
    with pytest.raises(InvalidLayout, match="reduces the gradients after the backward"):  # the pipeline engine
        evaluate(m, c, _ds(grad_dtype="bf16"), Layout(pp=2, dp=8, zero_stage=1, overlap_grad_reduce=True))
    with pytest.raises(InvalidLayout, match="overlap_param_gather: DeepSpeed's ZeRO-1/2"):
        evaluate(m, c, _ds(), Layout(dp=16, zero_stage=2, overlap_param_gather=True))


def test_a_search_for_deepspeed_prices_its_engine_and_offers_no_zero0_for_bf16():
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100", nodes=2)
    tr = TrainingSpec(global_batch_size=64, seq_length=4096)
    r = planner.plan(m, c, tr, framework="deepspeed", top_k=6, structural=False)
    assert r.status == "optimal"
    for p in (r.best, *r.alternatives):
        lay = p.layout
        assert p.training.optimizer_impl == "deepspeed" and lay.zero_stage >= 1
        # ZeRO-1 here is BF16_Optimizer (FP32 accumulation): no bucket, no overlap
        assert not (lay.zero_stage == 1 and lay.overlap_grad_reduce)
        expected = {1: 0, 2: GB * 2 * (2 if lay.overlap_grad_reduce else 1), 3: GB * 2}[lay.zero_stage]
        assert p.memory.peak_stage.get("zero_buckets") == expected
        p.to_deepspeed()
    with pytest.raises(PlannerError, match="impossible with framework 'deepspeed'"):
        planner.plan(m, c, tr, framework="deepspeed", zero_stage=0)
    with pytest.raises(PlannerError, match="optimizer_impl: 'deepspeed' is not the engine framework 'megatron' runs"):
        planner.plan(m, c, tr.model_copy(update={"optimizer_impl": "deepspeed"}), framework="megatron")


def test_naming_the_engine_with_framework_any_searches_its_targets_rules():
    """plan(framework='any') with DeepSpeed's engine named: DeepSpeed's ZeRO stages and overlaps
    (no BF16 ZeRO-0, no parameter-gather overlap), every plan evaluable and emittable for DeepSpeed."""
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100", nodes=2)
    r = planner.plan(m, c, _ds(), framework="any", top_k=4, structural=False)
    assert r.status == "optimal"
    for p in (r.best, *r.alternatives):
        assert p.layout.zero_stage >= 1 and not p.layout.overlap_param_gather
        p.to_deepspeed()


def test_emitters_refuse_another_engine():
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100", nodes=2)
    ds = evaluate(m, c, _ds(), Layout(dp=16, zero_stage=1))
    meg = evaluate(m, c, TrainingSpec(global_batch_size=64, seq_length=4096), Layout(dp=16, zero_stage=1))
    with pytest.raises(PlannerError, match="priced with the deepspeed optimizer engine"):
        ds.to_megatron()
    with pytest.raises(PlannerError, match="priced with the megatron optimizer engine"):
        meg.to_deepspeed()
    fsdp = evaluate(m, c, TrainingSpec(global_batch_size=64, seq_length=4096), Layout(dp=16, zero_stage=3))
    with pytest.raises(PlannerError, match="not the fsdp2 one this config runs"):
        fsdp.to_torchtitan()


def test_pipeline_split_is_deepspeeds_own():
    """deepspeed_engine.pipeline_split (the planner's own linear-partition programme) against
    DeepSpeed 0.19.8's partition_balanced on Megatron-DeepSpeed's GPTModelPipe layer specs (weight 1
    per decoder layer): the same counts per stage at every depth up to 40 on up to 8 stages, and
    at 61, 95 and 126 layers (DeepSeek-V3's and Llama-3.1-405B's depths)."""
    pytest.importorskip("deepspeed")
    from planner.check._deepspeed import _stage_layers
    from planner.deepspeed_engine import pipeline_split

    cases = [(L, pp) for L in range(2, 41) for pp in range(2, min(L, 8) + 1)] + [(61, 16), (95, 12), (126, 16)]
    for L, pp in cases:
        assert list(pipeline_split(L, pp)) == _stage_layers(L, pp), (L, pp)
    assert pipeline_split(30, 4) == (8, 8, 7, 7) and pipeline_split(61, 16) == (4,) * 13 + (3,) * 3


# BF16_Optimizer's gradient accumulation, bytes per local parameter in each micro-batch, read off
# deepspeed 0.19.8 bf16_optimizer.py and torch's accumulate_grad.h (not imported from the planner):
ZEROING = 2              # backward_prologue -> clear_lp_grads: torch._foreach_zero_ of the BF16 grads
ACCUMULATE_GRAD = 2 + 2 + 2  # autograd: 'variable_grad += new_grad' into the zeroed grad (read, read, write)
TO_FP32 = 2 + 4          # update_hp_grads: lp.grad.to(float32) reads BF16, writes an FP32 copy
HP_ADD = 4 + 4 + 4       # hp_grad.add_(copy): reads both, writes the FP32 accumulator


def _gpt_params(L, h, vocab, positions):
    """A GPT-3 layer with biases: QKV 3h^2+3h, proj h^2+h, FC1 4h^2+4h, FC2 4h^2+h, two LayerNorms 4h;
    plus word and position embeddings and the final LayerNorm (the output layer tied to the embedding)."""
    return L * (12 * h * h + 13 * h), vocab * h + positions * h, 2 * h


def test_bf16_optimizer_accumulates_fp32_gradients_after_every_micro_batch():
    """GPT-3 1.3B (24 layers, h 2048, vocab 50257, 2048 positions), tp 2, one stage, ZeRO-1 with FP32
    accumulation (BF16_Optimizer) on A100-80GB: each of m = 64 / (4 x 4) = 4 micro-batches clears the
    BF16 gradients, autograd adds into them, and update_hp_grads adds an FP32 copy into the FP32
    gradient of the whole local model -- 26 B per parameter on HBM at 2039 GB/s x the catalog's
    STREAM efficiency."""
    m, c = planner.load_model("gpt3-1.3b"), planner.load_cluster("dgx-a100-80g")
    layers, emb, final_norm = _gpt_params(24, 2048, 50257, 2048)
    local = (layers + emb + final_norm) / 2
    per_param = ZEROING + ACCUMULATE_GRAD + TO_FP32 + HP_ADD
    assert per_param == 26
    hbm = 2039e9 * c.calibration.hbm_efficiency
    assert c.gpu.hbm_bandwidth == 2039e9
    tr = TrainingSpec(global_batch_size=64, seq_length=2048, optimizer_impl="deepspeed")
    p = evaluate(m, c, tr, Layout(tp=2, dp=4, zero_stage=1, micro_batch_size=4))
    assert p.time.pipeline.stages[0].grad_accum == pytest.approx(per_param * local / hbm, rel=1e-9)
    assert p.time.breakdown()["grad_accum"] == pytest.approx(4 * per_param * local / hbm, rel=1e-9)
    # the same plan with 16 micro-batches of 1 pays it 16 times: 4x the seconds
    p1 = evaluate(m, c, tr, Layout(tp=2, dp=4, zero_stage=1, micro_batch_size=1))
    assert p1.time.breakdown()["grad_accum"] == pytest.approx(16 * per_param * local / hbm, rel=1e-9)


def test_each_pipeline_stage_accumulates_its_own_parameters():
    """pp 4: the first rank holds 6 layers and the embeddings, the middle ones 6 layers, the last 6
    layers, the final norm and the tied output copy (vocab x h); each accumulates its own."""
    m, c = planner.load_model("gpt3-1.3b"), planner.load_cluster("dgx-a100-80g")
    layers, emb, final_norm = _gpt_params(24, 2048, 50257, 2048)
    hbm = c.gpu.hbm_bandwidth * c.calibration.hbm_efficiency
    tr = TrainingSpec(global_batch_size=64, seq_length=2048, optimizer_impl="deepspeed")
    p = evaluate(m, c, tr, Layout(tp=2, pp=4, dp=1, zero_stage=1, micro_batch_size=4))
    held = [layers / 4 + emb, layers / 4, layers / 4, layers / 4 + final_norm + 50257 * 2048]
    for st, n in zip(p.time.pipeline.stages, held):
        assert st.grad_accum == pytest.approx(26 * (n / 2) / hbm, rel=1e-9)


def test_fp16_zero1_accumulates_an_fp32_copy_after_the_first_micro_batch():
    """FP16 weights with FP32 accumulation at ZeRO-1 (DeepSpeedZeroOptimizer, use_grad_accum_attribute):
    the gradient hook casts each micro-batch's FP16 gradient to FP32 (read 2, write 4) and, after the
    first, adds it into param.grad_accum (read 4 + 4, write 4), then drops param.grad. m = 4: on
    average (6 + 3 x 18) / 4 = 15 B per parameter and micro-batch."""
    m, c = planner.load_model("gpt3-1.3b"), planner.load_cluster("dgx-a100-80g")
    layers, emb, final_norm = _gpt_params(24, 2048, 50257, 2048)
    hbm = c.gpu.hbm_bandwidth * c.calibration.hbm_efficiency
    tr = TrainingSpec(global_batch_size=64, seq_length=2048, optimizer_impl="deepspeed", precision="fp16")
    p = evaluate(m, c, tr, Layout(tp=2, dp=4, zero_stage=1, micro_batch_size=4))
    per = (2 + 4 + 3 * (2 + 4 + 4 + 4 + 4)) / 4
    assert per == 15
    assert p.time.pipeline.stages[0].grad_accum == pytest.approx(per * (layers + emb + final_norm) / 2 / hbm, rel=1e-9)


@pytest.mark.parametrize("training,layout", [
    (_ds(grad_dtype="bf16"), Layout(tp=2, dp=4, zero_stage=1, micro_batch_size=4)),  # ZeRO-1, 16-bit accumulation
    (_ds(precision="fp16", grad_dtype="bf16"), Layout(tp=2, dp=4, zero_stage=0, micro_batch_size=4)),  # FP16_Optimizer
])
def test_16bit_accumulation_adds_into_grad_after_the_first_micro_batch(training, layout):
    """Accumulating in the model dtype, the gradients stay in .grad until the step (stage 1 reduces at
    the boundary; zero_grad sets them to None): the first micro-batch's is stolen by autograd, each
    of the m - 1 later ones added in place (read 2 + 2, write 2): 6 x 3 / 4 = 4.5 B per parameter and
    micro-batch on average at m = 4."""
    m, c = planner.load_model("gpt3-1.3b"), planner.load_cluster("dgx-a100-80g")
    layers, emb, final_norm = _gpt_params(24, 2048, 50257, 2048)
    hbm = c.gpu.hbm_bandwidth * c.calibration.hbm_efficiency
    p = evaluate(m, c, training.model_copy(update={"seq_length": 2048}), layout)
    assert p.time.pipeline.num_microbatches == 4
    per = ACCUMULATE_GRAD * 3 / 4
    assert p.time.pipeline.stages[0].grad_accum == pytest.approx(per * (layers + emb + final_norm) / 2 / hbm, rel=1e-9)


@pytest.mark.parametrize("training,layout", [
    (TrainingSpec(global_batch_size=64, seq_length=2048), Layout(dp=8, zero_stage=1)),  # Megatron: fused into wgrad
    (_ds(), Layout(dp=8, zero_stage=2)),  # DeepSpeedZeroOptimizer: reduces into its partitions
    (_ds(), Layout(dp=8, zero_stage=3)),
    (_ds(grad_dtype="bf16"), Layout(dp=8, zero_stage=1, micro_batch_size=8)),  # one micro-batch: nothing to add
])
def test_no_accumulation_pass_where_the_engine_does_not_copy(training, layout):
    m, c = planner.load_model("gpt3-1.3b"), planner.load_cluster("dgx-a100-80g")
    p = evaluate(m, c, training.model_copy(update={"seq_length": 2048}), layout)
    assert p.time.breakdown()["grad_accum"] == 0.0


def test_bloom_steps_get_faster_with_larger_micro_batches():
    """BLOOM-176B as trained (Scao et al. 2022, §3.4: 384 A100-80GB, tp 4, pp 12, dp 8, global batch
    2048 x 2048 tokens, BF16 with ZeRO-1, activation checkpointing, Megatron-DeepSpeed). At a fixed
    batch, larger micro-batches mean fewer BF16_Optimizer passes over the stage's 3.7B parameters
    (~96 GB of HBM traffic each): the step falls from micro-batch 1 to 4 although the 1F1B bubble
    grows (11/256 -> 11/64 of the step); without the pass it would rise."""
    m = planner.load_model("gpt3-175b").model_copy(update={
        "name": "bloom-176b", "num_layers": 70, "hidden_size": 14336, "num_attention_heads": 112,
        "ffn_hidden_size": 4 * 14336, "vocab_size": 250880})
    c = planner.load_cluster("dgx-a100-80g", nodes=48)
    tr = TrainingSpec(global_batch_size=2048, seq_length=2048, optimizer_impl="deepspeed")
    steps = {}
    for b in (1, 2, 4):
        p = evaluate(m, c, tr, Layout(tp=4, pp=12, dp=8, zero_stage=1, micro_batch_size=b, recompute="full"))
        assert p.fits
        steps[b] = p.step_time_s
    assert steps[1] > steps[2] and steps[4] / steps[1] - 1 < -0.05


def test_a_deepspeed_search_pairs_the_accumulation_with_zero1_only():
    """The CP-SAT rows price BF16_Optimizer's pass for ZeRO-1 and not for ZeRO-2 (one pipeline row
    per group of ZeRO stages): the search's optimum equals the brute force over evaluate()."""
    from planner.oracle import enumerate_plans
    m = planner.load_model("gpt3-1.3b").model_copy(update={"num_layers": 8})
    c = planner.load_cluster("dgx-a100-80g")
    tr = TrainingSpec(global_batch_size=64, seq_length=2048, optimizer_impl="deepspeed")
    cons = {"pp": (1, 2)}
    r = planner.plan(m, c, tr, framework="deepspeed", top_k=1, structural=False, **cons)
    ranked = enumerate_plans(m, c, tr, framework="deepspeed", constraints=cons)
    assert r.status == "optimal"
    assert r.best.time.objective_us == ranked[0].time.objective_us
    zero1 = [p for p in ranked if p.layout.zero_stage == 1]
    zero2 = [p for p in ranked if p.layout.zero_stage == 2]
    assert zero1 and zero2
    assert all(p.time.breakdown()["grad_accum"] > 0 for p in zero1)
    assert all(p.time.breakdown()["grad_accum"] == 0 for p in zero2)


def test_explain_names_the_accumulation_it_prices():
    from planner.explain import explain
    m, c = planner.load_model("gpt3-1.3b"), planner.load_cluster("dgx-a100-80g")
    lines = explain(m, c, TrainingSpec(global_batch_size=64, seq_length=2048), framework="deepspeed",
                    sensitivities=False, zero_stage=1, micro_batch_size=1)
    line = next(x for x in lines if x.startswith("Gradient accumulation"))
    assert "DeepSpeed's optimizer wrapper" in line and "micro-batches" in line
    megatron = explain(m, c, TrainingSpec(global_batch_size=64, seq_length=2048), sensitivities=False)
    assert not any(x.startswith("Gradient accumulation") for x in megatron)


def test_bf16_optimizer_keeps_bf16_gradients_beside_its_fp32_buffer():
    """BF16_Optimizer zeroes its BF16 .grad tensors before each backward instead of freeing them, so
    from the second micro-batch on they are whole at the activation peak, 2 B per parameter beside the
    FP32 gradient buffer (4 B) and the BF16 weights (2 B): GPT-3 1.3B on tp 2 holds
    (24 (12 h^2 + 13 h) + (50257 + 2048) h + 2 h) / 2 parameters. The ZeRO optimizer's .grad is its
    buffer, or is dropped once reduced: no such item."""
    m, c = planner.load_model("gpt3-1.3b"), planner.load_cluster("dgx-a100-80g")
    layers, emb, final_norm = _gpt_params(24, 2048, 50257, 2048)
    local = (layers + emb + final_norm) / 2
    tr = TrainingSpec(global_batch_size=64, seq_length=2048, optimizer_impl="deepspeed")
    st = evaluate(m, c, tr, Layout(tp=2, dp=4, zero_stage=1, micro_batch_size=4)).memory.stages[0]
    assert st.get("bf16_grads") == pytest.approx(2 * local, rel=1e-12)
    assert st.get("gradients") == pytest.approx(4 * local, rel=1e-12)
    for t, z in ((tr.model_copy(update={"grad_dtype": "bf16"}), 1), (tr, 2)):
        assert evaluate(m, c, t, Layout(tp=2, dp=4, zero_stage=z, micro_batch_size=4)).memory.stages[0].get("bf16_grads") == 0


@pytest.mark.parametrize("pp", [1, 2])
def test_megatron_deepspeed_loss_by_hand(pp):
    """Megatron-DeepSpeed's loss (deepspeed_engine [Loss]) peaks at 10 B per local logit with and without
    DeepSpeed's pipeline engine: BF16 logits + FP32 copy + the shifted copy its in-place exp overwrites
    (2 + 4 + 4), or the FP32 output the pipeline keeps + the FP32 gradient + its BF16 cast (4 + 4 + 2).
    Llama-3-8B, 4096 tokens, TP 2 with sequence parallelism: the final norm's and output layer's inputs
    4 x 4096 x 4096 / 2 = 33,554,432 B, the loss 10 x 4096 x 64,128 = 2,626,682,880 B on the last stage."""
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100", nodes=2)
    p = evaluate(m, c, _ds(), Layout(tp=2, pp=pp, dp=8 // pp, zero_stage=1, sequence_parallel=True))
    assert p.memory.stages[-1].get("logits") == 33_554_432 + 2_626_682_880


@pytest.mark.parametrize("tp", [1, 2])
def test_pipeline_keeps_the_in_flight_stage_outputs(tp):
    """DeepSpeed's pipeline engine keeps every stage's output but the last's until its backward, one per
    micro-batch in flight (TrainSchedule.num_pipe_buffers: min(stages - stage, micro-batches)); under TP it
    keeps this rank's 1/tp partition of it (pipe_partitioned, DeepSpeed's default) and frees the rest
    (deepspeed_engine [PipeOut]). Llama-3-8B, 4,096 tokens, pp 4 on 16 GPUs, GBS 64: a stage's output is
    4,096 x 4,096 x 2 B = 33,554,432 B (over TP's sequence shards with SP, then partitioned again): stage r holds
    4 - r of them (16 micro-batches a rank is more than that), the last stage none."""
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100", nodes=2)
    lay = Layout(tp=tp, pp=4, dp=4 // tp, zero_stage=1, sequence_parallel=tp > 1)
    stages = evaluate(m, c, _ds(), lay).memory.stages
    edge = 4096 * 4096 * 2 / tp / tp
    assert [s.get("pipeline_buffers") for s in stages] == pytest.approx([4 * edge, 3 * edge, 2 * edge, 0], rel=1e-12)
    # Megatron's engine frees each sent output's storage (deallocate_pipeline_outputs): none there
    mp = evaluate(m, c, TrainingSpec(global_batch_size=64, seq_length=4096), lay)
    assert all(s.get("pipeline_buffers") == 0 for s in mp.memory.stages)
