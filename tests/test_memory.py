"""The memory ledger against the seed's worked numbers, Korthikanti 2022 Table 2 and hand arithmetic."""

import pytest

import planner
from planner.errors import SpecError
from planner.memory import (
    activation_bytes_per_layer,
    in_flight_microbatches,
    memory_ledger,
    stage_layers,
    static_memory,
)
from planner.specs import Layout, TrainingSpec

GB = 1e9


@pytest.mark.parametrize("psi,params,grads,adam,total", [
    (7e9, 14, 14, 84, 112),  # the seed's 7B row
    (70e9, 140, 140, 840, 1120),
    (405e9, 810, 810, 4860, 6480),
])
def test_static_memory_seed_table(psi, params, grads, adam, total):
    st = static_memory(psi)
    assert (st.params / GB, st.grads / GB, st.optimizer / GB, st.total / GB) == (params, grads, adam, total)


def test_static_memory_megatron_fp32_grads_and_distributed_optimizer():
    # Megatron: 18 B/param; with the distributed optimizer over d ranks 6 + 12/d (dist_optimizer.md)
    assert static_memory(1.0, grad_dtype="fp32").total == 18
    assert static_memory(1.0, grad_dtype="fp32", zero_stage=1, shard=8).total == pytest.approx(6 + 12 / 8)
    # ZeRO paper Fig. 1 (Psi = 7.5B, N_d = 64, K = 12): 120 GB, 31.4 GB, 16.6 GB, 1.9 GB
    for stage, expected in [(0, 120), (1, 31.4), (2, 16.6), (3, 1.9)]:
        assert static_memory(7.5e9, zero_stage=stage, shard=64).total / GB == pytest.approx(expected, abs=0.06)


# A GPT-3 175B layer at s = 2048, b = 1, t = 8 (Korthikanti et al. 2022 Table 2 and Table 3 shapes)
S, B, H, A, T = 2048, 1, 12288, 96, 8
SBH = S * B * H
KORTHIKANTI_TABLE2 = [  # (kwargs, bytes per layer in units of sbh)
    (dict(), 34 + 5 * A * S / H),  # no parallelism
    (dict(tp=T), 10 + 24 / T + 5 * A * S / (H * T)),  # tensor parallel
    (dict(tp=T, sequence_parallel=True), (34 + 5 * A * S / H) / T),  # tensor + sequence parallel
    (dict(tp=T, recompute="selective"), 10 + 24 / T),  # TP + selective recompute
    (dict(tp=T, sequence_parallel=True, recompute="selective"), 34 / T),  # TP + SP + selective
    (dict(recompute="full"), 2),  # full recompute
]
# The table omits the O(sb) LayerNorm statistics (2 x 8 sb, fp32 mean + rstd): at h = 12288 that
# is 16/12288 sbh, so the ledger may exceed the paper by at most 0.002 sbh.
LN_STATS_SBH = 16 / H


@pytest.mark.parametrize("kwargs,sbh_units", KORTHIKANTI_TABLE2)
def test_activation_korthikanti_table2(kwargs, sbh_units):
    m = planner.load_model("gpt3-175b")
    got = activation_bytes_per_layer(m, B, S, attention="eager", **kwargs) / SBH
    assert sbh_units <= got <= sbh_units + LN_STATS_SBH


def test_activation_llama_flash_by_hand():
    """Llama-3-8B, s = 4096, b = 1, flash (memory.md §2b): sbh(14 + 6r) + 6sbf + 4asb + 8sb, r = g/a = 1/4."""
    m = planner.load_model("llama3-8b")
    s, h, f, a = 4096, 4096, 14336, 32
    expected = s * h * (14 + 6 * 0.25) + 6 * s * f + 4 * a * s + 8 * s
    assert activation_bytes_per_layer(m, 1, s) == expected
    # context parallel 2 halves every term [memory.md §2c]
    assert activation_bytes_per_layer(m, 1, s, cp=2) == expected / 2


def test_activation_cp_needs_flash():
    with pytest.raises(SpecError, match="cp"):
        activation_bytes_per_layer(planner.load_model("llama3-8b"), 1, 4096, cp=2, attention="eager")


def test_in_flight_microbatches_1f1b_and_interleaved():
    lay = Layout(pp=4, dp=1, tp=1)
    assert [in_flight_microbatches(lay, i, 64) for i in range(4)] == [4, 3, 2, 1]
    assert in_flight_microbatches(lay, 0, 2) == 2  # fewer micro-batches than stages
    # interleaved: first stage holds p (1 + (p-1)/(p v)) = 4 (1 + 3/8) = 5.5 [Korthikanti22 §4.3]
    assert in_flight_microbatches(Layout(pp=4, vpp=2), 0, 64) == pytest.approx(5.5)


def test_uneven_stage_layers():
    m = planner.load_model("llama3-8b")  # 32 layers
    assert stage_layers(m, Layout(pp=4)) == [8, 8, 8, 8]
    assert stage_layers(m, Layout(pp=4, first_stage_layers=7, last_stage_layers=7)) == [7, 9, 9, 7]
    assert stage_layers(m, Layout(pp=2, first_stage_layers=15, last_stage_layers=17)) == [15, 17]


def test_ledger_7b_on_8_gpus_by_hand():
    """Llama-2-7B, pure DP 8, bf16 grads, no ZeRO: 16 B/param static, plus activations of one
    micro-batch of 32 layers (flash, s=4096, b=1), the logits on the (only) stage, overhead. The loss:
    the final norm's and the output layer's inputs (2 + 2 B per token and hidden unit) and Megatron's
    cross entropy at its peak, the BF16 logits beside their FP32 copy (2 + 4 B per logit)."""
    m = planner.load_model("llama2-7b")
    c = planner.load_cluster("dgx-h100")
    tr = TrainingSpec(global_batch_size=8, seq_length=4096, grad_dtype="bf16")
    led = memory_ledger(m, c, tr, Layout(dp=8))
    st = led.stages[0]
    assert st.get("weights") + st.get("gradients") + st.get("optimizer") == 16 * m.num_params
    s, h, f, a, V = 4096, 4096, 11008, 32, 32000
    per_layer = s * h * (14 + 6 * 1.0) + 6 * s * f + 4 * a * s + 8 * s  # MHA: r = 1
    assert st.get("activations") == 32 * per_layer
    assert st.get("logits") == 4 * s * h + (2 + 4) * s * V
    assert not led.fits  # 108 GB static alone exceeds 80 GB: the seed's "shard it" case


def test_fsdp2_keeps_the_fp32_shard_as_master_and_the_output_layer_gathered():
    """torchtitan's FSDP2, ZeRO-3 over 8 GPUs, Llama-3-8B: the FP32 weight shard is the master (4 B),
    FP32 gradient shards (reduce_dtype, 4 B), Adam m and v (8 B): 16 B/param over 8, not the
    ledger's 2 + 4 + 12; the [norm, lm_head] unit stays gathered after forward, so at the start of
    backward the output weight (V h bf16) and its unsharded bf16 gradient are whole on every GPU;
    two blocks gathered (the one in use and the prefetched one)."""
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100")
    psi, V, h = m.num_params, 128256, 4096
    tr = TrainingSpec(global_batch_size=8, seq_length=4096, optimizer_impl="fsdp2")
    st = memory_ledger(m, c, tr, Layout(dp=8, zero_stage=3)).stages[0]
    assert (st.get("weights"), st.get("gradients"), st.get("optimizer")) == pytest.approx((4 * psi / 8, 4 * psi / 8, 8 * psi / 8))
    assert st.get("fsdp2_output_layer") == 2 * V * h * 2
    assert st.get("zero3_gather") == 2 * 2 * (m.num_params - 2 * V * h - h) / 32  # two of 32 blocks, bf16
    mega = memory_ledger(m, c, tr.model_copy(update={"optimizer_impl": None}), Layout(dp=8, zero_stage=3)).stages[0]
    assert mega.get("weights") + mega.get("optimizer") == pytest.approx(14 * psi / 8) and mega.get("fsdp2_output_layer") == 0
    # under torchtitan's pipeline every unit of the stage stays gathered (reshard_after_forward off),
    # the embedding's too, and the output layer's gradient accumulates in FP32 with the rest
    # (fsdp2_pipeline_grads; tests/test_torchtitan_engine.py)
    pp = memory_ledger(m, c, tr, Layout(pp=2, dp=4, zero_stage=3)).stages
    assert pp[0].get("zero3_gather") == 16 * 2 * (m.num_params - 2 * V * h - h) / 32 + 2 * V * h
    assert pp[0].get("fsdp2_output_layer") == 0 and pp[1].get("fsdp2_output_layer") == V * h * 2


def test_ledger_peak_is_worst_stage():
    m = planner.load_model("llama3-70b")
    c = planner.load_cluster("dgx-h100", nodes=8)
    tr = TrainingSpec(global_batch_size=64, seq_length=4096)
    led = memory_ledger(m, c, tr, Layout(tp=8, pp=8, dp=1, sequence_parallel=True))
    totals = [s.total for s in led.stages]
    assert led.peak_bytes == max(totals)
    assert led.peak_stage.stage in (0, 7)  # most in flight (first) or the logits (last)
    assert totals[1] > totals[6]  # fewer micro-batches in flight further down


def test_zero_shards_over_dp_times_cp():
    m = planner.load_model("llama3-8b")
    c = planner.load_cluster("dgx-h100", nodes=2)
    tr = TrainingSpec(global_batch_size=16, seq_length=8192)
    led = memory_ledger(m, c, tr, Layout(dp=8, cp=2, zero_stage=1))
    assert led.stages[0].get("optimizer") == pytest.approx(12 * m.num_params / 16)


def test_full_recompute_adds_one_layer_at_backward_peak():
    m = planner.load_model("llama3-8b")
    c = planner.load_cluster("dgx-h100")
    tr = TrainingSpec(global_batch_size=8, seq_length=4096)
    st = memory_ledger(m, c, tr, Layout(dp=8, recompute="full")).stages[0]
    assert st.get("activations") == 32 * 2 * 4096 * 4096
    assert st.get("recompute_peak") == activation_bytes_per_layer(m, 1, 4096)
    part = memory_ledger(m, c, tr, Layout(dp=8, recompute="full", recompute_num_layers=8)).stages[0]
    assert part.get("activations") == 8 * 2 * 4096 * 4096 + 24 * activation_bytes_per_layer(m, 1, 4096)


def test_op_checkpointing_by_hand_with_tp_and_sequence_parallel():
    """torchtitan's per-op checkpointing of one Llama-3-8B block (h 4096, 32 heads of 128, 8 KV
    heads, f 14336), b 1, s 4096, TP 2 with sequence parallelism, by hand from its policy (wq, wv,
    w1, w2 and attention kept; the reduce-scatters after wo and w2 kept; the block input):
    input 2 x 4096 x 4096 / 2; wq out 2 x 4096 x 4096 / 2; wv out 2 x 4096 x 1024 / 2; attention
    out 2 x 4096 x 4096 / 2 + lse 4 x 32 x 4096 / 2; w1 out 2 x 4096 x 14336 / 2; w2's partial
    sums 2 x 4096 x 4096 (whole); two reduce-scatter outputs 2 x 4096 x 4096 / 2 each."""
    m = planner.load_model("llama3-8b")
    s = 4096
    by_hand = (s * 4096 + s * 4096 + s * 1024 + s * 4096 + 2 * 32 * s + s * 14336 + 2 * s * 4096
               + 2 * s * 4096)
    assert activation_bytes_per_layer(m, 1, s, tp=2, sequence_parallel=True, recompute="op") == by_hand
    # without TP: the whole-width terms, no reduce-scatter outputs
    whole = 2 * s * 4096 * 4 + 2 * s * 1024 + 4 * 32 * s + 2 * s * 14336
    assert activation_bytes_per_layer(m, 1, s, recompute="op") == whole
    # the ledger keeps it per layer and adds the block re-materialised in backward
    st = memory_ledger(m, planner.load_cluster("dgx-h100"), TrainingSpec(global_batch_size=8, seq_length=s),
                       Layout(dp=8, zero_stage=3, recompute="op")).stages[0]
    assert st.get("activations") == 32 * whole
    assert st.get("recompute_peak") == activation_bytes_per_layer(m, 1, s) - whole


def test_op_checkpointing_is_refused_outside_dense_llama():
    with pytest.raises(SpecError, match="recompute 'op'"):
        activation_bytes_per_layer(planner.load_model("gpt3-175b"), 1, 2048, recompute="op")
    m, c = planner.load_model("gpt3-175b"), planner.load_cluster("dgx-a100-80g", nodes=16)
    with pytest.raises(planner.PlannerError, match="recompute 'op' .* dense llama-family models only"):
        planner.evaluate(m, c, TrainingSpec(global_batch_size=1536, seq_length=2048),
                         Layout(tp=8, pp=8, dp=2, recompute="op"))


def test_fused_cross_entropy_keeps_bf16_logits_and_their_gradient():
    """flash-attn's CrossEntropyLoss (llm-foundry's default loss) saves the BF16 logits and allocates a
    BF16 gradient of the same shape in backward (flash_attn/ops/triton/cross_entropy.py), with three
    fp32 values per row: 4 s b h (final-norm and LM-head inputs) + (2 + 2) s b V + 12 s b, against
    Megatron's FP32 path's 4 s b h + 6 s b V (its BF16 logits beside their FP32 copy). MPT-1B-like: s 2048,
    b 4, h 2048, V 50368."""
    from planner.specs import ModelSpec
    m = ModelSpec(name="mpt-1b", family="gpt", num_layers=24, hidden_size=2048, num_attention_heads=16,
                  ffn_hidden_size=8192, vocab_size=50368, max_position_embeddings=2048, dropout=False)
    c = planner.load_cluster("dgx-h100")
    sb = 2048 * 4
    fused = memory_ledger(m, c, TrainingSpec(global_batch_size=32, seq_length=2048, cross_entropy="fused"),
                          Layout(dp=8, micro_batch_size=4)).stages[0]
    fp32 = memory_ledger(m, c, TrainingSpec(global_batch_size=32, seq_length=2048),
                         Layout(dp=8, micro_batch_size=4)).stages[0]
    assert fused.get("logits") == 4 * sb * 2048 + 4 * sb * 50368 + 12 * sb
    assert fp32.get("logits") == 4 * sb * 2048 + 6 * sb * 50368
    assert fused.get("embedding") == 0 and fp32.get("embedding") == 0  # no embedding dropout without dropout


def test_te_cross_entropy_holds_the_bf16_logits_only():
    """Transformer Engine's parallel cross-entropy (Megatron-Bridge's cross_entropy_fusion_impl='te')
    saves the BF16 logits and writes their gradient over them in backward, with three fp32 values per
    row (max, sum, the target's logit): 4 s b h + 2 s b V + 12 s b, against megatron-core's fused
    loss's 4 s b h + 6 s b V. GPT-OSS-120B's vocabulary (201,088) at micro-batch 4 of 4096 tokens: 12.3 GiB
    less on the last rank."""
    m, c = planner.load_model("gpt-oss-120b"), planner.load_cluster("gb200-nvl72", nodes=16)
    sb, h, V = 4096 * 4, 2880, 201_088
    lay = Layout(dp=64, ep=64, etp=1, micro_batch_size=4)
    te = memory_ledger(m, c, TrainingSpec(global_batch_size=1280, seq_length=4096, cross_entropy="te"), lay).stages[0]
    native = memory_ledger(m, c, TrainingSpec(global_batch_size=1280, seq_length=4096), lay).stages[0]
    assert te.get("logits") == 4 * sb * h + 2 * sb * V + 12 * sb
    assert native.get("logits") == 4 * sb * h + 6 * sb * V
    assert (native.get("logits") - te.get("logits")) / 2**30 == pytest.approx(12.3, abs=0.05)


@pytest.mark.parametrize("kernel", ["fused", "te"])
def test_fused_cross_entropy_is_priced_not_emitted(kernel):
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100")
    tr = TrainingSpec(global_batch_size=8, seq_length=4096, cross_entropy=kernel)
    p = planner.evaluate(m, c, tr, Layout(dp=8, zero_stage=1))
    for emit, target in ((p.to_megatron, "Megatron"), (p.to_deepspeed, "DeepSpeed"), (p.to_torchtitan, "torchtitan")):
        with pytest.raises(planner.PlannerError, match=f"{target}: training.cross_entropy '{kernel}'"):
            emit()
    with pytest.raises(planner.PlannerError, match=f"cross_entropy: '{kernel}' .* framework 'megatron'"):
        planner.plan(m, c, tr)
    assert planner.plan(m, c, tr, framework=None, top_k=1, structural=False).status == "optimal"


def test_gpt_layer_without_dropout_by_hand():
    """Korthikanti22 Table 2's 34 sbh (flash) less the two 1-byte hidden-dropout masks: 32 sbh, plus
    the two LayerNorms' fp32 mean and rstd (16 sb) and flash's fp32 logsumexp (4 a s b); no
    embedding-dropout mask either. b 1, s 2048, h 4096, 32 heads, f 4h."""
    from planner.specs import ModelSpec
    m = ModelSpec(name="mpt-7b-like", family="gpt", num_layers=32, hidden_size=4096, num_attention_heads=32,
                  ffn_hidden_size=16384, vocab_size=50368, max_position_embeddings=2048, dropout=False)
    sb = 2048
    assert activation_bytes_per_layer(m, 1, 2048) == 32 * sb * 4096 + 16 * sb + 4 * 32 * sb
    with_dropout = m.model_copy(update={"dropout": None})
    assert activation_bytes_per_layer(with_dropout, 1, 2048) == 34 * sb * 4096 + 16 * sb + 4 * 32 * sb


def test_the_megatron_files_turn_on_the_loss_the_plan_prices():
    """megatron-core's fused loss (priced at 32 B a logit) is what the files launch with
    --cross-entropy-loss-fusion; a plan priced with the unfused one (52 B) leaves the flag out. Same ledger."""
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100")
    fused = planner.evaluate(m, c, TrainingSpec(global_batch_size=8, seq_length=4096), Layout(dp=8, zero_stage=1))
    unfused = planner.evaluate(m, c, TrainingSpec(global_batch_size=8, seq_length=4096, cross_entropy="unfused"),
                               Layout(dp=8, zero_stage=1))
    assert "--cross-entropy-loss-fusion" in fused.to_megatron().args
    assert "--cross-entropy-loss-fusion" not in unfused.to_megatron().args
    assert unfused.peak_memory_bytes == fused.peak_memory_bytes
    assert unfused.step_time_s == pytest.approx(fused.step_time_s + (52 - 32) * 4096 * 128_256 / (0.89 * 3.35e12),
                                                rel=1e-6)
