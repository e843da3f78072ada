"""FP8 linear layers: what each GPU runs, the FP8 peak and GEMM curve, the casts, the weight copies,
the search's precision choice, the launch flags. Numbers worked out by hand from the cited sources."""

from __future__ import annotations

import io
import json

import pytest

import planner
from planner.cli import main
from planner.cost import _gemm_time, fp8_cast_elements
from planner.errors import PlannerError
from planner.choices import plan_precisions
from planner.search import plan
from planner.specs import Layout, TrainingSpec

TRAIN = dict(global_batch_size=64, seq_length=4096)


def test_fp8_peaks_and_curves_are_the_cited_measurements():
    # H100 SXM FP8 dense 1978.9 TFLOP/s (glennklockwood.com H100 table, S5); cuBLASLt FP8 square
    # GEMMs m=n=k 1024..16384: 274.1 / 1011.3 / 1216.9 / 1290.1 / 1377.3 TFLOP/s (Azure AI
    # benchmarking guide, S26); GB200: 489.2 / 2243.6 / 2834.6 / 2876.6 / 2906.9 of 5000
    for name, peak, measured in (("dgx-h100", 1979e12, (274.1, 1011.3, 1216.9, 1290.1, 1377.3)),
                                 ("hgx-h200", 1979e12, (290.8, 1013.4, 1249.1, 1300.6, 1366.3)),
                                 ("gb200-nvl72", 5000e12, (489.2, 2243.6, 2834.6, 2876.6, 2906.9))):
        c = planner.load_cluster(name)
        assert c.gpu.peak_fp8_flops == pytest.approx(peak)
        assert "S26" in c.provenance["calibration.gemm_efficiency_fp8"]
        for (gflop, eff), tflops, n in zip(c.calibration.gemm_efficiency_fp8, measured, (1024, 2048, 4096, 8192, 16384)):
            assert gflop == pytest.approx(2 * n**3 / 1e9, rel=0.03)  # m=n=k: 2 n^3 FLOPs (2.1 for 2.15)
            assert eff * peak / 1e12 == pytest.approx(tflops, abs=0.006 * peak / 1e12)  # rounded to 2 digits


def test_an_fp8_gemm_runs_at_the_fp8_curve_times_its_share_in_training():
    c = planner.load_cluster("dgx-h100")
    flops = 2 * 16384**3  # 8796 GFLOP: 1377.3 TFLOP/s measured, 0.70 of 1979 on the curve
    # Transformer Engine's stacks keep 0.8 of it in training (fitted on the H100 FP8 rows), torchao's all
    assert _gemm_time(c, [flops], fp8=True) == pytest.approx(flops / (1979e12 * 0.70 * 0.8), rel=1e-3)
    assert _gemm_time(c, [flops], "fp8", "unfused") == pytest.approx(flops / (1979e12 * 0.70), rel=1e-3)
    assert _gemm_time(c, [flops]) == pytest.approx(flops / (989e12 * 0.80), rel=1e-3)  # BF16: MAMF 80 %
    assert _gemm_time(c, [flops], None, "unfused") == _gemm_time(c, [flops])  # BF16 has no such share
    for name in ("dgx-b200", "gb200-nvl72", "dgx-b300", "gb300-nvl72"):  # no dense FP8 run on Blackwell
        assert planner.load_cluster(name).calibration.fp8_gemm_in_training == 1.0


def test_mxfp8_gemms_keep_their_own_share_on_blackwell():
    """GB200's FP8 curve tops out at 2,906.9 of 5,000 TFLOP/s (S26, m=n=k=16384: 0.58). Per-tensor FP8
    (delayed, tensorwise) keeps all of it in training; MXFP8's block-scaled kernels keep 0.76 of it,
    the share that turns the model's MXFP8-over-BF16 speedup of the one published pair (Megatron-Bridge
    25.11 DeepSeek-V3 on 256 GB300: 4,357 over 3,848 tokens/s/GPU) into the measured 1.132x. Hopper
    has no separate share (MXFP8 needs Blackwell), so its MXFP8 would read the per-tensor one."""
    c = planner.load_cluster("gb200-nvl72")
    flops = 2 * 16384**3
    assert _gemm_time(c, [flops], "fp8") == pytest.approx(flops / (5000e12 * 0.58), rel=1e-3)
    assert _gemm_time(c, [flops], "mxfp8") == pytest.approx(flops / (5000e12 * 0.58 * 0.76), rel=1e-3)
    assert planner.load_cluster("dgx-h100").calibration.mxfp8_gemm_in_training is None
    mx = TrainingSpec(**TRAIN, fp8="mxfp8")
    m = planner.load_model("llama3-8b")
    from planner.cost import _layer_time_of, gemm_format
    assert gemm_format(mx) == "mxfp8" and gemm_format(TrainingSpec(**TRAIN, fp8="tensorwise")) == "fp8"
    slow = c.model_copy(update={"calibration": c.calibration.model_copy(update={"mxfp8_gemm_in_training": 0.5})})
    assert _layer_time_of(m, slow, mx, 1, 1, 1, False).fwd > _layer_time_of(m, c, mx, 1, 1, 1, False).fwd


def test_the_catalog_fp8_share_is_the_fit_on_the_published_fp8_rows():
    """benchmarks/calibrate.py's FP8 fit, on the H100 FP8 rows with the catalog's BF16 parameters,
    returns the catalog's value for each kernel family: the YAML holds the fit, not a hand-tuned number."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from calibrate import FP8_GRID, fit, prior_of
    from runs import load_runs

    low = [r for r in load_runs(low_precision=True) if r.cluster.gpu.name == "H100-SXM5-80GB" and not r.oom]
    assert {r.training.kernels for r in low} == {"fused", "unfused"}
    c = low[0].cluster
    best = fit(low, prior_of(c, FP8_GRID), FP8_GRID, prior_of(c))[1]
    assert best == {"fp8_gemm_in_training": c.calibration.fp8_gemm_in_training,
                    "fp8_gemm_in_training_unfused": c.calibration.fp8_gemm_in_training_unfused}


def test_cast_elements_of_llama3_8b():
    # h 4096, 8 KV heads of 128 (h_kv 1024), f 14336, SwiGLU: forward inputs QKV h, proj h, FC1 h,
    # FC2 f; backward output grads QKV h + 2 h_kv, proj h, FC1 2f, FC2 h
    m = planner.load_model("llama3-8b")
    assert fp8_cast_elements(m, 1) == (4096 + 4096 + 4096 + 14336, 4096 + 2048 + 4096 + 2 * 14336 + 4096)
    fwd, bwd = fp8_cast_elements(m, 2)
    assert fwd == 4096 + 2048 + 4096 + 7168 and bwd == (4096 + 2048) / 2 + 4096 + 14336 + 4096


def test_fp8_weight_copies_in_the_ledger():
    # Transformer Engine keeps row- and column-wise FP8 copies: 2 B per linear weight; Llama-3-8B's
    # linear weights per layer: 4096 x (4096 + 2048) + 4096 x 4096 + 4096 x 28672 + 14336 x 4096
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100")
    linear = 4096 * 6144 + 4096 * 4096 + 4096 * 28672 + 14336 * 4096
    lay = Layout(tp=2, pp=2, dp=2, zero_stage=1, sequence_parallel=True)
    bf16 = planner.evaluate(m, c, TrainingSpec(**TRAIN), lay)
    fp8 = planner.evaluate(m, c, TrainingSpec(**TRAIN, fp8="delayed"), lay)
    for s16, s8 in zip(bf16.memory.stages, fp8.memory.stages):
        assert s8.get("fp8_weights") == pytest.approx(16 * linear / 2 * 2)  # 16 layers, tp 2
        assert s16.get("fp8_weights") == 0
    rowwise = planner.evaluate(m, c, TrainingSpec(**TRAIN, fp8="rowwise"), lay)  # torchao: no weight cache
    assert all(s.get("fp8_weights") == 0 for s in rowwise.memory.stages)
    assert fp8.step_time_s < bf16.step_time_s


@pytest.mark.parametrize("cluster, recipe, match", [
    ("dgx-a100-80g", "delayed", "needs compute capability 9.x or newer; A100"),
    ("dgx-h100", "mxfp8", "needs compute capability 10.x to 11.x; H100"),
    ("mi300x", "delayed", "no measured FP8 GEMM curve"),
])
def test_recipes_a_gpu_cannot_run_are_refused(cluster, recipe, match):
    m = planner.load_model("llama3-8b")
    t = TrainingSpec(**TRAIN, fp8=recipe)
    with pytest.raises(PlannerError, match=match):
        planner.evaluate(m, planner.load_cluster(cluster), t, Layout(tp=8, dp=1))
    with pytest.raises(PlannerError, match=match):
        plan(m, planner.load_cluster(cluster), t)


def test_fp8_launch_files_are_megatrons_and_torchtitans_rowwise():
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100")
    lay = Layout(tp=2, pp=1, dp=4, zero_stage=1, sequence_parallel=True)
    p = planner.evaluate(m, c, TrainingSpec(**TRAIN, fp8="tensorwise"), lay)
    args = p.to_megatron().args
    i = args.index("--fp8-recipe")
    assert args[i + 1] == "tensorwise" and args[args.index("--fp8-format") + 1] == "hybrid"
    with pytest.raises(PlannerError, match="torchao"):
        planner.evaluate(m, c, TrainingSpec(**TRAIN, fp8="rowwise"), lay).to_megatron()
    with pytest.raises(PlannerError, match="FP8"):
        p.to_deepspeed()
    with pytest.raises(PlannerError, match="FP8"):
        planner.evaluate(m, c, TrainingSpec(**TRAIN, fp8="tensorwise"), lay.model_copy(update={"zero_stage": 3,
                         "overlap_grad_reduce": True})).to_torchtitan()
    with pytest.raises(PlannerError, match="torchtitan 0.3 runs torchao's float8 as 'rowwise' and its MXFP8 as "
                                           "'torchao-mxfp8', not 'tensorwise'"):
        plan(m, c, TrainingSpec(**TRAIN, fp8="tensorwise"), framework="torchtitan")
    with pytest.raises(PlannerError, match="not 'torchao-tensorwise'"):  # 0.3 no longer offers tensor-wise scaling
        plan(m, c, TrainingSpec(**TRAIN, fp8="torchao-tensorwise"), framework="torchtitan")
    with pytest.raises(PlannerError, match="DeepSpeed's launch config runs no FP8"):
        plan(m, c, TrainingSpec(**TRAIN, fp8="rowwise"), framework="deepspeed")
    r = plan(m, c, TrainingSpec(**TRAIN, fp8="rowwise"), framework="torchtitan", top_k=1, structural=False)
    assert r.status == "optimal" and "planner_job.py" in r.best.to_torchtitan().files
    with pytest.raises(PlannerError, match="TOML is not written for float8"):
        from planner.emit.torchtitan import torchtitan_toml
        torchtitan_toml(r.best)
    out = io.StringIO()  # --precision fp8 means the target's default recipe: torchtitan's rowwise
    assert main(["plan", "llama3-8b", "dgx-h100", "--nodes", "1", "--global-batch-size", "64", "--seq-length", "4096",
                 "--framework", "torchtitan", "--precision", "fp8", "--top-k", "1", "--json"],
                stdout=out, stderr=io.StringIO()) == 0
    assert json.loads(out.getvalue())["best"]["fp8"] == "rowwise"


def test_precision_choice_is_the_faster_and_proven():
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100")
    t = TrainingSpec(**TRAIN)
    merged, each = plan_precisions(m, c, t, [None, "delayed"], top_k=3, structural=False, time_limit_s=60)
    assert set(each) == {None, "delayed"} and all(r.status == "optimal" for r in each.values())
    assert merged.status == "optimal" and merged.gap == 0.0
    fastest = min((r.best for r in each.values()), key=lambda p: p.time.objective_us)
    assert merged.best.time.objective_us == fastest.time.objective_us
    assert merged.best.training.fp8 == "delayed"  # FP8 GEMMs on H100: the faster of the two here
    # and what checks that gain: NeMo's dense FP8 recipes on Hopper were published without BF16 twins
    assert merged.explanation[-1].startswith("workload choice: fp8=none ")
    assert merged.explanation[-1].endswith("no published FP8/BF16 pair of one layout on this GPU generation and kernel "
                                           "family, with a recipe that scales the same way, checks this gain")
    steps = [p.time.objective_us for p in (merged.best, *merged.alternatives)]
    assert steps == sorted(steps)


def test_cli_offers_the_choice_and_explain_prices_fp8():
    out = io.StringIO()
    assert main(["plan", "llama3-8b", "dgx-h100", "--nodes", "1", "--global-batch-size", "64", "--seq-length", "4096",
                 "--fp8", "none,delayed", "--top-k", "2"], stdout=out, stderr=io.StringIO()) == 0
    assert "choice: fp8=none:" in out.getvalue() and "chosen: fp8=delayed optimizer_states=fp32" in out.getvalue()
    assert "note: no published FP8/BF16 pair of one layout" in out.getvalue()
    out = io.StringIO()  # torchtitan on Hopper runs rowwise: torchao's published row-wise pair gained less than priced
    assert main(["plan", "llama3-8b", "dgx-h100", "--nodes", "1", "--global-batch-size", "16", "--seq-length", "4096",
                 "--framework", "torchtitan", "--precision", "bf16,fp8", "--top-k", "1"],
                stdout=out, stderr=io.StringIO()) == 0
    text = " ".join(out.getvalue().split())
    assert "note: on 1 published FP8/BF16 pair" in text and "row-wise scaling" in text
    assert "expect less from FP8 than this" in text
    out = io.StringIO()  # torchtitan 0.3 no longer runs tensor-wise float8: no FP8 plan, so no note on its gain
    assert main(["plan", "llama3-8b", "dgx-h100", "--nodes", "1", "--global-batch-size", "16", "--seq-length", "4096",
                 "--framework", "torchtitan", "--fp8", "none,torchao-tensorwise", "--top-k", "1"],
                stdout=out, stderr=io.StringIO()) == 0
    text = " ".join(out.getvalue().split())
    assert "fp8=torchao-tensorwise refused (training.fp8: torchtitan 0.3 runs" in text and "note:" not in text
    out = io.StringIO()  # two choices at once: every combination searched and proven
    assert main(["plan", "llama3-8b", "dgx-h100", "--nodes", "1", "--global-batch-size", "64", "--seq-length", "4096",
                 "--fp8", "none,delayed", "--optimizer-states", "fp32,bf16", "--top-k", "2"],
                stdout=out, stderr=io.StringIO()) == 0
    text = out.getvalue()
    assert text.count("(optimal)") == 4 and "fp8=delayed/optimizer_states=bf16" in text
    err = io.StringIO()
    assert main(["plan", "llama3-8b", "dgx-h100", "--fp8", "fp4"], stdout=io.StringIO(), stderr=err) == 2
    assert "--fp8: unknown recipe 'fp4'" in err.getvalue()
    from planner.explain import explain

    lines = explain(planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100"), TrainingSpec(**TRAIN))
    line = next(line for line in lines if line.startswith("Sensitivity, FP8 (delayed)"))
    # NeMo's dense FP8 recipes were published without their BF16 twins: nothing checks this gain
    assert "no published FP8/BF16 pair of one layout on this GPU generation and kernel family" in line
    assert "with a recipe that scales the same way" in line  # explain reads the FP8 alternative's recipe


def test_published_fp8_speedup_pairs_are_the_sources_ratios_and_explain_reads_them_by_sign():
    """uncertainty.FP8_SPEEDUPS (benchmarks/intervals.py --write) holds, per stack, the published FP8-over-BF16
    speedups of one layout against the model's out of sample. Its measured ratios are the sources' own
    throughputs: torchtitan's Llama-3-8B on 8 and 128 H100s 8,532 / 6,667 and 8,380 / 6,514 tokens/s/GPU, its
    405B on 128 177 / 109 [torchtitan benchmarks/llama3_h100_202412_torchtitan.md, docs/performance.md];
    explain leans the way the median misses by more than 5 points, and says nothing where it is within 5."""
    from planner.uncertainty import FP8_SPEEDUPS, SpeedupCheck, fp8_speedup_check, fp8_speedup_note

    tt = FP8_SPEEDUPS[("dense", 9, "unfused", "per-tensor")]
    # torchtitan's tensor-wise float8, and torchao's float8 README: Llama-3-8B on 8 H100, tensor-wise with FP8
    # all-gathers 7,689.5 over BF16's 6,150 tokens/s/GPU [pytorch/ao torchao/float8/README.md @ 8c81863ba]
    assert tt.pairs == 4
    for ratio in (8532 / 6667, 8380 / 6514, 177 / 109, 7689.5 / 6150):  # 1.28, 1.29, 1.62, 1.25
        assert f"{ratio:.2f}x" in tt.basis
    assert tt.lo_points <= tt.median_points <= tt.hi_points < -5  # all four predicted short
    # the same README's row-wise run of that layout, 6,768: priced long (the model prices both scalings' GEMMs alike)
    rw = FP8_SPEEDUPS[("dense", 9, "unfused", "row-wise")]
    assert rw.pairs == 1 and f"{6768 / 6150:.2f}x" in rw.basis and rw.median_points > 5
    # torchao's MX README, Llama-3-8B on 8 power-limited B200 (benchmarks/data/speedup_pairs.yaml): float8 rowwise
    # 8,640.5, tensor-wise 10,417.0 and MXFP8 (RCEIL) 9,642.0 over BF16's 8,307.5 tokens/s/GPU, at the catalog's B200;
    # and torchtitan's NVFP4 page's MXFP8 baselines on 4 GB200: Llama-3-8B 28,084 / 21,919, Qwen3-8B 27,587 / 20,913
    bw = {s: FP8_SPEEDUPS[("dense", 10, "unfused", s)] for s in ("row-wise", "per-tensor", "block")}
    for s, ratio in (("row-wise", 8640.5 / 8307.5), ("per-tensor", 10417.0 / 8307.5)):
        assert bw[s].pairs == 1 and f"{ratio:.2f}x" in bw[s].basis
    assert bw["block"].pairs == 3
    assert all(f"{r:.2f}x" in bw["block"].basis for r in (9642.0 / 8307.5, 28084 / 21919, 27587 / 20913))
    assert bw["per-tensor"].median_points < bw["block"].median_points < 0 < bw["row-wise"].median_points
    # torchao's MoE README: torchtitan's Llama-4 Scout (2 layers) on 4 B200, MXFP8 linears and grouped experts,
    # 70,747 over BF16's 49,381 tokens/s/GPU: a gain the model prices far short (its BF16 experts priced at the curve)
    moe = FP8_SPEEDUPS[("moe", 10, "unfused", "block")]
    assert moe.pairs == 1 and f"{70747 / 49381:.2f}x" in moe.basis and moe.median_points < -20
    assert fp8_speedup_check(planner.load_cluster("dgx-b200"), TrainingSpec(**TRAIN, kernels="unfused", fp8="torchao-mxfp8"),
                             planner.load_model("llama4-scout")) is moe
    h100, llama = planner.load_cluster("dgx-h100"), planner.load_model("llama3-8b")
    for fp8, check in (("torchao-tensorwise", tt), ("rowwise", rw)):
        assert fp8_speedup_check(h100, TrainingSpec(**TRAIN, kernels="unfused", fp8=fp8), llama) is check
    assert fp8_speedup_check(h100, TrainingSpec(**TRAIN, kernels="unfused"), llama) is None  # not low precision
    assert fp8_speedup_check(h100, TrainingSpec(**TRAIN, fp8="delayed"), llama) is None
    assert "expect more from FP8" in fp8_speedup_note(tt) and "expect less from FP8" in fp8_speedup_note(rw)
    above = SpeedupCheck(pairs=2, median_points=8.2, lo_points=6.0, hi_points=10.4, basis="two pairs")
    assert "8 points above the measured one (median; +6 to +10); expect less from FP8" in fp8_speedup_note(above)
    close = SpeedupCheck(pairs=1, median_points=-0.4, lo_points=-0.4, hi_points=-0.4, basis="one pair")
    assert fp8_speedup_note(close).endswith("within a point of the measured one")
    one = SpeedupCheck(pairs=1, median_points=-1.3, lo_points=-1.3, hi_points=-1.3, basis="one pair")
    assert fp8_speedup_note(one).endswith("speedup was 1 point below the measured one")


def test_fp8_linears_save_their_inputs_in_one_byte():
    # Llama-3-8B, b 1, s 8192, tp 2 with SP: QKV and FC1 inputs s b h / 2 each drop from 2 B to 1 B,
    # the FC2 input s b f / 2 too; the out-proj input gains a 1 B FP8 copy beside flash attention's
    # BF16 output (no recompute) or replaces it (selective): 1 B x s b (a d) / 2
    from planner.memory import activation_bytes_per_layer

    m = planner.load_model("llama3-8b")
    sbh, sbf = 8192 * 4096, 8192 * 14336
    kw = dict(tp=2, sequence_parallel=True)
    for rc, proj in (("none", +1), ("selective", -1)):
        bf16 = activation_bytes_per_layer(m, 1, 8192, recompute=rc, **kw)
        fp8 = activation_bytes_per_layer(m, 1, 8192, recompute=rc, fp8_inputs=True, **kw)
        assert bf16 - fp8 == pytest.approx(sbh / 2 + sbh / 2 + sbf / 2 - proj * sbh / 2)
    assert activation_bytes_per_layer(m, 1, 8192, recompute="full", fp8_inputs=True, **kw) == 2 * sbh / 2


def test_fp8_param_gather_halves_the_linear_weights_gathered_and_drops_the_copies():
    from planner.memory import param_gather_bytes, stage_params

    m, c = planner.load_model("llama3-70b"), planner.load_cluster("dgx-h100", nodes=8)
    lay = Layout(tp=4, pp=4, dp=4, zero_stage=1, sequence_parallel=True)
    off = TrainingSpec(global_batch_size=1024, seq_length=8192, fp8="delayed")
    on = off.model_copy(update={"fp8_param_gather": True})
    # stage 1 (20 layers, no embedding): 20 x 855,638,016 linear weights / tp 4 at 1 B, the rest at 2 B
    psi, lin = stage_params(m, lay, 1, 20), 20 * 855_638_016 / 4
    assert param_gather_bytes(m, off, lay, 1, 20) == pytest.approx((2 * psi,))
    assert param_gather_bytes(m, on, lay, 1, 20) == pytest.approx((2 * (psi - lin) + lin,))
    p_off, p_on = planner.evaluate(m, c, off, lay), planner.evaluate(m, c, on, lay)
    assert p_on.memory.stages[1].get("fp8_weights") == 0
    assert p_off.memory.stages[1].total - p_on.memory.stages[1].total == pytest.approx(2 * lin)
    assert p_on.time.dp_exposed < p_off.time.dp_exposed
    assert "--fp8-param-gather" in p_on.to_megatron().args and "--fp8-param-gather" not in p_off.to_megatron().args
    with pytest.raises(planner.SpecError, match="fp8_param_gather"):
        TrainingSpec(global_batch_size=8, seq_length=8, fp8="rowwise", fp8_param_gather=True)


def test_merged_status_is_only_as_proven_as_its_weakest_search():
    from types import SimpleNamespace as NS

    from planner.choices import merged_status

    def res(status, us=None, gap=None):
        best = None if us is None else NS(time=NS(objective_us=us))
        return NS(status=status, best=best, gap=gap)

    assert merged_status([res("optimal", 100, 0.0), res("infeasible")], 100) == ("optimal", 0.0)
    assert merged_status([res("optimal", 100, 0.0), res("unknown", 90)], 90) == ("unknown", None)
    # the FP8 search stopped at 80 with a 25 % gap (bound 60): the union is only known to be >= 60
    st, gap = merged_status([res("optimal", 100, 0.0), res("feasible", 80, 0.25)], 80)
    assert st == "feasible" and gap == pytest.approx((80 - 60) / 80)


def test_fp8_layer_time_is_fp8_gemms_plus_the_casts():
    # forward: the four GEMMs at the FP8 curve instead of BF16, plus 4 B per cast element at the
    # achieved HBM bandwidth (3350 GB/s x 0.89); backward: twice the GEMMs plus the gradient casts
    from planner.cost import _layer_time_of, layer_gemm_flops

    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100")
    t16, t8 = TrainingSpec(**TRAIN), TrainingSpec(**TRAIN, fp8="delayed")
    a, b = _layer_time_of(m, c, t16, 2, 1, 1, True), _layer_time_of(m, c, t8, 2, 1, 1, True)
    tokens = 4096
    gemm = sum(_gemm_time(c, [f], fp8=True) - _gemm_time(c, [f]) for f in layer_gemm_flops(m, tokens, 2))
    hbm = 3350e9 * 0.89
    fwd_el, bwd_el = 4096 + 2048 + 4096 + 7168, (4096 + 2048) / 2 + 4096 + 14336 + 4096
    assert b.fwd - a.fwd == pytest.approx(gemm + 4 * tokens * fwd_el / hbm, rel=1e-6)
    assert b.bwd - a.bwd == pytest.approx(2 * gemm + 4 * tokens * bwd_el / hbm, rel=1e-6)


def test_torchao_casts_the_weights_in_every_micro_batch():
    # no FP8 weight cache in torchao: 3 B (read BF16, write FP8) per linear weight in forward and again
    # in backward; Llama-3-8B's 218,103,808 linear weights per layer over tp 2, at 3350 GB/s x 0.89
    from planner.cost import _layer_time_of

    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100")
    te = _layer_time_of(m, c, TrainingSpec(**TRAIN, fp8="delayed"), 2, 1, 1, True)
    ao = _layer_time_of(m, c, TrainingSpec(**TRAIN, fp8="rowwise"), 2, 1, 1, True)
    w = 3 * 218_103_808 / 2 / (3350e9 * 0.89)
    assert ao.fwd - te.fwd == pytest.approx(w, rel=1e-6) and ao.bwd - te.bwd == pytest.approx(w, rel=1e-6)


def test_torchao_tensorwise_tp_gathers_fp8_and_reduce_scatters_bf16():
    """torchao's float8 TP (tensor-wise): Float8ColwiseParallel casts its input before the
    sequence-parallel all-gather, Float8RowwiseParallel casts the output gradient before the backward
    all-gather; the reduce-scatters stay BF16. Llama-3-8B, b 1, s 4096, TP 2 on a flat 370 GB/s
    NVLink: each all-gather of 2 x 4096 x 4096 B costs 25 us + (1/2) S / 370 GB/s, so each of the
    4 all-gathers per layer (2 forward, 2 backward) saves (1/2)(S/2) / 370 GB/s, 32 layers."""
    from planner.cost import pipeline_time
    m = planner.load_model("llama3-8b")
    c = planner.load_cluster("dgx-h100", nodes=1)
    c = c.model_copy(update={"nvlink": c.nvlink.model_copy(update={"busbw_curve": [(2**20, 370e9), (2**33, 370e9)]})})
    lay = Layout(tp=2, dp=4, sequence_parallel=True)
    tr = dict(global_batch_size=8, seq_length=4096)
    rowwise = pipeline_time(m, c, TrainingSpec(**tr, fp8="rowwise"), lay).stages[0].tp_comm
    tensorwise = pipeline_time(m, c, TrainingSpec(**tr, fp8="torchao-tensorwise"), lay).stages[0].tp_comm
    assert rowwise - tensorwise == pytest.approx(32 * 4 * 0.5 * (2 * 4096 * 4096 / 2) / 370e9, rel=1e-6)


def test_fsdp_float8_all_gather_gathers_the_linear_weights_in_one_byte():
    """torchtitan's float8.enable_fsdp_float8_all_gather (torchao tensor-wise only): FSDP2 gathers
    the FP8 cast of each linear weight's shard. Llama-3-8B layers hold 218,103,808 linear weights:
    the two gathered layers take 2 x (218,103,808 + the norms' 2 x 4096, counted alike) x 1 B instead
    of 2 B, and the ZeRO-3 gathers carry 1 B per linear weight. Rowwise has no such mode."""
    from planner.memory import param_gather_bytes, stage_params

    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100")
    lay = Layout(dp=8, zero_stage=3)
    off = TrainingSpec(**TRAIN, fp8="torchao-tensorwise")
    on = off.model_copy(update={"fp8_param_gather": True})
    p_off, p_on = planner.evaluate(m, c, off, lay), planner.evaluate(m, c, on, lay)
    assert p_off.memory.stages[0].get("zero3_gather") == 2 * (218_103_808 + 2 * 4096) * 2
    assert p_on.memory.stages[0].get("zero3_gather") == 2 * (218_103_808 + 2 * 4096) * 1
    psi, lin = stage_params(m, lay, 0, 32), 32 * 218_103_808
    assert param_gather_bytes(m, on, lay, 0, 32) == pytest.approx((2 * (psi - lin) + lin,))
    assert p_on.time.dp_exposed < p_off.time.dp_exposed
    with pytest.raises(planner.PlannerError, match="torchao's"):
        p_on.to_megatron()


def test_mxfp8_weights_are_gathered_in_bf16_through_the_gradient_buffer():
    """megatron-core 0.19.2 cannot map MXFP8 weights into the parameter buffer: it gathers BF16 through
    a buffer shared with the gradients and quantises after (2 B per parameter on the wire), while the
    weights are kept as MXFP8 only (no BF16 copy, no separate FP8 copies)."""
    from planner.memory import param_gather_bytes, stage_params

    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-b200")
    lay = Layout(dp=8, zero_stage=1)
    off = TrainingSpec(global_batch_size=64, seq_length=4096, fp8="mxfp8")
    on = off.model_copy(update={"fp8_param_gather": True})
    psi = stage_params(m, lay, 0, 32)
    assert param_gather_bytes(m, on, lay, 0, 32) == pytest.approx((2 * psi,))
    p_off, p_on = planner.evaluate(m, c, off, lay), planner.evaluate(m, c, on, lay)
    assert p_on.memory.stages[0].get("fp8_weights") == 0 and p_off.memory.stages[0].get("fp8_weights") > 0
    assert p_on.time.dp_exposed == pytest.approx(p_off.time.dp_exposed)
    assert "--reuse-grad-buf-for-mxfp8-param-ag" in p_on.to_megatron().args
    assert "--reuse-grad-buf-for-mxfp8-param-ag" not in p_off.to_megatron().args


def test_nvfp4_peaks_are_the_cited_datasheet_figures():
    """Dense FP4 peaks (clusters/*.yaml provenance): HGX B200 9,000 TFLOP/s at 1,000 W and GB200 10,000 at
    1,200 W (glennklockwood.com B200: half the 18,000 / 20,000 sparse), HGX B300 13,125, GB300 1,080 PFLOPS
    a 72-GPU rack = 15,000; no FP4 on Hopper."""
    for name, tflops in (("dgx-b200", 9000), ("gb200-nvl72", 10000), ("dgx-b300", 13125), ("gb300-nvl72", 15000)):
        assert planner.load_cluster(name).gpu.peak_fp4_flops == pytest.approx(tflops * 1e12)
    assert planner.load_cluster("dgx-h100").gpu.peak_fp4_flops is None


def test_an_nvfp4_gemm_runs_at_the_fp4_peak_on_the_fp8_curve():
    """ASSUMPTION (no NVFP4 size sweep published): the FP8 curve's fractions of the FP4 peak, so on
    B200 an NVFP4 GEMM takes 4,500 / 9,000 of the FP8 one at every size."""
    c = planner.load_cluster("dgx-b200")
    for f in (1e9, 3e11, 2e13):
        assert _gemm_time(c, [f], "fp4") == pytest.approx(_gemm_time(c, [f], "fp8") / 2, rel=1e-12)


def test_nvfp4_is_refused_where_it_cannot_run():
    m = planner.load_model("llama3-8b")
    with pytest.raises(PlannerError, match="recipe 'nvfp4' needs compute capability 10.x or newer; H100"):
        planner.evaluate(m, planner.load_cluster("dgx-h100"), TrainingSpec(**TRAIN, fp8="nvfp4"), Layout(tp=8, dp=1))
    with pytest.raises(ValueError, match="'fp8_param_gather': NVFP4 weights gathered in FP4"):
        TrainingSpec(**TRAIN, fp8="nvfp4", fp8_param_gather=True)


def test_nvfp4_weight_copies_inputs_and_casts():
    """NVFP4BlockScaling keeps a row- and a column-wise copy of each linear weight, each 4-bit values
    plus an E4M3 scale per 16: 2 x (0.5 + 1/16) = 1.125 B per weight (Llama-3-8B, 16 layers a stage,
    tp 2); a linear's saved input for wgrad is its 0.5625 B column-wise copy, so QKV, FC1 and FC2
    inputs shrink by 1.4375 B per element and the out-proj adds a 0.5625 B copy beside flash
    attention's BF16 output; quantising an operand reads it in BF16 and writes both copies, 3.125 B."""
    from planner.cost import cast_bytes
    from planner.memory import activation_bytes_per_layer

    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-b200")
    linear = 4096 * 6144 + 4096 * 4096 + 4096 * 28672 + 14336 * 4096
    lay = Layout(tp=2, pp=2, dp=2, zero_stage=1, sequence_parallel=True)
    fp4 = planner.evaluate(m, c, TrainingSpec(**TRAIN, fp8="nvfp4"), lay)
    for st in fp4.memory.stages:
        assert st.get("fp8_weights") == pytest.approx(16 * linear / 2 * 1.125)
    sbh, sbf = 8192 * 4096, 8192 * 14336
    kw = dict(tp=2, sequence_parallel=True)
    bf16 = activation_bytes_per_layer(m, 1, 8192, **kw)
    nv = activation_bytes_per_layer(m, 1, 8192, fp8_inputs=True, quant_bytes=0.5625, **kw)
    assert bf16 - nv == pytest.approx(1.4375 * (sbh / 2 + sbh / 2 + sbf / 2) - 0.5625 * sbh / 2)
    assert cast_bytes(TrainingSpec(**TRAIN, fp8="nvfp4")) == 3.125
    assert cast_bytes(TrainingSpec(**TRAIN, fp8="mxfp8")) == 4
    bf = planner.evaluate(m, c, TrainingSpec(**TRAIN), lay)
    mx = planner.evaluate(m, c, TrainingSpec(**TRAIN, fp8="mxfp8"), lay)
    assert fp4.step_time_s < mx.step_time_s < bf.step_time_s


def test_bf16_first_last_layers_priced_on_the_ranks_that_hold_them():
    """Megatron's --first-last-layers-bf16: the first N and last M layers run their linears in BF16.
    Llama-3-8B (32 layers) on 8 B200 under NVFP4, tp 2 pp 2 dp 2, 2 first and 1 last layer in BF16:
    rank 0 pays 2 layers at the BF16 rate and rank 1 one, the other layers as before -- the per-layer
    rates read off the all-NVFP4 and all-BF16 ranks (16 identical layers each, no logits on rank 0,
    the same logits on rank 1 at both precisions); the NVFP4 weight copies (2 x 0.5625 B) leave those
    layers: 218,103,808 linear weights per layer (QKV 4096 x 6144, out-proj 4096^2, three 4096 x
    14,336), 109,051,904 per GPU at tp 2."""
    from planner.cost import stage_time
    from planner.memory import memory_ledger

    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-b200", nodes=1)
    lay = Layout(tp=2, pp=2, dp=2, sequence_parallel=True)
    base = dict(global_batch_size=16, seq_length=4096)
    low, bf16 = TrainingSpec(**base, fp8="nvfp4"), TrainingSpec(**base)
    ends = TrainingSpec(**base, fp8="nvfp4", bf16_first_layers=2, bf16_last_layers=1)

    def compute(t, r):
        return stage_time(m, c, t, lay, r, 16).compute
    for r, k in ((0, 2), (1, 1)):
        per_layer_extra = (compute(bf16, r) - compute(low, r)) / 16
        assert compute(ends, r) == pytest.approx(compute(low, r) + k * per_layer_extra, rel=1e-9)
    per_gpu = (4096 * 6144 + 4096 * 4096 + 3 * 4096 * 14336) // 2
    assert per_gpu == 109_051_904
    for r, k in ((0, 2), (1, 1)):
        copies = memory_ledger(m, c, ends, lay).stages[r].get("fp8_weights")
        assert copies == pytest.approx((16 - k) * per_gpu * 2 * 0.5625)
    # the BF16 layers keep their linears' inputs in BF16: rank 1 (one micro-batch in flight) holds one
    # such layer; the difference per layer is the saved quantised inputs at 2 B instead of 0.5625 B
    from planner.memory import activation_bytes_per_layer
    kw = dict(tp=2, sequence_parallel=True)
    one = (activation_bytes_per_layer(m, 1, 4096, fp8_inputs=False, **kw)
           - activation_bytes_per_layer(m, 1, 4096, fp8_inputs=True, quant_bytes=0.5625, **kw))
    assert one > 0
    act = [s.get("activations") for s in memory_ledger(m, c, ends, lay).stages]
    act0 = [s.get("activations") for s in memory_ledger(m, c, low, lay).stages]
    assert act[1] - act0[1] == pytest.approx(1 * one) and act[0] - act0[0] == pytest.approx(2 * 2 * one)  # 2 in flight


def test_bf16_first_last_layers_follow_megatrons_rules():
    m = planner.load_model("llama3-8b")
    h100 = planner.load_cluster("dgx-h100", nodes=1)
    with pytest.raises(PlannerError, match="field 'bf16_first_layers': .*other than delayed"):
        TrainingSpec(**TRAIN, fp8="delayed", bf16_first_layers=1)  # TransformerConfig refuses delayed scaling
    with pytest.raises(PlannerError, match="field 'bf16_last_layers': .*rowwise"):
        TrainingSpec(**TRAIN, fp8="rowwise", bf16_last_layers=1)  # torchao has no such option
    t = TrainingSpec(**TRAIN, fp8="tensorwise", bf16_first_layers=9)
    with pytest.raises(PlannerError, match=r"bf16_first_layers\(9\) > num_layers\(32\) // pp\(4\) = 8"):
        planner.evaluate(m, h100, t, Layout(pp=4, dp=2))
    t = TrainingSpec(**TRAIN, fp8="tensorwise", bf16_last_layers=5)  # 8 layers per rank over vpp 2: chunks of 4
    with pytest.raises(PlannerError, match=r"last virtual stage holds 4 layers, fewer than bf16_last_layers\(5\)"):
        planner.evaluate(m, h100, t, Layout(pp=4, dp=2, vpp=2))
    # without a recipe the option has no effect, as in Megatron
    plain = planner.evaluate(m, h100, TrainingSpec(**TRAIN), Layout(dp=8))
    assert planner.evaluate(m, h100, TrainingSpec(**TRAIN, bf16_first_layers=1), Layout(dp=8)).step_time_s == plain.step_time_s


def test_the_last_rank_keeps_its_bf16_layers_in_its_last_virtual_stage():
    """Llama-3-8B on 8 H100, tp 2 pp 4 vpp 2, FP8 current scaling: the search gives the last rank (the
    LM head's) a 3-layer last virtual stage; with its last 4 layers in BF16 that stage holds at least
    4 (planner.space.last_rank_min_layers: 4 x vpp on the rank, whose last chunk holds the floor)."""
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100", nodes=1)
    splits = {}
    for k in (0, 4):
        t = TrainingSpec(global_batch_size=64, seq_length=4096, fp8="tensorwise", bf16_last_layers=k)
        best = plan(m, c, t, top_k=1, structural=False, pp=4, vpp=2, tp=2, time_limit_s=60).best
        splits[k] = best.layout.pipeline_layers
        assert best.time.objective_us == planner.evaluate(m, c, t, best.layout).time.objective_us
    assert splits[0][-1] == 3 and splits[4][-1] >= 4


def test_bf16_end_layers_of_an_explicit_split_fall_where_it_puts_them():
    """pipeline_layers (2, 3, 3, 2) on pp 2 x vpp 2 (stage i on rank i % 2): with 3 first and 3 last BF16
    layers of 10, rank 0 holds layers 0-1 and 5-7 (BF16: 0, 1, 7), rank 1 holds 2-4 and 8-9 (BF16: 2, 8, 9)."""
    from planner.memory import bf16_layers_on

    m = planner.load_model("llama3-8b").model_copy(update={"num_layers": 10})
    t = TrainingSpec(**TRAIN, fp8="tensorwise", bf16_first_layers=3, bf16_last_layers=3)
    lay = Layout(pp=2, vpp=2, dp=4, pipeline_layers=(2, 3, 3, 2))
    assert [bf16_layers_on(m, t, lay, r) for r in (0, 1)] == [3, 3]
    t2 = t.model_copy(update={"bf16_first_layers": 1, "bf16_last_layers": 2})  # BF16: 0 (rank 0), 8, 9 (rank 1)
    assert [bf16_layers_on(m, t2, lay, r) for r in (0, 1)] == [1, 2]
    assert bf16_layers_on(m, t.model_copy(update={"fp8": None}), lay, 0) == 0  # no recipe: no effect


def test_a_float8_job_module_for_a_model_outside_torchtitans_registry_says_so():
    """torchtitan's registry has Llama-3 8B and 70B: for another model planner_job.py builds the 8B
    stand-in as train.sh's defaults do, and its docstring tells the user to replace it."""
    from planner.emit.torchtitan import float8_job_module

    t = TrainingSpec(global_batch_size=256, seq_length=8192, fp8="rowwise", optimizer_impl="fsdp2", kernels="unfused")
    lay = Layout(tp=4, pp=1, dp=8, zero_stage=3, sequence_parallel=True)
    other = planner.evaluate(planner.load_model("qwen2.5-72b"), planner.load_cluster("hgx-h200", nodes=4), t, lay)
    assert "qwen2.5-72b has no torchtitan registry config: replace llama3_8b" in float8_job_module(other)
    own = planner.evaluate(planner.load_model("llama3-70b"), planner.load_cluster("hgx-h200", nodes=4), t, lay)
    text = float8_job_module(own)
    assert "no torchtitan registry config" not in text and 'model_registry("70B"' in text


def test_transformer_engine_recipes_gather_their_quantised_copies():
    """Transformer Engine quantises before a sequence-parallel all-gather (layernorm_linear.py, base.py:
    grad_output_preprocess, distributed.py: gather_along_first_dim): forward the row-wise copy; backward
    the output gradient's row- and column-wise copies, one for tensor-wise FP8 (the transpose is local),
    two for the block-scaled recipes unless Userbuffers carries it (one usage at a time)."""
    from planner.memory import tp_gather_element_bytes

    def b(fp8, backward=False, ub=False):
        return tp_gather_element_bytes(TrainingSpec(**TRAIN, fp8=fp8), backward, ub)
    assert [b(None), b(None, True)] == [2, 2]
    for tensorwise in ("delayed", "tensorwise", "torchao-tensorwise"):
        assert [b(tensorwise), b(tensorwise, True), b(tensorwise, True, True)] == [1, 1, 1]
    for block in ("blockwise", "mxfp8"):
        assert [b(block), b(block, True), b(block, True, True)] == [1, 2, 1]
    assert [b("nvfp4"), b("nvfp4", True), b("nvfp4", True, True)] == [0.5625, 1.125, 0.5625]  # 4 bits + a scale per 16
    assert b("rowwise") == 2  # torchao's rowwise float8 under torchtitan: DTensor gathers BF16


def test_transformer_engine_fp8_tp_gathers_cost_their_bytes():
    """Llama-3-8B, b 1, s 4096, TP 2 with SP on a flat NVLink curve, 32 layers, 2 forward and 2 backward
    all-gathers a layer of S = 4096 x 4096 elements, each (1/2) x bytes / the ring bus bandwidth (370 GB/s on
    H100, 720 on B200) plus latency, reduce-scatters in BF16 throughout. Against BF16 (2 B): delayed scaling saves 1 B an element in all four (H100); on B200,
    MXFP8 saves 1 B in the two forward ones only (its backward gathers two 1 B copies), NVFP4 1.4375 B forward
    and 0.875 B backward."""
    from planner.cost import pipeline_time

    def tp(cluster, fp8):
        c = planner.load_cluster(cluster, nodes=1)
        c = c.model_copy(update={"nvlink": c.nvlink.model_copy(update={"busbw_curve": [(2**20, 370e9), (2**33, 370e9)]})})
        t = TrainingSpec(global_batch_size=8, seq_length=4096, fp8=fp8)
        return pipeline_time(planner.load_model("llama3-8b"), c, t, Layout(tp=2, dp=4, sequence_parallel=True)).stages[0].tp_comm, c

    bf16, c = tp("dgx-h100", None)
    assert c.nvlink.ring_busbw == 370e9
    per_byte = 32 * 0.5 * 4096 * 4096 / 370e9  # one all-gather a layer, one byte an element saved
    assert bf16 - tp("dgx-h100", "delayed")[0] == pytest.approx(4 * per_byte * c.calibration.tp_comm_exposed, rel=1e-6)
    bf16, c = tp("dgx-b200", None)
    assert c.nvlink.ring_busbw == 720e9
    per_byte, e = 32 * 0.5 * 4096 * 4096 / 720e9, c.calibration.tp_comm_exposed
    assert bf16 - tp("dgx-b200", "mxfp8")[0] == pytest.approx(2 * per_byte * e, rel=1e-6)
    assert bf16 - tp("dgx-b200", "nvfp4")[0] == pytest.approx((2 * 1.4375 + 2 * 0.875) * per_byte * e, rel=1e-6)


# FP8 attention (TrainingSpec.fp8_attention): cuDNN's own SDPA benchmark, NVIDIA/cudnn-frontend@3929da2
# benchmark/sdpa_benchmark_training/results, causal ('top_left'), TFLOP/s (forward, backward):
CUDNN_SDPA = {  # (gpu csv, shapes, seq): {dtype: (fwd, bwd)}
    ("gb200", "llama3.1", 4096): {"bfloat16": (1408, 1148), "fp8": (1805, 1178), "mxfp8": (1685, 1054)},
    ("gb200", "llama3.1", 8192): {"bfloat16": (1574, 1332), "fp8": (2047, 1454), "mxfp8": (1902, 1287)},
    ("gb300", "dsv3", 4096): {"bfloat16": (1590, 1143), "fp8": (2788, 1982), "mxfp8": (2517, 1522)},
    ("gb300", "dsv3", 8192): {"bfloat16": (1825, 1291), "fp8": (3128, 2310), "mxfp8": (2829, 1780)},
    ("h200", "llama3.1", 4096): {"bfloat16": (591, 474), "fp8": (854, 471)},
    ("h200", "llama3.1", 8192): {"bfloat16": (644, 541), "fp8": (964, 430)},
}


def _sdpa_ratio(gpu: str, shapes: str, dtype: str) -> tuple[float, float]:
    """The mean over sequence 4096 and 8192 of dtype's TFLOP/s over BF16's, forward and backward."""
    rows = [v for (g, s, _), v in CUDNN_SDPA.items() if g == gpu and s == shapes]
    return tuple(sum(r[dtype][i] / r["bfloat16"][i] for r in rows) / len(rows) for i in (0, 1))


@pytest.mark.parametrize("cluster, gpu, scaling, dtype, shapes, head_dim", [
    ("gb200-nvl72", "gb200", "mxfp8", "mxfp8", "llama3.1", 128),
    ("gb200-nvl72", "gb200", "per_tensor", "fp8", "llama3.1", 128),
    ("dgx-b300", "gb300", "mxfp8", "mxfp8", "dsv3", 192),
    ("gb300-nvl72", "gb300", "per_tensor", "fp8", "dsv3", 192),
    ("dgx-h100", "h200", "per_tensor", "fp8", "llama3.1", 128),
])
def test_fp8_attention_speeds_are_cudnns_measured_ratios(cluster, gpu, scaling, dtype, shapes, head_dim):
    c = planner.load_cluster(cluster)
    point = next(p for p in c.calibration.fp8_attention_speed[scaling] if p[0] == head_dim)
    assert point[1:] == pytest.approx(_sdpa_ratio(gpu, shapes, dtype), abs=6e-4)
    assert "SDPA8" in c.provenance[f"calibration.fp8_attention_speed.{scaling}"]


def test_fp8_attention_divides_the_attention_core_and_adds_its_casts():
    """Llama-3-8B on GB200, MXFP8, seq 4096, one sequence: the core runs 1.203x forward and 0.942x
    backward (cuDNN's head-dim-128 ratios, above); Q (32 heads x 128), K and V (8 heads x 128 each) are
    quantised in the forward and the output gradient (32 x 128) in the backward, 4096 tokens at MXFP8's
    4 B (read BF16 2, write a row- and a column-wise copy) over 8 TB/s x 0.86. The BF16 backward it
    divides runs at cuDNN's measured BF16 backward speed (SDPA16)."""
    from planner.cost import FLASH_BWD_FACTOR, _layer_time_of

    m, c = planner.load_model("llama3-8b"), planner.load_cluster("gb200-nvl72")
    bf16 = TrainingSpec(**TRAIN, fp8="mxfp8")
    fp8a = TrainingSpec(**TRAIN, fp8="mxfp8", fp8_attention=True)
    a, b = _layer_time_of(m, c, bf16, 1, 1, 1, False), _layer_time_of(m, c, fp8a, 1, 1, 1, False)
    f, bw = 1.203, 0.942  # the catalog's rounding of _sdpa_ratio("gb200", "llama3.1", "mxfp8")
    cast = 4 * 4096 * 32 * 128 / (8000e9 * 0.86)  # one 32 x 128-wide tensor
    assert b.attn_fwd == pytest.approx(a.attn_fwd / f, rel=1e-3)
    assert a.fwd - b.fwd == pytest.approx(a.attn_fwd * (1 - 1 / f) - 1.5 * cast, rel=1e-3)  # Q + K + V = 1.5 x Q
    slower = 1408 / 1148  # cuDNN's BF16 backward is its own speed: 1148 against the forward's 1408 TFLOP/s at 4096
    assert b.bwd - a.bwd == pytest.approx(FLASH_BWD_FACTOR * a.attn_fwd * slower * (1 / bw - 1) + cast, rel=2e-3)
    # MLA's 192-wide query-key heads take the dsv3 point, a 160-wide head the mean of the two
    from planner.cost import fp8_attention_speed
    ds = planner.load_model("deepseek-v3")
    assert fp8_attention_speed(ds, c, fp8a) == pytest.approx((1.385, 1.271))
    mid = planner.specs.ModelSpec.model_validate({**m.model_dump(), "kv_channels": 160})
    assert fp8_attention_speed(mid, c, fp8a) == pytest.approx(((1.203 + 1.385) / 2, (0.942 + 1.271) / 2))
    assert fp8_attention_speed(m, c, bf16) == (1.0, 1.0)
    from planner.cost import fp8_attention_cast_elements  # per token on one GPU: (Q + K + V, dO)
    assert fp8_attention_cast_elements(m, 16) == (4096 / 16 + 2 * 128, 4096 / 16)  # 8 K/V heads over 16 ranks: one each
    assert fp8_attention_cast_elements(ds, 2) == (128 * 192 / 2 + 128 * (192 + 128) / 2, 128 * 128 / 2)  # MLA: K, V per head


def test_fp8_attention_leaves_the_bf16_end_layers_and_the_step_in_hoppers_measured_direction():
    """On H100, cuDNN's FP8 backward is slower than its BF16 one at these lengths (0.894 mean), so FP8
    attention makes a causal 8k step slower, as measured; a model all of whose layers are kept in BF16
    (tensorwise's --num-layers-at-start-in-bf16) prices the same step with it or without."""
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100")
    lay = Layout(tp=1, pp=1, dp=8, zero_stage=1, micro_batch_size=1)
    t = dict(global_batch_size=64, seq_length=8192, fp8="tensorwise")
    off = planner.evaluate(m, c, TrainingSpec(**t), lay).step_time_s
    on = planner.evaluate(m, c, TrainingSpec(**t, fp8_attention=True), lay).step_time_s
    assert on > off
    allbf16 = dict(t, bf16_first_layers=m.num_layers)
    on_, off_ = (planner.evaluate(m, c, TrainingSpec(**allbf16, fp8_attention=f), lay) for f in (True, False))
    assert on_.step_time_s == pytest.approx(off_.step_time_s, rel=1e-12)
    assert on_.peak_memory_bytes == pytest.approx(off_.peak_memory_bytes, rel=1e-12)


def test_fp8_attention_is_refused_where_megatron_or_the_catalog_cannot_run_it():
    for kw, text in ((dict(fp8="blockwise"), "delayed, tensorwise or mxfp8"), (dict(fp8=None), "fp8=None"),
                     (dict(fp8="nvfp4"), "fp8='nvfp4'"),
                     (dict(fp8="delayed", kernels="unfused"), "fused attention only")):
        with pytest.raises(ValueError, match="fp8_attention") as e:
            TrainingSpec(**TRAIN, fp8_attention=True, **kw)
        assert text in str(e.value)
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100")
    t = TrainingSpec(**TRAIN, fp8="delayed", fp8_attention=True)
    lay = Layout(tp=1, pp=1, dp=8, zero_stage=1, micro_batch_size=1)
    bare = c.model_copy(update={"calibration": c.calibration.model_copy(update={"fp8_attention_speed": None})})
    with pytest.raises(PlannerError, match="no measured per_tensor FP8 attention speed"):
        planner.evaluate(m, bare, t, lay)
    with pytest.raises(ValueError, match="strictly increasing head dims"):
        c.calibration.model_validate({**c.calibration.model_dump(), "fp8_attention_speed": {"mxfp8": [(192, 1, 1), (128, 1, 1)]}})
    oss = planner.load_model("gpt-oss-120b")  # learnable sinks: TE's FP8 kernel for them needs sm100
    with pytest.raises(PlannerError, match="learnable softmax sinks on Blackwell only"):
        planner.evaluate(oss, planner.load_cluster("dgx-h100", nodes=8), t,
                         Layout(tp=1, pp=1, dp=64, ep=64, etp=1, zero_stage=1, micro_batch_size=1))
    with pytest.raises(PlannerError, match="no launch config turns it on"):
        plan(m, c, t, framework="megatron", top_k=1, structural=False, time_limit_s=10)
    with pytest.raises(PlannerError, match="no command-line flag"):
        planner.evaluate(m, c, t, lay).to_megatron()


def test_the_cli_prices_fp8_attention_and_says_why_no_launch_turns_it_on(tmp_path):
    base = ["llama3-8b", "gb200-nvl72", "--nodes", "2", "--global-batch-size", "16", "--seq-length", "4096",
            "--fp8", "mxfp8", "--fp8-attention"]
    out = io.StringIO()
    assert main(["evaluate", *base, "--dp", "8", "--zero", "1", "--json"], stdout=out, stderr=io.StringIO()) == 0
    assert json.loads(out.getvalue())["fp8_attention"] is True
    err = io.StringIO()
    assert main(["plan", *base, "--framework", "megatron"], stdout=io.StringIO(), stderr=err) == 2
    assert "fp8_attention" in err.getvalue() and len(err.getvalue().strip().splitlines()) == 1
    err = io.StringIO()
    assert main(["evaluate", *base, "--dp", "8", "--zero", "1", "--emit", "megatron", "--out", str(tmp_path / "m")],
                stdout=io.StringIO(), stderr=err) == 2
    assert "no command-line flag" in err.getvalue() and len(err.getvalue().strip().splitlines()) == 1
    from planner.explain import explain

    lines = explain(planner.load_model("llama3-8b"), planner.load_cluster("gb200-nvl72", nodes=2),
                    TrainingSpec(global_batch_size=16, seq_length=4096, fp8="mxfp8", fp8_attention=True), framework="any")
    assert any(line.startswith("Sensitivity, BF16 attention (FP8's core runs 1.20x forward, 0.94x backward here)")
               for line in lines)


def test_fp8_attention_saves_what_transformer_engine_keeps():
    """Llama-3-8B, one 4096-token sequence, tp 1, FP8 linears. BF16 attention keeps Q (32 x 128), K and V
    (8 x 128 each) in BF16, and the saved V view pins the fused QKV output (Q + K, 5120 wide, 2 B). FP8
    attention keeps FP8 copies instead: delayed scaling 1 B each and the output in FP8 too (1 B less of its
    4096-wide BF16 copy); MXFP8 a row- and a column-wise copy with a scale per 32 (2.0625 B) and the BF16
    output. With the core recomputed its checkpoint keeps the BF16 inputs: nothing changes."""
    from planner.memory import activation_bytes_per_layer

    m, t = planner.load_model("llama3-8b"), 4096
    base = activation_bytes_per_layer(m, 1, t, fp8_inputs=True)
    qkv = t * (4096 + 1024 + 1024)
    pinned = 2 * t * (4096 + 1024)
    assert base - activation_bytes_per_layer(m, 1, t, fp8_inputs=True, fp8_attention="delayed") == \
        2 * qkv + pinned - qkv + t * 4096  # 80 MiB
    assert base - activation_bytes_per_layer(m, 1, t, fp8_inputs=True, fp8_attention="tensorwise") == \
        2 * qkv + pinned - qkv
    assert base - activation_bytes_per_layer(m, 1, t, fp8_inputs=True, fp8_attention="mxfp8") == \
        pytest.approx(2 * qkv + pinned - 2.0625 * qkv)
    kw = dict(fp8_inputs=True, recompute="selective")
    assert activation_bytes_per_layer(m, 1, t, fp8_attention="delayed", **kw) == activation_bytes_per_layer(m, 1, t, **kw)
    # Qwen3's per-head norms keep the fused buffer pinned: only Q, K, V shrink (32 x 128 + 2 x 4 x 128 wide)
    q3 = planner.load_model("qwen3-30b-a3b")
    assert q3.qk_norm
    rows = t * (32 * 128 + 2 * 4 * 128)
    assert activation_bytes_per_layer(q3, 1, t, fp8_inputs=True) - activation_bytes_per_layer(
        q3, 1, t, fp8_inputs=True, fp8_attention="tensorwise") == pytest.approx(rows)
    # DeepSeek-V3 (MLA, 128 heads: Q and K 192 wide, V 128) at tp 8: BF16 Q, K, V give way to FP8 ones; where
    # mla_up_proj already dropped the BF16 ones, the FP8 copies come back
    ds = planner.load_model("deepseek-v3")
    mla = t * 128 * (2 * 192 + 128) / 8
    kw = dict(tp=8, sequence_parallel=True, fp8_inputs=True)
    assert activation_bytes_per_layer(ds, 1, t, **kw) - activation_bytes_per_layer(ds, 1, t, fp8_attention="mxfp8", **kw) \
        == pytest.approx(2 * mla - 2.0625 * mla)
    kw.update(recompute="selective", recompute_modules=("mla_up_proj",))
    assert activation_bytes_per_layer(ds, 1, t, fp8_attention="mxfp8", **kw) - activation_bytes_per_layer(ds, 1, t, **kw) \
        == pytest.approx(2.0625 * mla)
    # the plan's peak: 32 layers x 80 MiB less on one H100 rank (no pipeline, one micro-batch in flight)
    c, lay = planner.load_cluster("dgx-h100"), Layout(tp=1, pp=1, dp=8, zero_stage=1, micro_batch_size=1)
    peak = [planner.evaluate(m, c, TrainingSpec(global_batch_size=64, seq_length=t, fp8="delayed", fp8_attention=on),
                             lay).peak_memory_bytes for on in (False, True)]
    assert peak[0] - peak[1] == pytest.approx(32 * 80 * 2**20)


def test_torchao_mxfp8_casts_each_operand_in_its_own_kernels():
    """torchao's MXFP8 linears (mx_mm) against its float8 rowwise ones on Llama-3-8B, tp 1, 4,096 tokens,
    B200 (8,000 GB/s x 0.86; the same GEMM family, MXFP8 at the FP8 peak): float8's casts are Inductor's,
    priced as Transformer Engine's (2 + 1 + 1 = 4 B an input element forward, 4 an output-gradient element
    backward); MXFP8's are torchao's own kernels, one read and one write a copy (3 B): the input forward and
    again backward, the output gradient twice backward. Elements a token: forward 4096 + 4096 + 4096 +
    14336 = 26,624; backward (4096 + 2 x 1024) + 4096 + 2 x 14336 + 4096 = 43,008. Both cast the weights
    each way (3 B), so they cancel."""
    from planner.cost import _layer_time_of
    from planner.space import framework_training

    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-b200")
    rw = _layer_time_of(m, c, framework_training(TrainingSpec(**TRAIN, fp8="rowwise"), "torchtitan"), 1, 1, 1, False)
    mx = _layer_time_of(m, c, framework_training(TrainingSpec(**TRAIN, fp8="torchao-mxfp8"), "torchtitan"), 1, 1, 1, False)
    hbm, tokens, cf, cb = 8000e9 * 0.86, 4096, 26_624, 43_008
    assert mx.fwd - rw.fwd == pytest.approx((3 - 4) * cf * tokens / hbm, rel=1e-6)
    assert mx.bwd - rw.bwd == pytest.approx((3 * cf + (6 - 4) * cb) * tokens / hbm, rel=1e-6)


def test_torchtitan_fp8_on_blackwell_is_mxfp8_and_matches_torchaos_published_gain():
    """'FP8' for torchtitan is torchao's MXFP8 on Blackwell (rowwise on Hopper, where MXFP8 is refused).
    torchao's MX README publishes Llama-3-8B on 8 B200 (FSDP2, per-op AC, batch 1 x 8,192, compiled):
    8,307.5 tokens/s/GPU in BF16 and 9,642.0 with torchtitan 0.3's MXFP8 (RCEIL scales), +16.1 %
    [pytorch/ao torchao/prototype/mx_formats/README.md, Training e2e benchmarks on NVIDIA B200]. Nothing is
    fitted on it: the model's gain is within 5 points (issue bar), +13.4 % at this writing."""
    from planner.space import check_precision, default_fp8_recipe, framework_training

    b200, h100 = planner.load_cluster("dgx-b200"), planner.load_cluster("dgx-h100")
    assert default_fp8_recipe(b200, "torchtitan") == "torchao-mxfp8"
    assert default_fp8_recipe(h100, "torchtitan") == "rowwise"
    with pytest.raises(PlannerError, match="recipe 'torchao-mxfp8' needs compute capability 10.x or newer"):
        check_precision(h100, TrainingSpec(**TRAIN, fp8="torchao-mxfp8"))
    with pytest.raises(Exception, match="fp8_param_gather"):  # torchao's MX communication is BF16
        TrainingSpec(**TRAIN, fp8="torchao-mxfp8", fp8_param_gather=True)
    m, lay = planner.load_model("llama3-8b"), Layout(dp=8, zero_stage=3, micro_batch_size=1, recompute="op")
    step = {fp8: planner.evaluate(m, b200, framework_training(TrainingSpec(global_batch_size=8, seq_length=8192,
                                                                           fp8=fp8), "torchtitan"), lay).step_time_s
            for fp8 in (None, "torchao-mxfp8")}
    predicted, measured = step[None] / step["torchao-mxfp8"], 9642.0 / 8307.5
    assert abs(predicted - measured) < 0.05, (predicted, measured)


def test_torchtitan_mxfp8_launch_converts_the_decoder_linears(tmp_path):
    """An MXFP8 torchtitan plan of Llama-3-8B on a DGX B200 emits planner_job.py with MXFP8LinearConverter
    over the decoder blocks' linears (its fqns include list), which torchtitan 0.3 parses: every linear but
    the LM head in MXFP8, as priced."""
    pytest.importorskip("torchtitan")
    from planner.check import check_torchtitan

    m = planner.load_model("llama3-8b")
    p = plan(m, planner.load_cluster("dgx-b200"), TrainingSpec(global_batch_size=64, seq_length=8192,
             fp8="torchao-mxfp8"), framework="torchtitan", top_k=1, structural=False).best
    files = p.to_torchtitan()
    assert "MXFP8LinearConverter.Config(fqns=['attention', 'feed_forward']" in files.files["planner_job.py"]
    files.write(tmp_path)
    res = check_torchtitan(list(files.args), p.num_gpus, module="planner_job", config="planner_job",
                           folder=str(tmp_path), num_layers=m.num_layers)
    assert res.ok, res.line()
    # every block's wqkv, wo, w1, w2, w3 in MXFP8, the LM head in BF16
    assert res.details["high_precision_linears"] == ["lm_head"] and res.details["float8_linears"] == 5 * 32


def test_every_recipe_has_a_scaling():
    """specs.FP8_SCALING names how each recipe TrainingSpec.fp8 accepts scales its operands (the key the published
    speedup pairs are read by): Transformer Engine's delayed and current (tensorwise) scaling and torchao's
    tensorwise one scale a tensor, torchao's rowwise one a row, blockwise, MXFP8 and NVFP4 one a block."""
    from typing import get_args

    from planner.specs import FP8_SCALING, Fp8Recipe

    assert set(FP8_SCALING) == set(get_args(Fp8Recipe))
    assert {r for r, s in FP8_SCALING.items() if s == "per-tensor"} == {"delayed", "tensorwise", "torchao-tensorwise"}
    assert [r for r, s in FP8_SCALING.items() if s == "row-wise"] == ["rowwise"]
