"""LatentMoE and a hybrid model's multi-token prediction (Nemotron-3 Super 120B-A12B): parameter counts against
the released checkpoint, each latent term by hand (weights whole on every TP rank, saved bytes, expert GEMMs,
all-to-all volume, model FLOPs), one shared MTP block over two depths, the Hugging Face import, and the launch
config megatron-core accepts."""

from __future__ import annotations

import pytest

import planner
from planner.errors import PlannerError
from planner.specs import Layout, ModelSpec, TrainingSpec

SUPER = "nemotron-3-super-120b-a12b"
H, L, E, K, FE, FS = 4096, 1024, 512, 22, 2688, 5376  # hidden, latent, experts, top-k, expert and shared widths


def sup() -> ModelSpec:
    return planner.load_model(SUPER)


def test_super_counts_match_the_released_checkpoint():
    """The BF16 checkpoint's safetensors headers hold 123,611,012,096 weights, 2,942,324,736 of them the one
    MTP block; 107,898,470,400 are routed experts a token does not use (counted from the headers by
    an independent parser); the model card says 120B total and 12B active."""
    m = sup()
    assert m.num_params + m.mtp_params == 123_611_012_096
    assert m.mtp_params == 2_942_324_736
    assert m.num_params - m.active_params == 107_898_470_400
    assert m.num_params == pytest.approx(120e9, rel=0.01) and m.active_params == pytest.approx(12.8e9, rel=0.01)


def test_an_moe_layer_by_hand():
    """Its norm, the h x E router, the shared expert (two h x f_s projections), the two latent projections
    (h x L each) and E experts of two L x f_e projections (squared ReLU: no gate)."""
    total, active = sup().symbol_params("E")
    base = H + H * E + 2 * H * FS + 2 * H * L
    assert total == base + E * 2 * L * FE
    assert active == base + K * 2 * L * FE


def test_the_latent_projections_are_whole_on_every_tp_rank():
    """TELinear in 'duplicated' mode: at tp 2 a rank holds half of the other weights and all of the two latent
    projections of its 40 MoE layers and the MTP block's one: stage_params(tp 1) - 2 stage_params(tp 2) is
    minus those whole weights."""
    from planner.memory import stage_params

    m = sup()
    one = stage_params(m, Layout(tp=1, ep=8, dp=8), 0, 88)
    two = stage_params(m, Layout(tp=2, ep=8, dp=4, sequence_parallel=True), 0, 88)
    assert one - 2 * two == pytest.approx(-(40 + 1) * 2 * H * L)


def test_the_routed_experts_keep_latent_wide_rows():
    """Per GPU and micro-batch of N tokens (BF16, etp 1): the router's fp32 logits and scores (8 B an
    expert), the experts' input rows, FC1's output and FC2's input (N top_k rows of L, f_e, f_e), and
    fc2_latent_proj's input (N x L); fc1_latent_proj's input is the norm output the layer already keeps.
    Under MXFP8 the linears' inputs are 1 B and fc1_latent_proj quantises its own copy of that norm output."""
    from planner.memory import moe_routed_bytes

    m, n = sup(), 4096
    rows = n * K
    assert moe_routed_bytes(m, n, 1) == 8 * n * E + 2 * rows * L + 2 * rows * FE + 2 * rows * FE + 2 * n * L
    assert moe_routed_bytes(m, n, 1, fp8_inputs=True) == (8 * n * E + rows * L + 2 * rows * FE + rows * FE
                                                         + n * L + n * H)


def test_latent_experts_compute_and_travel_at_the_latent_width():
    """The per-token model FLOPs of an MoE layer: router 2 h E, shared expert 2 x 2 h f_s, top_k experts
    2 x 2 L f_e, the two latent projections 2 x 2 h L. The all-to-all carries N top_k rows of L (BF16)
    and the fp32 probabilities each way, forward and backward."""
    from planner.comm import alltoall_time
    from planner.cost import model_flops_per_token, moe_time
    from planner.topology import placement

    m = sup()
    plain = m.model_copy(update={"layer_pattern": m.layer_pattern.replace("E", "M"), "moe": None, "mtp_layers": 0,
                                 "mtp_shared": False})
    flops = 2 * (H * E + 2 * H * FS + K * 2 * L * FE + 2 * H * L)
    assert model_flops_per_token(m.model_copy(update={"mtp_layers": 0, "mtp_shared": False}), 8192) == pytest.approx(
        model_flops_per_token(plain, 8192) + 3 * 40 * (flops - model_flops_per_token_mamba(plain)))
    c = planner.load_cluster("dgx-h100")
    t = TrainingSpec(global_batch_size=64, seq_length=8192)
    n = 8192 / 2  # tokens a rank holds at tp 2
    got = moe_time(m, c, t, 2, 1, 1, 8, 1).ep
    g = placement(c, (8, 1))
    assert got == pytest.approx(2 * (alltoall_time(c, g, 2 * n * K * L) + alltoall_time(c, g, 4 * n * K)))


def model_flops_per_token_mamba(plain: ModelSpec) -> float:
    """One Mamba-2 layer's forward FLOPs per token (the layer the plain copy has where Super has E)."""
    from planner.cost import mamba_gemm_flops, mamba_scan_flops

    return sum(mamba_gemm_flops(plain, 1, 1)) + mamba_scan_flops(plain, 1, 1)


def test_one_shared_mtp_block_runs_twice_and_is_held_once():
    """mtp_shared (Megatron --mtp-use-repeated-layer): the two depths cost the same time and activations as
    two blocks of their own, and one block's weights (2,942,324,736, the checkpoint's MTP block) fewer."""
    from planner.cost import mtp_time

    m = sup()
    own = m.model_copy(update={"mtp_shared": False})
    c = planner.load_cluster("gb200-nvl72", nodes=16)
    t = TrainingSpec(global_batch_size=512, seq_length=8192, fp8="mxfp8")
    lay = Layout(tp=2, dp=32, ep=64, etp=1, sequence_parallel=True, micro_batch_size=1, zero_stage=1,
                 moe_dispatcher="deepep")
    assert (m.mtp_param_depths, own.mtp_param_depths) == (1, 2)
    assert mtp_time(m, c, t, lay) == pytest.approx(mtp_time(own, c, t, lay))
    a, b = planner.evaluate(m, c, t, lay), planner.evaluate(own, c, t, lay)

    def mtp_bytes(plan):
        return next(i.bytes for i in plan.memory.stages[-1].items if i.name == "mtp")
    assert mtp_bytes(a) == mtp_bytes(b)
    assert own.mtp_params - m.mtp_params == 2_942_324_736


def test_a_hybrid_mtp_depth_is_one_transformer_moe_layer():
    """'*E' is an attention layer and an MoE block: the same time as a transformer MoE layer's, as the MTP
    terms price it, twice plus the head (projection, output layer and loss) per depth."""
    from planner.cost import _layer_terms, _layer_time, mtp_head_time, mtp_time

    m = sup()
    c = planner.load_cluster("dgx-h100", nodes=2)
    t = TrainingSpec(global_batch_size=64, seq_length=8192)
    lay = Layout(tp=2, dp=8, ep=16, etp=1, sequence_parallel=True, micro_batch_size=1, zero_stage=1)
    per = sum(_layer_terms(_layer_time(m, c, t, lay, symbol="*"), lay, 1.0)) + sum(
        _layer_terms(_layer_time(m, c, t, lay, symbol="E"), lay, 1.0))
    assert mtp_time(m, c, t, lay) == pytest.approx(2 * per + mtp_head_time(m, c, t, lay), rel=1e-9)


@pytest.mark.parametrize("update, field", [
    (dict(mtp_shared=True, mtp_layers=0), "mtp_shared"),
])
def test_a_bad_mtp_spec_is_one_line_naming_the_field(update, field):
    data = {**sup().model_dump(exclude={"sources", "provenance"}), **update}
    with pytest.raises(PlannerError) as err:
        ModelSpec.load(data)
    assert field in str(err.value) and "\n" not in str(err.value)


SUPER_HF = {  # the config.json of nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16, the fields the bridge reads
    "architectures": ["NemotronHForCausalLM"], "num_hidden_layers": 88, "hidden_size": H,
    "hybrid_override_pattern": "MEMEMEM*EMEMEMEM*EMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEM*EMEMEMEME",
    "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128, "intermediate_size": FE,
    "vocab_size": 131072, "tie_word_embeddings": False, "mamba_num_heads": 128, "mamba_head_dim": 64,
    "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4, "chunk_size": 128, "mlp_hidden_act": "relu2",
    "use_bias": False, "n_routed_experts": E, "num_experts_per_tok": K, "moe_intermediate_size": FE,
    "moe_latent_size": L, "moe_shared_expert_intermediate_size": FS, "n_shared_experts": 1, "n_group": 1,
    "topk_group": 1, "num_nextn_predict_layers": 1, "mtp_hybrid_override_pattern": "*E",
}


def test_hf_import_of_super_builds_the_catalog_model_with_its_one_depth():
    """The config has one MTP block; Megatron-Bridge's recipe runs it twice (mtp_num_layers 2,
    mtp_use_repeated_layer), which the catalog entry records."""
    from planner.catalog import model_from_hf_config

    got = model_from_hf_config(SUPER_HF, "super")
    skip = {"name", "sources", "provenance", "mtp_layers", "mtp_shared"}
    assert got.model_dump(exclude=skip) == sup().model_dump(exclude=skip)
    assert (got.mtp_layers, got.mtp_shared) == (1, False) and got.mtp_params == sup().mtp_params


def test_hf_import_refuses_an_mtp_depth_it_does_not_price():
    from planner.catalog import model_from_hf_config

    with pytest.raises(PlannerError) as err:
        model_from_hf_config({**SUPER_HF, "mtp_hybrid_override_pattern": "ME"}, "super")
    assert "mtp_hybrid_override_pattern" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("layout", [
    dict(tp=2, pp=1, dp=8, ep=16, etp=1, sequence_parallel=True),
    dict(tp=1, pp=2, dp=8, ep=8, vpp=2),
])
def test_megatron_builds_the_latent_experts_and_the_shared_mtp_block(megatron_path, layout):
    """megatron-core 0.19.2 parses the emitted pattern's MTP part as two '*E' depths on the last rank, runs
    them with one repeated layer, and sets the latent width."""
    pytest.importorskip("torch")
    from planner.check import check_megatron, megatron_payload

    m = sup()
    c, t = planner.load_cluster("dgx-h100", nodes=2), TrainingSpec(global_batch_size=64, seq_length=8192)
    p = planner.evaluate(m, c, t, Layout(micro_batch_size=1, zero_stage=1, **layout))
    files = p.to_megatron()
    r, = check_megatron([megatron_payload(files.args, p.num_gpus, files.env, p.cluster.gpu.arch)])
    assert r.ok, r.line()
    assert r.details["hybrid_mtp"] == ["*E", 2] and r.details["mtp_num_layers"] == 2
    assert r.details["mtp_use_repeated_layer"] and r.details["moe_latent_size"] == L
    assert r.details["mtp_ranks"] == [p.layout.pp - 1]


def test_the_published_super_layouts_are_priced_and_fit():
    """Megatron-Bridge's Nemotron-3 Super MXFP8 rows (64 GB200 at tp 2 ep 64, 64 B300 at tp 1 ep 8) are
    layouts evaluate prices, and they fit the GPUs they ran on."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from runs import load_moe_runs

    runs, _ = load_moe_runs()
    rows = [r for r in runs if "nemotron_3_super" in r.id]
    assert len(rows) == 8
    for r in rows:
        p = planner.evaluate(r.model, r.cluster, r.training, r.layout)
        # the one warning: the known miss its own published runs measure (planner.uncertainty.MODELS)
        assert [w for w in p.warnings if not w.startswith("a known miss")] == [] and p.peak_memory_bytes < r.cluster.gpu.memory


def test_explain_says_what_the_latent_tokens_carry_and_how_little_is_attention():
    """At tp 2 a GPU holds 4,096 of the 8,192 tokens, each sent to 22 experts as 1,024 BF16 values: 185 MB an
    all-to-all; the attention core (8 layers and the 2 MTP depths, 2 s a (d_qk + d_v) a token each) is
    1.34 of the 29.2 forward GFLOP a token, 5 %."""
    from planner.explain import explain

    c = planner.load_cluster("gb200-nvl72", nodes=16)
    t = TrainingSpec(global_batch_size=512, seq_length=8192, fp8="mxfp8")
    lines = explain(sup(), c, t, tp=2, ep=64, pp=1, micro_batch_size=1, sensitivities=False)
    assert "its 2 multi-token prediction depth(s) sharing one block, 2.9B more" in lines[0]
    experts = next(line for line in lines if line.startswith("Experts:"))
    assert "top-22 on a 1,024-wide latent" in experts and "each all-to-all moves 185 MB per GPU" in experts
    assert 2 * 8192 * 32 * 256 * 10 / 1e9 == pytest.approx(1.342, abs=1e-3)
    assert any("the attention core is 5% of the model FLOPs" in line for line in lines)


def test_bf16_end_layers_take_each_layers_kind():
    """Megatron keeps layers by global number in BF16 whatever they are: Super's last 14 ('EMEM*EMEMEMEME')
    are 7 MoE, 6 Mamba-2 and 1 attention layer, all on the one rank at pp 1 and on the last at pp 2;
    DeepSeek-V3's first 4 are its 3 dense layers and one MoE layer."""
    from planner.memory import bf16_kinds_on

    m = sup()
    t = TrainingSpec(global_batch_size=512, seq_length=8192, fp8="nvfp4", bf16_last_layers=14)
    assert bf16_kinds_on(m, t, Layout(pp=1), 0) == {"E": 7, "M": 6, "*": 1}
    assert bf16_kinds_on(m, t, Layout(pp=2), 0) == {} and bf16_kinds_on(m, t, Layout(pp=2), 1) == {"E": 7, "M": 6, "*": 1}
    ds = planner.load_model("deepseek-v3")
    t = TrainingSpec(global_batch_size=512, seq_length=4096, fp8="mxfp8", bf16_first_layers=4, bf16_last_layers=2)
    assert bf16_kinds_on(ds, t, Layout(pp=1), 0) == {"-": 3, "E": 3}


@pytest.mark.parametrize("name, cluster, lay", [
    (SUPER, "gb200-nvl72", dict(tp=2, dp=32, ep=64, etp=1, sequence_parallel=True, moe_dispatcher="deepep")),
    ("mixtral-8x7b", "dgx-b200", dict(tp=1, dp=64, ep=8)),
])
def test_every_layer_in_bf16_is_the_bf16_run(name, cluster, lay):
    """With all its layers kept in BF16 a low-precision run's layers cost and keep what a BF16 run's do:
    compute, recompute, TP and EP terms and activations equal (MTP depths, which the recipe still runs in
    NVFP4, left out), and no layer holds low-precision weight copies."""
    m = planner.load_model(name).model_copy(update={"mtp_layers": 0, "mtp_shared": False})
    c = planner.load_cluster(cluster, nodes=8 if cluster == "dgx-b200" else 16)
    base = dict(global_batch_size=512, seq_length=4096)
    layout = Layout(micro_batch_size=1, zero_stage=1, **lay)
    bf16 = planner.evaluate(m, c, TrainingSpec(**base), layout)
    every = planner.evaluate(m, c, TrainingSpec(**base, fp8="nvfp4", bf16_last_layers=m.num_layers), layout)
    a, b = bf16.time.pipeline.stages[0], every.time.pipeline.stages[0]
    for term in ("compute", "recompute", "tp_comm", "ep_comm"):
        assert getattr(b, term) == pytest.approx(getattr(a, term), rel=1e-9), term

    def item(plan, name):
        return sum(i.bytes for i in plan.memory.stages[0].items if i.name == name)
    assert item(every, "activations") == pytest.approx(item(bf16, "activations"), rel=1e-9)
    assert item(every, "fp8_weights") == 0
    mixed = planner.evaluate(m, c, TrainingSpec(**base, fp8="nvfp4", bf16_last_layers=4), layout)
    assert every.step_time_s > mixed.step_time_s > planner.evaluate(m, c, TrainingSpec(**base, fp8="nvfp4"), layout).step_time_s


def test_megatron_keeps_a_hybrids_last_layers_in_bf16(megatron_path):
    """megatron-core 0.19.2 accepts Super's NVFP4 recipe with its last 14 layers in BF16."""
    pytest.importorskip("torch")
    from planner.check import check_megatron, megatron_payload

    c = planner.load_cluster("gb200-nvl72", nodes=16)
    t = TrainingSpec(global_batch_size=512, seq_length=8192, fp8="nvfp4", bf16_last_layers=14)
    p = planner.evaluate(sup(), c, t, Layout(tp=2, pp=2, dp=16, ep=32, etp=1, sequence_parallel=True,
                                             micro_batch_size=1, zero_stage=1))
    files = p.to_megatron()
    r, = check_megatron([megatron_payload(files.args, p.num_gpus, files.env, p.cluster.gpu.arch)])
    assert r.ok, r.line()
    assert r.details["bf16_end_layers"] == [0, 14] and r.details["fp4"] == "e2m1"
