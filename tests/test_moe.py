"""Mixture-of-Experts and multi-latent attention models: the parameter counts against the published
totals and active counts, the Hugging Face import, expert-parallel layouts (rules, ledger, time,
search, launch flags) and the refusal of what is not priced (multi-latent attention, leading dense layers)."""

from __future__ import annotations

import io

import pytest

import planner
from planner.catalog import model_from_hf_config
from planner.cli import main
from planner.errors import ConfigImportError, PlannerError
from planner.specs import Layout, ModelSpec, MoERouting, MoESpec, TrainingSpec

# (catalog id, published total, published active, digits the publisher rounds to)
PUBLISHED = [
    ("mixtral-8x7b", 46.7e9, 12.9e9),  # Mixtral paper / model card
    ("qwen3-30b-a3b", 30.5e9, 3.3e9),  # Qwen3 model card
    ("qwen3-235b-a22b", 235e9, 22e9),
    ("deepseek-v3", 671e9, 37e9),  # DeepSeek-V3 report §4.2 (MTP's 14B not included)
    ("llama4-maverick", 400e9, 17e9),  # Llama-4 Maverick model card (text model)
]


@pytest.mark.parametrize("ref, total, active", PUBLISHED)
def test_counts_match_the_published_totals(ref, total, active):
    m = planner.load_model(ref)
    assert m.num_params == pytest.approx(total, rel=0.005)
    # active counts are published to two or three digits (rounded or cut): within one unit of the last
    digits = len(f"{active / 1e9:g}".split(".")[1]) if "." in f"{active / 1e9:g}" else 0
    assert abs(m.active_params - active) <= 10 ** (9 - digits)


def test_qwen3_8b_counts_its_card():
    """Qwen3-8B (HF config: 36 layers of hidden 4096, 32 Q and 8 KV heads of 128, FFN 12288, Q/K RMSNorm, vocabulary
    151,936, untied). By hand: a layer 4096 x 4096 x 2 + 2 x 4096 x 1024 + 3 x 4096 x 12288 + 2 x 4096 + 2 x 128 =
    192,946,432, x 36 = 6,946,071,552 (the card's 6.95B without embeddings); plus 2 x 151,936 x 4096 = 1,244,659,712 and
    the final norm: 8,190,735,360 (the card's 8.2B)."""
    m = planner.load_model("qwen3-8b")
    assert m.qk_norm and not m.tied_embeddings and m.moe is None
    assert m.num_params == m.active_params == 8_190_735_360


def test_llama4_scout_counts_its_text_model():
    """Llama-4 Scout (HF config: 48 layers of hidden 5120, 40 heads and 8 KV heads of 128, 16 experts top-1 of 8192 and a
    shared expert of 8192 on every layer, vocabulary 202,048, untied). By hand: attention 5120 x (5120 + 2 x 1024) + 5120 x
    5120 = 62,914,560; experts 16 x 3 x 5120 x 8192 = 2,013,265,920; shared expert 125,829,120; router 81,920; two norms
    10,240: 2,202,101,760 a layer, x 48 = 105,700,884,480, plus embedding and output 2 x 202,048 x 5120 = 2,068,971,520
    and the final norm: 107,769,861,120. The card's 109B counts the vision encoder too; active: 48 x (62,914,560 + 2 x
    125,829,120 + 81,920 + 10,240) + 2,068,971,520 + 5120 = 17,172,894,720, the card's 17B."""
    m = planner.load_model("llama4-scout")
    assert m.num_params == 107_769_861_120
    assert m.active_params == 17_172_894_720


@pytest.mark.parametrize("ref, total, active", [("gpt-oss-120b", 116.83e9, 5.13e9), ("gpt-oss-20b", 20.91e9, 3.61e9)])
def test_gpt_oss_counts_match_openai_model_card(ref, total, active):
    # OpenAI's gpt-oss model card (arXiv 2508.10925) Table 1 gives totals and active counts to two decimals;
    # its active count leaves out the input embedding (embedding + unembedding 1.16B, half of it active)
    m = planner.load_model(ref)
    assert m.num_params == pytest.approx(total, abs=0.005e9)
    assert m.active_params_without_embedding == pytest.approx(active, abs=0.005e9)
    assert m.active_params - m.active_params_without_embedding == 201088 * 2880


def test_mixtral_layer_by_hand():
    # h 4096, 8 KV heads of 128, f 14336, 8 experts, top 2: attention 4096 x (4096 + 2 x 1024) + 4096 x 4096,
    # two RMSNorms, router 4096 x 8, experts 8 x 3 x 4096 x 14336
    m = planner.load_model("mixtral-8x7b")
    attn = 4096 * 6144 + 4096 * 4096
    expert = 3 * 4096 * 14336
    assert m.moe_layer_params == (attn + 2 * 4096 + 4096 * 8 + 8 * expert, attn + 2 * 4096 + 4096 * 8 + 2 * expert)


def test_mla_attention_by_hand():
    # DeepSeek-V3: Q = 7168 x 1536 (+ norm 1536) then 1536 x 128 x (128 + 64); KV down 7168 x (512 + 64)
    # (+ norm 512), up 512 x 128 x (128 + 128); out-proj 128 x 128 x 7168
    m = planner.load_model("deepseek-v3")
    q = 7168 * 1536 + 1536 + 1536 * 128 * 192
    kv = 7168 * 576 + 512 + 512 * 128 * 256
    assert m.attention_params == q + kv + 128 * 128 * 7168


def test_hf_import_of_mixtral_and_qwen3_moe():
    mixtral = {"architectures": ["MixtralForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32,
               "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000,
               "num_local_experts": 8, "num_experts_per_tok": 2, "tie_word_embeddings": False}
    m = model_from_hf_config(mixtral, "mixtral")
    assert m.num_params == planner.load_model("mixtral-8x7b").num_params
    qwen = {"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048, "num_hidden_layers": 48,
            "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144,
            "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936,
            "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": False}
    assert model_from_hf_config(qwen, "q").num_params == planner.load_model("qwen3-30b-a3b").num_params
    # decoder_sparse_step 2: layers 1, 3, ..., 47 MoE, the even ones dense MLPs of intermediate_size
    # (3 x 2048 x 6144 each) instead of 128 experts of 3 x 2048 x 768 and the 2048 x 128 router
    half = model_from_hf_config(dict(qwen, decoder_sparse_step=2), "q")
    assert half.moe.layer_step == 2 and half.moe_layers == 24 and not half.is_moe_layer(0) and half.is_moe_layer(47)
    assert half.num_params == model_from_hf_config(qwen, "q").num_params - 24 * (128 * 3 * 2048 * 768 + 2048 * 128
                                                                                 - 3 * 2048 * 6144)
    with pytest.raises(ConfigImportError, match="mlp_only_layers"):
        model_from_hf_config(dict(qwen, mlp_only_layers=[0, 1]), "q")
    with pytest.raises(ConfigImportError, match="Mixture-of-Experts"):  # MoE keys on a dense architecture
        model_from_hf_config(dict(mixtral, architectures=["LlamaForCausalLM"]), "x")


DEEPSEEK_V3_HF = {  # deepseek-ai/DeepSeek-V3 config.json
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
    "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256, "routed_scaling_factor": 2.5,
    "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
    "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8, "moe_layer_freq": 1,
    "first_k_dense_replace": 3, "norm_topk_prob": True, "scoring_func": "sigmoid", "num_nextn_predict_layers": 1,
    "vocab_size": 129280, "tie_word_embeddings": False, "attention_bias": False}


def test_hf_import_of_deepseek_v3_and_kimi_k2():
    """DeepseekV3ForCausalLM configs: DeepSeek-V3's is the catalog model (671.0B / 37.6B active, within
    0.5 % of the report's 671B / 37B); Kimi-K2's (64 heads, 384 experts, one dense layer, a 163,840
    vocabulary) gives Moonshot's 1T total / 32B activated to their rounding. The config's MTP depth is
    kept (mtp_layers 1, outside the published totals); a malformed count and MoE layers between dense
    ones are refused."""
    m = model_from_hf_config(DEEPSEEK_V3_HF, "ds")
    same = {"name", "sources", "provenance"}  # every field the planner prices equals the catalog entry's
    assert m.model_dump(exclude=same) == planner.load_model("deepseek-v3").model_dump(exclude=same)
    assert m.num_params == pytest.approx(671e9, rel=0.005) and m.active_params == pytest.approx(37e9, rel=0.02)
    kimi = model_from_hf_config(dict(DEEPSEEK_V3_HF, num_attention_heads=64, num_key_value_heads=64,
                                     n_routed_experts=384, first_k_dense_replace=1, n_group=1, topk_group=1,
                                     vocab_size=163840, routed_scaling_factor=2.827), "kimi")
    assert kimi.num_params == pytest.approx(1e12, rel=0.03) and kimi.active_params == pytest.approx(32e9, rel=0.03)
    assert kimi.moe.num_experts == 384 and kimi.moe.first_dense_layers == 1 and kimi.mla.kv_lora_rank == 512
    assert m.mtp_layers == 1 and model_from_hf_config(dict(DEEPSEEK_V3_HF, num_nextn_predict_layers=0), "ds").mtp_layers == 0
    with pytest.raises(ConfigImportError, match="num_nextn_predict_layers = -1: expected a non-negative integer"):
        model_from_hf_config(dict(DEEPSEEK_V3_HF, num_nextn_predict_layers=-1), "ds")
    with pytest.raises(ConfigImportError, match="moe_layer_freq"):
        model_from_hf_config(dict(DEEPSEEK_V3_HF, moe_layer_freq=2), "ds")
    with pytest.raises(ConfigImportError, match="multi-latent attention"):  # MLA keys on a Llama: refused
        model_from_hf_config({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 2,
                              "num_attention_heads": 32, "intermediate_size": 11008, "vocab_size": 32000,
                              "kv_lora_rank": 512}, "x")


QWEN15_MOE_HF = {  # Qwen/Qwen1.5-MoE-A2.7B config.json
    "architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 16,
    "num_key_value_heads": 16, "intermediate_size": 5632, "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632, "num_experts": 60, "num_experts_per_tok": 4, "vocab_size": 151936,
    "tie_word_embeddings": False, "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": False}


def test_hf_import_of_qwen2_moe_with_its_gated_shared_expert():
    """Qwen2-MoE: Q/K/V biases, 60 experts of 1408 top-4 and one shared expert of 5632 behind a 1 x h
    sigmoid gate. Qwen1.5-MoE-A2.7B comes out at 14.3B total / 2.7B activated as Qwen publishes it, and
    Qwen2-57B-A14B at 57B / 14B; the gate is 2,048 parameters a layer, 24 x 2048 in all."""
    m = model_from_hf_config(QWEN15_MOE_HF, "q")
    assert m.num_params == pytest.approx(14.3e9, rel=0.005) and m.active_params == pytest.approx(2.7e9, rel=0.01)
    assert m.qkv_bias and m.moe.shared_expert_gate and m.moe.shared_expert_ffn_hidden_size == 5632
    ungated = m.model_copy(update={"moe": m.moe.model_copy(update={"shared_expert_gate": False})})
    assert m.num_params - ungated.num_params == 24 * 2048
    big = model_from_hf_config(dict(QWEN15_MOE_HF, hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
                                    num_key_value_heads=4, intermediate_size=18944, moe_intermediate_size=2560,
                                    shared_expert_intermediate_size=20480, num_experts=64, num_experts_per_tok=8), "q57")
    assert big.num_params == pytest.approx(57e9, rel=0.01) and big.active_params == pytest.approx(14e9, rel=0.02)
    with pytest.raises(ConfigImportError, match="use_sliding_window"):
        model_from_hf_config(dict(QWEN15_MOE_HF, use_sliding_window=True), "q")
    with pytest.raises(planner.SpecError, match="shared_expert_gate"):
        planner.ModelSpec.load({**m.model_dump(exclude={"sources", "provenance"}),
                                "moe": {**m.moe.model_dump(), "shared_expert_ffn_hidden_size": 0}}, "x")


def test_deepseek_v3_is_priced_and_its_ledger_printed():
    m, c = planner.load_model("deepseek-v3"), planner.load_cluster("dgx-h100", nodes=32)
    t = TrainingSpec(global_batch_size=1024, seq_length=4096)
    with pytest.raises(PlannerError, match="is not a multiple of ep"):
        planner.evaluate(m, c, t, Layout(tp=8, pp=1, dp=32, ep=256, sequence_parallel=True))
    p = planner.evaluate(m, c, t, Layout(tp=8, pp=4, dp=8, ep=64, etp=1, sequence_parallel=True, zero_stage=1,
                                         pipeline_layers=(16, 16, 16, 13)))
    assert p.time.breakdown()["ep_comm"] > 0 and p.memory.stages[0].layers == 16
    out = io.StringIO()
    assert main(["ledger", "deepseek-v3"], stdout=out, stderr=io.StringIO()) == 0
    assert "671.03B parameters (37.55B active" in out.getvalue()


def test_expert_sharding_in_the_static_ledger():
    # Mixtral on 8 GPUs, tp 1, dp 8, ep 8 (etp 1), ZeRO-1, bf16 grads. Routed experts: 32 layers x 8 x
    # 3 x 4096 x 14336 = 45,097,156,608 (the rest, 1,605,636,096, is dense). Each GPU holds the dense part
    # and one expert of each layer; dense Adam states over dp 8, expert states over the expert-data-
    # parallel group tp x dp / (ep x etp) = 1.
    from planner.memory import expert_params, moe_static_memory

    m = planner.load_model("mixtral-8x7b")
    experts, dense = 45_097_156_608, 46_702_792_704 - 45_097_156_608
    assert expert_params(m) == experts and m.num_params - experts == dense
    st = moe_static_memory(m, tp=1, pp=1, dp=8, ep=8, etp=1, grad_dtype="bf16", zero_stage=1)
    assert st.params == pytest.approx(2 * (dense + experts / 8))
    assert st.grads == pytest.approx(2 * (dense + experts / 8))
    assert st.optimizer == pytest.approx(12 * dense / 8 + 12 * experts / 8)
    with pytest.raises(planner.SpecError, match="ep"):
        moe_static_memory(m, tp=1, pp=1, dp=8, ep=16, etp=1)  # 16 x 1 does not divide 1 x 8
    with pytest.raises(planner.SpecError, match="num_experts"):
        moe_static_memory(m, tp=3, pp=1, dp=2, ep=3, etp=1)
    out = io.StringIO()
    assert main(["ledger", "mixtral-8x7b", "--ep", "8", "--etp", "1", "--json"], stdout=out, stderr=io.StringIO()) == 0


def test_expert_parallel_rules_name_the_broken_one():
    from planner.space import layout_problems

    m, c = planner.load_model("mixtral-8x7b"), planner.load_cluster("dgx-h100", nodes=2)
    t = TrainingSpec(global_batch_size=64, seq_length=4096)

    def problems(**kw):
        return " | ".join(layout_problems(m, c, t, Layout(**{"dp": 16, **kw})))

    assert problems(ep=8, etp=1) == ""
    assert "num_experts(8) % ep(16)" in problems(ep=16)
    assert "is not a multiple of ep(8)*etp(4)" in problems(tp=2, dp=8, ep=8, etp=4, sequence_parallel=True)
    assert "needs sequence_parallel" in problems(tp=2, dp=8, ep=4)
    assert problems(ep=8, zero_stage=3) == ""  # Megatron-FSDP shards the experts over their own group
    ds = TrainingSpec(global_batch_size=64, seq_length=4096, optimizer_impl="deepspeed")
    assert "priced as Megatron-FSDP shards them" in " ".join(layout_problems(m, c, ds, Layout(dp=16, ep=8, zero_stage=3)))
    assert "tp-cp-dp-pp only" in problems(ep=8, pp=2, dp=8, rank_order="tp-cp-pp-dp")
    dense = planner.load_model("llama3-8b")
    assert "need a Mixture-of-Experts model" in " ".join(layout_problems(dense, c, t, Layout(dp=16, ep=2)))
    with pytest.raises(PlannerError, match="ep/etp.*dense"):
        planner.plan(dense, c, t, ep=2)
    for fw in ("deepspeed", "torchtitan"):
        with pytest.raises(PlannerError, match="Megatron only"):
            planner.plan(m, c, t, framework=fw)


def test_moe_static_items_by_hand():
    # Mixtral, tp 2 dp 8 ep 8 etp 1 on 16 H100, ZeRO-1, bf16 grads, one stage. Routed experts
    # 32 x 8 x 3 x 4096 x 14336 = 45,097,156,608, the rest 1,605,636,096. A GPU holds the rest / tp and
    # experts / (ep etp); Adam states: the rest over dp 8, experts over edp = tp dp / (ep etp) = 2.
    m, c = planner.load_model("mixtral-8x7b"), planner.load_cluster("dgx-h100", nodes=2)
    t = TrainingSpec(global_batch_size=64, seq_length=4096, grad_dtype="bf16")
    lay = Layout(tp=2, dp=8, ep=8, etp=1, zero_stage=1, sequence_parallel=True)
    dense, experts = 1_605_636_096 / 2, 45_097_156_608 / 8
    st = planner.evaluate(m, c, t, lay).memory.stages[0]
    assert lay.edp == 2
    assert st.get("weights") == pytest.approx(2 * (dense + experts))
    assert st.get("gradients") == pytest.approx(2 * (dense + experts))
    assert st.get("optimizer") == pytest.approx(12 * dense / 8 + 12 * experts / 2)


def test_routed_activations_by_hand():
    # Qwen3-30B-A3B, b 1, s 4096, one GPU (tp 1, etp 1), BF16, flash attention, no recompute.
    # Attention side per [MemRef §2b] with q = 32 x 128 = 4096, h_kv = 4 x 128 = 512, a = 32:
    # sb (2h x 4 + 8 + 2q x 2 + 2 h_kv x 2 + 2 (q + h_kv) + 4a) = 4096 x 44,168 = 180,912,128
    # (the norm-2 output is the router's input; no shared experts). Routed side, N = 4096 tokens x top 8:
    # router 8 N E = 4,194,304; FC1 input 2 (8N) h = 134,217,728; SwiGLU input 2 (8N) 2 f_e = 100,663,296;
    # FC2 input 2 (8N) f_e = 50,331,648.
    from planner.memory import activation_bytes_per_layer, moe_routed_bytes

    m = planner.load_model("qwen3-30b-a3b")
    routed = 4_194_304 + 134_217_728 + 100_663_296 + 50_331_648
    assert moe_routed_bytes(m, 4096, 1) == routed
    # Qwen3 normalises each head's Q and K: the norms keep fp32 rstd, 4 sb (a + g) = 589,824 (their
    # inputs are views of the fused QKV output V already pins)
    assert activation_bytes_per_layer(m, 1, 4096) == 180_912_128 + 589_824 + routed
    assert m.qk_norm and "--qk-layernorm" in planner.evaluate(
        m, planner.load_cluster("dgx-h100"), TrainingSpec(global_batch_size=64, seq_length=4096),
        Layout(dp=8, ep=8, zero_stage=1)).to_megatron().args
    # tp 2 with SP and etp 2: N = 2048 per GPU, each receives N x 8 x etp rows, f_e / 2 wide
    assert moe_routed_bytes(m, 2048, 2) == 8 * 2048 * 128 + 2 * 32768 * 2048 + 2 * 32768 * 768 + 2 * 32768 * 384
    # FP8: the expert GEMM inputs at 1 B
    assert moe_routed_bytes(m, 4096, 1, fp8_inputs=True) == routed - 134_217_728 // 2 - 50_331_648 // 2


def test_alltoall_by_hand():
    # 1e11 bytes per GPU (past the last measured size: full busbw). EP 8 in one DGX H100: 7/8 over NVLink
    # at the ring busbw 370 GB/s + 25 us. EP 16 over two nodes: 8/16 leaves the node on the GPU's own
    # 47 GB/s NIC, 7/16 crosses NVLink at the same time; + 20 us.
    from planner.comm import alltoall_time
    from planner.topology import placement

    c = planner.load_cluster("dgx-h100", nodes=2)
    assert alltoall_time(c, placement(c, (8, 1)), 1e11) == pytest.approx(25e-6 + 1e11 * 7 / 8 / 370e9)
    assert alltoall_time(c, placement(c, (16, 1)), 1e11) == pytest.approx(20e-6 + 1e11 * 8 / 16 / 47e9)
    nvl72 = planner.load_cluster("gb200-nvl72", nodes=18)
    assert placement(nvl72, (64, 1)).tier == "nvlink"  # EP 64 stays inside the rack


def test_moe_flops_by_hand():
    # Qwen3-30B-A3B per token, s 4096: 3 x (48 x (2 (h(q + 2 h_kv) + q h) + 2 h E + 2 x 3 h k f_e + 4 s q) + 2 h V)
    from planner.cost import model_flops_per_token, moe_time

    h, q, hkv, E, k, fe, s, V = 2048, 4096, 512, 128, 8, 768, 4096, 151936
    per_layer = 2 * (h * (q + 2 * hkv) + q * h) + 2 * h * E + 2 * 3 * h * k * fe + 4 * s * q
    m = planner.load_model("qwen3-30b-a3b")
    assert model_flops_per_token(m, s) == 3 * (48 * per_layer + 2 * h * V)
    # one GPU of ep 8 (tp 1): router 2 N h E and the routed GEMMs 2 N k 3 h f_e, N = 4096, on a flat curve
    c = planner.load_cluster("dgx-h100")
    flat = c.calibration.model_copy(update={"gemm_efficiency": [(1e-3, 1.0), (1e9, 1.0)], "grouped_gemm_call": 0.0})
    c = c.model_copy(update={"calibration": flat})
    t = TrainingSpec(global_batch_size=64, seq_length=s)
    got = moe_time(m, c, t, tp=1, cp=1, b=1, ep=8, etp=1).gemm
    assert got == pytest.approx((2 * 4096 * h * E + 2 * 4096 * k * 3 * h * fe) / 989e12)


def test_expert_gradients_reduce_over_the_expert_data_parallel_group():
    # Mixtral tp 1, dp 16, ep 8 on two DGX H100, ZeRO-0 without overlap: the non-expert gradients
    # all-reduce over dp 16; each expert (experts / 8 per GPU) over edp 2, whose members are 8 ranks
    # apart: GPU 0 and GPU 8, on two nodes.
    from planner.comm import collective_time
    from planner.cost import stage_dp_time
    from planner.topology import placement

    m, c = planner.load_model("mixtral-8x7b"), planner.load_cluster("dgx-h100", nodes=2)
    t = TrainingSpec(global_batch_size=64, seq_length=4096, grad_dtype="bf16")
    lay = Layout(dp=16, ep=8, etp=1)
    edp = placement(c, (2, 8))
    assert edp.tier == "scaleout" and edp.nodes == 2
    want = (collective_time(c, placement(c, (16, 1)), "allreduce", 2 * 1_605_636_096)
            + collective_time(c, edp, "allreduce", 2 * 45_097_156_608 / 8))
    assert stage_dp_time(m, c, t, lay, 0, 32) == pytest.approx(want)


MIXTRAL_DENSE = 1_605_636_096
"""Mixtral-8x7B's non-expert parameters: 32 layers of attention (4096 x (4096 + 2 x 1024) QKV and
4096 x 4096 out), two RMSNorm weights and the 4096 x 8 router, 41,984,000 each; the untied
embedding and output layer, 32,000 x 4096 each; the final norm."""
MIXTRAL_EXPERT = 3 * 4096 * 14336
"""One SwiGLU expert: 176,160,768 parameters."""


def test_megatron_fsdp_shards_experts_over_their_group_in_the_ledger():
    # Mixtral tp 1, dp 16, ep 8 on two DGX H100 at ZeRO-3 (Megatron-FSDP optim_grads_params): each
    # GPU holds one expert of each of the 32 layers, replicated over edp = 16 / 8 = 2, and 1/16 of
    # the rest; 16 B a parameter of what it shards to. Two layer units gathered: a layer's
    # attention, norms and router and its local expert.
    m, c = planner.load_model("mixtral-8x7b"), planner.load_cluster("dgx-h100", nodes=2)
    t = TrainingSpec(global_batch_size=64, seq_length=4096)
    items = {i.name: i.bytes for i in planner.evaluate(m, c, t, Layout(dp=16, ep=8, zero_stage=3)).memory.stages[0].items}
    shard = MIXTRAL_DENSE / 16 + 32 * MIXTRAL_EXPERT / 2
    assert shard == 2_918_924_544
    assert items["weights"] == pytest.approx(2 * shard)
    assert items["gradients"] == pytest.approx(4 * shard)
    assert items["optimizer"] == pytest.approx(12 * shard)
    assert items["zero3_gather"] == pytest.approx(2 * 2 * (41_984_000 + MIXTRAL_EXPERT))
    z2 = {i.name: i.bytes for i in planner.evaluate(m, c, t, Layout(dp=16, ep=8, zero_stage=2)).memory.stages[0].items}
    assert z2["weights"] == pytest.approx(2 * (MIXTRAL_DENSE + 32 * MIXTRAL_EXPERT))  # ZeRO-2 keeps the weights
    assert z2["gradients"] == pytest.approx(4 * shard) and "zero3_gather" not in z2


def test_megatron_fsdp_gathers_and_reduces_each_layers_experts_over_their_group():
    # The same layout, 4 micro-batches (64 / 16): per micro-batch, every unit is gathered in forward
    # and again in backward (2 B/param) and its gradient reduce-scattered (FP32, 4 B): the dense
    # units (embedding, 32 layers, the output layer with the final norm) over dp 16, each layer's
    # local expert over edp 2 (GPU 0 and GPU 8, one per node). H100's dp_overlap is 0: all exposed.
    from planner.comm import collective_time
    from planner.cost import stage_dp_time
    from planner.topology import placement

    m, c = planner.load_model("mixtral-8x7b"), planner.load_cluster("dgx-h100", nodes=2)
    t = TrainingSpec(global_batch_size=64, seq_length=4096)
    assert c.calibration.dp_overlap == 0.0
    dp, edp = placement(c, (16, 1)), placement(c, (2, 8))
    assert edp.tier == "scaleout" and edp.nodes == 2 and edp.per_node == 1

    def unit(group, params):
        return (2 * collective_time(c, group, "allgather", 2 * params)
                + collective_time(c, group, "reducescatter", 4 * params))
    dense = unit(dp, 32000 * 4096) + 32 * unit(dp, 41_984_000) + unit(dp, 32000 * 4096 + 4096)
    want = 4 * (dense + 32 * unit(edp, MIXTRAL_EXPERT))
    assert stage_dp_time(m, c, t, Layout(dp=16, ep=8, zero_stage=3), 0, 32) == pytest.approx(want)
    # ZeRO-2 (optim_grads): every micro-batch's backward reduce-scatters each unit, and after the
    # step each unit's updated weights are all-gathered once
    units = [(dp, 32000 * 4096), *[(dp, 41_984_000)] * 32, (dp, 32000 * 4096 + 4096), *[(edp, MIXTRAL_EXPERT)] * 32]
    want2 = (4 * sum(collective_time(c, g, "reducescatter", 4 * n) for g, n in units)
             + sum(collective_time(c, g, "allgather", 2 * n) for g, n in units))
    assert stage_dp_time(m, c, t, Layout(dp=16, ep=8, zero_stage=2), 0, 32) == pytest.approx(want2)


def test_plan_chooses_expert_parallelism_and_explains_it():
    from planner.explain import explain

    m, c = planner.load_model("qwen3-30b-a3b"), planner.load_cluster("dgx-h100", nodes=2)
    t = TrainingSpec(global_batch_size=1024, seq_length=4096, fp8="blockwise")
    r = planner.plan(m, c, t, top_k=3, time_limit_s=60)
    assert r.status == "optimal" and r.best.layout.ep > 1
    assert r.best.time.breakdown()["ep_comm"] > 0
    lines = explain(m, c, t, sensitivities=False, time_limit_s=60)
    assert any("all-to-all moves" in x and "NVLink domain" in x for x in lines), lines
    assert any(x.startswith("Same layout with ep") for x in lines), lines


def test_explain_says_which_nvlink_domains_an_ep_group_spans():
    """On NVL72 (here 64 GPUs a domain of 4-GPU trays) an EP group of 128 spans two NVLink domains, 64 GPUs each,
    which NCCL's multi-node NVLink treats as two nodes: explain says so, not 32 trays sharing one NIC each."""
    from planner.explain import _experts

    m = planner.load_model("qwen3-30b-a3b")
    c = planner.load_cluster("gb200-nvl72", nodes=32, nvlink_domain_size=64)
    t = TrainingSpec(global_batch_size=1024, seq_length=4096)
    first = _experts(m, c, t, planner.evaluate(m, c, t, Layout(dp=128, ep=128)))[0]
    assert "across 2 NVLink domains (64 in each reach each other over NVLink)" in first, first


def test_mla_parameters_and_flops_by_hand():
    # DeepSeek-V3 attention (h 7168, a 128, r_q 1536, r_kv 512, d_qk 128, d_rope 64, d_v 128):
    # duplicated on every TP rank: Q down 7168 x 1536 + its norm 1536, KV down 7168 x 576 + its norm 512
    # = 15,140,864; split by TP: Q up 1536 x 128 x 192 = 37,748,736, KV up 512 x 128 x 256 = 16,777,216,
    # out 128 x 128 x 7168 = 117,440,512. An MoE layer's non-expert rest adds two norms (2 x 7168), the
    # router 7168 x 256 and one shared expert 3 x 7168 x 2048: 232,996,864. A middle rank of tp 2 holding
    # 4 MoE layers: 4 x ((232,996,864 - 15,140,864) / 2 + 15,140,864) = 496,275,456.
    from planner.memory import stage_params

    m = planner.load_model("deepseek-v3")
    assert m.mla_duplicated_params == 15_140_864
    assert m.attention_params == 15_140_864 + 37_748_736 + 16_777_216 + 117_440_512
    lay = Layout(tp=2, pp=16, dp=32, ep=64, etp=1, sequence_parallel=True)
    assert stage_params(m, lay, 1, 4) == 4 * ((232_996_864 - 15_140_864) / 2 + 15_140_864)
    # Model FLOPs per token at s 4096: 3 x (61 x (2 x 187,105,280 linear + 2 s a (192 + 128) core)
    # + 58 x 2 h (E + 3 (k f_e + f_s)) + 3 x 2 x 3 h f + 2 h V) = 281,152,192,512 for the main model;
    # its MTP depth adds one more MoE layer, 2 (3 h + 2 h^2) for its norms and projection and 2 h V
    # for its logits. Megatron-Bridge published 338 model TFLOP/s/GPU at 1,297 tokens/s/GPU for its
    # 25.09 H100 run, which trains that depth: 260.6 GFLOP per token with causal attention counted at
    # half, and ours less 3 x 62 x s a 320 is 260.6 too.
    from planner.cost import model_flops_per_token

    s, h, a, V = 4096, 7168, 128, 129_280
    main = 3 * (61 * (2 * 187_105_280 + 2 * s * a * 320) + 58 * 2 * h * (256 + 3 * (8 * 2048 + 2048))
                + 3 * 2 * 3 * h * 18432 + 2 * h * V)
    assert main == 281_152_192_512
    assert model_flops_per_token(m.model_copy(update={"mtp_layers": 0}), s) == main
    want = main + 3 * (2 * 187_105_280 + 2 * s * a * 320 + 2 * h * (256 + 3 * (8 * 2048 + 2048))
                       + 2 * (3 * h + 2 * h * h) + 2 * h * V)
    assert model_flops_per_token(m, s) == want
    assert (want - 3 * 62 * s * a * 320) / 1e9 == pytest.approx(338e12 / 1297 / 1e9, rel=0.001)
    # the attention core one GPU times: QK^T over 192-wide heads and PV over 128-wide ones, halved causal
    from planner.cost import _attention_flops

    assert _attention_flops(m, 1, s, 1, 2, causal=True) == 2 * s * s * a * (192 + 128) / 2 / 2


def test_mla_activations_by_hand():
    # DeepSeek-V3, b 1, s 4096, one GPU, BF16, flash. Per token [MLASelfAttention]: RMSNorm1 input and the
    # down-projection input 2h + 2h, q norm input + q_up input 4 r_q, kv norm input + kv_up input 4 r_kv,
    # Q and K after RoPE 2 x 2 a 192, V 2 a 128, the output 2 a 128, lse 4a, four fp32 rstd 16, RMSNorm2
    # input + FC1 input 4h: 229,904 B; a dense layer's SwiGLU adds 6f (f 18,432), an MoE layer's shared
    # expert 6 x 2048 and its routed tokens (N = 4096 x top 8): router 8 N E, FC1 input 2 (8N) h,
    # SwiGLU input 2 (8N) 2 f_e, FC2 input 2 (8N) f_e.
    from planner.memory import activation_bytes_per_layer

    m = planner.load_model("deepseek-v3")
    h, a, s = 7168, 128, 4096
    attention = 8 * h + 16 + 4 * 1536 + 4 * 512 + 2 * 2 * a * 192 + 2 * a * 128 + 4 * a + 2 * a * 128
    assert activation_bytes_per_layer(m, 1, s, moe_layer=False) == s * (attention + 6 * 18432)
    routed = 8 * s * 256 + 2 * 8 * s * h + 2 * 8 * s * 2 * 2048 + 2 * 8 * s * 2048
    assert activation_bytes_per_layer(m, 1, s) == s * (attention + 6 * 2048) + routed


def test_leading_dense_layers_are_priced_on_the_first_rank():
    # DeepSeek-V3's first rank holds the 3 dense layers and 2 MoE layers: its compute equals 3 layers of
    # a dense twin (same attention, the dense MLP) plus 2 of an MoE twin without dense layers, each
    # priced on its own code path; a middle rank holding 5 layers is 5 MoE layers.
    from planner.cost import stage_time

    m = planner.load_model("deepseek-v3")
    dense_twin = m.model_copy(update={"moe": None})
    moe_twin = m.model_copy(update={"moe": m.moe.model_copy(update={"first_dense_layers": 0})})
    c, t = planner.load_cluster("dgx-h100", nodes=128), TrainingSpec(global_batch_size=8192, seq_length=4096)
    lay = Layout(tp=2, pp=16, dp=32, ep=64, etp=1, sequence_parallel=True)
    one_dense = stage_time(dense_twin, c, t, lay.model_copy(update={"ep": 1, "etp": None}), 1, 1)
    one_moe = stage_time(moe_twin, c, t, lay, 1, 1)
    first = stage_time(m, c, t, lay, 0, 5)
    assert first.compute == pytest.approx(3 * one_dense.compute + 2 * one_moe.compute)
    assert first.ep_comm == pytest.approx(2 * one_moe.ep_comm)
    assert stage_time(m, c, t, lay, 1, 5).compute == pytest.approx(5 * one_moe.compute)
    from planner.space import layout_problems

    # an explicit split places them where it puts the first layers: 2 on rank 0, 1 on rank 1
    split = lay.model_copy(update={"pipeline_layers": (2, 5, *[4] * 13, 2)})
    assert layout_problems(m, c, t, split) == []
    assert stage_time(m, c, t, split, 1, 5).compute == pytest.approx(one_dense.compute + 4 * one_moe.compute)
    from planner.cost import pipeline_time

    stages = pipeline_time(m, c, t, split).stages  # every rank priced with its own dense layers
    assert stages[1].compute == pytest.approx(one_dense.compute + 4 * one_moe.compute)
    assert stages[2].compute == pytest.approx(4 * one_moe.compute)
    # without one, the first virtual stage must hold all three
    bad = layout_problems(m, c, t, lay.model_copy(update={"first_stage_layers": 2, "last_stage_layers": 3}))
    assert any("fewer than the 3 leading dense layers" in b for b in bad), bad


def test_load_imbalance_scales_the_busiest_rank():
    # 1.5x the mean tokens on the busiest EP rank: its routed GEMM FLOPs, all-to-all volume and receive
    # buffers grow 1.5x; the router (on the rank's own tokens) does not.
    from planner.comm import alltoall_time
    from planner.cost import moe_time
    from planner.memory import moe_routed_bytes
    from planner.topology import placement

    m = planner.load_model("qwen3-30b-a3b")
    c = planner.load_cluster("dgx-h100", nodes=2)
    flat = c.calibration.model_copy(update={"gemm_efficiency": [(1e-3, 1.0), (1e9, 1.0)], "grouped_gemm_call": 0.0})
    c = c.model_copy(update={"calibration": flat})
    h, E, k, fe, n = 2048, 128, 8, 768, 4096
    t = TrainingSpec(global_batch_size=64, seq_length=4096, moe_imbalance=1.5)
    got = moe_time(m, c, t, tp=1, cp=1, b=1, ep=16, etp=1)
    assert got.gemm == pytest.approx((2 * n * h * E + 1.5 * 2 * n * k * 3 * h * fe) / 989e12)
    group = placement(c, (16, 1))
    assert got.ep == pytest.approx(2 * (alltoall_time(c, group, 1.5 * 2 * n * k * h) + alltoall_time(c, group, 1.5 * 4 * n * k)))
    assert moe_routed_bytes(m, n, 1, routing=MoERouting(1.5)) - moe_routed_bytes(m, n, 1) == pytest.approx(
        0.5 * (moe_routed_bytes(m, n, 1) - 8 * n * E))
    with pytest.raises(planner.SpecError, match="moe_imbalance"):
        TrainingSpec(global_batch_size=64, seq_length=4096, moe_imbalance=0.9)


def test_capacity_factor_caps_and_padding_fixes_the_routed_rows():
    """Megatron's token dropping on Qwen3-30B-A3B (h 2048, 128 experts, top 8, f_e 768), 4,096 tokens a GPU
    at ep 16 over two DGX H100. Capacity per source rank and expert: ceil(4096 x 8 / 128 x c) (moe_utils.
    get_capacity). Padded at c = 1.1: ceil(281.6) = 282 rows from each rank to each expert, so each GPU's 8
    experts compute 8 x 16 x 282 = 128 x 282 = 36,096 rows (dropless: 32,768), and each rank sends 36,096
    rows (num_out_tokens = capacity x num_experts). Dropping without padding caps the busiest rank at c
    times the mean: at imbalance 1.5, c = 1.25 leaves 40,960 rows, c = 2 leaves the 49,152 the imbalance
    gives. Saved bytes (BF16): router 8 x 4096 x 128, FC1 input 2 R h, SwiGLU input 2 R 2 f_e, FC2 input
    2 R f_e: at R = 36,096, 4,194,304 + 147,849,216 + 110,886,912 + 55,443,456 = 318,373,888 B."""
    from planner.comm import alltoall_time
    from planner.cost import moe_time
    from planner.memory import moe_routed_bytes, routed_rows
    from planner.topology import placement

    m = planner.load_model("qwen3-30b-a3b")
    n = 4096
    assert routed_rows(m, n, 1, MoERouting(capacity_factor=1.1, pad=True)) == 36_096
    assert routed_rows(m, n / 2, 2, MoERouting(capacity_factor=1.1, pad=True)) == 128 * 2 * 141  # tp = etp 2: ceil(140.8)
    assert routed_rows(m, n, 1, MoERouting(1.5, 1.25)) == 40_960
    assert routed_rows(m, n, 1, MoERouting(1.5, 2.0)) == 49_152
    assert routed_rows(m, n, 1, MoERouting(capacity_factor=1.0)) == 32_768  # balanced: nothing to drop
    assert moe_routed_bytes(m, n, 1, routing=MoERouting(capacity_factor=1.1, pad=True)) == 318_373_888
    c = planner.load_cluster("dgx-h100", nodes=2)
    flat = c.calibration.model_copy(update={"gemm_efficiency": [(1e-3, 1.0), (1e9, 1.0)], "grouped_gemm_call": 0.0})
    c = c.model_copy(update={"calibration": flat})
    t = TrainingSpec(global_batch_size=64, seq_length=4096, moe_capacity_factor=1.1, moe_pad_to_capacity=True)
    got = moe_time(m, c, t, tp=1, cp=1, b=1, ep=16, etp=1)
    assert got.gemm == pytest.approx((2 * n * 2048 * 128 + 2 * 36_096 * 3 * 2048 * 768) / 989e12)
    group = placement(c, (16, 1))
    assert got.ep == pytest.approx(2 * (alltoall_time(c, group, 2 * 36_096 * 2048) + alltoall_time(c, group, 4 * 36_096)))
    # permutations: the 36,096 padded rows out and the same sorted over the 8 local experts, each undone in
    # combine, read and written in BF16 (4 B an element), at the cluster's HBM speed
    hbm = c.gpu.hbm_bandwidth * c.calibration.hbm_efficiency
    assert got.memory == pytest.approx(4 * 2 * (36_096 + 36_096) * 2048 / hbm)
    # the step prices it: padding costs time, dropping under balanced routing does not
    mc, lay = planner.load_cluster("dgx-h100", nodes=2), Layout(pp=2, dp=8, ep=8, zero_stage=1, recompute="full")
    base = TrainingSpec(global_batch_size=64, seq_length=4096)
    dropless = planner.evaluate(m, mc, base, lay).step_time_s
    dropped = planner.evaluate(m, mc, base.model_copy(update={"moe_capacity_factor": 1.25}), lay).step_time_s
    padded = planner.evaluate(m, mc, base.model_copy(update={"moe_capacity_factor": 1.25, "moe_pad_to_capacity": True}),
                              lay).step_time_s
    assert dropped == dropless < padded
    with pytest.raises(planner.SpecError, match="'moe_pad_to_capacity': needs moe_capacity_factor"):
        TrainingSpec(global_batch_size=64, seq_length=4096, moe_pad_to_capacity=True)
    with pytest.raises(planner.PlannerError, match="moe_pad_to_capacity does not run with the deepep dispatcher"):
        planner.evaluate(m, mc, base.model_copy(update={"moe_capacity_factor": 1.0, "moe_pad_to_capacity": True}),
                         lay.model_copy(update={"etp": 1, "moe_dispatcher": "deepep"}))
    with pytest.raises(planner.PlannerError, match="moe_capacity_factor needs a Mixture-of-Experts model"):
        planner.evaluate(planner.load_model("llama3-8b"), mc, base.model_copy(update={"moe_capacity_factor": 1.0}),
                         Layout(dp=16, zero_stage=1))
    # offered DeepEP, a padded search keeps Megatron's all-to-all (DeepEP does not pad)
    pick = planner.plan(m, mc, base.model_copy(update={"moe_capacity_factor": 1.0, "moe_pad_to_capacity": True}),
                        top_k=1, structural=False, moe_dispatcher=["alltoall", "deepep"]).best
    assert pick.layout.moe_dispatcher == "alltoall"


def test_deepep_sends_a_token_once_per_remote_node():
    # EP 16 over two DGX H100, 128 experts (64 per node), top 8. A token misses the other node with
    # probability C(64, 8) / C(128, 8) = prod (64 - i) / (128 - i), i < 8 (0.0031), so it crosses the
    # network 0.9969 times instead of the all-to-all's 8 x 8/16 = 4. 1e7 tokens of 4 KiB rows (past the
    # largest measured size: full busbw): network 1e7 x 4096 x 0.9969 at 47 GB/s, NVLink 1e7 x 8 x 4096
    # x 15/16 at 370 GB/s; the slower (NVLink here) + 20 us. Inside one node: NVLink only, + 25 us.
    from planner.comm import node_dedup_alltoall_time
    from planner.topology import placement

    c = planner.load_cluster("dgx-h100", nodes=2)
    miss = 1.0
    for i in range(8):
        miss *= (64 - i) / (128 - i)
    assert miss == pytest.approx(0.0031, abs=1e-4)
    net = 1e7 * 4096 * (1 - miss) / 47e9
    nvl = 1e7 * 8 * 4096 * 15 / 16 / 370e9
    assert node_dedup_alltoall_time(c, placement(c, (16, 1)), 1e7, 4096, 8, 128) == pytest.approx(20e-6 + max(net, nvl))
    assert node_dedup_alltoall_time(c, placement(c, (8, 1)), 1e7, 4096, 8, 128) == pytest.approx(
        25e-6 + 1e7 * 8 * 4096 * 7 / 8 / 370e9)


def test_deepep_is_searched_when_allowed_and_emitted_as_megatrons_flex_dispatcher():
    from planner.space import layout_problems

    m, c = planner.load_model("qwen3-30b-a3b"), planner.load_cluster("dgx-h100", nodes=2)
    t = TrainingSpec(global_batch_size=1024, seq_length=4096)
    r = planner.plan(m, c, t, top_k=1, structural=False, ep=16, moe_dispatcher=["alltoall", "deepep"])
    lay = r.best.layout
    assert lay.moe_dispatcher == "deepep" and lay.ep == 16  # two nodes: DeepEP sends a quarter of the bytes
    args = r.best.to_megatron().args
    i = args.index("--moe-token-dispatcher-type")
    assert list(args[i + 1: i + 4]) == ["flex", "--moe-flex-dispatcher-backend", "deepep"]
    assert "etp 1" in " ".join(layout_problems(m, c, t, Layout(tp=2, dp=8, ep=8, sequence_parallel=True,
                                                               moe_dispatcher="deepep")))
    with pytest.raises(PlannerError, match="moe_dispatcher"):
        planner.plan(m, c, t, moe_dispatcher="nccl")


def test_explain_offers_deepep_when_the_ep_group_crosses_nodes():
    from planner.explain import explain

    m, c = planner.load_model("qwen3-30b-a3b"), planner.load_cluster("dgx-h100", nodes=2)
    lines = explain(m, c, TrainingSpec(global_batch_size=1024, seq_length=4096), sensitivities=False, ep=16)
    assert any("across 2 nodes" in x for x in lines), lines
    assert any("--moe-dispatcher alltoall,deepep" in x for x in lines), lines


def _two_stream_schedule(pre_f, m_f, m_b, pre_b, a_f, a_b):
    """Event-by-event replay of Megatron's combined 1F1B for one layer (model_chunk_schedule_plan.py:
    TransformerLayerSchedulePlan.run): kernels issue in code order on a compute and a comm stream; each
    starts when its stream is free and its input is ready."""
    comp = comm = 0.0
    done = {}

    def run(stream, name, dur, *after):
        nonlocal comp, comm
        start = max([comp if stream == "comp" else comm] + [done[d] for d in after])
        done[name] = start + dur
        if stream == "comp":
            comp = done[name]
        else:
            comm = done[name]

    run("comm", "combine_b", a_b)
    run("comp", "pre_f", pre_f)
    run("comp", "mlp_b", m_b, "combine_b")
    run("comm", "dispatch_f", a_f, "pre_f")
    run("comm", "dispatch_b", a_b, "mlp_b")
    run("comp", "mlp_f", m_f, "dispatch_f")
    run("comm", "combine_f", a_f, "mlp_f")
    run("comp", "pre_b", pre_b, "dispatch_b")
    return max(done.values())


@pytest.mark.parametrize("seed", range(6))
def test_ep_overlap_exposes_what_the_two_streams_cannot_hide(seed):
    import random

    from planner.cost import LayerTime, ep_overlap_exposed

    rnd = random.Random(seed)
    pre_f, m_f, a = rnd.uniform(0.5, 3), rnd.uniform(0.5, 3), rnd.uniform(0.1, 4)
    tp = rnd.uniform(0, 0.3)
    lt = LayerTime(fwd=pre_f + m_f, bwd=2 * (pre_f + m_f), attn_fwd=0.2, tp_fwd=tp, tp_bwd=tp, cp_fwd=0.0,
                   cp_bwd=0.0, ep_fwd=2 * a, ep_bwd=2 * a, mlp_fwd=m_f, mlp_bwd=2 * m_f)
    alone = (pre_f + tp) + m_f + 2 * m_f + (2 * pre_f + tp)  # the compute of one forward and one backward
    replay = _two_stream_schedule(pre_f + tp, m_f, 2 * m_f, 2 * pre_f + tp, a, a)
    assert ep_overlap_exposed(lt) == pytest.approx(replay - alone, abs=1e-12)


def test_ep_overlap_hides_the_all_to_all_behind_the_other_micro_batch():
    """Qwen3-30B on 16 H100, EP 8 in a node: overlapped, the paired micro-batches expose only what the
    streams cannot hide; the first forward and last backward expose theirs whole (pp 1: one of m);
    one layer more than a micro-batch is in flight (micro-batch i+1's layer j is built while micro-batch
    i's layer 47 - j is freed: 48 + 1 layers); Megatron gets the flag."""
    from planner.cost import _layer_time, ep_overlap_exposed

    m, c = planner.load_model("qwen3-30b-a3b"), planner.load_cluster("dgx-h100", nodes=2)
    t = TrainingSpec(global_batch_size=256, seq_length=4096)
    off = Layout(tp=1, pp=1, dp=16, ep=8, zero_stage=1, micro_batch_size=2)
    on = off.model_copy(update={"ep_overlap": True})
    a, b = planner.evaluate(m, c, t, off), planner.evaluate(m, c, t, on)
    lt = _layer_time(m, c, t, off)
    micro = 256 // (16 * 2)
    whole, paired = lt.ep_fwd + lt.ep_bwd, ep_overlap_exposed(lt)
    assert paired < whole
    assert b.time.breakdown()["ep_comm"] == pytest.approx(48 * micro * (paired + (whole - paired) / micro), rel=1e-9)
    assert a.time.breakdown()["ep_comm"] == pytest.approx(48 * micro * whole, rel=1e-9)
    act = lambda p: p.memory.peak_stage.get("activations")  # noqa: E731
    assert act(b) == pytest.approx(act(a))  # one micro-batch in flight either way ...
    assert b.memory.peak_stage.get("ep_overlap_layer") == pytest.approx(act(a) / 48)  # ... and one of its 48 layers
    assert a.memory.peak_stage.get("ep_overlap_layer") == 0
    assert "--overlap-moe-expert-parallel-comm" in b.to_megatron().args
    assert "--overlap-moe-expert-parallel-comm" not in a.to_megatron().args
    assert "ov=ep" in b.layout.short()


def test_ep_overlap_with_tp_on_hopper_gets_more_than_one_hardware_queue(megatron_path):
    """The EP overlap needs CUDA_DEVICE_MAX_CONNECTIONS > 1 (megatron-core transformer/moe/README.md), TP on Hopper
    asks for 1: with the overlap on, the launch takes Megatron-Bridge's performance scripts' value (32 under DeepEP,
    8 with the all-to-all dispatcher; scripts/performance/utils/overrides.py), without it 1, on Blackwell none; and
    megatron-core 0.19.2's own validate_args accepts each (it only warns where TP meets the overlap)."""
    pytest.importorskip("torch")
    from planner.check import check_megatron, megatron_payload

    m, t = planner.load_model("qwen3-30b-a3b"), TrainingSpec(global_batch_size=256, seq_length=4096)
    h100, b200 = planner.load_cluster("dgx-h100", nodes=2), planner.load_cluster("dgx-b200", nodes=2)
    base = Layout(tp=2, pp=1, dp=8, ep=8, etp=1, zero_stage=1, micro_batch_size=2, sequence_parallel=True)
    cases = [(h100, base.model_copy(update={"ep_overlap": True}), "8"),
             (h100, base.model_copy(update={"ep_overlap": True, "moe_dispatcher": "deepep"}), "32"),
             (h100, base, "1"), (b200, base.model_copy(update={"ep_overlap": True}), None)]
    plans = [planner.evaluate(m, c, t, lay) for c, lay, _ in cases]
    assert [p.to_megatron().env.get("CUDA_DEVICE_MAX_CONNECTIONS") for p in plans] == [want for *_, want in cases]
    results = check_megatron([megatron_payload(p.to_megatron().args, p.num_gpus, p.to_megatron().env, p.cluster.gpu.arch)
                              for p in plans])
    assert [r.ok for r in results] == [True] * 4, [r.line() for r in results]
    from planner.explain import _experts  # explain says which queue count the launch sets, and why

    said = [next(x for x in _experts(m, p.cluster, t, p) if "EP overlap" in x) for p in plans]
    assert "the launch sets 8" in said[0] and "the launch sets 32" in said[1]
    assert not any("CUDA_DEVICE_MAX_CONNECTIONS" in x for x in said[2:])


def test_interleaved_ep_overlap_runs_one_more_warm_up_chunk():
    """Megatron's interleaved warm-up is 2(p - i - 1) + (v - 1) p chunk-micro-batches, one more with
    overlap_moe_expert_parallel_comm, each rank then holding one more [megatron-core 0.19.2
    pipeline_parallel/schedules.py: get_pp_rank_microbatches]: p 4, v 2, rank 0 holds
    (6 + 4 + 1 + 1) / 2 = 6 micro-batches' worth of layers instead of 5.5; the last rank (0 + 4 + 1 + 1) / 2
    = 3 instead of 2.5; capped at m v chunks (m 2: 4 / 2 = 2)."""
    from planner.memory import in_flight_microbatches
    ov, base = Layout(pp=4, vpp=2, ep=8, dp=8, ep_overlap=True), Layout(pp=4, vpp=2, ep=8, dp=8)
    assert (in_flight_microbatches(ov, 0, 16), in_flight_microbatches(base, 0, 16)) == (6.0, 5.5)
    assert (in_flight_microbatches(ov, 3, 16), in_flight_microbatches(base, 3, 16)) == (3.0, 2.5)
    assert in_flight_microbatches(ov, 0, 2) == 2.0


def test_ep_overlap_rules_are_megatrons():
    m, c = planner.load_model("qwen3-30b-a3b"), planner.load_cluster("dgx-h100", nodes=2)
    t = TrainingSpec(global_batch_size=256, seq_length=4096)
    for lay, match in ((Layout(tp=1, pp=1, dp=16, ep=1, ep_overlap=True), "needs ep > 1"),
                       (Layout(tp=1, pp=2, dp=8, ep=8, ep_overlap=True), "needs interleaving"),
                       (Layout(tp=1, pp=1, dp=16, ep=8, recompute="full", ep_overlap=True), "full recompute")):
        with pytest.raises(PlannerError, match=match):
            planner.evaluate(m, c, t, lay)
    with pytest.raises(PlannerError, match="ep_overlap"):
        planner.evaluate(planner.load_model("llama3-8b"), c, t, Layout(tp=1, dp=16, ep_overlap=True))


def test_search_turns_ep_overlap_on_where_it_pays_and_obeys_the_constraint():
    m, c = planner.load_model("qwen3-30b-a3b"), planner.load_cluster("dgx-h100", nodes=2)
    t = TrainingSpec(global_batch_size=1024, seq_length=4096)
    r = planner.plan(m, c, t, time_limit_s=60, structural=False, ep_overlap="both")
    assert r.status == "optimal" and r.best.layout.ep > 1 and r.best.layout.ep_overlap
    off = planner.plan(m, c, t, time_limit_s=60, structural=False)  # Megatron's default: off
    assert not off.best.layout.ep_overlap and off.best.step_time_s > r.best.step_time_s
    with pytest.raises(PlannerError, match="constraint ep_overlap"):
        planner.plan(m, c, t, ep_overlap="sometimes")
    from planner.explain import _experts

    line = next(x for x in _experts(m, c, t, r.best) if "EP overlap" in x)
    without = planner.evaluate(m, c, t, r.best.layout.model_copy(update={"ep_overlap": False}))
    assert f"is on; without it the step would take {without.step_time_s / r.best.step_time_s - 1:+.1%}" in line


# --- Megatron's --recompute-modules (Layout.recompute_modules) -----------------------------------


def _freed(m, modules, **kw):
    from planner.memory import activation_bytes_per_layer

    none = activation_bytes_per_layer(m, 1, 4096, recompute="none", **kw)
    return none - activation_bytes_per_layer(m, 1, 4096, recompute="selective", recompute_modules=modules, **kw)


def test_recompute_modules_free_what_megatrons_output_discarding_checkpoints_drop():
    """DeepSeek-V3, one 4096-token sequence, TP 1 (a = 128 heads, d_qk 128, d_rope 64, d_v 128, h 7168,
    top-8 of 2048-wide experts, 18432-wide dense MLP), by hand from megatron-core's modules:
    mla_up_proj drops Q and K after RoPE and V: 2 * 4096 * 128 * (192 + 192 + 128) B; moe_act the
    routed activation output: 2 * 4096 * 8 * 2048 B; layernorm the MLA input norm's and the MoE
    pre-MLP norm's outputs: 2 * 2 * 4096 * 7168 B; mlp (dense layers) the norm rstd, FC1 input,
    SwiGLU input and FC2 input: 4*4096 + 2*4096*7168 + 4*4096*18432 + 2*4096*18432 B."""
    m = planner.load_model("deepseek-v3")
    up, act, norms = 536_870_912, 134_217_728, 117_440_512
    assert _freed(m, ("mla_up_proj",)) == pytest.approx(up)
    assert _freed(m, ("moe_act",)) == pytest.approx(act)
    assert _freed(m, ("layernorm",)) == pytest.approx(norms)
    assert _freed(m, ("layernorm", "mla_up_proj", "moe_act")) == pytest.approx(up + act + norms)
    assert _freed(m, ("mlp",), moe_layer=False) == pytest.approx(511_721_472)
    assert _freed(m, ("moe_act",), moe_layer=False) == 0 and _freed(m, ("mlp",)) == 0
    # FP8 linears save 1 B inputs, and Megatron has them save the original instead (set_save_original_input),
    # so moe_act frees the 1 B FC2 input; the MLA norm's kept copy is 1 B, the MoE norm's BF16 output
    # plus the shared expert's 1 B copy
    assert _freed(m, ("moe_act",), fp8_inputs=True) == pytest.approx(act / 2)
    assert _freed(m, ("layernorm",), fp8_inputs=True) == pytest.approx(4096 * 7168 + 2 * 4096 * 7168 + 4096 * 7168)
    # the attention core alone is Megatron's default: only the fp32 logsumexp goes (flash)
    assert _freed(m, ("core_attn",)) == pytest.approx(4 * 128 * 4096)


def test_recompute_modules_are_priced_as_the_passes_and_gemms_they_rerun():
    """Qwen3-30B-A3B (48 MoE layers, h 2048, top-8 of 768-wide experts, norms fused into QKV) on 8 H100:
    moe_act re-reads the routed FC1 output and writes the activation, 2 B x 32768 rows x 3 x 768 per
    layer; layernorm re-runs the pre-MLP norm, a read and a write of 2 B x 4096 x 2048; at the
    cluster's streaming bandwidth (3.35 TB/s x 0.89). MLA's up-projection FLOPs by hand."""
    from planner.cost import mla_up_proj_flops

    m, c = planner.load_model("qwen3-30b-a3b"), planner.load_cluster("dgx-h100")
    t = TrainingSpec(global_batch_size=64, seq_length=4096)
    bw = 3350e9 * 0.89

    def rc(modules):
        lay = Layout(dp=8, ep=8, zero_stage=1, recompute="selective", recompute_modules=modules)
        return planner.evaluate(m, c, t, lay).time.pipeline.stages[0].recompute

    assert rc(("moe_act",)) == pytest.approx(48 * 2 * 32768 * 3 * 768 / bw, rel=1e-3)
    assert rc(("layernorm",)) == pytest.approx(48 * 2 * 2 * 4096 * 2048 / bw, rel=1e-3)
    assert rc(("layernorm", "moe_act")) == pytest.approx(rc(("layernorm",)) + rc(("moe_act",)), rel=1e-3)
    assert rc(("moe_act",)) < rc(("core_attn",))
    # DeepSeek-V3 (h 7168) keeps MLA's input norm as a module of its own too: two norms per MoE layer,
    # one in a leading dense layer (its MLP norm is fused into FC1)
    from planner.cost import _layer_time_of

    ds = planner.load_model("deepseek-v3")
    for dense, norms in ((False, 2), (True, 1)):
        lt = _layer_time_of(ds, c, t, 1, 1, 1, False, False, 8, 1, dense)
        assert lt.recompute_of(("layernorm",)) == pytest.approx(norms * 2 * 2 * 4096 * 7168 / bw, rel=1e-3)
    assert mla_up_proj_flops(planner.load_model("deepseek-v3"), 4096, 1) == pytest.approx(
        [2 * 4096 * 1536 * 128 * 192, 2 * 4096 * 512 * 128 * 256])


def test_recompute_modules_follow_megatrons_rules_and_reach_only_megatron():
    from planner.space import layout_problems

    moe, c = planner.load_model("qwen3-30b-a3b"), planner.load_cluster("dgx-h100")
    t = TrainingSpec(global_batch_size=64, seq_length=4096)
    lay = Layout(dp=8, ep=8, zero_stage=1, recompute="selective", recompute_modules=("mla_up_proj",))
    assert any("mla_up_proj" in p and "multi-latent" in p for p in layout_problems(moe, c, t, lay))
    dense = planner.load_model("llama3-8b")
    lay = Layout(dp=8, zero_stage=1, recompute="selective", recompute_modules=("moe_act",))
    assert any("'moe_act' needs an MoE model" in p for p in layout_problems(dense, c, t, lay))
    lay = Layout(dp=8, ep=8, zero_stage=1, recompute="selective", recompute_modules=("layernorm",))
    assert any("Delayed scaling" in p for p in layout_problems(moe, c, t.model_copy(update={"fp8": "delayed"}), lay))
    assert not layout_problems(moe, c, t.model_copy(update={"fp8": "tensorwise"}), lay)
    with pytest.raises(planner.SpecError, match="recompute_modules.*selective"):
        Layout(recompute="full", recompute_modules=("moe_act",))
    with pytest.raises(planner.SpecError, match="recompute_modules"):
        Layout(recompute="selective", recompute_modules=("shared_experts",))  # not priced
    lay = Layout(dp=8, zero_stage=1, recompute="selective", recompute_modules=("moe",))
    assert any("'moe' needs an MoE model" in p for p in layout_problems(dense, c, t, lay))
    assert Layout(recompute="selective", recompute_modules="moe_act,layernorm").recompute_modules == ("layernorm", "moe_act")
    p = planner.evaluate(dense, c, t, Layout(dp=8, zero_stage=1, recompute="selective", recompute_modules=("mlp",)))
    assert "--recompute-modules" in p.to_megatron().args
    ds = planner.evaluate(dense, c, t.model_copy(update={"optimizer_impl": "deepspeed"}), p.layout)
    with pytest.raises(PlannerError, match="Megatron-DeepSpeed: selective recompute re-runs the attention core only"):
        ds.to_deepspeed()


def test_the_megatron_search_offers_the_recipes_recompute_modules_for_moe_and_mla():
    """A second selective option beside the attention core: the output-discarding checkpoints that
    apply to the model (Megatron refuses layernorm / moe_act under delayed scaling); nothing for dense
    models or for targets without --recompute-modules."""
    from planner.space import build_space, offered_recompute_modules

    c = planner.load_cluster("dgx-h100", nodes=2)
    t = TrainingSpec(global_batch_size=256, seq_length=4096)
    moe, mla, dense = planner.load_model("qwen3-30b-a3b"), planner.load_model("deepseek-v3"), planner.load_model("llama3-8b")

    def offered(model, training=t, framework="megatron"):
        sp = build_space(model, c, training, framework=framework)
        return {o[2] for opts in sp.recomputes.values() for o in opts if len(o) > 2}

    assert offered(moe) == {("layernorm", "moe_act")}
    assert offered(mla) == {("layernorm", "mla_up_proj", "moe_act")}
    assert offered(mla, t.model_copy(update={"fp8": "delayed"})) == {("mla_up_proj",)}
    assert offered(moe, t.model_copy(update={"fp8": "delayed"})) == set()
    assert offered(dense) == set()
    assert offered_recompute_modules(moe, t, "deepspeed") is None and offered_recompute_modules(moe, t, "torchtitan") is None
    sp = build_space(moe, c, t, framework="megatron", constraints={"recompute": "none"})
    assert all(len(o) == 2 for opts in sp.recomputes.values() for o in opts)
    r = planner.plan(moe, c, t, framework="megatron", recompute="selective", top_k=1, structural=False, time_limit_s=60)
    assert r.best.layout.recompute_modules == ("layernorm", "moe_act")  # cheaper than the attention core, same memory class


def test_h800_is_the_h100_die_with_eight_nvlink_links():
    """The cluster DeepSeek-V3 trained on: H100 compute and HBM, NVLink at the 160 GB/s its report gives
    (the H100's 370 GB/s ring x 8 / 18 links = 164), one 400G NIC per GPU; an EP-8 all-to-all inside
    a node therefore costs about 370 / 160 = 2.3 times the H100's."""
    from planner.comm import alltoall_time
    from planner.topology import placement

    h800, h100 = planner.load_cluster("h800", nodes=2), planner.load_cluster("dgx-h100", nodes=2)
    assert h800.gpu.peak_bf16_flops == h100.gpu.peak_bf16_flops and h800.gpu.memory == h100.gpu.memory
    assert h800.nvlink.ring_busbw == 160e9 and h800.scaleout.nic_busbw == h100.scaleout.nic_busbw
    big = 2 * 4096 * 8 * 7168 * 8  # one micro-batch's dispatch, 8 MiB per peer and more
    slow = alltoall_time(h800, placement(h800, (8, 1)), big) / alltoall_time(h100, placement(h100, (8, 1)), big)
    assert slow == pytest.approx(370 / 160, rel=0.1)


# Dense layers interleaved with MoE ones (MoESpec.layer_step): Llama-4 Maverick

def llama4_maverick():
    """Llama-4 Maverick's text model as NeMo's Llama4Experts128Config builds it (48 layers, h 5120,
    40 heads of 128, 8 KV heads, dense MLPs of 16,384, 128 experts of 8,192 top-1 beside one shared
    expert of 8,192, vocabulary 202,048; MoE every second layer, interleave_moe_layer_step 2)."""
    return ModelSpec(name="llama4-maverick", family="llama", num_layers=48, hidden_size=5120, num_attention_heads=40,
                     num_kv_heads=8, ffn_hidden_size=16384, vocab_size=202048,
                     moe={"num_experts": 128, "top_k": 1, "expert_ffn_hidden_size": 8192,
                          "shared_expert_ffn_hidden_size": 8192, "layer_step": 2})


def test_llama4_maverick_counts_its_alternating_layers():
    """Per layer: attention 2 x 5120^2 + 2 x 5120 x 1024 and two norms; a dense layer's MLP 3 x 5120 x
    16384; an MoE layer's router 5120 x 128, 128 experts of 3 x 5120 x 8192 (one active) and the
    shared one. 24 of each, the embedding and output layer 202,048 x 5120 each and the final norm:
    400.7B in all and 17.2B active, Meta's 400B / 17B to their rounding."""
    m = llama4_maverick()
    attn, expert = 2 * 5120**2 + 2 * 5120 * 1024 + 2 * 5120, 3 * 5120 * 8192
    dense, moe_base = attn + 3 * 5120 * 16384, attn + 5120 * 128 + expert
    ends = 2 * 202048 * 5120 + 5120
    assert [m.is_moe_layer(i) for i in range(48)] == [False, True] * 24 and (m.moe_layers, m.dense_layers) == (24, 24)
    assert m.num_params == 24 * dense + 24 * (moe_base + 128 * expert) + ends
    assert m.active_params == 24 * dense + 24 * (moe_base + expert) + ends
    assert m.num_params == pytest.approx(400e9, rel=0.005) and m.active_params == pytest.approx(17e9, rel=0.02)
    with pytest.raises(ValueError, match=r"layer_step \(2\) must divide the layers after the leading dense ones \(47 - 0\)"):
        ModelSpec.model_validate({**m.model_dump(), "num_layers": 47})


def test_interleaved_layers_are_priced_and_held_where_they_fall():
    """A rank's layers are counted one by one: at pp 4 each even rank of 12 holds 6 dense and 6 MoE
    layers, and its compute is 6 layers of a dense twin plus 6 of an all-MoE twin, its EP traffic that
    of the 6 MoE layers, its expert weights 6 layers' 128 x 3 x 5120 x 8192 / (ep 16 x etp 1). An
    explicit split (13, 11, 12, 12) gives rank 0 layers 0-12 (7 dense: 0, 2, ..., 12) and rank 1
    layers 13-23 (5 dense: 14, ..., 22)."""
    from planner.cost import stage_time
    from planner.memory import dense_layers_on, param_shards

    m = llama4_maverick()
    dense_twin = m.model_copy(update={"moe": None})
    moe_twin = m.model_copy(update={"moe": m.moe.model_copy(update={"layer_step": 1})})
    c, t = planner.load_cluster("dgx-h100", nodes=64), TrainingSpec(global_batch_size=1024, seq_length=8192)
    lay = Layout(tp=4, pp=4, dp=32, ep=16, etp=1, sequence_parallel=True)
    one_dense = stage_time(dense_twin, c, t, lay.model_copy(update={"ep": 1, "etp": None}), 1, 1)
    one_moe = stage_time(moe_twin, c, t, lay, 1, 1)
    assert [dense_layers_on(m, lay, r) for r in range(4)] == [6, 6, 6, 6]
    mid = stage_time(m, c, t, lay, 1, 12)
    assert mid.compute == pytest.approx(6 * one_dense.compute + 6 * one_moe.compute)
    assert mid.ep_comm == pytest.approx(6 * one_moe.ep_comm)
    assert param_shards(m, lay, 1, 12)[1].params == 6 * 128 * 3 * 5120 * 8192 / 16
    split = lay.model_copy(update={"pipeline_layers": (13, 11, 12, 12)})
    assert [dense_layers_on(m, split, r) for r in range(4)] == [7, 5, 6, 6]
    assert stage_time(m, c, t, split, 1, 11).compute == pytest.approx(5 * one_dense.compute + 6 * one_moe.compute)


def test_interleaved_layers_search_the_even_split_and_emit_megatrons_pattern():
    """The search cannot follow which layers of a variable split are dense, so it runs the even split
    (Space.free_split off); Megatron gets the per-layer list its moe_freq_type evaluates; interleaving
    with uneven first/last stages is refused unless pipeline_layers says where each layer goes."""
    from planner.emit.megatron import moe_layer_pattern
    from planner.space import build_space, layout_problems

    m = llama4_maverick()
    assert moe_layer_pattern(m) == "(([0]*1+[1])*24)" and eval(moe_layer_pattern(m)) == [0, 1] * 24
    ds = planner.load_model("deepseek-v3")
    assert eval(moe_layer_pattern(ds)) == [0] * 3 + [1] * 58
    both = ds.model_copy(update={"num_layers": 63, "moe": ds.moe.model_copy(update={"layer_step": 2})})
    assert eval(moe_layer_pattern(both)) == [0] * 3 + [0, 1] * 30 == [int(both.is_moe_layer(i)) for i in range(63)]
    c, t = planner.load_cluster("dgx-h100", nodes=64), TrainingSpec(global_batch_size=1024, seq_length=8192)
    space = build_space(m, c, t, constraints={"tp": 4, "ep": 128})
    assert not space.free_split and space.shapes
    assert all(sp == ((48 // s.pp,) * s.pp,) for s in space.shapes for sp in [space.fixed_splits(s.pp, s.vpp)])
    lay = Layout(tp=4, pp=4, vpp=2, dp=32, ep=16, etp=1, sequence_parallel=True, first_stage_layers=10,
                 last_stage_layers=10)
    assert any("give pipeline_layers" in p for p in layout_problems(m, c, t, lay))


def test_llama4_chunked_attention_is_planned_where_one_chunk_spans_the_sequence():
    """The catalog's Maverick is the hand-built one with its 8,192-token attention chunks. Up to 8,192
    tokens one chunk spans the sequence and every layer is causal over it; beyond, no target runs
    chunked attention, so plan and evaluate refuse it in one line naming the rule."""
    from planner.errors import InvalidLayout

    m = planner.load_model("llama4-maverick")
    same = {"name", "sources", "provenance", "attention_chunk"}
    assert m.attention_chunk == 8192 and m.model_dump(exclude=same) == llama4_maverick().model_dump(exclude=same)
    c = planner.load_cluster("dgx-h100", nodes=64)
    lay = Layout(tp=4, dp=128, ep=128, etp=4, sequence_parallel=True, zero_stage=1)
    at = planner.evaluate(m, c, TrainingSpec(global_batch_size=1024, seq_length=8192), lay)
    assert at.step_time_s == planner.evaluate(llama4_maverick(), c, TrainingSpec(global_batch_size=1024,
                                                                                 seq_length=8192), lay).step_time_s
    long = TrainingSpec(global_batch_size=1024, seq_length=16384)
    with pytest.raises(PlannerError, match=r"training.seq_length\(16384\) > attention_chunk\(8192\)"):
        planner.plan(m, c, long)
    with pytest.raises(InvalidLayout, match=r"seq_length\(16384\) > attention_chunk\(8192\)"):
        planner.evaluate(m, c, long, lay)
    with pytest.raises(ValueError, match="'attention_chunk': chunked and sliding-window"):
        ModelSpec.model_validate({**m.model_dump(), "sliding_window": 4096})


LLAMA4_MAVERICK_HF = {  # meta-llama/Llama-4-Maverick-17B-128E text_config, as a Llama4ForCausalLM config
    "architectures": ["Llama4ForCausalLM"], "model_type": "llama4_text", "hidden_size": 5120,
    "intermediate_size": 8192, "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 202048, "num_local_experts": 128,
    "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "attention_chunk_size": 8192, "use_qk_norm": False,
    "tie_word_embeddings": False, "attention_bias": False}


def test_hf_import_of_llama4():
    """Llama4ForCausalLM: dense MLPs of intermediate_size_mlp between MoE layers of intermediate_size
    experts and one shared expert as wide, every interleave_moe_layer_step-th layer MoE, chunked
    attention: Maverick's text config is the catalog entry. Scout's Q/K L2 norm (use_qk_norm), a
    moe_layers list off the step, and the multimodal wrapper (with its vision encoder) are refused."""
    m = model_from_hf_config(LLAMA4_MAVERICK_HF, "maverick")
    same = {"name", "sources", "provenance"}
    assert m.model_dump(exclude=same) == planner.load_model("llama4-maverick").model_dump(exclude=same)
    with pytest.raises(ConfigImportError, match="use_qk_norm"):
        model_from_hf_config(dict(LLAMA4_MAVERICK_HF, use_qk_norm=True, num_local_experts=16,
                                  interleave_moe_layer_step=1), "scout")
    with pytest.raises(ConfigImportError, match="moe_layers = .* not every interleave_moe_layer_step-th layer"):
        model_from_hf_config(dict(LLAMA4_MAVERICK_HF, moe_layers=[0, 2, 4]), "x")
    assert model_from_hf_config(dict(LLAMA4_MAVERICK_HF, moe_layers=list(range(1, 48, 2))), "x").moe_layers == 24
    with pytest.raises(ConfigImportError, match="vision encoder .*text_config"):
        model_from_hf_config({"architectures": ["Llama4ForConditionalGeneration"], "text_config": LLAMA4_MAVERICK_HF}, "x")


def test_megatron_fsdp_collects_experts_of_the_moe_layers_only():
    # DeepSeek-V3's first 3 of 61 layers are dense: Megatron-FSDP's expert units are the other 58
    # layers' local experts (256 / ep of them, 3 x 7168 x 2048 each) and its MTP depth's MoE layer's
    # (59 on the one rank; 58 without the depth), and add up to the expert shard.
    from planner.cost import expert_shard_units
    from planner.memory import param_shards

    m = planner.load_model("deepseek-v3")
    lay = Layout(tp=4, dp=64, ep=64, etp=1, zero_stage=3, sequence_parallel=True)
    u = expert_shard_units(m, lay, 0, 61)
    assert (u.layers, u.layer, u.embedding, u.output) == (59, 4 * 3 * 7168 * 2048, 0.0, 0.0)
    assert u.layers * u.layer == pytest.approx(param_shards(m, lay, 0, 61)[1].params)
    assert expert_shard_units(m.model_copy(update={"mtp_layers": 0}), lay, 0, 61).layers == 58


def test_group_limited_routing_caps_the_nodes_a_token_reaches():
    """DeepSeek-V3 (256 experts, top 8) over 8 nodes: free routing misses a node with C(224, 8) / C(256, 8),
    so a token reaches 7 (1 - that) = 4.63 other nodes; its 8 groups, 4 chosen, one group a node, give
    7 (1 - C(7, 4) / C(8, 4)) = 3.5; 4 groups of two nodes each, 2 chosen: a node's group is chosen with 1/2
    and one of the 8 experts, drawn from the chosen 128, lands among its 32: 7 x 1/2 x (1 - C(96, 8) / C(128, 8)).
    DeepEP's network bytes follow (one row per remote node)."""
    from math import comb

    from planner.comm import node_dedup_alltoall_time, remote_nodes
    from planner.topology import placement
    assert remote_nodes(256, 8, 8) == pytest.approx(7 * (1 - comb(224, 8) / comb(256, 8)), rel=1e-12)
    assert remote_nodes(256, 8, 8, 8, 4) == pytest.approx(3.5, rel=1e-12)
    assert remote_nodes(256, 8, 8, 4, 2) == pytest.approx(7 / 2 * (1 - comb(96, 8) / comb(128, 8)), rel=1e-12)
    assert remote_nodes(256, 8, 8, 3 * 8, 4) < remote_nodes(256, 8, 8)  # 3 groups a node
    assert remote_nodes(256, 8, 1, 8, 4) == 0.0
    c = planner.load_cluster("dgx-h100", nodes=8)
    flat = [(2.0**20, 370e9), (2.0**33, 370e9)]  # every size at full bus bandwidth; the network leg sets the time
    c = c.model_copy(update={"nvlink": c.nvlink.model_copy(update={"ring_busbw": 1e15, "busbw_curve": flat})})
    g = placement(c, (64, 1))
    free, limited = (node_dedup_alltoall_time(c, g, 4096, 2 * 7168, 8, 256, *k) - c.scaleout.latency
                     for k in ((None, None), (8, 4)))
    assert limited / free == pytest.approx(3.5 / remote_nodes(256, 8, 8), rel=1e-9)
    # the MoE layer's dispatch and combine read the model's groups: DeepSeek-V3 with DeepEP over the 8 nodes
    from planner.cost import moe_time
    m = planner.load_model("deepseek-v3")
    free_model = m.model_copy(update={"moe": m.moe.model_copy(update={"router_groups": None, "router_group_topk": None})})
    tr = TrainingSpec(global_batch_size=64, seq_length=4096)
    limited_ep, free_ep = (moe_time(k, c, tr, 1, 1, 1, 64, 1, "deepep").ep for k in (m, free_model))
    lat = 2 * c.scaleout.latency  # dispatch and combine, each one collective
    assert (limited_ep - lat) / (free_ep - lat) == pytest.approx(limited / free, rel=1e-9)


def test_group_limited_routing_is_checked_and_emitted():
    """Megatron's rules: groups divide the experts, at most router_groups (and top_k) chosen, both or neither;
    the Megatron files turn it on (--moe-router-num-groups / --moe-router-group-topk) where the model has it."""
    base = dict(num_experts=256, top_k=8, expert_ffn_hidden_size=2048)
    for bad, field in ((dict(router_groups=8), "router_groups"), (dict(router_groups=7, router_group_topk=4), "router_groups"),
                       (dict(router_groups=8, router_group_topk=9), "router_group_topk")):
        with pytest.raises(planner.SpecError, match=field):
            MoESpec(**base, **bad)
    m = planner.load_model("deepseek-v3")
    assert (m.moe.router_groups, m.moe.router_group_topk) == (8, 4)
    p = planner.evaluate(m, planner.load_cluster("dgx-h100", nodes=128), TrainingSpec(global_batch_size=8192, seq_length=4096),
                         planner.Layout(tp=2, pp=16, dp=32, ep=64, etp=1, sequence_parallel=True, zero_stage=1,
                                        recompute="selective", pipeline_layers=(4,) * 15 + (1,)))
    args = p.to_megatron().args
    assert args[args.index("--moe-router-num-groups") + 1] == "8" and args[args.index("--moe-router-group-topk") + 1] == "4"


def test_allgather_dispatcher_gathers_every_token_over_etp_x_ep():
    """Megatron's default dispatcher on Mixtral-8x7B (8 experts, top 2), one DGX H100, ep 8, a micro-batch
    of 4096 tokens a GPU: forward all-gathers the 8 ranks' 32,768 tokens with their hidden states (2 h B),
    FP32 probabilities (4 E) and routing map (E bytes), 32,768 x (8,192 + 32 + 8) = 269,746,176 B, and
    reduce-scatters the FP32 outputs, 32,768 x 4 x 4,096 = 536,870,912 B, over the 8 GPUs' NVLink; the
    experts see the same rows as with the all-to-all. Megatron's all-to-all sends each token to its 2
    experts' ranks only, so here it is the faster one and the search, offered both, keeps it (two nodes,
    where Mixtral fits); Qwen3-30B-A3B's top 8 of 128 at ep 2 sends each token's 8 copies, 4 of them to
    the other rank, where the all-gather sends it once: there the search picks the all-gather."""
    from planner.comm import collective_time
    from planner.cost import moe_time
    from planner.topology import placement
    m, c = planner.load_model("mixtral-8x7b"), planner.load_cluster("dgx-h100", nodes=1)
    tr = TrainingSpec(global_batch_size=64, seq_length=4096)
    ag = moe_time(m, c, tr, 1, 1, 1, 8, 1, "allgather")
    a2a = moe_time(m, c, tr, 1, 1, 1, 8, 1, "alltoall")
    group = placement(c, (8, 1))
    assert 32_768 * (2 * 4096 + 4 * 8 + 8) == 269_746_176 and 32_768 * 4 * 4096 == 536_870_912
    assert ag.ep == pytest.approx(collective_time(c, group, "allgather", 269_746_176)
                                  + collective_time(c, group, "reducescatter", 536_870_912), rel=1e-12)
    assert ag.gemm == a2a.gemm and ag.ep > 2 * a2a.ep
    # tp 2, etp 2, ep 4: each rank holds 2,048 tokens (sequence parallel); the etp x ep group of 8 gathers 16,384
    both_axes = moe_time(m, c, tr, 2, 1, 1, 4, 2, "allgather")
    assert both_axes.ep == pytest.approx(collective_time(c, group, "allgather", 16_384 * 8_232)
                                         + collective_time(c, group, "reducescatter", 16_384 * 4 * 4096), rel=1e-12)
    both = ["alltoall", "allgather"]
    best = planner.plan(m, planner.load_cluster("dgx-h100", nodes=2), tr, top_k=1, structural=False,
                        moe_dispatcher=both).best
    assert best.layout.moe_dispatcher == "alltoall" and best.layout.ep > 1
    qwen = planner.plan(planner.load_model("qwen3-30b-a3b"), c, tr, top_k=1, structural=False, ep=2, moe_dispatcher=both)
    assert qwen.best.layout.moe_dispatcher == "allgather" and "ep2 allgather" in qwen.best.layout.short()
    with pytest.raises(planner.PlannerError, match="ep_overlap runs with the alltoall or deepep dispatcher"):
        planner.evaluate(m, c, tr, Layout(dp=8, ep=8, moe_dispatcher="allgather", ep_overlap=True))


def test_an_expert_gemm_waits_for_the_host_to_issue_it():
    """Transformer Engine's grouped linear issues one cuBLASLt matmul per local expert from the host
    (nvte_multi_tensor_gemm), 45 us each in the catalog, so FC1 and FC2 each take at least local x 45 us.
    Qwen3-30B-A3B on 8 GB200 (EP 8: 16 local experts), MXFP8, 4 x 4,096 tokens: each expert gets
    16,384 x 8 / 16 = 8,192 rows; FC1 8,192 x 2,048 x 1,536 x 2 = 51.5 GFLOP runs at GB200's FP8 curve
    between 17.2 GFLOP (0.45) and 137 (0.57), log-interpolated, times MXFP8's 0.76 of 5 PFLOP/s: ~29 us,
    FC2 (25.8 GFLOP, 0.416 x 0.76) ~16 us; both under 45 us, so the forward's routed GEMMs take
    2 x 16 x 45 us = 1.44 ms beside the router's BF16 GEMM. With the experts' GEMMs longer than the call
    (Mixtral-8x7B: 8 experts, EP 8, one each, 16,384 tokens x top 2 = 32,768 rows) the floor does not bind,
    and torchtitan's one torch._grouped_mm per projection never pays it."""
    import math

    from planner.cost import _gemm_time, moe_time

    m, c = planner.load_model("qwen3-30b-a3b"), planner.load_cluster("gb200-nvl72", nodes=2)
    t = TrainingSpec(global_batch_size=64, seq_length=4096, fp8="mxfp8")
    router = _gemm_time(c, [2 * 16384 * 2048 * 128])
    fc1, fc2 = 2 * 8192 * 2048 * 1536, 2 * 8192 * 768 * 2048
    eff = [0.45 + 0.12 * math.log(f / 17.2e9) / math.log(137 / 17.2) for f in (fc1, fc2)]
    gpu = [f / (5000e12 * e * 0.76) for f, e in zip((fc1, fc2), eff)]
    assert max(gpu) < 45e-6
    got = moe_time(m, c, t, tp=1, cp=1, b=4, ep=8, etp=1, dispatcher="deepep").gemm
    assert got == pytest.approx(router + 2 * 16 * 45e-6, rel=1e-6)
    none = c.model_copy(update={"calibration": c.calibration.model_copy(update={"grouped_gemm_call": 0.0})})
    assert moe_time(m, none, t, tp=1, cp=1, b=4, ep=8, etp=1, dispatcher="deepep").gemm == pytest.approx(
        router + 16 * sum(gpu), rel=2e-3)
    tt = t.model_copy(update={"fp8": None, "optimizer_impl": "fsdp2"})
    floorless = moe_time(m, none, tt, tp=1, cp=1, b=4, ep=8, etp=1).gemm
    assert moe_time(m, c, tt, tp=1, cp=1, b=4, ep=8, etp=1).gemm == pytest.approx(floorless, rel=1e-9)
    mixtral = planner.load_model("mixtral-8x7b")  # one expert a GPU at EP 8, 32,768 rows: milliseconds a GEMM
    bf16 = t.model_copy(update={"fp8": None})
    assert moe_time(mixtral, c, bf16, tp=1, cp=1, b=4, ep=8, etp=1).gemm == pytest.approx(
        moe_time(mixtral, none, bf16, tp=1, cp=1, b=4, ep=8, etp=1).gemm, rel=1e-12)


def test_explain_names_the_hosts_floor_where_it_binds():
    """Qwen3-30B-A3B on 16 GB200 at EP 8 (16 experts a GPU): each grouped GEMM is 16 calls x 45 us, more than
    the GPU needs for FC2, so explain says the expert GEMMs wait on the host; Mixtral's one large expert a GPU
    does not."""
    from planner.explain import explain

    c = planner.load_cluster("gb200-nvl72", nodes=4)
    lines = explain(planner.load_model("qwen3-30b-a3b"), c,
                    TrainingSpec(global_batch_size=256, seq_length=4096, fp8="mxfp8"), ep=8)
    assert any("wait on the host" in line and "16 x 45 us = 0.72 ms" in line for line in lines)
    lines = explain(planner.load_model("mixtral-8x7b"), c, TrainingSpec(global_batch_size=256, seq_length=4096), ep=8)
    assert not any("wait on the host" in line for line in lines)
