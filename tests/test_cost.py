"""Cost-model terms against hand-worked numbers, paper formulas and direction checks."""


import pytest

import planner
from planner.comm import busbw, collective_time
from planner.cost import (
    dp_time,
    model_flops_per_token,
    time_to_train_s,
    training_flops,
)
from planner.errors import InvalidLayout
from planner.plans import evaluate
from planner.space import layout_problems
from planner.specs import Layout, TrainingSpec
from planner.topology import group_placement, placement

DAY, YEAR = 86400, 365.25 * 86400


def test_seed_compute_arithmetic():
    """70B params x 1T tokens: 6ND = 4.2e23 FLOPs; 1 GPU at 1e15 FLOP/s, 50 % MFU: 8.4e8 s = 26.6
    years; 1024 GPUs: 9.5 days (the seed's worked example)."""
    flops = training_flops(70e9, 1e12)
    assert flops == pytest.approx(4.2e23)
    one = time_to_train_s(flops, 1, 1e15, 0.5)
    assert one == pytest.approx(8.4e8)
    assert one / YEAR == pytest.approx(26.6, abs=0.05)
    assert time_to_train_s(flops, 1024, 1e15, 0.5) / DAY == pytest.approx(9.5, abs=0.05)


def test_plan_time_to_train_uses_throughput():
    m = planner.load_model("llama3-8b")
    c = planner.load_cluster("dgx-h100", nodes=1)
    tr = TrainingSpec(global_batch_size=64, seq_length=4096, token_budget=1e12)
    p = evaluate(m, c, tr, Layout(dp=8, zero_stage=1, micro_batch_size=1, recompute="selective"))
    assert p.time_to_train_s() == pytest.approx(1e12 / p.tokens_per_second)


def test_model_flops_korthikanti_eq7():
    """GPT with f = 4h: 72 L h^2 (1 + s/6h + V/(12 h L)) FLOPs per token (Korthikanti 2022 Eq. 7 / (B s))."""
    m = planner.load_model("gpt3-175b")
    L, h, V, s = 96, 12288, 50257, 2048
    assert model_flops_per_token(m, s) == pytest.approx(72 * L * h**2 * (1 + s / (6 * h) + V / (12 * h * L)))


def test_model_flops_llama_megatron_formula():
    """Megatron's num_floating_point_operations per token, with the unmasked attention term:
    12 L h^2 [(1 + g/a + s/h) + 1.5 f/h] + 6 h V  (GQA, SwiGLU; q_proj = h)."""
    m = planner.load_model("llama3-70b")
    L, h, a, g, f, V, s = 80, 8192, 64, 8, 28672, 128256, 8192
    expected = 12 * L * h**2 * ((1 + g / a + s / h) + 1.5 * f / h) + 6 * h * V
    assert model_flops_per_token(m, s) == pytest.approx(expected)


def test_allreduce_time_by_hand():
    """8-GPU NVLS all-reduce of 1 GiB on DGX H100: busbw = 480 GB/s x (466/479) (the measured
    curve at 1 GiB); t = 25 us + 2 * 7/8 * S / busbw (nccl-tests PERFORMANCE.md)."""
    c = planner.load_cluster("dgx-h100")
    g = placement(c, (8, 1))
    S = 2**30
    bw = 480e9 * 466 / 479
    assert busbw(c, g, "allreduce", S) == pytest.approx(bw)
    assert collective_time(c, g, "allreduce", S) == pytest.approx(25e-6 + 2 * 7 / 8 * S / bw)
    # all-gather uses the ring busbw (370 GB/s) and (n-1)/n
    assert collective_time(c, g, "allgather", S) == pytest.approx(25e-6 + 7 / 8 * S / (370e9 * 466 / 479))


def test_scaleout_group_gets_one_nic_per_member_per_node():
    """DP groups with one member per node (TP = 8 fills each node) ride one 47 GB/s rail each."""
    c = planner.load_cluster("dgx-h100", nodes=4)
    g = group_placement(c, Layout(tp=8, dp=4), "dp")
    assert (g.tier, g.per_node) == ("scaleout", 1)
    assert busbw(c, g, "allreduce", 8 * 2**30) == pytest.approx(47e9)
    # a pure-DP ring spanning 4 nodes has 8 members per node: min(370, 8 x 47) GB/s
    g8 = group_placement(c, Layout(dp=32), "dp")
    assert busbw(c, g8, "allreduce", 8 * 2**30) == pytest.approx(370e9)


def test_multi_node_nvlink_domains_are_nccls_nodes():
    """GB200 NVL72 (4 GPUs a tray, 72 a domain; its catalog: NVLink ring 680 GB/s, one 47 GB/s NIC a GPU,
    20 us to cross the fabric) on 144 GPUs, tp 4 x dp 36: a DP group holds one GPU of each of 36 trays, 18
    in each of the two domains. NCCL fuses a domain's trays into one node (NVIDIA/nccl src/graph/topo.cc,
    'MNNVL clique support'), so its ring crosses the fabric between the two domains only, scattering its
    channels' crossings over the 18 members' NICs: busbw min(680, 18 x 47) = 680 GB/s, where counting
    trays gave one NIC, 47 GB/s. Latency (NCCL tuning.cc, Simple): a reduce-scatter makes 35 steps, one
    across domains (the tier's 20 us), 34 over NVLink at 3.4 us = 135.6 us (trays: 20 + 34 x 14 = 496 us);
    PAT needs one rank per node, which 18 per domain are not. All-reduce: ring 20 + 14 + 68 x 3.4 =
    265.2 us against tree 20 + (2 log2 2 - 1) x 14 + 2 x 17 x 4 = 170 us. An all-to-all over the same
    group sends 18/36 of its bytes to its own domain over NVLink and 18/36 over its NIC."""
    from planner.comm import alltoall_time, latency
    c = _flat_curve(planner.load_cluster("gb200-nvl72", nodes=36))
    c = c.model_copy(update={"nvlink": c.nvlink.model_copy(update={"busbw_curve": [(2**20, 680e9), (2**33, 680e9)]})})
    g = group_placement(c, Layout(tp=4, dp=36), "dp")
    assert (g.tier, g.nodes, g.per_node, g.domains, g.per_domain) == ("scaleout", 36, 1, 2, 18)
    assert busbw(c, g, "reducescatter", 2**30) == pytest.approx(680e9)
    assert latency(c, g, "reducescatter") == pytest.approx(20e-6 + 34 * 3.4e-6)
    assert latency(c, g, "allreduce") == pytest.approx(20e-6 + 14e-6 + 2 * 17 * 4e-6)
    S = 2**20
    assert collective_time(c, g, "allgather", S) == pytest.approx(20e-6 + 34 * 3.4e-6 + 35 / 36 * S / 680e9)
    assert alltoall_time(c, g, S) == pytest.approx(20e-6 + max(18 / 36 * S / 47e9, 17 / 36 * S / 680e9))
    # a DGX H100 node is its NVLink domain: nothing changes there
    h = group_placement(planner.load_cluster("dgx-h100", nodes=4), Layout(tp=8, dp=4), "dp")
    assert (h.domains, h.per_domain, h.nccl_nodes, h.nic_drivers) == (0, 0, 4, 1)


def test_rank_order_moves_dp_and_pp_groups():
    """tp-cp-dp-pp (default): with tp 8 x pp 2 x dp 4 on 8 nodes a DP group has one member per node;
    with tp-cp-pp-dp (--use-tp-pp-dp-mapping) the PP neighbours are 8 ranks apart instead of 32."""
    c = planner.load_cluster("dgx-h100", nodes=8)
    default = Layout(tp=8, pp=2, dp=4)
    swapped = Layout(tp=8, pp=2, dp=4, rank_order="tp-cp-pp-dp")
    assert (group_placement(c, default, "dp").per_node, group_placement(c, default, "pp").per_node) == (1, 1)
    from planner.topology import axis_stride
    assert (axis_stride(default, "dp"), axis_stride(default, "pp")) == (8, 32)
    assert (axis_stride(swapped, "pp"), axis_stride(swapped, "dp")) == (8, 16)
    # the dp x cp gradient group: ranks {0, 2, 4, 6} by default (one node), {0, 2, 8, 10} with pp
    # inside it (two nodes, two members each)
    two = planner.load_cluster("dgx-h100", nodes=2)
    g = group_placement(two, Layout(tp=2, cp=2, pp=2, dp=2), "dpcp")
    assert (g.size, g.tier) == (4, "nvlink")
    g = group_placement(two, Layout(tp=2, cp=2, pp=2, dp=2, rank_order="tp-cp-pp-dp"), "dpcp")
    assert (g.size, g.tier, g.per_node) == (4, "scaleout", 2)


def test_tp_forced_across_nodes_is_much_slower_and_warned():
    m = planner.load_model("llama2-70b")  # 64 heads, 8 kv heads: tp 16 is legal in shape terms
    c = planner.load_cluster("dgx-h100", nodes=2)
    tr = TrainingSpec(global_batch_size=16, seq_length=4096)
    inside = evaluate(m, c, tr, Layout(tp=8, dp=2, zero_stage=1, recompute="full"))
    across = evaluate(m, c, tr, Layout(tp=16, dp=1, zero_stage=1, recompute="full"))
    per_layer_in = inside.time.breakdown()["tp_comm"] / (2 * 80)
    per_layer_out = across.time.breakdown()["tp_comm"] / 80
    assert per_layer_out > 3 * per_layer_in
    assert any("NVLink domain" in w for w in across.warnings)
    assert not any("NVLink domain" in w for w in inside.warnings)


def test_bubble_is_p_minus_1_over_v_m():
    """Narayanan 2021 §2.2: with equal stages, bubble / ideal = (p - 1)/(v m). A 256-token
    vocabulary makes the last stage's logits GEMM negligible, so the four stages are equal."""
    m = planner.load_model("llama3-8b").model_copy(update={"vocab_size": 256})
    c = planner.load_cluster("dgx-h100", nodes=1)
    for gbs, v in [(8, 1), (32, 1), (8, 2), (32, 4)]:
        tr = TrainingSpec(global_batch_size=gbs, seq_length=4096)
        p = evaluate(m, c, tr, Layout(pp=4, dp=2, vpp=v))
        pipe = p.time.pipeline
        ideal = pipe.num_microbatches * pipe.slowest.total
        assert pipe.bubble / ideal == pytest.approx(3 / (v * pipe.num_microbatches), rel=1e-3)


def test_uneven_stages_fill_and_drain_through_each_stage():
    """1F1B with unequal stages: the first micro-batch's forward and the last one's backward pass
    through every stage once, the other m - 1 go at the slowest stage's pace:
    (m - 1) T_max + sum T_i; interleaving shrinks the fill and drain v-fold. Hand arithmetic on
    the stage times evaluate reports, for the Llama-3-8B split 6|10|10|6 (logits on the last)."""
    m = planner.load_model("llama3-8b")
    c = planner.load_cluster("dgx-h100", nodes=1)
    tr = TrainingSpec(global_batch_size=32, seq_length=4096)
    for v, split in [(1, (6, 10, 10, 6)), (2, (3, 5, 5, 3, 3, 5, 5, 3))]:
        pipe = evaluate(m, c, tr, Layout(pp=4, dp=2, vpp=v, pipeline_layers=split)).time.pipeline
        t = [s.total for s in pipe.stages]
        assert [s.layers for s in pipe.stages] == [6, 10, 10, 6]
        mb = pipe.num_microbatches
        assert pipe.total == pytest.approx(mb * max(t) + (sum(t) - max(t)) / v, rel=1e-12)
        if v == 1:
            assert pipe.total == pytest.approx((mb - 1) * max(t) + sum(t), rel=1e-12)


def test_bubble_shrinks_as_microbatches_grow():
    m = planner.load_model("llama3-8b")
    c = planner.load_cluster("dgx-h100", nodes=1)
    fractions = []
    for gbs in (8, 16, 64, 256):
        p = evaluate(m, c, TrainingSpec(global_batch_size=gbs, seq_length=4096), Layout(pp=4, dp=2))
        fractions.append(p.time.pipeline.bubble / p.step_time_s)
    assert fractions == sorted(fractions, reverse=True)


def test_interleaving_helps_at_small_m():
    m = planner.load_model("llama3-8b")
    c = planner.load_cluster("dgx-h100", nodes=1)
    tr = TrainingSpec(global_batch_size=8, seq_length=4096)  # m = 4 = pp
    plain = evaluate(m, c, tr, Layout(pp=4, dp=2))
    inter = evaluate(m, c, tr, Layout(pp=4, dp=2, vpp=4))
    assert inter.step_time_s < plain.step_time_s


def _flat_curve(c):
    """The cluster with every message at its saturated bus bandwidth (time = alpha + bytes / busbw)."""
    return c.model_copy(update={
        "nvlink": c.nvlink.model_copy(update={"busbw_curve": [(2**20, 370e9), (2**33, 370e9)]}),
        "calibration": c.calibration.model_copy(update={"dp_overlap": 0.0})})


# NCCL's ring latency for 32 ranks on 4 nodes of 8 (Simple protocol, NVIDIA/nccl src/graph/tuning.cc):
# 31 steps, 3 of them across nodes at 14 us, the first of those the tier's own 20 us (dgx-h100.yaml
# scaleout.latency), 28 inside a node at 3.4 us
RING_32_ON_4_NODES_S = 20e-6 + 2 * 14e-6 + 28 * 3.4e-6


def test_zero3_moves_1_5x_the_data_of_zero1():
    """ZeRO paper §7: ZeRO-3 moves 3 Psi against 2 Psi for ZeRO-1 (bf16 grads, no overlap, m = 1).
    With the size curve flat only the collectives' latencies differ: ZeRO-1 reduces and gathers the
    whole buffer once each (no overlap flags), ZeRO-3 gathers each of its 34 units (embedding, 32
    layers, output layer) twice and reduce-scatters it once [Megatron-FSDP: one bucket per
    TransformerLayer], 102 collectives against 2."""
    m = planner.load_model("llama3-8b")
    c = _flat_curve(planner.load_cluster("dgx-h100", nodes=4))
    tr = TrainingSpec(global_batch_size=32, seq_length=4096, grad_dtype="bf16")
    z1 = dp_time(m, c, tr, Layout(dp=32, zero_stage=1))
    z3 = dp_time(m, c, tr, Layout(dp=32, zero_stage=3))
    volume = 2 * m.num_params * 2 * 31 / 32 / 370e9  # ZeRO-1: 2 B/param reduce-scattered, 2 B gathered
    assert z1 == pytest.approx(volume + 2 * RING_32_ON_4_NODES_S, rel=1e-6)
    assert z3 == pytest.approx(1.5 * volume + 102 * RING_32_ON_4_NODES_S, rel=1e-6)


def test_zero3_latency_grows_with_the_units_and_the_ring():
    """Per-unit collectives: ZeRO-3 over 32 ranks on 4 nodes pays 102 ring latencies a micro-batch
    (test above); over 128 ranks on 16 nodes each latency is 20 + 14 x 14 + 112 x 3.4 us, so at equal
    bytes per rank the step loses 102 x (that - the 32-rank one) seconds, m = 1."""
    m = planner.load_model("llama3-8b")
    small = _flat_curve(planner.load_cluster("dgx-h100", nodes=4))
    big = _flat_curve(planner.load_cluster("dgx-h100", nodes=16))
    t32 = dp_time(m, small, TrainingSpec(global_batch_size=32, seq_length=4096, grad_dtype="bf16"),
                  Layout(dp=32, zero_stage=3))
    t128 = dp_time(m, big, TrainingSpec(global_batch_size=128, seq_length=4096, grad_dtype="bf16"),
                   Layout(dp=128, zero_stage=3))
    volume = 3 * m.num_params * 2 / 370e9
    ring128 = 20e-6 + 14 * 14e-6 + 112 * 3.4e-6
    assert t128 - t32 == pytest.approx(volume * (127 / 128 - 31 / 32) + 102 * (ring128 - RING_32_ON_4_NODES_S),
                                       rel=1e-6)


def test_torchtitan_keeps_norm_and_output_gathered_for_backward():
    """torchtitan wraps [norm, output] with reshard_after_forward=False (torchtitan 0.3.0
    distributed/fsdp.py: apply_fsdp_to_decoder): its backward gathers every unit but that one again,
    so a micro-batch costs one gather of the output layer and final norm (2 B each) less than Megatron-FSDP's."""
    m = planner.load_model("llama3-8b")
    c = _flat_curve(planner.load_cluster("dgx-h100", nodes=4))
    lay = Layout(dp=32, zero_stage=3)
    fsdp = dp_time(m, c, TrainingSpec(global_batch_size=32, seq_length=4096), lay)
    titan = dp_time(m, c, TrainingSpec(global_batch_size=32, seq_length=4096, optimizer_impl="fsdp2"), lay)
    output_gather = RING_32_ON_4_NODES_S + m.output_params * 2 * 31 / 32 / 370e9  # the final norm with it
    assert fsdp - titan == pytest.approx(output_gather, rel=1e-6)


def test_zero3_costs_more_than_zero1_at_equal_headroom():
    """With the same layout (so the same activation headroom), ZeRO-3 is never cheaper in time."""
    m = planner.load_model("llama3-70b")
    c = planner.load_cluster("dgx-h100", nodes=8)
    tr = TrainingSpec(global_batch_size=64, seq_length=4096)
    t1 = evaluate(m, c, tr, Layout(tp=8, dp=8, zero_stage=1, recompute="full"))
    t3 = evaluate(m, c, tr, Layout(tp=8, dp=8, zero_stage=3, recompute="full"))
    assert t3.time.dp_exposed > t1.time.dp_exposed
    assert t3.peak_memory_bytes < t1.peak_memory_bytes


@pytest.mark.parametrize("layout,message", [
    (Layout(tp=8, pp=4, dp=3), "tp(8)*pp(4)*dp(3)*cp(1)=96 != world_size(64)"),
    (Layout(tp=3, dp=21, pp=1), "num_attention_heads(64) % tp(3) = 1 != 0"),
    (Layout(pp=3, dp=21, tp=1), "num_layers(80) % pp(3) = 2 != 0"),
    (Layout(pp=4, dp=16, vpp=3), "layers per stage(20) % vpp(3) = 2 != 0"),
    (Layout(pp=4, dp=16, first_stage_layers=18, last_stage_layers=17), "remaining layers(45) % middle stages(2) != 0"),
    (Layout(dp=64, micro_batch_size=3), "global_batch_size(128) % (dp(64)*micro_batch_size(3)) = 128 != 0"),
    (Layout(dp=64, sequence_parallel=True), "sequence_parallel needs tp > 1 (tp(1))"),
    (Layout(pp=4, dp=16, vpp=2, micro_batch_size=4), "interleaved schedule: num_microbatches(2) must be a multiple of pp(4)"),
])
def test_invalid_layout_messages_show_the_arithmetic(layout, message):
    m = planner.load_model("llama3-70b")
    c = planner.load_cluster("dgx-h100", nodes=8)
    tr = TrainingSpec(global_batch_size=128, seq_length=4096)
    with pytest.raises(InvalidLayout, match="^invalid layout: "):
        evaluate(m, c, tr, layout)
    assert any(p.startswith(message) for p in layout_problems(m, c, tr, layout))  # the arithmetic first, any hint after


def test_legal_layouts_pass():
    m = planner.load_model("llama3-70b")
    c = planner.load_cluster("dgx-h100", nodes=8)
    tr = TrainingSpec(global_batch_size=128, seq_length=4096)
    for lay in (Layout(dp=16, cp=4), Layout(tp=8, dp=8, sequence_parallel=True), Layout(tp=16, dp=4),
                Layout(tp=8, pp=4, dp=2, vpp=5), Layout(tp=8, pp=4, dp=2, first_stage_layers=19, last_stage_layers=19)):
        assert layout_problems(m, c, tr, lay) == []


def test_kv_heads_rule():
    """Megatron: num_query_groups % tp == 0 or tp % num_query_groups == 0."""
    m = planner.ModelSpec(name="m", family="llama", num_layers=4, hidden_size=1536, num_attention_heads=24,
                          num_kv_heads=6, ffn_hidden_size=4096, vocab_size=32000)
    c = planner.load_cluster("dgx-h100", nodes=1)
    tr = TrainingSpec(global_batch_size=8, seq_length=1024)
    assert "num_kv_heads(6) and tp(4): neither divides the other" in layout_problems(m, c, tr, Layout(tp=4, dp=2))
    assert layout_problems(m, c, tr, Layout(tp=2, dp=4)) == []


def test_invalid_cp_and_sp_rules():
    m = planner.load_model("llama3-8b")
    c = planner.load_cluster("dgx-h100", nodes=1)
    with pytest.raises(InvalidLayout, match=r"seq_length\(4098\) % \(2\*cp\(4\)\) = 2 != 0"):
        evaluate(m, c, TrainingSpec(global_batch_size=8, seq_length=4098), Layout(dp=2, cp=4))
    with pytest.raises(InvalidLayout, match=r"\(seq_length\(4100\)/cp\(1\)\) % tp\(8\) = 4 != 0"):
        evaluate(m, c, TrainingSpec(global_batch_size=8, seq_length=4100), Layout(tp=8, sequence_parallel=True))


# --- data-parallel overlap: Megatron's bucketed mechanism, worked by hand ------------------------

def _flat_h100():
    """One DGX H100 whose bus bandwidth does not depend on message size (a flat measured curve), so
    each collective is alpha + f * S / busbw: alpha 25 us, ring busbw 370 GB/s, f = 7/8 for
    reduce-scatter and all-gather over 8 ranks [nccl-tests PERFORMANCE.md]."""
    c = planner.load_cluster("dgx-h100", nodes=1)
    nvl = c.nvlink.model_copy(update={"busbw_curve": [(2**20, 370e9), (2**33, 370e9)]})
    return c.model_copy(update={"nvlink": nvl})


def _rs(nbytes):  # reduce-scatter or all-gather over the 8 GPUs of the node, by hand
    return 25e-6 + 7 / 8 * nbytes / 370e9


def test_megatron_bucket_size_rule():
    """max(40M, 1M x dp_cp) parameters [Megatron-LM distributed_data_parallel.py]."""
    from planner.cost import ddp_bucket_params
    assert ddp_bucket_params(8) == 40_000_000
    assert ddp_bucket_params(64) == 64_000_000
    assert ddp_bucket_params(4096) == 4_096_000_000


def test_dp_exposed_without_overlap_flags_is_the_whole_collective():
    """ZeRO-1, no flags: one reduce-scatter of the fp32 grads (4 B/param) after backward and one
    all-gather of the bf16 weights (2 B/param) after the step, both exposed."""
    m, c = planner.load_model("llama3-8b"), _flat_h100()
    tr = TrainingSpec(global_batch_size=8, seq_length=4096)
    psi = m.num_params
    t = dp_time(m, c, tr, Layout(dp=8, zero_stage=1))
    assert t == pytest.approx(_rs(psi * 4) + _rs(psi * 2), rel=1e-9)


def test_dp_exposed_with_overlap_is_the_last_bucket():
    """With both flags, 8.03B params go out in ceil(psi / 40M) = 201 buckets during one backward
    (~0.2 s of compute, far more than the ~0.09 s of reduce-scatter), so only the last bucket, the
    remainder psi - 200 x 40M, is exposed; the same for the all-gather under the next forward."""
    m, c = planner.load_model("llama3-8b"), _flat_h100()
    tr = TrainingSpec(global_batch_size=8, seq_length=4096)
    psi = m.num_params
    last = psi - 200 * 40_000_000
    assert 0 < last < 40_000_000
    t = dp_time(m, c, tr, Layout(dp=8, zero_stage=1, overlap_grad_reduce=True, overlap_param_gather=True))
    assert t == pytest.approx(_rs(last * 4) + _rs(last * 2), rel=1e-9)
    only_grad = dp_time(m, c, tr, Layout(dp=8, zero_stage=1, overlap_grad_reduce=True))
    assert only_grad == pytest.approx(_rs(last * 4) + _rs(psi * 2), rel=1e-9)


def test_zero2_reduces_gradients_in_every_micro_batch():
    """ZeRO-2 keeps no full gradient buffer, so each of the m = 32 / (8 x 1) = 4 micro-batches
    reduce-scatters its gradients; the weights are gathered once per step. Megatron-FSDP's
    optim_grads does both per unit (34: embedding, 32 TransformerLayers, output), each with its alpha."""
    m, c = planner.load_model("llama3-8b"), _flat_h100()
    tr = TrainingSpec(global_batch_size=32, seq_length=4096)
    psi = m.num_params
    t = dp_time(m, c, tr, Layout(dp=8, zero_stage=2))
    assert t == pytest.approx(4 * (_rs(psi * 4) + 33 * 25e-6) + _rs(psi * 2) + 33 * 25e-6, rel=1e-9)


def test_zero0_all_reduce_overlapped_with_backward():
    """Plain DDP: an all-reduce (f = 2 x 7/8); with the flag only the last bucket is exposed."""
    m, c = planner.load_model("llama3-8b"), _flat_h100()
    c = c.model_copy(update={"nvlink": c.nvlink.model_copy(update={"allreduce_busbw": 370e9})})  # no NVLS gain
    tr = TrainingSpec(global_batch_size=8, seq_length=4096)
    psi = m.num_params
    ar = lambda nbytes: 25e-6 + 2 * 7 / 8 * nbytes / 370e9  # noqa: E731
    assert dp_time(m, c, tr, Layout(dp=8)) == pytest.approx(ar(psi * 4), rel=1e-9)
    last = psi - 200 * 40_000_000
    assert dp_time(m, c, tr, Layout(dp=8, overlap_grad_reduce=True)) == pytest.approx(ar(last * 4), rel=1e-9)


def test_searched_megatron_plans_emit_exactly_the_overlaps_they_are_priced_with():
    m = planner.load_model("llama3-8b")
    c = planner.load_cluster("dgx-h100", nodes=2)
    tr = TrainingSpec(global_batch_size=64, seq_length=4096)
    from planner.search import plan
    r = plan(m, c, tr, top_k=3, structural=False)
    for p in [r.best, *r.alternatives]:
        args = p.to_megatron().args
        assert ("--overlap-grad-reduce" in args) == p.layout.overlap_grad_reduce
        assert ("--overlap-param-gather" in args) == p.layout.overlap_param_gather
        off = p.layout.model_copy(update={"overlap_grad_reduce": False, "overlap_param_gather": False})
        if p.layout.dp * p.layout.cp > 1 and p.layout.zero_stage < 3:
            assert evaluate(m, c, tr, off).time.dp_exposed > p.time.dp_exposed  # the flags buy time


def test_overlap_param_gather_needs_the_distributed_optimizer():
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100", nodes=1)
    probs = layout_problems(m, c, TrainingSpec(global_batch_size=8, seq_length=4096),
                            Layout(dp=8, overlap_param_gather=True))
    assert any("overlap_param_gather" in p for p in probs)


# --- terms a one-line bug could drop (each against hand arithmetic) ------------------------------

def test_ledger_activations_see_context_parallelism():
    """Llama-3-8B, seq 8192 over cp 2 = 4096 local tokens, b 1, tp 1, flash, no recompute. By hand
    [shared/reference/memory.md §2b]: 14 sbh + 6 sb h_kv + 6 sbf + 8 sb + 4 a sb with s = 4096,
    h = 4096, h_kv = 1024, f = 14336, a = 32: 234,881,024 + 25,165,824 + 352,321,536 + 32,768
    + 524,288 = 612,925,440 B per layer; 32 layers, one micro-batch in flight (pp 1)."""
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100", nodes=1)
    tr = TrainingSpec(global_batch_size=4, seq_length=8192)
    p = evaluate(m, c, tr, Layout(dp=4, cp=2, zero_stage=1))
    assert p.memory.stages[0].get("activations") == 32 * 612_925_440


def test_zero3_gathers_in_every_micro_batch():
    """ZeRO-3 with m = 32 / 8 = 4 micro-batches, no prefetch overlap: each micro-batch gathers the
    bf16 weights twice (forward, backward) and reduce-scatters fp32 gradients [ZeRO §7], one
    collective per unit (34: embedding, 32 layers, output), each with its alpha."""
    m, c = planner.load_model("llama3-8b"), _flat_h100()
    c = c.model_copy(update={"calibration": c.calibration.model_copy(update={"dp_overlap": 0.0})})
    tr = TrainingSpec(global_batch_size=32, seq_length=4096)
    psi = m.num_params
    t = dp_time(m, c, tr, Layout(dp=8, zero_stage=3))
    bandwidth = 7 / 8 * (2 * psi * 2 + psi * 4) / 370e9
    assert t == pytest.approx(4 * (bandwidth + 3 * 34 * 25e-6), rel=1e-9)


def test_fsdp_zero2_is_hidden_by_the_fsdp_prefetch_share_not_by_its_flags():
    """Megatron-FSDP's optim_grads (ZeRO-2), m = 32 / 8 = 4 micro-batches: each reduce-scatters the FP32
    gradients unit by unit (34 units: embedding, 32 layers, output), and the step all-gathers the BF16 weights
    once. With the overlap flags on (as the planner emits them) FSDP's prefetch hides calibration.dp_overlap of
    the compute, as for ZeRO-3 -- at 0, every collective exposed: 4 (7/8 Psi 4 / 370e9 + 34 x 25 us) +
    7/8 Psi 2 / 370e9 + 34 x 25 us. llm-foundry's SHARD_GRAD_OP runs spend about that: MPT-1B on 128 / 256 /
    512 H100 ran 0.557 / 0.578 / 0.617 s steps on 0.506 s of priced compute, collectives priced 0.058 /
    0.090 / 0.153 s exposed (benchmarks/fidelity.py --row mpt1b_h100_80gb_512gpu). The prefetch share hides;
    flags off, nothing does."""
    m, c = planner.load_model("llama3-8b"), _flat_h100()
    tr = TrainingSpec(global_batch_size=32, seq_length=4096)
    psi = m.num_params
    share = lambda x: c.model_copy(update={"calibration": c.calibration.model_copy(update={"dp_overlap": x})})  # noqa: E731
    on = Layout(dp=8, zero_stage=2, overlap_grad_reduce=True, overlap_param_gather=True)
    off = Layout(dp=8, zero_stage=2)
    exposed = 4 * (7 / 8 * psi * 4 / 370e9 + 34 * 25e-6) + 7 / 8 * psi * 2 / 370e9 + 34 * 25e-6
    assert dp_time(m, share(0.0), tr, on) == pytest.approx(exposed, rel=1e-9)
    assert dp_time(m, share(1.0), tr, off) == pytest.approx(exposed, rel=1e-9)
    assert dp_time(m, share(0.5), tr, on) < dp_time(m, share(0.25), tr, on) < exposed


def test_interleaved_p2p_is_paid_per_virtual_stage():
    """pp 2 inside one node, v = 2 chunks: each chunk sends its activation forward and its gradient
    backward, 2 v sends per micro-batch of 2 b s h = 33,554,432 B, each alpha + S / p2p bandwidth
    (25 us, 370 GB/s, flat curve)."""
    from planner.cost import pipeline_time
    m, c = planner.load_model("llama3-8b"), _flat_h100()
    tr = TrainingSpec(global_batch_size=8, seq_length=4096)
    one = 25e-6 + 2 * 4096 * 4096 / 370e9
    for v in (1, 2):
        pt = pipeline_time(m, c, tr, Layout(pp=2, dp=4, vpp=v, overlap_p2p=False if v > 1 else None))
        assert pt.stages[0].p2p == pytest.approx(2 * v * one, rel=1e-9)


def test_interleaved_p2p_overlaps_the_next_chunk_by_default():
    """megatron-core 0.19.2 overlaps interleaved p2p by default: each send runs beside the next
    chunk's forward and only the excess is exposed. On a 1 GB/s peer link (a send of 33,554,432 B
    takes 25 us + 33.6 ms) with a flat GEMM efficiency of 0.5, one layer's forward by hand is
    GEMMs 2 s h (a d + 2 h_kv) + 2 s (a d) h + 2 s h 2f + 2 s f h at 0.5 x 989 TFLOP/s, attention
    (causal half of 4 s^2 a d) at 0.332 x 989 TFLOP/s x 319/333 (FlashAttention-2's causal speed at
    4k over 8k, FA3 paper Fig. 'head dim 128, H100'), and 8 x 2 s h bytes at 0.89 x 3.35 TB/s;
    a chunk is 16 / 2 = 8 layers (s = 4096, h = a d = 4096, h_kv = 1024, f = 14336)."""
    from planner.cost import pipeline_time
    m = planner.load_model("llama3-8b")
    c = planner.load_cluster("dgx-h100", nodes=1)
    c = c.model_copy(update={
        "nvlink": c.nvlink.model_copy(update={"p2p_bandwidth": 1e9, "busbw_curve": [(2**20, 370e9), (2**33, 370e9)]}),
        "calibration": c.calibration.model_copy(update={"gemm_efficiency": [(1.0, 0.5), (1e6, 0.5)]})})
    tr = TrainingSpec(global_batch_size=8, seq_length=4096)
    s, h, hkv, f = 4096, 4096, 1024, 14336
    gemm = (2 * s * h * (h + 2 * hkv) + 2 * s * h * h + 2 * s * h * 2 * f + 2 * s * f * h) / (0.5 * 989e12)
    attn = 4 * s * s * h / 2 / (0.332 * 989e12 * 319 / 333)
    elem = 8 * 2 * s * h / (0.89 * 3350e9)
    chunk = 8 * (gemm + attn + elem)
    send = 25e-6 + 2 * s * h / 1e9
    pt = pipeline_time(m, c, tr, Layout(pp=2, dp=4, vpp=2))
    assert pt.stages[0].p2p == pytest.approx(2 * 2 * (send - chunk), rel=1e-9)
    assert send > chunk > 0


def test_last_stage_pays_the_logits_gemm_and_the_loss():
    """With a flat GEMM efficiency of 0.5, the last stage's compute exceeds the first's by the
    output layer: forward 2 tokens h V plus backward twice that, at 0.5 x 989 TFLOP/s
    (tokens = 4096, h = 4096, V = 128,256), and by megatron-core's fused loss over the 4096 x 128,256
    logits: forward the FP32 copy and its maximum (2 + 4), exp and the sum (4 + 4), the division
    (4 + 4), backward the gradient written back and cast (4 + 4 + 2) = 32 B a logit, at 0.89 x 3.35 TB/s."""
    from planner.cost import pipeline_time
    m = planner.load_model("llama3-8b")
    c = planner.load_cluster("dgx-h100", nodes=1)
    c = c.model_copy(update={"calibration": c.calibration.model_copy(update={"gemm_efficiency": [(1.0, 0.5), (1e6, 0.5)]})})
    tr = TrainingSpec(global_batch_size=8, seq_length=4096)
    pt = pipeline_time(m, c, tr, Layout(pp=2, dp=4))
    logits = 3 * 2 * 4096 * 4096 * 128_256 / (0.5 * 989e12)
    loss = 32 * 4096 * 128_256 / (0.89 * 3.35e12)
    assert pt.stages[1].compute - pt.stages[0].compute == pytest.approx(logits + loss, rel=1e-9)


@pytest.mark.parametrize("engine, tp, per_logit", [
    # Megatron's fused loss (the emitted --cross-entropy-loss-fusion), see the test above
    ({}, 1, 32),
    # megatron-core's loss without the flag: cast 6, max 4, subtract 8, exp 8, sum 4, divide 8; product 8, cast 6
    ({"cross_entropy": "unfused"}, 1, 52),
    # Megatron-DeepSpeed: one pass per step (cast 6, max 4, shift 8, exp 8, sum 4, divide 8; backward product 8, cast 6)
    ({"optimizer_impl": "deepspeed"}, 1, 52),
    # torchtitan before 0.3, eager: cast 6, log_softmax 3 reads + 1 write (16); backward zeros 4, softmax backward
    # 16, cast 6; with TP loss_parallel's separate ops: 6 + 4 + 8 + 8 + 4 + 8 and 4 + 8 + 12 + 8 + 6
    ({"optimizer_impl": "fsdp2", "kernels": "unfused"}, 1, 48),
    ({"optimizer_impl": "fsdp2", "kernels": "unfused"}, 2, 76),
    # torchtitan 0.3's compiled chunk loss: two reads of the BF16 chunk forward, a read and a BF16 write backward
    ({"optimizer_impl": "fsdp2", "kernels": "unfused", "loss_chunks": 8}, 1, 8),
    # flash-attn's fused loss (llm-foundry): one read forward, a read and a write backward
    ({"cross_entropy": "fused", "kernels": "unfused"}, 1, 6),
    # Transformer Engine's loss (Megatron-Bridge): the online-softmax read forward, a read and the in-place write backward
    ({"cross_entropy": "te"}, 1, 6),
])
def test_the_loss_moves_each_engines_bytes_per_logit(engine, tp, per_logit):
    """loss_seconds: the engine's bytes per local logit over b s V / tp logits at 0.89 x 3.35 TB/s
    (Llama-3-8B, micro-batch 2, s 4096, V 128,256); a CP rank holds s / cp of the tokens."""
    from planner.cost import loss_seconds
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100", nodes=1)
    tr = TrainingSpec(global_batch_size=16, seq_length=4096, **engine)
    lay = Layout(tp=tp, dp=8 // tp, micro_batch_size=2, sequence_parallel=tp > 1)
    assert loss_seconds(m, c, tr, lay) == pytest.approx(per_logit * 2 * 4096 * 128_256 / tp / (0.89 * 3.35e12), rel=1e-12)
    if tp == 1 and not engine:
        cp2 = Layout(tp=1, dp=4, cp=2, micro_batch_size=2)
        assert loss_seconds(m, c, tr, cp2) == pytest.approx(32 * 2 * 2048 * 128_256 / (0.89 * 3.35e12), rel=1e-12)


def test_selective_recompute_pays_the_attention_core_again():
    """Selective recompute re-runs QK^T / softmax / PV forward in backward [Korthikanti22 §5].
    Llama-3-8B, b 1, s 4096, flash (causal half of 4 b s^2 a d = 4 x 4096^2 x 4096 FLOPs) at the
    measured FlashAttention-2 efficiency 0.332 of 989 TFLOP/s at 8k, times 319/333 at 4k (its causal
    speed at 4k over 8k, FA3 paper Fig. 'head dim 128, H100'), for each of the 32 layers."""
    from planner.cost import pipeline_time
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100", nodes=1)
    tr = TrainingSpec(global_batch_size=8, seq_length=4096)
    per_layer = 4 * 4096 * 4096 * 4096 / 2 / (989e12 * 0.332 * 319 / 333)
    pt = pipeline_time(m, c, tr, Layout(dp=8, recompute="selective"))
    assert pt.stages[0].recompute == pytest.approx(32 * per_layer, rel=1e-9)
    assert pipeline_time(m, c, tr, Layout(dp=8)).stages[0].recompute == 0.0


def test_cp_ring_exposes_what_attention_cannot_hide():
    """CP 2 on a (deliberately) slow 1 GB/s peer link: each ring step sends the rank's K and V,
    2 x 2 B x (s / cp) x h_kv = 4 x 16384 x 1024 B, in 25 us + S / 1 GB/s, beside the attention of
    the resident block (causal half of 4 (s/cp) s a d FLOPs, / cp, at 0.332 x 989 TFLOP/s x 335/333:
    FlashAttention-2's causal speed at 16k, the chunk's length, over 8k)."""
    from planner.cost import pipeline_time
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100", nodes=1)
    nvl = c.nvlink.model_copy(update={"p2p_bandwidth": 1e9, "busbw_curve": [(2**20, 370e9), (2**33, 370e9)]})
    c = c.model_copy(update={"nvlink": nvl})
    tr = TrainingSpec(global_batch_size=4, seq_length=32768)
    step = 25e-6 + 4 * 16384 * 1024 / 1e9
    attn_step = 4 * 16384 * 32768 * 4096 / 2 / (989e12 * 0.332 * 335 / 333) / 2
    pt = pipeline_time(m, c, tr, Layout(dp=4, cp=2))
    fwd, bwd = step - attn_step, 2 * step - 2.5 * attn_step  # backward moves K/V and dK/dV
    assert pt.stages[0].cp_comm == pytest.approx(32 * (fwd + bwd), rel=1e-9)


def test_tp_comm_overlap_hides_each_collective_behind_its_gemm():
    """Llama-3-8B, tp 2 with sequence parallelism, b 1, s 4096, flat GEMM efficiency 0.5, flat bus
    bandwidth: each SP all-gather / reduce-scatter of 2 s h bytes over 2 GPUs takes 25 us +
    1/2 x 33,554,432 B / 370 GB/s. Exposed: without overlap 2 (AG + RS) per direction; with
    --tp-comm-overlap, TE's pairs: forward AG-QKV and AG-FC1 (ring exchange, max(0, AG - GEMM)),
    RS-proj and RS-FC2 (pipelined in 4: max(RS/4, RS - GEMM)); backward AG-proj, AG-FC2 (ring),
    RS-QKV, RS-FC1 (bulk, beside the wgrad GEMMs); pipelined and bulk kernels take 16 of the 132
    SMs from the GEMMs they run beside (proj, FC2 forward; QKV and FC1 dgrad and wgrad backward).
    GEMMs of 2 s h (a d + 2 h_kv)/2, 2 s h^2/2, 2 s h 2f/2 and 2 s f h/2 FLOPs at 0.5 x 989 TFLOP/s."""
    from planner.cost import pipeline_time
    m = planner.load_model("llama3-8b")
    c = _flat_h100()
    c = c.model_copy(update={"calibration": c.calibration.model_copy(update={"gemm_efficiency": [(1.0, 0.5), (1e6, 0.5)]})})
    tr = TrainingSpec(global_batch_size=8, seq_length=4096)
    s, h, hkv, f = 4096, 4096, 1024, 14336
    coll = 25e-6 + 0.5 * 2 * s * h / 370e9
    g = [x / 2 / (0.5 * 989e12) for x in (2 * s * h * (h + 2 * hkv), 2 * s * h * h, 2 * s * h * 2 * f, 2 * s * f * h)]
    plain = pipeline_time(m, c, tr, Layout(tp=2, dp=4, sequence_parallel=True)).stages[0].tp_comm
    assert plain == pytest.approx(32 * 2 * (2 * 2 * coll), rel=1e-9)
    over = pipeline_time(m, c, tr, Layout(tp=2, dp=4, sequence_parallel=True, tp_comm_overlap=True)).stages[0].tp_comm
    fwd = (max(0.0, coll - g[0]) + max(0.0, coll - g[2]) + max(coll / 4, coll - g[1]) + max(coll / 4, coll - g[3])
           + 16 / 132 * (g[1] + g[3]))
    bwd = max(0.0, coll - g[1]) + max(0.0, coll - g[3]) + max(0.0, coll - g[0]) + max(0.0, coll - g[2]) \
        + 16 / 132 * 2 * (g[0] + g[2])
    assert over == pytest.approx(32 * (fwd + bwd), rel=1e-9)
    assert over < plain


def test_tp_comm_overlap_needs_sequence_parallel():
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100", nodes=1)
    probs = layout_problems(m, c, TrainingSpec(global_batch_size=8, seq_length=4096),
                            Layout(tp=2, dp=4, tp_comm_overlap=True))
    assert any("tp_comm_overlap" in p for p in probs)


def test_scaleout_latency_grows_with_the_nodes_a_group_spans():
    """NCCL tuning.cc (Simple; v2.23.4-v2.30.7 constants): a ring reduce-scatter over 64 nodes, one
    GPU each, makes 63 inter-node steps, the first at the scale-out latency (20 us) and 62 more at
    hwLat[NET][Ring] = 14 us; an all-reduce over 64 nodes picks the tree, 2 log2(64) = 12 levels:
    20 us + 11 x 14 us (a ring would cost 20 + 125 x 14 us)."""
    from planner.comm import latency
    c = planner.load_cluster("dgx-h100", nodes=64)
    g = placement(c, (64, 8))  # one GPU per node, 64 nodes
    assert g.tier == "scaleout" and g.nodes == 64
    assert latency(c, g, "reducescatter") == pytest.approx(20e-6 + 62 * 14e-6)
    assert latency(c, g, "allreduce") == pytest.approx(20e-6 + 11 * 14e-6)
    two = placement(c, (2, 8))
    assert latency(c, two, "allgather") == pytest.approx(20e-6)  # one crossing: the tier's own alpha
    assert latency(c, two, "allreduce") == pytest.approx(20e-6 + 14e-6)  # ring 2 steps = tree 2 levels


def test_a_ring_over_full_nodes_pays_its_intra_node_steps():
    """A ring over 512 GPUs on 64 nodes (8 each, an FSDP group) makes nsteps = 511 steps, of which
    nInterSteps = 63 cross nodes; the other 448 pay intraLat = max(hwLat[NVLINK][Ring][Simple] 3.4 us,
    3 x 1 us net overhead) [NVIDIA/nccl src/graph/tuning.cc]: 20 + 62 x 14 + 448 x 3.4 = 2,411.2 us.
    An all-reduce picks the tree: 20 + 11 x 14 + 2 x 7 x 4.0 = 230 us (the ring: 4,816.4 us)."""
    from planner.comm import latency
    c = planner.load_cluster("dgx-h100", nodes=64)
    g = placement(c, (512, 1))
    assert (g.size, g.nodes, g.per_node) == (512, 64, 8)
    assert latency(c, g, "allgather") == pytest.approx(2411.2e-6)
    assert latency(c, g, "reducescatter") == pytest.approx(2411.2e-6)
    assert latency(c, g, "allreduce") == pytest.approx(230e-6)
    # two nodes of 8: a ring all-gather 20 + 0 x 14 + 14 x 3.4 us; all-reduce ring 20 + 14 + 28 x 3.4
    # against the tree 20 + 14 + 2 x 7 x 4.0 = 90 us
    g16 = placement(c, (16, 1))
    assert latency(c, g16, "allgather") == pytest.approx(20e-6 + 14 * 3.4e-6)
    assert latency(c, g16, "allreduce") == pytest.approx(90e-6)


@pytest.mark.parametrize("v,split", [(1, (6, 10, 10, 6)), (1, (9, 8, 8, 7)), (2, (3, 5, 5, 3, 3, 5, 5, 3)),
                                     (4, None)])
def test_integer_objective_is_the_pipeline_in_microseconds(v, split):
    """The search ranks by Plan.time.objective_us, built from per-rank coefficients rounded up to
    whole microseconds. It must be the float pipeline + update time within that rounding: at most
    (layers + 4) us per rank and micro-batch, i.e. (m + p)(max layers + 4) us over the step."""
    m = planner.load_model("llama3-8b")
    c = planner.load_cluster("dgx-h100", nodes=1)
    tr = TrainingSpec(global_batch_size=32, seq_length=4096)
    p = evaluate(m, c, tr, Layout(pp=4, dp=2, vpp=v, pipeline_layers=split))
    pipe, mb = p.time.pipeline, p.time.pipeline.num_microbatches
    slack_us = (mb + 4) * (max(s.layers for s in pipe.stages) + 4) + 1
    assert abs(p.time.objective_us - (pipe.total + p.time.update.total) * 1e6) <= slack_us
    # the fill and drain is what separates these splits: it is far above the rounding
    t = [s.total for s in pipe.stages]
    assert (sum(t) - max(t)) / v * 1e6 > 10 * slack_us


def test_update_waits_for_the_rank_with_the_most_parameters():
    """With dp = 1 there is no DP traffic; the step's update is the Adam pass of the slowest rank:
    32 bytes of HBM traffic per parameter it holds. Split 6|6|6|14 of Llama-3-8B: the last rank
    holds 14 layers and the output layer (hand count from the model card's shapes)."""
    m = planner.load_model("llama3-8b")
    c = planner.load_cluster("dgx-h100", nodes=1)
    tr = TrainingSpec(global_batch_size=32, seq_length=4096)
    h, f, V, a, g, d = 4096, 14336, 128256, 32, 8, 128
    per_layer = h * (a * d + 2 * g * d) + a * d * h + 3 * h * f + 2 * h  # QKV, out-proj, SwiGLU, two norms
    last = 14 * per_layer + V * h + h  # + output layer and the final norm
    p = evaluate(m, c, tr, Layout(pp=4, dp=1, tp=2, pipeline_layers=(6, 6, 6, 14)))
    expect = last / 2 * 32 / (c.gpu.hbm_bandwidth * c.calibration.hbm_efficiency)
    assert p.time.update.stage == 3
    assert p.time.optimizer == pytest.approx(expect, rel=2e-3)
    assert p.time.dp_exposed == 0.0


def test_bf16_adam_states_of_the_precision_aware_optimizer():
    # Megatron's precision-aware optimizer with BF16 moments: m and v at 2 B each and the master weight
    # as its 16-bit remainder (TE FusedAdam store_param_remainders) = 6 B/param instead of 12; with an FP8
    # recipe other than delayed Megatron keeps the master whole: 8 B. The step touches 2 x states + 8 B.
    from planner.cost import stage_optimizer_time
    from planner.memory import adam_bytes, stage_params

    t = TrainingSpec(global_batch_size=1024, seq_length=8192)
    assert adam_bytes(t) == 12
    assert adam_bytes(t.model_copy(update={"optimizer_states": "bf16"})) == 6
    assert adam_bytes(t.model_copy(update={"optimizer_states": "bf16", "fp8": "tensorwise"})) == 8
    assert adam_bytes(t.model_copy(update={"optimizer_states": "bf16", "fp8": "delayed"})) == 6
    m, c = planner.load_model("llama3-70b"), planner.load_cluster("dgx-h100", nodes=8)
    lay = Layout(tp=4, pp=4, dp=4, zero_stage=1, sequence_parallel=True)
    bf16 = t.model_copy(update={"optimizer_states": "bf16"})
    psi = stage_params(m, lay, 1, 20) / 4  # ZeRO-1 over dp 4
    hbm = 3350e9 * 0.89
    assert stage_optimizer_time(m, c, t, lay, 1, 20) == pytest.approx(psi * 32 / hbm)
    assert stage_optimizer_time(m, c, bf16, lay, 1, 20) == pytest.approx(psi * 20 / hbm)
    a, b = planner.evaluate(m, c, t, lay), planner.evaluate(m, c, bf16, lay)
    assert a.memory.stages[1].get("optimizer") - b.memory.stages[1].get("optimizer") == pytest.approx(6 * psi)
    args = b.to_megatron().args
    assert args[args.index("--exp-avg-dtype") + 1] == "bf16" and "--use-precision-aware-optimizer" in args
    with pytest.raises(planner.PlannerError, match="precision-aware"):
        b.to_deepspeed()


def test_op_checkpointing_recomputes_the_linears_it_did_not_keep():
    """torchtitan's per-op checkpointing re-runs wk, wo and w3 (the even linears of wq, wk, wv, wo,
    w1, w3, w2) and every elementwise pass, not attention. Llama-3-8B, b 1, s 4096, one H100 with a
    flat GEMM curve (0.5 of 989 TFLOP/s): 2 x 4096 x 4096 x (1024 + 4096 + 14336) FLOPs, plus the
    catalog's 8 fused elementwise passes of 2 x 4096 x 4096 B at 0.89 x 3.35 TB/s, per layer."""
    from planner.cost import pipeline_time
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100", nodes=1)
    c = c.model_copy(update={"calibration": c.calibration.model_copy(
        update={"gemm_efficiency": [(0.001, 0.5), (1e6, 0.5)]})})
    tr = TrainingSpec(global_batch_size=8, seq_length=4096)
    per_layer = (2 * 4096 * 4096 * (1024 + 4096 + 14336) / (0.5 * 989e12)
                 + 8 * 2 * 4096 * 4096 / (0.89 * 3350e9))
    pt = pipeline_time(m, c, tr, Layout(dp=8, recompute="op"))
    assert pt.stages[0].recompute == pytest.approx(32 * per_layer, rel=1e-9)


def test_op_checkpointing_repeats_the_all_gathers_not_the_reduce_scatters():
    """With TP 2 and sequence parallelism the policy keeps the reduce-scatter outputs and re-runs
    the two forward all-gathers of the 2 x 4096 x 4096 B activations: the recompute term exceeds
    the TP-less one (same GEMMs per GPU halved) by exactly those all-gathers, on a flat 370 GB/s
    NVLink: 25 us + (1/2) S / 370 GB/s each [nccl-tests PERFORMANCE.md]."""
    from planner.cost import pipeline_time
    m, c = planner.load_model("llama3-8b"), _flat_h100()
    c = c.model_copy(update={"calibration": c.calibration.model_copy(
        update={"gemm_efficiency": [(0.001, 0.5), (1e6, 0.5)]})})
    tr = TrainingSpec(global_batch_size=8, seq_length=4096)
    gemm = 2 * 4096 * 4096 * (1024 + 4096 + 14336) / 2 / (0.5 * 989e12)
    elem = 8 * 2 * 4096 * 4096 / 2 / (0.89 * 3350e9)
    ag = 25e-6 + 0.5 * 2 * 4096 * 4096 / 370e9
    pt = pipeline_time(m, c, tr, Layout(tp=2, dp=4, sequence_parallel=True, recompute="op"))
    assert pt.stages[0].recompute == pytest.approx(32 * (gemm + elem + 2 * ag), rel=1e-6)


def test_flash_attention_speed_follows_the_causal_length_curve():
    """FlashAttention-2's causal forward on H100, head dim 128 [FA3 paper, arXiv 2407.08608, Fig.
    'Attention forward speed, head dim 128 (H100 80GB SXM5)', causal]: 191, 260, 298, 319, 333 and
    335 TFLOP/s at 512 ... 16k. The calibrated efficiency is the one at 8k, so a kernel of 2k keys
    runs at 298/333 of it, 3k log-interpolated between 2k and 4k, and the curve is held flat beyond
    its ends. With CP the kernel sees s / cp: 8k over CP 2 is a 4k kernel."""
    import math

    from planner.cost import flash_length_factor, flash_speed_factor
    m = planner.load_model("llama3-8b")
    assert flash_length_factor(2048) == pytest.approx((298 / 333,) * 2, rel=1e-12)
    t = math.log(3000 / 2048) / math.log(2)
    assert flash_length_factor(3000)[0] == pytest.approx((298 + t * (319 - 298)) / 333, rel=1e-12)
    assert flash_length_factor(128)[0] == pytest.approx(191 / 333, rel=1e-12)
    assert flash_length_factor(131072)[0] == pytest.approx(335 / 333, rel=1e-12)
    assert flash_speed_factor(m, 8192, 1) == pytest.approx((1.0, 1.0), rel=1e-12)
    assert flash_speed_factor(m, 8192, 2)[0] == pytest.approx(319 / 333, rel=1e-12)


def test_one_gpu_per_node_gathers_take_pat_where_it_is_faster():
    """NCCL's tuner (src/graph/tuning.cc) runs all-gather and reduce-scatter over one GPU per node as
    PAT where that is faster than the ring: alpha log2(nodes) x 14 / 3.5 + nRanks x 2.8 us beside
    the tier's 20 us, at 0.75 of the ring's bus bandwidth. tp 8 x dp 4 on 4 DGX H100 (flat size
    curve): each dp group has one GPU per node, its own NIC at 47 GB/s. 1 MiB: ring 20 + 2 x 14 us +
    3/4 MiB / 47 GB/s, PAT 20 + 8 + 11.2 us + that / 0.75; 1 GiB: the ring."""
    c = _flat_curve(planner.load_cluster("dgx-h100", nodes=4))
    g = group_placement(c, Layout(tp=8, dp=4), "dp")
    assert (g.per_node, g.nodes) == (1, 4)
    for size, pat_wins in ((2**20, True), (2**30, False)):
        wire = 3 / 4 * size / 47e9
        ring, pat = 48e-6 + wire, 39.2e-6 + wire / 0.75
        assert (pat < ring) == pat_wins
        for op in ("allgather", "reducescatter"):
            assert collective_time(c, g, op, size) == pytest.approx(min(ring, pat), rel=1e-9)
    # two GPUs a node (tp 4 x dp 8) take the ring: 3 steps across nodes, 4 inside at 3.4 us, two NICs
    g2 = group_placement(c, Layout(tp=4, dp=8), "dp")
    assert (g2.per_node, g2.nodes) == (2, 4)
    ring8 = 20e-6 + 2 * 14e-6 + 4 * 3.4e-6 + 7 / 8 * 2**20 / 94e9
    assert collective_time(c, g2, "allgather", 2**20) == pytest.approx(ring8, rel=1e-9)
