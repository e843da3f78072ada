"""Hybrid Mamba-2 / attention / MoE models (Nemotron-3 Nano): parameter counts against the model card, each
layer kind's weights, saved activations and scan traffic by hand, ranks priced from the layers they hold,
the rules (what Megatron runs and what is priced), the search, and the launch config Megatron accepts and
splits as the planner does."""

from __future__ import annotations

import pytest

import planner
from planner.errors import PlannerError
from planner.specs import Layout, ModelSpec, TrainingSpec

NANO = "nemotron-3-nano-30b-a3b"


def nano() -> ModelSpec:
    return planner.load_model(NANO)


def test_nano_counts_match_the_model_card():
    """NVIDIA's model card: 31.6B parameters, about 3.2B active per token (3.6B with the embeddings)."""
    m = nano()
    assert m.num_params == pytest.approx(31.6e9, rel=0.005)
    assert abs(m.active_params - 3.6e9) <= 0.05e9
    assert abs(m.active_params_without_embedding - 3.2e9) <= 0.05e9
    assert (m.layer_pattern.count("M"), m.moe_layers, m.layer_pattern.count("*")) == (23, 23, 6)


def test_each_layer_kind_by_hand():
    """h 2688; Mamba-2: 64 heads of 64, state 128, 8 groups: in_proj 2688 x (2 x 4096 + 2 x 8 x 128 + 64) =
    2688 x 10304, out_proj 4096 x 2688, the convolution over 4096 + 2048 channels, 4 taps and a bias, dt_bias,
    A_log and D (64 each), the gated norm (4096) and the layer's norm (2688). MoE: its norm, the 2688 x 128
    router, a shared squared-ReLU MLP of 3712 and 128 experts of 1856 (two projections each, no gate).
    Attention: 32 query heads and 2 KV heads of 128."""
    m = nano()
    mamba = 2688 * 10304 + 4096 * 2688 + 6144 * 4 + 6144 + 3 * 64 + 4096 + 2688
    assert m.symbol_params("M") == (mamba, mamba) == (38_744_896, 38_744_896)
    base = 2688 + 2688 * 128 + 2 * 2688 * 3712
    assert m.symbol_params("E") == (base + 128 * 2 * 2688 * 1856, base + 6 * 2 * 2688 * 1856)
    attention = 2688 + 2688 * 4096 + 2 * 2688 * 256 + 4096 * 2688
    assert m.symbol_params("*") == (attention, attention)
    assert m.mlp_params(1856) == 2 * 2688 * 1856  # squared ReLU: FC1 f wide, no gate


def test_mamba_saved_activations_by_hand():
    """Per token, BF16, tp 1: in_proj's input 2h, its norm's rstd 4 B and its norm output 2h; the
    (z, x, B, C, dt) copy 2 x 10304 and out_x 2 x 4096 the scan keeps; the group norm's input 2 x 4096 and
    8 fp32 rstd; out_proj's input 2 x 4096 = 55,972 B. Under TE FP8 the two GEMM inputs are 1 B a value;
    with tp 2 and sequence parallelism the h-wide tensors are a sequence shard, the rest split over tp."""
    from planner.memory import activation_bytes_per_layer

    m = nano()
    one = activation_bytes_per_layer(m, 1, 1, symbol="M")
    assert one == 5376 + 4 + 5376 + 20608 + 8192 + 8192 + 32 + 8192 == 55_972
    fp8 = activation_bytes_per_layer(m, 1, 1, symbol="M", fp8_inputs=True)
    assert fp8 == 5376 + 4 + 2688 + 20608 + 8192 + 8192 + 32 + 4096
    sp = activation_bytes_per_layer(m, 1, 1, symbol="M", tp=2, sequence_parallel=True)
    assert sp == pytest.approx((5376 + 4 + 5376) / 2 + (20608 + 8192 + 8192 + 32 + 8192) / 2)
    assert activation_bytes_per_layer(m, 4, 8192, symbol="M") == 55_972 * 4 * 8192
    assert activation_bytes_per_layer(m, 1, 1, symbol="M", recompute="full") == 2 * 2688  # its input only


def test_hybrid_halves_keep_their_own_terms():
    """An attention layer keeps the attention half of a transformer layer's terms, an MoE layer the MoE
    half: together they are one transformer MoE layer of the same shapes (norms included, one each)."""
    from planner.memory import activation_bytes_per_layer

    m = nano()
    transformer = m.model_copy(update={"layer_pattern": None, "mamba": None, "num_layers": 52})
    for kw in ({}, {"fp8_inputs": True}, {"tp": 2, "sequence_parallel": True, "etp": 1}):
        whole = activation_bytes_per_layer(transformer, 2, 4096, **kw)
        halves = sum(activation_bytes_per_layer(m, 2, 4096, symbol=c, **kw) for c in "*E")
        assert halves == pytest.approx(whole)


def test_scan_traffic_and_flops_by_hand():
    """Kernel by kernel (MambaSplitConv1dScanCombinedFn.forward): convolution 4 x 6144; chunk state reads
    x and B (2 x 4096 + 2 x 1024), writes FP32 states (4 x 4096: H P N / Q = 64 x 64 x 128 / 128); state
    passing reads those and writes BF16 (4 + 2) x 4096; C B^T reads 4 x 1024 and writes 4 x 8 x 128; the
    chunk scan reads C B^T 4096, x 8192, C 2048, states 8192, z 8192 and writes 16384; the group norm moves
    16384: 147,456 B per token. FLOPs: (2 x 128 x 64 + 4 x 128 x 64) x 64 + 2 x 128 x 128 x 8 per token."""
    from planner.cost import mamba_gemm_flops, mamba_scan_bytes, mamba_scan_flops

    m = nano()
    per_token = (4 * 6144 + (8192 + 2048 + 16384) + (16384 + 8192) + (4096 + 4096)
                 + (4096 + 8192 + 2048 + 8192 + 8192 + 16384) + 16384)
    assert mamba_scan_bytes(m, 1, 1) == per_token == 147_456
    assert mamba_scan_bytes(m, 1000, 2) == 1000 * per_token / 2
    assert mamba_scan_flops(m, 1, 1) == (2 * 128 * 64 + 4 * 128 * 64) * 64 + 2 * 128 * 128 * 8
    # the GEMMs are Megatron-Bridge's count of in_proj and out_proj (flop_utils.mamba_layer_flops)
    assert mamba_gemm_flops(m, 1, 1) == [2 * 2688 * (2 * 4096 + 2 * 8 * 128 + 64), 2 * 4096 * 2688]


def test_model_flops_count_each_layer_once():
    """Per token: 23 Mamba-2 layers (GEMMs and scan), 23 MoE blocks (router, 6 routed and the shared
    squared-ReLU experts: 2 GEMMs each), 6 attention blocks (QKV, out-proj, causal-free 4 s a d core) and
    the logits, all x 3 (forward and backward)."""
    from planner.cost import model_flops_per_token

    m, s = nano(), 8192
    mamba = 2 * 2688 * 10304 + 2 * 4096 * 2688 + (2 * 128 * 64 + 4 * 128 * 64) * 64 + 2 * 128 * 128 * 8
    moe = 2 * 2688 * (128 + 6 * 2 * 1856 + 2 * 3712)
    attention = 2 * 2688 * (4096 + 2 * 256) + 2 * 4096 * 2688 + 2 * s * 32 * (128 + 128)
    expected = 3 * (23 * mamba + 23 * moe + 6 * attention + 2 * 2688 * 131072)
    assert model_flops_per_token(m, s) == pytest.approx(expected)


def _twin(m: ModelSpec, symbol: str, n: int) -> ModelSpec:
    """A model of n layers of one kind, the same shapes."""
    return m.model_copy(update={"layer_pattern": symbol * n, "num_layers": n,
                                "mamba": m.mamba if symbol == "M" else None,
                                "moe": m.moe if symbol == "E" else None})


def test_a_rank_is_priced_from_the_layers_it_holds():
    """Rank 0 of pp 2 holds the first 26 symbols of the pattern: its compute is that many layers of each
    kind, each priced as in a model of that kind alone; its weights are those layers' and the embedding;
    its activations those layers' for the micro-batches in flight (2 at pp 2)."""
    from planner.cost import stage_time
    from planner.memory import activation_bytes_per_layer, param_shards, symbols_on

    m = nano()
    c, t = planner.load_cluster("dgx-h100", nodes=2), TrainingSpec(global_batch_size=256, seq_length=8192)
    lay = Layout(tp=1, pp=2, dp=8, ep=8, micro_batch_size=1, zero_stage=1)
    first = m.layer_pattern[:26]
    counts = {c: first.count(c) for c in "ME*"}
    assert symbols_on(m, lay, 0) == counts and sum(counts.values()) == 26
    one = {s: stage_time(_twin(m, s, 2), c, t, lay, 0, 1) for s in "ME*"}
    st = stage_time(m, c, t, lay, 0, 26)
    assert st.compute == pytest.approx(sum(counts[s] * one[s].compute for s in "ME*"))
    assert st.ep_comm == pytest.approx(counts["E"] * one["E"].ep_comm)
    dense, experts = param_shards(m, lay, 0, 26)
    routed = 128 * 2 * 2688 * 1856
    assert dense.params == (sum(counts[s] * m.symbol_params(s)[0] for s in "ME*") - counts["E"] * routed
                            + 131072 * 2688)
    assert experts.params == counts["E"] * routed / 8
    ledger = planner.evaluate(m, c, t, lay).memory.stages[0]
    act = next(it.bytes for it in ledger.items if it.name == "activations")
    assert act == pytest.approx(2 * sum(counts[s] * activation_bytes_per_layer(m, 1, 8192, symbol=s, etp=1)
                                        for s in "ME*"))


@pytest.mark.parametrize("change, rule", [
    (dict(cp=2, dp=8), "Mamba-2"),
    (dict(tp=16, dp=1, ep=8, etp=1, sequence_parallel=True), "num_groups(8) must both divide by tp(16)"),
    (dict(zero_stage=3), "zero_stage 3 with a hybrid"),
])
def test_hybrid_rules_name_what_is_not_run_or_priced(change, rule):
    m = nano()
    c, t = planner.load_cluster("dgx-h100", nodes=2), TrainingSpec(global_batch_size=256, seq_length=8192)
    lay = Layout(**{**dict(tp=1, pp=1, dp=16, ep=8, micro_batch_size=1, zero_stage=1), **change})
    with pytest.raises(PlannerError) as err:
        planner.evaluate(m, c, t, lay)
    assert rule in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("update, field", [
    (dict(layer_pattern="MEX*"), "layer_pattern"),
    (dict(layer_pattern="ME*"), "layer_pattern"),  # 3 symbols for 52 layers
    (dict(mamba=None), "mamba"),
    (dict(mtp_shared=True), "mtp_shared"),  # without MTP depths
    (dict(sliding_window=128), "sliding_window"),
])
def test_a_bad_hybrid_spec_is_one_line_naming_the_field(update, field):
    data = {**nano().model_dump(exclude={"sources", "provenance"}), **update}
    with pytest.raises(PlannerError) as err:
        ModelSpec.load(data)
    assert field in str(err.value) and "\n" not in str(err.value)


def test_hybrid_runs_on_megatron_only():
    from planner.space import layout_problems

    m = nano()
    c, t = planner.load_cluster("dgx-h100", nodes=2), TrainingSpec(global_batch_size=256, seq_length=8192)
    for impl in ("fsdp2", "deepspeed"):
        problems = layout_problems(m, c, t.model_copy(update={"optimizer_impl": impl}),
                                   Layout(tp=1, pp=1, dp=16, ep=8, micro_batch_size=1, zero_stage=1))
        assert any("hybrid Mamba-2 models run on Megatron's hybrid stack only" in p for p in problems)
    assert "Mamba-2 hybrid layers (layer_pattern)" in m.megatron_only


def test_the_search_plans_a_hybrid_on_the_fixed_split_and_megatrons_rules():
    from planner.space import build_space

    m = nano()
    c, t = planner.load_cluster("dgx-h100", nodes=2), TrainingSpec(global_batch_size=256, seq_length=8192)
    space = build_space(m, c, t)
    assert not space.free_split and all(s.cp == 1 for s in space.shapes)
    assert all(3 not in z for z in space.zeros.values())
    r = planner.plan(m, c, t)
    assert r.status == "optimal" and r.best.layout.cp == 1
    again = planner.evaluate(m, c, t, r.best.layout)
    assert again.step_time_s == pytest.approx(r.best.step_time_s)


@pytest.mark.parametrize("layout", [
    dict(tp=1, pp=1, dp=8, ep=8),
    dict(tp=2, pp=2, dp=2, ep=4, etp=1, sequence_parallel=True),
    dict(tp=1, pp=2, dp=4, ep=4, vpp=2),
    dict(tp=1, pp=2, dp=4, ep=4, pipeline_layers=(30, 22)),
])
def test_megatron_builds_the_hybrid_layers_where_the_plan_prices_them(megatron_path, layout):
    """pretrain_hybrid.py's arguments pass Megatron's validate_args and its own stage selection
    (select_pipeline_segment on the pattern's pipes) puts on each rank the layer kinds the planner priced
    there; the Mamba-2 shape, squared ReLU and the absent position embedding reach TransformerConfig."""
    pytest.importorskip("torch")
    from planner.check import check_megatron, megatron_payload
    from planner.emit.megatron import training_script
    from planner.memory import symbols_on

    m = nano()
    c, t = planner.load_cluster("dgx-h100"), TrainingSpec(global_batch_size=64, seq_length=8192, fp8="tensorwise")
    p = planner.evaluate(m, c, t, Layout(micro_batch_size=1, zero_stage=1, **layout))
    files = p.to_megatron()
    assert training_script(m) == "pretrain_hybrid.py" and "pretrain_hybrid.py" in files.files["train.sh"]
    r, = check_megatron([megatron_payload(files.args, p.num_gpus, files.env, p.cluster.gpu.arch)])
    assert r.ok, r.line()
    held = ["".join(row) for row in r.details["hybrid_layers"]]
    assert [{s: h.count(s) for s in set(h)} for h in held] == [symbols_on(m, p.layout, i) for i in range(p.layout.pp)]
    assert r.details["mamba"] == [64, 64, 128, 8]
    assert (r.details["activation"], r.details["gated_linear_unit"]) == ("squared_relu", False)
    assert r.details["position_embedding_type"] == "none" and r.details["num_experts"] == 128


def test_the_published_gb300_layout_is_priced_and_fits():
    """Megatron-Bridge's Nemotron-3 Nano MXFP8 recipe on 8 GB300s (tp 1, ep 8, micro-batch 4, no recompute)
    is a layout evaluate prices, and it fits the 288 GB GPUs it ran on."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from runs import load_moe_runs

    runs, _ = load_moe_runs()
    nano_rows = [r for r in runs if "nemotron_3_nano" in r.id and "gb300" in r.id]
    assert len(nano_rows) == 6
    for r in nano_rows:
        p = planner.evaluate(r.model, r.cluster, r.training, r.layout)
        assert not p.warnings and p.peak_memory_bytes < r.cluster.gpu.memory


NANO_HF = {  # the config.json fields Megatron-Bridge's NemotronHBridge reads, with Nemotron-3 Nano's values
    "architectures": ["NemotronHForCausalLM"], "num_hidden_layers": 52, "hidden_size": 2688,
    "hybrid_override_pattern": "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
    "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128, "intermediate_size": 1856,
    "vocab_size": 131072, "tie_word_embeddings": False, "mamba_num_heads": 64, "mamba_head_dim": 64,
    "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4, "chunk_size": 128, "mlp_hidden_act": "relu2",
    "use_bias": False, "n_routed_experts": 128, "num_experts_per_tok": 6, "moe_intermediate_size": 1856,
    "moe_shared_expert_intermediate_size": 3712, "n_group": 1, "topk_group": 1, "num_nextn_predict_layers": 0,
}


def test_hf_import_of_nemotron_h_builds_the_catalog_model():
    from planner.catalog import model_from_hf_config

    got = model_from_hf_config(NANO_HF, "nano")
    want = nano()
    skip = {"name", "sources", "provenance"}
    assert got.model_dump(exclude=skip) == want.model_dump(exclude=skip)


@pytest.mark.parametrize("key, value, named", [("mlp_hidden_act", "silu", "mlp_hidden_act"), ("conv_kernel", 3, "conv_kernel"),
                                               ("use_bias", True, "use_bias"),
                                               ("num_nextn_predict_layers", 1, "mtp_hybrid_override_pattern"),
                                               ("hybrid_override_pattern", "MEG*", "layer_pattern")])
def test_hf_import_of_nemotron_h_refuses_what_it_does_not_price(key, value, named):
    from planner.catalog import model_from_hf_config

    with pytest.raises(PlannerError) as err:
        model_from_hf_config({**NANO_HF, key: value}, "nano")
    assert "\n" not in str(err.value) and named in str(err.value)


def test_the_moe_module_checkpoint_keeps_only_the_blocks_input():
    """Megatron's --recompute-modules moe wraps the MoE block in one checkpoint (MoELayer.forward,
    moe_layer_recompute), layernorm discards the pre-MLP norm's output: a Nano MoE layer then keeps the
    norm's input and its fp32 rstd, (2 x 2688 + 4) B per token. moe alone frees the router's 8 B x 128,
    6 routed rows of (2 x 2688 + 2 x 1856 + 2 x 1856) B and the shared expert's 2 x 3712 + 2 x 3712 B."""
    from planner.memory import activation_bytes_per_layer

    m, s = nano(), 8192
    kw = dict(recompute="selective", symbol="E", etp=1)
    assert activation_bytes_per_layer(m, 1, s, recompute_modules=("moe", "layernorm"), **kw) == (2 * 2688 + 4) * s
    kept = activation_bytes_per_layer(m, 1, s, symbol="E", etp=1)
    freed = (8 * 128 + 6 * (2 * 2688 + 2 * 1856 + 2 * 1856) + 2 * 3712 + 2 * 3712) * s
    assert kept - activation_bytes_per_layer(m, 1, s, recompute_modules=("moe",), **kw) == freed
    # moe_act inside the checkpointed block frees nothing more
    both = activation_bytes_per_layer(m, 1, s, recompute_modules=("moe", "moe_act"), **kw)
    assert both == activation_bytes_per_layer(m, 1, s, recompute_modules=("moe",), **kw)


def test_the_moe_module_reruns_the_block_and_its_all_to_alls():
    """Its recompute re-runs the whole block forward: at least its routed GEMMs at the GPU's dense peak, its
    dispatch and combine, and the host's stall at the re-run forward's sync (calibration.moe_host_stall); Megatron
    refuses it beside the EP overlap, and the H100 recipe's modules are priced."""
    from planner.cost import _layer_time, moe_time
    from planner.space import layout_problems

    m = nano()
    c, t = planner.load_cluster("dgx-h100", nodes=2), TrainingSpec(global_batch_size=256, seq_length=8192)
    lay = Layout(tp=1, pp=1, dp=16, ep=8, etp=1, micro_batch_size=1, zero_stage=1, recompute="selective",
                 recompute_modules=("moe", "layernorm", "core_attn", "moe_act"))
    lt = _layer_time(m, c, t, lay, symbol="E")
    block = moe_time(m, c, t, 1, 1, 1, 8, 1)
    routed_flops = 2 * 8192 * 6 * (2 * 2688 * 1856)  # FC1 and FC2 of 6 experts a token
    assert c.calibration.moe_host_stall == pytest.approx(1.5e-3)
    assert lt.recompute_of(("moe",)) == pytest.approx(block.gemm + block.memory + block.ep + 1.5e-3)
    assert lt.recompute_of(("moe",)) > routed_flops / c.gpu.peak_bf16_flops + block.ep
    assert planner.evaluate(m, c, t, lay).step_time_s > 0
    overlapped = lay.model_copy(update={"ep_overlap": True})
    assert any("ep_overlap does not run with recompute_modules 'moe'" in p for p in layout_problems(m, c, t, overlapped))


def test_an_attention_and_an_moe_layer_cost_one_transformer_moe_layer():
    """The halves together run what a transformer MoE layer of the same shapes runs: its GEMMs, attention,
    norms and residual adds (half a layer's elementwise passes each), FP8 casts, EP and TP collectives
    (tp 2 with sequence parallelism: attention's gather / reduce-scatter pair, the shared experts')."""
    from planner.cost import _layer_time

    m = nano()
    transformer = m.model_copy(update={"layer_pattern": None, "mamba": None, "num_layers": 52})
    c = planner.load_cluster("dgx-h100")
    lay = Layout(tp=2, dp=4, ep=4, etp=1, micro_batch_size=1, sequence_parallel=True, zero_stage=1)
    for t in (TrainingSpec(global_batch_size=64, seq_length=8192),
              TrainingSpec(global_batch_size=64, seq_length=8192, fp8="tensorwise")):
        whole = _layer_time(transformer, c, t, lay)
        a, e = _layer_time(m, c, t, lay, symbol="*"), _layer_time(m, c, t, lay, symbol="E")
        for field in ("fwd", "bwd", "tp_fwd", "tp_bwd", "ep_fwd", "attn_fwd"):
            assert getattr(a, field) + getattr(e, field) == pytest.approx(getattr(whole, field)), field


def test_a_mamba_layer_gathers_and_scatters_like_attention_and_reruns_its_scan_in_backward():
    """With tp 2 and sequence parallelism in_proj all-gathers b s h and out_proj reduce-scatters it, the pair
    an attention block runs. Its backward is twice its forward plus one more pass of the convolution, scan and
    norm (mamba_ssm's backward re-runs the forward's chunk-state and state-passing kernels and the convolution
    before its gradient kernels): 147,456 B per token, split over tp, at the H100's HBM bandwidth x efficiency."""
    from planner.cost import _layer_time

    m, c = nano(), planner.load_cluster("dgx-h100")
    t = TrainingSpec(global_batch_size=64, seq_length=8192)
    lay = Layout(tp=2, dp=4, ep=4, etp=1, micro_batch_size=1, sequence_parallel=True, zero_stage=1)
    mamba, attention = _layer_time(m, c, t, lay, symbol="M"), _layer_time(m, c, t, lay, symbol="*")
    assert mamba.tp_fwd == pytest.approx(attention.tp_fwd) and mamba.tp_fwd > 0
    scan = 147_456 * 8192 / 2 / (c.gpu.hbm_bandwidth * c.calibration.hbm_efficiency)
    assert mamba.bwd - 2 * mamba.fwd == pytest.approx(scan)
