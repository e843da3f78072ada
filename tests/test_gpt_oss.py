"""GPT-OSS: biased linears, attention sinks, alternating 128-token windows. Parameter counts against
OpenAI's model card and by hand, the share of the score matrix a flash kernel computes against a
tile-by-tile count, the time it saves, the Hugging Face import, and the refusal of targets that
would build another model."""

from __future__ import annotations

import pytest

import planner
from planner.catalog import model_from_hf_config
from planner.cost import FLASH_KEY_TILE, computed_score_share
from planner.errors import ConfigImportError, PlannerError
from planner.specs import Layout, TrainingSpec


@pytest.mark.parametrize("ref, total, active", [
    ("gpt-oss-120b", 116.83e9, 5.13e9),  # OpenAI gpt-oss model card, table 1
    ("gpt-oss-20b", 20.91e9, 3.61e9),
])
def test_counts_match_the_model_card(ref, total, active):
    """The card's active count leaves out the input embedding table (a lookup, not a GEMM)."""
    m = planner.load_model(ref)
    assert abs(m.num_params - total) <= 0.005e9
    assert abs(m.active_params - m.embedding_params - active) <= 0.005e9


def test_gpt_oss_layer_by_hand():
    # h 2880; Q 64 x 64 = 4096 wide, K and V 8 x 64 = 512; every projection biased; one sink per head;
    # router 2880 x 128 + 128; each expert gate+up 2880 x 5760 (+5760) and down 2880 x 2880 (+2880)
    m = planner.load_model("gpt-oss-120b")
    attn = 2880 * 4096 + 4096 + 2 * (2880 * 512 + 512) + 4096 * 2880 + 2880 + 64
    assert m.attention_params == attn
    expert = 2880 * 5760 + 5760 + 2880 * 2880 + 2880
    base = attn + 2 * 2880 + 2880 * 128 + 128
    assert m.moe_layer_params == (base + 128 * expert, base + 4 * expert)


def _variant(m, **update):
    """The model with fields replaced, validated afresh (model_copy would keep cached properties)."""
    return planner.ModelSpec.load({**m.model_dump(), **update}, m.name)


def _tile_share(s: int, window: int | None, tile: int = FLASH_KEY_TILE) -> float:
    """Score-matrix share a tiled kernel computes: every (query tile, key tile) block holding at least
    one key the mask lets a query see, counted block by block."""
    blocks = 0
    for qi in range(0, s, tile):
        for kj in range(0, qi + tile, tile):
            # visible iff k <= q and q - k < window: the block's nearest pair decides
            q_hi, k_lo = qi + tile - 1, kj
            lowest_gap = max(0, qi - (kj + tile - 1))
            if k_lo <= q_hi and (window is None or lowest_gap < window):
                blocks += 1
    return blocks * tile * tile / (s * s)


@pytest.mark.parametrize("s", [4096, 8192, 32768])
def test_window_share_matches_a_tile_by_tile_count(s):
    """Per layer kind, the formula's share agrees with counting the kernel's tiles; the model's share
    is the mean over its alternating layers."""
    m = planner.load_model("gpt-oss-120b")
    full, windowed = _tile_share(s, None), _tile_share(s, 128)
    assert computed_score_share(m, s) == pytest.approx((full + windowed) / 2, rel=0.04)
    dense = planner.load_model("llama3-8b")
    assert computed_score_share(dense, s) == 0.5
    # a windowed layer computes about (w + T) s of the s^2 scores: at 32k that is 0.8 % vs 50 %
    assert windowed < 0.07 * 4096 / s + 1e-9


def test_a_window_wider_than_the_sequence_is_plain_causal():
    m = _variant(planner.load_model("gpt-oss-120b"), sliding_window=8192)
    assert computed_score_share(m, 4096) == 0.5


def _windowed_pair(cluster: str):
    """GPT-OSS-120B with and without its windows on 64 GPUs of `cluster` (tp 1, ep 64, 4 x 4,096 tokens):
    (windowed model, full model, cluster, training, layout, windowed layer time, full layer time)."""
    from planner.cost import _layer_time

    win = planner.load_model("gpt-oss-120b")
    full = _variant(win, sliding_window=None, full_attention_every=None)
    c = planner.load_cluster(cluster, nodes=8)
    t = TrainingSpec(global_batch_size=1280, seq_length=4096)
    lay = Layout(tp=1, pp=1, dp=64, ep=64, zero_stage=1, micro_batch_size=4)
    return win, full, c, t, lay, _layer_time(win, c, t, lay), _layer_time(full, c, t, lay)


def test_windows_shorten_the_step_by_the_attention_they_skip():
    """Same model and layout with and without windows: only the attention core changes, by the
    score share (0.5 -> ~0.28 at 4k) and the speed of the windowed layers' short kernels (255 keys:
    FlashAttention-2's causal speed at 512, its shortest, 191 TFLOP/s, against 319 at 4k [FA3 paper
    Fig. 'head dim 128, H100']: H100, whose catalog prices that curve), and the step is shorter."""
    win, full, c, t, lay, a, b = _windowed_pair("dgx-h100")
    k = 128 + 128 - 1
    windowed = (4096 * k - k * k / 2) / 4096**2  # computed share of a windowed layer's score matrix
    assert a.attn_fwd / b.attn_fwd == pytest.approx((0.5 / 319 + windowed / 191) / (2 * 0.5 / 319), rel=1e-9)
    assert a.fwd - a.attn_fwd == pytest.approx(b.fwd - b.attn_fwd, rel=1e-9)
    assert planner.evaluate(win, c, t, lay).step_time_s < planner.evaluate(full, c, t, lay).step_time_s


def test_blackwell_windows_run_at_cudnns_measured_window_speed():
    """On B200 the fused attention is cuDNN's measured kernel (clusters/dgx-b200.yaml, GB200's shares):
    a full causal layer at s = 4096 runs its forward at 1408 TFLOP/s and its five-matmul backward at
    1148, while the window-128 kernel (gpt_oss shapes) reaches 161 / 182 at 4096 and 165 / 187 at 8192
    over the W keys a query sees -- over the 255 keys the model counts (tile convention), 1.961x and
    1.977x those; their mean. Each rate is a share of GB200's 8192 forward (1574) times B200's own
    0.630 of peak. Forward and backward times of one layer's attention core follow, the backward over
    2.5x the forward's FLOPs."""
    *_, a, b = _windowed_pair("dgx-b200")
    k = 128 + 128 - 1
    windowed = (4096 * k - k * k / 2) / 4096**2
    w_fwd = (161 * 1011967.5 / 516160 + 165 * 2056447.5 / 1040448) / 2
    w_bwd = (182 * 1011967.5 / 516160 + 187 * 2056447.5 / 1040448) / 2
    # harmonic: half the layers full (0.5 of the matrix at 1408), half windowed (`windowed` at w_fwd)
    assert a.attn_fwd / b.attn_fwd == pytest.approx((0.5 / 1408 + windowed / w_fwd) / (2 * 0.5 / 1408), rel=2e-3)
    flops = 2 * 4 * 4096 * 4096 * 64 * (64 + 64) * 0.5  # the full model's causal core, one micro-batch
    peak = 2250e12 * 1574 / 2500
    assert b.attn_fwd == pytest.approx(flops / (peak * 1408 / 1574), rel=2e-3)
    attn_bwd = (b.bwd - 2 * (b.fwd - b.attn_fwd))  # what the backward adds beyond twice the rest
    assert attn_bwd == pytest.approx(2.5 * flops / (peak * 1148 / 1574), rel=2e-3)
    win_bwd = a.bwd - 2 * (a.fwd - a.attn_fwd)
    assert win_bwd / attn_bwd == pytest.approx((0.5 / 1148 + windowed / w_bwd) / (2 * 0.5 / 1148), rel=2e-3)


def test_hf_import_of_gpt_oss():
    cfg = {"architectures": ["GptOssForCausalLM"], "num_hidden_layers": 36, "hidden_size": 2880,
           "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880,
           "vocab_size": 201088, "num_local_experts": 128, "num_experts_per_tok": 4, "sliding_window": 128,
           "layer_types": ["sliding_attention", "full_attention"] * 18, "attention_bias": True,
           "tie_word_embeddings": False, "swiglu_limit": 7.0}
    m = model_from_hf_config(cfg, "gpt-oss")
    ref = planner.load_model("gpt-oss-120b")
    assert (m.num_params, m.windowed_layers, m.full_attention_every) == (ref.num_params, 18, 2)
    with pytest.raises(ConfigImportError, match="layer_types"):
        model_from_hf_config({**cfg, "layer_types": ["full_attention", "sliding_attention"] * 18}, "g")
    with pytest.raises(ConfigImportError, match="swiglu_limit"):
        model_from_hf_config({**cfg, "swiglu_limit": 10.0}, "g")


def test_qwen2_windows_are_refused_and_mistral_windows_kept():
    qwen = {"architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
            "intermediate_size": 128, "vocab_size": 100, "use_sliding_window": True, "sliding_window": 32}
    with pytest.raises(ConfigImportError, match="use_sliding_window"):
        model_from_hf_config(qwen, "q")
    mistral = {**qwen, "architectures": ["MistralForCausalLM"], "use_sliding_window": None}
    assert model_from_hf_config(mistral, "m").windowed_layers == 2


def test_megatron_flags_and_other_targets_refused():
    m = planner.load_model("gpt-oss-120b")
    p = planner.evaluate(m, planner.load_cluster("dgx-b200", nodes=8), TrainingSpec(global_batch_size=1280, seq_length=4096),
                         Layout(tp=1, pp=1, dp=64, ep=64, zero_stage=1, micro_batch_size=4))
    args = p.to_megatron().args
    joined = " ".join(args)
    assert "--window-size 127,0 --window-attn-skip-freq 2" in joined and "--softmax-type learnable" in joined
    assert "--quick-geglu --glu-linear-offset 1.0 --activation-func-clamp-value 7.0" in joined
    assert "--disable-bias-linear" not in args and "--swiglu" not in args
    for emit in (p.to_torchtitan, p.to_deepspeed):
        with pytest.raises(PlannerError, match="sliding-window attention"):
            emit()
    with pytest.raises(PlannerError, match="attention sinks"):
        planner.plan(m, planner.load_cluster("dgx-b200", nodes=8), TrainingSpec(global_batch_size=1280, seq_length=4096),
                     framework="torchtitan")
    gpt = {"name": "g", "family": "gpt", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
           "ffn_hidden_size": 256, "vocab_size": 100, "max_position_embeddings": 128}
    for field, value in (("sliding_window", 32), ("attention_sinks", True), ("linear_bias", True)):
        with pytest.raises(planner.errors.SpecError, match=f"field '{field}'"):
            planner.ModelSpec.load({**gpt, field: value}, "g")
    with pytest.raises(planner.errors.SpecError, match="needs sliding_window"):
        planner.ModelSpec.load({**gpt, "family": "llama", "full_attention_every": 2}, "g")
