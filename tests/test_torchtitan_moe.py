"""Mixture-of-Experts on torchtitan 0.3: the Qwen3 MoE flavours its registry builds, EP borrowed from
FSDP and TP (experts never TP-sharded beside EP), FSDP2 sharding the experts over efsdp, the standard
all-to-all dispatcher without probabilities; searched, priced, emitted and built by torchtitan itself."""

import pytest

import planner
from planner.comm import alltoall_time, collective_time
from planner.cost import moe_time, stage_dp_time
from planner.errors import PlannerError
from planner.explain import explain
from planner.search import plan
from planner.space import framework_training, layout_problems
from planner.specs import Layout, TrainingSpec
from planner.topology import placement

# Hugging Face config.json of each model (the catalog's sources), not torchtitan's registry: (layers,
# hidden, heads, kv heads, head dim, vocab, experts, top-k, moe_intermediate_size)
HF = {"qwen3-30b-a3b": (48, 2048, 32, 4, 128, 151936, 128, 8, 768),
      "qwen3-235b-a22b": (94, 4096, 64, 4, 128, 151936, 128, 8, 1536)}


def _titan(gbs=64, seq=4096, **kw) -> TrainingSpec:
    return framework_training(TrainingSpec(global_batch_size=gbs, seq_length=seq, **kw), "torchtitan")


@pytest.mark.parametrize("name, nodes, gbs", [("qwen3-30b-a3b", 2, 64), ("qwen3-235b-a22b", 16, 512)])
def test_torchtitan_builds_the_qwen3_moe_model_the_plan_prices(tmp_path, name, nodes, gbs):
    """A torchtitan search for each Qwen3 MoE model emits launch files that torchtitan 0.3 parses into
    the model of the Hugging Face config (its registry's 30B-A3B config; for 235B-A22B, which has no config
    function, planner_job.py with the flavour), builds the device meshes for the plan's EP (efsdp =
    dp_shard x cp x tp / ep) in a fake process group, and places the plan's pipeline split."""
    pytest.importorskip("torchtitan")
    from titan_checks import parsed_by_torchtitan

    m = planner.load_model(name)
    r = plan(m, planner.load_cluster("dgx-h100", nodes=nodes), TrainingSpec(global_batch_size=gbs, seq_length=4096),
             framework="torchtitan", top_k=1, structural=False)
    p = r.best
    assert r.status == "optimal" and p.layout.ep > 1 and p.layout.expert_tp == 1 and p.layout.zero_stage == 3
    files = p.to_torchtitan()
    assert "job.toml" not in files.files  # the 0.2-style TOML's expert keys are not checked
    assert ("planner_job.py" in files.files) == (name == "qwen3-235b-a22b")
    d = parsed_by_torchtitan(p, tmp_path)
    layers, h, a, g, hd, v, e, k, fe = HF[name]
    assert (d["num_layers"], d["moe_layers"], d["dim"], d["n_heads"], d["n_kv_heads"], d["head_dim"], d["vocab_size"],
            d["num_experts"], d["top_k"], d["expert_hidden_dim"]) == (layers, layers, h, a, g, hd, v, e, k, fe)
    assert d["qk_norm"] and not d["shared_experts"] and not d["weight_tying"]
    lay = p.layout
    assert (d["ep"], d["dp_shard"], d["efsdp"]) == (lay.ep, lay.dp, lay.dp * lay.cp * lay.tp // lay.ep) == (lay.ep, lay.dp,
                                                                                                         lay.edp)
    if lay.pp > 1:
        stages = lay.pp * lay.vpp
        assert d["stage_layers"] == list(lay.pipeline_layers or [m.num_layers // stages] * stages)


def test_torchtitans_mesh_refuses_an_ep_its_sparse_region_cannot_hold():
    """EP 32 on 16 GPUs: torchtitan's own mesh construction fails (efsdp would be 0)."""
    pytest.importorskip("torchtitan")
    from planner.check import check_torchtitan

    args = ["--parallelism.data_parallel_shard_degree", "16", "--parallelism.expert_parallel_degree", "32",
            "--training.disable_cuda_graphs"]
    r = check_torchtitan(args, 16, module="qwen3", config="qwen3_30b_a3b")
    assert not r.ok and r.stage == "mesh"


def test_torchtitans_all_to_all_carries_the_tokens_not_the_probabilities():
    """Qwen3-30B-A3B, 4,096 tokens a GPU, EP 16 over two DGX H100: each rank sends and receives N top_k =
    32,768 rows of h = 2048 BF16 (134 MB) in dispatch and again in combine, forward and backward. Megatron
    sends the FP32 probabilities beside them (4 B a row); torchtitan keeps them on the source rank and
    weighs the combined outputs there (AllToAllTokenDispatcher.combine)."""
    m, c = planner.load_model("qwen3-30b-a3b"), planner.load_cluster("dgx-h100", nodes=2)
    group = placement(c, (16, 1))
    rows = 4096 * 8
    titan = moe_time(m, c, _titan(), tp=1, cp=1, b=1, ep=16, etp=1)
    megatron = moe_time(m, c, TrainingSpec(global_batch_size=64, seq_length=4096), tp=1, cp=1, b=1, ep=16, etp=1)
    assert titan.ep == pytest.approx(2 * alltoall_time(c, group, 2 * rows * 2048))
    assert megatron.ep == pytest.approx(2 * (alltoall_time(c, group, 2 * rows * 2048) + alltoall_time(c, group, 4 * rows)))


def test_fsdp2_gathers_and_reduces_the_experts_over_efsdp():
    """FSDP2 under torchtitan shards a block's routed experts over efsdp, apart from its other parameters
    (apply_fsdp_to_decoder: a mesh per parameter). Qwen3-30B-A3B on 16 H100, dp_shard 16: at EP 8 each GPU
    holds 16 experts a layer, 128 x 3 x 2048 x 768 / 8 = 75,497,472 parameters, replicated on efsdp = 2 ranks
    eight apart (the other node); at EP 16 efsdp is 1 and the experts are never gathered. Everything else is
    the same shard over dp 16, so the difference of the two steps' data-parallel time is the experts':
    in each of the m = 2 micro-batches, 48 layers x (all-gather in forward, again in backward: 2 B a
    parameter; reduce-scatter of the FP32 gradient: 4 B), with nothing hidden (dp_overlap 0 on H100)."""
    m, c = planner.load_model("qwen3-30b-a3b"), planner.load_cluster("dgx-h100", nodes=2)
    assert c.calibration.dp_overlap == 0.0
    t = _titan()
    ep8 = Layout(dp=16, zero_stage=3, ep=8, etp=1, micro_batch_size=2, recompute="full")
    ep16 = ep8.model_copy(update={"ep": 16})
    experts = 128 * 3 * 2048 * 768 // 8
    assert experts == 75_497_472
    group = placement(c, (2, 8))
    assert group.tier == "scaleout"
    per_layer = 2 * collective_time(c, group, "allgather", 2 * experts) + collective_time(c, group, "reducescatter",
                                                                                          4 * experts)
    got = stage_dp_time(m, c, t, ep8, 0, 48) - stage_dp_time(m, c, t, ep16, 0, 48)
    assert got == pytest.approx(2 * 48 * per_layer)
    assert stage_dp_time(m, c, t, ep16, 0, 48) > 0  # the dense shard over dp 16 still moves


def test_fsdp2_gathers_a_block_with_its_local_experts():
    """zero3_gather: two blocks gathered at once (one computing, one prefetched), each the layer's dense
    parameters -- attention 2048 x (32 + 2 x 4) x 128 + 32 x 128 x 2048 = 18,874,368, Q/K norms 256, two
    RMSNorms 4,096, router 2048 x 128 = 262,144: 19,140,864 -- and its 16 local experts at EP 8,
    75,497,472, in BF16: 2 x 94,638,336 x 2 B = 378,553,344 B."""
    m, c = planner.load_model("qwen3-30b-a3b"), planner.load_cluster("dgx-h100", nodes=2)
    p = planner.evaluate(m, c, _titan(), Layout(dp=16, zero_stage=3, ep=8, etp=1, micro_batch_size=2, recompute="full"))
    item = {i.name: i.bytes for i in p.memory.peak_stage.items}
    assert item["zero3_gather"] == 2 * (19_140_864 + 75_497_472) * 2 == 378_553_344


def test_torchtitan_moe_rules():
    """What torchtitan 0.3 runs, each refused in one line: FSDP2 only (zero_stage 3), experts never
    TP-sharded beside EP, TP only with EP (its TP-sharded experts without EP are not priced), its standard
    dispatcher (no DeepEP, no all-gather, no EP overlap), dropless; float8 experts and CPU offload are
    not priced; models outside its registry's MoE flavours are not built."""
    m, c = planner.load_model("qwen3-30b-a3b"), planner.load_cluster("dgx-h100", nodes=2)
    t = _titan()

    def problems(**kw):
        return " | ".join(layout_problems(m, c, t, Layout(**{"dp": 16, "zero_stage": 3, "ep": 8, "etp": 1, **kw})))

    assert problems() == ""
    assert "FSDP2 sharding (zero_stage 3)" in problems(zero_stage=0)
    assert "etp 1" in problems(tp=2, dp=8, etp=2, sequence_parallel=True)
    assert "give ep > 1" in problems(tp=2, dp=8, ep=1, sequence_parallel=True)
    assert "standard all-to-all dispatcher" in problems(moe_dispatcher="deepep")
    assert "standard all-to-all dispatcher" in problems(ep_overlap=True)
    dropping = t.model_copy(update={"moe_capacity_factor": 1.25})
    assert "dropless" in " ".join(layout_problems(m, c, dropping, Layout(dp=16, zero_stage=3, ep=8, etp=1)))
    # float8 experts: torchao's rowwise grouped GEMMs, which PyTorch runs on Hopper only
    b200 = planner.load_cluster("dgx-b200", nodes=2)
    with pytest.raises(PlannerError, match=r"float8 routed experts \(torch._scaled_grouped_mm, row-wise\) run on "
                                           r"compute capability 9.x only; B200 is 10.x"):
        plan(m, b200, TrainingSpec(global_batch_size=64, seq_length=4096, fp8="rowwise"), framework="torchtitan")
    with pytest.raises(PlannerError, match="compute capability 9.x only"):  # evaluate's own check, Python API
        planner.evaluate(m, b200, _titan(fp8="rowwise"), Layout(dp=16, zero_stage=3, ep=8, etp=1))
    assert "as torchao's rowwise" in " ".join(layout_problems(m, c, _titan(fp8="torchao-tensorwise"),
                                                              Layout(dp=16, zero_stage=3, ep=8, etp=1)))
    with pytest.raises(PlannerError, match="multi-latent attention"):
        plan(planner.load_model("deepseek-v3"), planner.load_cluster("dgx-h100", nodes=128),
             TrainingSpec(global_batch_size=1024, seq_length=4096), framework="torchtitan")
    # a Qwen3 MoE of another shape, or without its Q/K norms: torchtitan's registry does not build it
    for other, named in ((m.model_copy(update={"num_layers": 24}), "experts \\(moe\\), Q/K norms"),
                         (m.model_copy(update={"qk_norm": False}), "experts \\(moe\\) emitted")):
        with pytest.raises(PlannerError, match=named):
            plan(other, c, TrainingSpec(global_batch_size=64, seq_length=4096), framework="torchtitan")
    # the search offers it zero_stage 3 and etp 1 only
    r = plan(m, c, TrainingSpec(global_batch_size=64, seq_length=4096), framework="torchtitan", top_k=5, structural=False)
    assert {(q.layout.zero_stage, q.layout.expert_tp, q.layout.moe_dispatcher) for q in [r.best, *r.alternatives]} == {
        (3, 1, "alltoall")}


def test_explain_prices_torchtitans_alternatives_on_its_engine():
    """explain's 'same layout with EP halved and doubled' prices them on the plan's engine (FSDP2), and
    names neither Megatron's EP overlap nor an FP8 plan torchtitan would not run."""
    m, c = planner.load_model("qwen3-30b-a3b"), planner.load_cluster("dgx-h100", nodes=2)
    tr = TrainingSpec(global_batch_size=64, seq_length=4096)
    lines = explain(m, c, tr, framework="torchtitan")
    text = "\n".join(lines)
    best = plan(m, c, tr, framework="torchtitan", top_k=1, structural=False).best
    half = planner.evaluate(m, c, best.training, best.layout.model_copy(update={"ep": best.layout.ep // 2}))
    assert f"ep {best.layout.ep // 2}: {half.step_time_s / best.step_time_s - 1:+.1%}" in text
    assert "--overlap-moe-expert-parallel-comm" not in text
    fp8 = plan(m, c, tr.model_copy(update={"fp8": "rowwise"}), framework="torchtitan", top_k=1, structural=False).best
    assert f"Sensitivity, FP8 (rowwise): {fp8.layout.short()}, {fp8.step_time_s:.2f} s/step" in text  # priced on Hopper


def test_torchtitan_float8_experts_cast_each_operand_per_gemm():
    """torchao's float8 grouped GEMMs under torchtitan (Float8GroupedExpertsConverter) against Transformer
    Engine's tensor-wise recipe on the same Qwen3-30B-A3B layer (tp 1, ep 8, 4,096 tokens; the same GEMM
    efficiency family): TE quantises each routed input element once forward, both copies (2 + 1 + 1 =
    4 B), and each output gradient once backward (4 B), its weights cached; torchao reads and writes one
    copy a cast (3 B): the input row-wise forward and again column-wise backward, the output gradient
    row-wise and column-wise backward (6 B), and every linear weight forward and backward (3 B each way:
    attention 2048 x (4096 + 512 + 512) + 4096 x 2048 = 18,874,368, its 16 local experts 16 x 3 x 2048
    x 768 = 75,497,472). Routed elements a token: 8 x (2048 + 768) = 22,528 forward, 8 x (2 x 768 +
    2048) = 28,672 backward; the attention's are cast alike by both (4 B)."""
    from planner.cost import _layer_time_of

    m, c = planner.load_model("qwen3-30b-a3b"), planner.load_cluster("dgx-h100", nodes=2)
    te = _layer_time_of(m, c, _titan(fp8="tensorwise"), 1, 1, 1, False, ep=8, etp=1)
    ao = _layer_time_of(m, c, _titan(fp8="rowwise"), 1, 1, 1, False, ep=8, etp=1)
    hbm, tokens, weights = 3350e9 * 0.89, 4096, 18_874_368 + 75_497_472
    rf, rb = 22_528, 28_672
    assert ao.fwd - te.fwd == pytest.approx(((3 - 4) * rf * tokens + 3 * weights) / hbm, rel=1e-6)
    assert ao.bwd - te.bwd == pytest.approx(((3 * (rf + 2 * rb) - 4 * rb) * tokens + 3 * weights) / hbm, rel=1e-6)


@pytest.mark.parametrize("cluster, fp8, converter", [("dgx-h100", "rowwise", "Float8GroupedExpertsConverter"),
                                                     ("dgx-b200", "torchao-mxfp8", "MXFP8GroupedExpertsConverter")])
def test_torchtitan_float8_moe_launch_builds_float8_experts(tmp_path, cluster, fp8, converter):
    """An FP8 torchtitan plan of Qwen3-30B-A3B on two DGX H100 (float8) or B200 (MXFP8) emits planner_job.py
    with torchao's low-precision linears (the LM head and the router gate in BF16, as priced) and routed
    experts, which torchtitan 0.3 parses: every decoder linear but the gates converted, every MoE layer's
    experts Float8GroupedExperts / MXFP8GroupedExperts."""
    pytest.importorskip("torchtitan")
    from planner.check import check_torchtitan

    m = planner.load_model("qwen3-30b-a3b")
    p = plan(m, planner.load_cluster(cluster, nodes=2), TrainingSpec(global_batch_size=64, seq_length=4096,
             fp8=fp8), framework="torchtitan", top_k=1, structural=False).best
    files = p.to_torchtitan()
    assert f"{converter}.Config(model_compile_enabled=True)" in files.files["planner_job.py"]
    files.write(tmp_path)
    res = check_torchtitan(list(files.args), p.num_gpus, module="planner_job", config="planner_job",
                           folder=str(tmp_path), num_layers=m.num_layers)
    assert res.ok, res.line()
    d = res.details
    assert d["float8_expert_layers"] == d["moe_layers"] == 48
    assert sorted(d["high_precision_linears"]) == sorted(["lm_head", *(f"layers.{i}.moe.router.gate" for i in range(48))])
    assert d["float8_linears"] > 0


def test_torchtitan_keeps_the_combined_rows_its_scores_weigh():
    """Qwen3-30B-A3B, 4,096 tokens a GPU (mbs 1, no recompute): each MoE layer keeps, as torchtitan's
    compiled module does (measured in tests/test_activation_harness.py), the router's FP32 softmax 4 x 4096
    x 128 = 2,097,152, top-k ids and scores 12 x 32,768 = 393,216, two int64 indices a routed row 16 x
    32,768 = 524,288, the routed input 2 x 32,768 x 2048 = 134,217,728, SwiGLU's three tensors 2 x 32,768 x
    3 x 768 = 150,994,944 and the combined rows the scores weigh, 134,217,728: 422,445,056 B. Megatron's
    set: FP32 logits and scores 8 x 4096 x 128 = 4,194,304 and the same expert tensors, 289,406,976 B.
    Over 48 layers and the one micro-batch in flight the activations differ by 48 x 133,038,080 B."""
    from planner.memory import moe_routed_bytes

    m, c = planner.load_model("qwen3-30b-a3b"), planner.load_cluster("dgx-h100", nodes=2)
    assert moe_routed_bytes(m, 4096, 1, scores_after_combine=True) == 422_445_056
    assert moe_routed_bytes(m, 4096, 1) == 289_406_976
    lay = Layout(dp=16, zero_stage=3, ep=8, etp=1, micro_batch_size=1, recompute="none")
    titan = planner.evaluate(m, c, _titan(), lay)
    megatron = planner.evaluate(m, c, TrainingSpec(global_batch_size=64, seq_length=4096), lay)

    def acts(p):
        return {i.name: i.bytes for i in p.memory.peak_stage.items}["activations"]
    assert acts(titan) - acts(megatron) == pytest.approx(48 * 133_038_080)


def test_planner_check_torchtitan_takes_the_module_and_config_train_sh_names():
    """planner check torchtitan --module qwen3 --config qwen3_30b_a3b: torchtitan parses the MoE model and
    builds its meshes (efsdp 2 at dp_shard 16, ep 8); the line shows a long list by its head and length."""
    pytest.importorskip("torchtitan")
    import io

    from planner.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = main(["check", "torchtitan", "--world-size", "16", "--module", "qwen3", "--config", "qwen3_30b_a3b", "--",
                 "--parallelism.data_parallel_shard_degree", "16", "--parallelism.expert_parallel_degree", "8",
                 "--training.disable_cuda_graphs"], stdout=out, stderr=err)
    line = out.getvalue()
    assert code == 0, err.getvalue()
    assert "efsdp=2 ep=8" in line and "num_experts=128" in line and "top_k=8" in line
    assert "... (145 items)]" in line  # 48 layers x (wqkv, wo, router gate) + lm_head


def test_a_torchtitan_moe_plan_carries_the_moe_step_error_and_the_eager_kernels_memory_error():
    """No published MoE run used torchtitan's eager kernels: its interval takes the step-time error of the MoE
    runs pooled and the memory error of the dense runs that published peaks with those kernels, and says so."""
    from planner.uncertainty import PUBLISHED, prediction_error

    m, c = planner.load_model("qwen3-30b-a3b"), planner.load_cluster("dgx-h100", nodes=2)
    e = prediction_error(c, _titan(), m)
    moe, eager = PUBLISHED[("moe", None, None)], PUBLISHED[("dense", None, "unfused")]
    assert (e.step_time_bias, e.step_time_sigma, e.ranking_sigma) == (moe.step_time_bias, moe.step_time_sigma,
                                                                       moe.ranking_sigma)
    assert (e.memory_bias, e.memory_sigma) == (eager.memory_bias, eager.memory_sigma)
    assert "none with unfused kernels" in e.basis
    # a Megatron MoE plan keeps the MoE runs' own error
    assert prediction_error(c, TrainingSpec(global_batch_size=64, seq_length=4096), m) == moe
