"""Mixture-of-Experts and multi-latent attention models: the parameter counts against the published
totals and active counts, the Hugging Face import, and the refusal to price their layouts (yet)."""

from __future__ import annotations

import io

import pytest

import planner
from planner.catalog import model_from_hf_config
from planner.cli import main
from planner.errors import ConfigImportError, PlannerError
from planner.specs import Layout, TrainingSpec

# (catalog id, published total, published active, digits the publisher rounds to)
PUBLISHED = [
    ("mixtral-8x7b", 46.7e9, 12.9e9),  # Mixtral paper / model card
    ("qwen3-30b-a3b", 30.5e9, 3.3e9),  # Qwen3 model card
    ("qwen3-235b-a22b", 235e9, 22e9),
    ("deepseek-v3", 671e9, 37e9),  # DeepSeek-V3 report §4.2 (MTP's 14B not included)
]


@pytest.mark.parametrize("ref, total, active", PUBLISHED)
def test_counts_match_the_published_totals(ref, total, active):
    m = planner.load_model(ref)
    assert m.num_params == pytest.approx(total, rel=0.005)
    # active counts are published to two or three digits (rounded or cut): within one unit of the last
    digits = len(f"{active / 1e9:g}".split(".")[1]) if "." in f"{active / 1e9:g}" else 0
    assert abs(m.active_params - active) <= 10 ** (9 - digits)


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
    with pytest.raises(ConfigImportError, match="decoder_sparse_step"):
        model_from_hf_config(dict(qwen, decoder_sparse_step=2), "q")
    with pytest.raises(ConfigImportError, match="Mixture-of-Experts"):  # MoE keys on a dense architecture
        model_from_hf_config(dict(mixtral, architectures=["LlamaForCausalLM"]), "x")


def test_moe_layouts_are_refused_not_approximated():
    m, c = planner.load_model("mixtral-8x7b"), planner.load_cluster("dgx-h100", nodes=2)
    t = TrainingSpec(global_batch_size=64, seq_length=4096)
    with pytest.raises(PlannerError, match="model.moe: mixtral-8x7b is a Mixture-of-Experts model"):
        planner.evaluate(m, c, t, Layout(tp=8, dp=2))
    with pytest.raises(PlannerError, match="not priced yet"):
        planner.plan(m, c, t)
    err = io.StringIO()
    assert main(["plan", "deepseek-v3", "dgx-h100", "--nodes", "32"], stdout=io.StringIO(), stderr=err) == 2
    assert err.getvalue().count("\n") == 1 and "671.0B parameters, 37.6B active" in err.getvalue()
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
