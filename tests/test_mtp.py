"""Multi-token prediction (ModelSpec.mtp_layers): parameters, the last rank's ledger and time, the
Megatron flags, each against numbers worked out by hand from the architecture."""

import pytest

import planner
from planner.errors import PlannerError
from planner.memory import memory_ledger, param_shards, stage_params
from planner.specs import Layout, ModelSpec, SpecError, TrainingSpec

H, V = 4096, 128_256  # Llama-3-8B
LAYER = 4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336 + 2 * 4096  # 218,112,000


def llama_mtp(n: int = 1):
    return planner.load_model("llama3-8b").model_copy(update={"mtp_layers": n})


def test_deepseek_v3_mtp_depth_by_hand():
    """DeepSeek-V3's one depth: an MoE layer (MLA 187,107,328 + two norms 14,336 + router 7168 x 256 +
    one shared and 256 routed experts of 3 x 7168 x 2048 = 11,507,286,016), eh_proj 2 x 7168^2 and three
    norms: 11,610,067,968. With the embedding and output head copies DeepSeek's checkpoint stores beside
    it (2 x 129,280 x 7168) that is 13.5B, the report's '14B MTP module' to its rounding; the 671B stays
    the main model's."""
    m = planner.load_model("deepseek-v3")
    moe_layer = 187_107_328 + 2 * 7168 + 7168 * 256 + 257 * 3 * 7168 * 2048
    assert moe_layer == 11_507_286_016 and m.mtp_layer_is_moe
    assert m.mtp_params == moe_layer + 2 * 7168 * 7168 + 3 * 7168 == 11_610_067_968
    assert 13.4e9 < m.mtp_params + 2 * 129_280 * 7168 < 14.5e9
    assert m.num_params == pytest.approx(671e9, rel=0.005)


def test_the_last_rank_holds_the_depths_and_an_embedding_copy():
    """pp 2, tp 2: the last rank adds the depth (a dense layer 218,112,000 + eh_proj 2 h^2 + 3 h) and,
    because its depth embeds the next tokens, a copy of the V x h embedding, all split by tp; the first
    rank is unchanged. Without a pipeline the one rank has the embedding already."""
    m, lay = llama_mtp(), Layout(tp=2, pp=2, dp=2, sequence_parallel=True)
    base = planner.load_model("llama3-8b")
    assert stage_params(m, lay, 0, 16) == stage_params(base, lay, 0, 16)
    depth = LAYER + 2 * H * H + 3 * H
    assert stage_params(m, lay, 1, 16) - stage_params(base, lay, 1, 16) == (depth + V * H) / 2
    one = Layout(tp=2, dp=4, sequence_parallel=True)
    assert stage_params(m, one, 0, 32) - stage_params(base, one, 0, 32) == depth / 2


def test_an_moe_depth_puts_its_experts_with_the_ranks_experts():
    """DeepSeek-V3 at pp 16, ep 64: the last rank's expert shard holds its one MoE layer's and the
    depth's local experts, 2 x 256 / 64 x 3 x 7168 x 2048; the non-expert part takes the depth's
    attention, norms, router, shared expert and eh_proj (MLA's down-projections whole on each TP rank)."""
    m, base = planner.load_model("deepseek-v3"), planner.load_model("deepseek-v3").model_copy(update={"mtp_layers": 0})
    lay = Layout(tp=2, pp=16, dp=32, ep=64, etp=1, sequence_parallel=True)
    dense, experts = param_shards(m, lay, 15, 1)
    assert experts.params == 2 * 4 * 3 * 7168 * 2048 and experts.dp == lay.edp
    rest = 232_996_864 + 2 * 7168 * 7168 + 3 * 7168  # the depth less its routed experts
    dup = 15_140_864  # MLA's Q and KV down-projections and their norms
    assert dense.params - param_shards(base, lay, 15, 1)[0].params == (rest - dup) / 2 + dup + 129_280 * 7168 / 2


def test_the_last_rank_keeps_the_depths_activations_logits_and_loss():
    """Llama-3-8B, pp 2, micro-batch 1 of 4096: per depth the next tokens' embedding (2 B) and the 2h-wide
    eh_proj input (4 B) per token and width, one layer's activations, and a second set of output-layer
    inputs and loss (4 s h + 6 s V, megatron-core's fused loss), once, for the micro-batch whose
    backward comes next. Under full recompute the depth keeps its two inputs, 4 s h."""
    from planner.memory import activation_bytes_per_layer
    c, s = planner.load_cluster("dgx-h100"), 4096
    tr = TrainingSpec(global_batch_size=8, seq_length=s)
    ledger = memory_ledger(llama_mtp(2), c, tr, Layout(pp=2, dp=4))
    layer = activation_bytes_per_layer(llama_mtp(2), 1, s)
    assert ledger.stages[1].get("mtp") == 2 * (6 * s * H + layer + 4 * s * H + 6 * s * V)
    assert ledger.stages[0].get("mtp") == 0
    full = memory_ledger(llama_mtp(2), c, tr, Layout(pp=2, dp=4, recompute="full")).stages[1]
    assert full.get("mtp") == 2 * (4 * s * H + 4 * s * H + 6 * s * V)


def test_the_last_rank_runs_a_layer_its_projection_and_the_logits_again():
    """Flat GEMM efficiency 0.5 (as test_cost's logits test): the last rank's compute exceeds the
    first's by the output layer and loss twice, 3 x 2 T h V / (0.5 x 989 TFLOP/s) and 32 B a logit
    at 0.89 x 3.35 TB/s each, by eh_proj's forward and two backward GEMMs, 3 x 2 T 2h h, and by one
    more layer's compute (the first rank's per layer: 16 each)."""
    from planner.cost import pipeline_time
    c = planner.load_cluster("dgx-h100", nodes=1)
    c = c.model_copy(update={"calibration": c.calibration.model_copy(update={"gemm_efficiency": [(1.0, 0.5), (1e6, 0.5)]})})
    tr = TrainingSpec(global_batch_size=8, seq_length=4096)
    pt = pipeline_time(llama_mtp(), c, tr, Layout(pp=2, dp=4))
    T = 4096
    logits = 3 * 2 * T * H * V / (0.5 * 989e12) + 32 * T * V / (0.89 * 3.35e12)
    proj = 3 * 2 * T * 2 * H * H / (0.5 * 989e12)
    layer = pt.stages[0].compute / 16
    assert pt.stages[1].compute - pt.stages[0].compute == pytest.approx(2 * logits + proj + layer, rel=1e-9)


def test_full_recompute_reruns_the_depth_whatever_recompute_num_layers_says():
    """MultiTokenPredictionLayer.forward checkpoints the depth whenever the granularity is full: with 2 of
    16 layers recomputed the last rank re-runs 3 layers' forward, the first rank 2."""
    from planner.cost import pipeline_time
    c, tr = planner.load_cluster("dgx-h100"), TrainingSpec(global_batch_size=8, seq_length=4096)
    pt = pipeline_time(llama_mtp(), c, tr, Layout(pp=2, dp=4, recompute="full", recompute_num_layers=2))
    assert pt.stages[1].recompute == pytest.approx(1.5 * pt.stages[0].recompute, rel=1e-9)


def test_megatron_flags_and_layout_carry_the_depths():
    """--mtp-num-layers, and 'm' before the loss in the last virtual stage of an explicit layout."""
    from planner.emit.megatron import pipeline_layout_string
    assert pipeline_layout_string((4,) * 15 + (1,), 1) == "Etttt|" + "tttt|" * 14 + "tmL"
    c, tr = planner.load_cluster("dgx-h100", nodes=1), TrainingSpec(global_batch_size=8, seq_length=4096)
    p = planner.evaluate(llama_mtp(), c, tr, Layout(pp=2, dp=4, zero_stage=1, pipeline_layers=(17, 15)))
    args = p.to_megatron().args
    assert args[args.index("--mtp-num-layers") + 1] == "1"
    assert args[args.index("--pipeline-model-parallel-layout") + 1] == "E" + "t" * 17 + "|" + "t" * 15 + "mL"
    assert "--mtp-num-layers" not in planner.evaluate(planner.load_model("llama3-8b"), c, tr,
                                                      Layout(dp=8, zero_stage=1)).to_megatron().args


def test_other_targets_and_rules_refuse_mtp_in_one_line():
    c, tr = planner.load_cluster("dgx-h100", nodes=1), TrainingSpec(global_batch_size=8, seq_length=4096)
    p = planner.evaluate(llama_mtp(), c, tr, Layout(dp=8, zero_stage=1))
    with pytest.raises(PlannerError, match="multi-token prediction \\(mtp_layers\\)"):
        p.to_torchtitan()
    with pytest.raises(SpecError, match="field 'mtp_layers': supported for the 'llama' family"):
        ModelSpec(**{**planner.load_model("gpt3-175b").model_dump(exclude={"sources", "provenance"}), "mtp_layers": 1})
    ds = planner.load_model("deepseek-v3").model_copy(update={"mtp_layers": 2})
    with pytest.raises(PlannerError, match="ep_overlap runs at most one MTP depth"):
        planner.evaluate(ds, planner.load_cluster("dgx-h100", nodes=32), TrainingSpec(global_batch_size=1024, seq_length=4096),
                         Layout(pp=8, vpp=2, dp=32, ep=32, etp=1, zero_stage=1, ep_overlap=True))


def test_the_shared_embeddings_gradient_is_all_reduced_between_first_and_last_rank():
    """Where the first and last rank both hold the word embedding (GPT-3's tied one, or an MTP model's
    copy) Megatron all-reduces its gradient over those two ranks after the data-parallel sync: V h / tp
    FP32 elements (GPT-3 175B at tp 8: 50,257 x 12,288 / 8 x 4 B = 308.8 MB), here over the two ranks
    pp 8 puts 7 x 64 ranks apart, on different nodes; none on the middle ranks, without a pipeline, or
    for an untied model without MTP; BF16 gradients halve it."""
    from planner.comm import collective_time
    from planner.cost import embedding_sync_time
    from planner.topology import placement
    m, c = planner.load_model("gpt3-175b"), planner.load_cluster("dgx-a100-80g", nodes=128)
    tr, lay = TrainingSpec(global_batch_size=1536, seq_length=2048), Layout(tp=8, pp=8, dp=16)
    pair = placement(c, (2, 7 * 8 * 16))  # rank 0 and the last pipeline rank of its group
    assert pair.tier == "scaleout" and pair.size == 2
    want = collective_time(c, pair, "allreduce", 50_257 * 12_288 / 8 * 4)
    assert 50_257 * 12_288 / 8 * 4 == 308_779_008
    assert embedding_sync_time(m, c, tr, lay, 0) == embedding_sync_time(m, c, tr, lay, 7) == want > 0
    assert embedding_sync_time(m, c, tr, lay, 3) == 0
    assert embedding_sync_time(m, c, tr, Layout(tp=8, dp=128), 0) == 0
    half = collective_time(c, pair, "allreduce", 50_257 * 12_288 / 8 * 2)
    assert embedding_sync_time(m, c, tr.model_copy(update={"grad_dtype": "bf16"}), lay, 0) == half
    llama, h100 = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100", nodes=1)
    tr8, two = TrainingSpec(global_batch_size=8, seq_length=4096), Layout(pp=2, dp=4)
    assert embedding_sync_time(llama, h100, tr8, two, 1) == 0
    assert embedding_sync_time(llama_mtp(), h100, tr8, two, 1) > 0


def test_explain_says_where_the_depths_sit_and_what_they_cost():
    from planner.cost import mtp_time
    from planner.explain import explain
    c, tr = planner.load_cluster("dgx-h100", nodes=1), TrainingSpec(global_batch_size=16, seq_length=4096)
    lines = explain(llama_mtp(), c, tr, pp=2, sensitivities=False)
    assert "its 1 multi-token prediction depth(s), 0.3B more, sit on the last pipeline rank" in lines[0]
    best = planner.plan(llama_mtp(), c, tr, top_k=1, structural=False, pp=2).best
    said = next(line for line in lines if "It also trains the 1 multi-token prediction depth(s)" in line)
    assert f"{mtp_time(best.model, best.cluster, best.training, best.layout) * 1e3:.1f} ms a micro-batch" in said
