"""Prediction-interval tables from out-of-sample residuals of the published runs.

    python benchmarks/intervals.py [--write] [--one-run] [--moe-stack]

Step time: the leave-one-source-group-out residuals ln(measured / predicted) (benchmarks/fidelity.py
refits every GPU generation without the held-out group), grouped by source (see hierarchy():
a new stack brings its own bias, so the spread of the group medians adds to the spread within a
group; ranking_sigma is the within-group spread alone, since two layouts run on one stack share
its bias — used to call two layouts tied). One table per workload (dense BF16/FP16, dense FP8,
MoE: their errors differ, so an MoE or FP8 job must not carry the dense rows' spread); within it
keyed by (GPU arch, kernel family) where a key has residuals from MIN_GROUPS source groups, else
the workload's rows pooled. FP8 rows are priced with the BF16 rows' parameters and the FP8 GEMM
share refitted without their source group; MoE rows with the BF16 rows' parameters refitted
without their source group, and the three fitted on MoE rows (the host's cost per expert GEMM and its stall at
every MoE forward's sync refitted on the other groups, Blackwell's MXFP8 share at its prior in the group it was
fitted on: fidelity.moe_held_out). Memory: residuals of the rows that publish a peak (no memory parameter is refitted
per group, so these are in-sample for the overhead only).

Prints the table and two coverages of the 80 % and 95 % intervals: built from the other half of
the rows (how well the interval is built; tested), and built without the row's whole source group
(what a stack unlike any published one can expect: far lower, because each source group carries
its own bias — the reason to calibrate). With --write puts the table into planner/uncertainty.py.
--one-run calibrates on one row of a dense sweep and predicts the rest; --moe-stack calibrates on the other
MoE models a release published on one GPU and predicts each one (same_stack_calibration).
Memory: the bias is never below 0 (a ledger that over-counts on a few rows is not credited) and the
spread never below 5 %; it comes from the peaks of the same kernel family (the published ones are
torchtitan's reserved memory with eager kernels), so the pooled entry, which prices the fused
stacks, keeps bias 0 while no fused-kernel run publishes a peak.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fidelity import (SPEEDUP_PAIRS, evaluate_runs, leave_one_group_out, moe_held_out,  # noqa: E402
                      ratio_pairs, same_layout_pairs)
from runs import load_moe_runs, load_runs  # noqa: E402

from planner.specs import FP8_SCALING  # noqa: E402
from planner.uncertainty import model_key, table_key  # noqa: E402

Z80 = 1.2815515655446004
ROOT = Path(__file__).resolve().parent.parent


def _key(run) -> tuple[int, str]:
    return run.cluster.gpu.arch, run.training.kernels


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def spread(xs: list[float]) -> tuple[float, float]:
    """(median, robust sigma) of log residuals."""
    if len(xs) < 2:
        return (xs[0] if xs else 0.0), 0.15
    return statistics.median(xs), max(0.01, (_quantile(xs, 0.9) - _quantile(xs, 0.1)) / (2 * Z80))


MIN_GROUPS = 3
"""A (GPU arch, kernels) key gets its own entry only with residuals from this many source groups."""


def hierarchy(step) -> tuple[float, float, float]:
    """(bias, sigma, within) of residuals grouped by source: bias = median of the group medians;
    sigma² = between² + within², between = spread of the group medians (a new stack's own bias),
    within = robust spread of residuals around their group's median (what separates two layouts
    on one stack). Every group counts once in the bias and the between spread, so one large
    group cannot stand for all stacks."""
    medians = {g: statistics.median([x for r, x in step if r.group == g]) for g in {r.group for r, _ in step}}
    between = statistics.pstdev(medians.values()) if len(medians) > 1 else 0.1
    _, within = spread([x - medians[r.group] for r, x in step])
    return statistics.median(medians.values()), math.hypot(between, within), within


def step_residuals(runs, fit_runs=None, fp8_runs=None) -> list[tuple[object, float]]:
    """(run, ln(measured / predicted step time)) out of sample, every usable row: predicted with the
    parameters refitted without the row's source group (on `fit_runs` where given; the FP8 share on
    `fp8_runs`' other groups where given)."""
    return [(r, math.log(1 + e))  # e = pred/meas throughput − 1
            for values in leave_one_group_out(runs, fit_runs, fp8_runs).values() for r, e in values]


def workload_residuals() -> dict[str, tuple[list, list]]:
    """Per workload (planner.uncertainty.workload): (step residuals, memory residuals). Dense
    BF16/FP16 rows leave their group out of the refit; the FP8 rows are predicted with the BF16
    rows' parameters and the FP8 share (fp8_gemm_in_training) refitted without their group (a
    group with BF16 rows too, torchtitan's, does not see them); the MoE rows with the BF16 rows'
    parameters refitted without their group and the three fitted on MoE rows refitted without it too (the host's
    cost per expert GEMM and its stall; Blackwell's MXFP8 share at its prior: fidelity.moe_held_out). Memory: the workload's
    own published peaks, split by kernel family in table() (no MoE run publishes one)."""
    dense, low = load_runs(), load_runs(low_precision=True)
    return {"dense": (step_residuals(dense), memory_residuals(dense)),
            "low-precision": (step_residuals(low, dense, low), memory_residuals(low)),
            "moe": (step_residuals(moe_held_out(load_moe_runs()[0]), dense), [])}


def memory_residuals(runs) -> list[tuple[object, float]]:
    out = []
    for r, plan, _ in evaluate_runs(runs):
        if plan is not None and not r.oom and r.peak_mem_bytes:
            out.append((r, math.log(r.peak_mem_bytes / plan.peak_memory_bytes)))
    return out


def table(step, mem, workload: str = "dense") -> dict:
    """Entries keyed (workload, GPU arch, kernels) where a key has residuals from MIN_GROUPS source
    groups; (workload, None, kernels) for a kernel family of the workload whose published peaks give
    other memory terms: the pooled step-time terms with that family's memory terms; and (workload,
    None, None), every row (memory: the fused stacks', none of which publishes a peak)."""
    keys = sorted(k for k in {_key(r) for r, _ in step}
                  if len({r.group for r, _ in step if _key(r) == k}) >= MIN_GROUPS)
    families = sorted({r.training.kernels for r, _ in step})

    def memory(kernels: str) -> tuple[float, float]:
        """(bias, sigma) from the published peaks of one kernel family; conservative: a ledger that
        over-counts on a few rows of one stack is not credited (bias ≥ 0), the spread is at least 5 %."""
        xs = [x for r, x in mem if r.training.kernels == kernels]
        b, sg = spread(xs) if xs else (0.0, 0.0)
        return max(0.0, b), max(0.05, sg)

    out = {}
    # a kernel family's pooled entry only where its memory terms differ from the workload's pooled ones
    for k in keys + [(None, f) for f in families if memory(f) != memory("fused")] + [None]:
        rows = [(r, x) for r, x in step if k is None or k[0] is None or _key(r) == k]
        mem_bias, mem_sigma = memory(k[1] if k is not None else "fused")
        bias, sigma, within = hierarchy(rows)
        out[(workload, *(k or (None, None)))] = dict(
            step_time_bias=bias, step_time_sigma=sigma, ranking_sigma=within, memory_bias=mem_bias,
            memory_sigma=mem_sigma, rows=len(rows), groups=len({r.group for r, _ in rows}))
    return out


MIN_MODEL_ROWS = 3
"""A model gets its own entry (MODELS) only with this many published runs on one GPU architecture and kernel family."""
ARCH_NAMES = {8: "A100", 9: "Hopper", 10: "Blackwell"}


def catalog_names() -> dict[tuple, str]:
    """model_key -> catalog id, to name a model whose published rows each carry their own name."""
    import planner
    return {model_key(planner.load_model(m)): m for m in planner.catalog.model_ids()}


def _base(tab: dict, w: str, arch: int, kernels: str) -> dict:
    """The entry planner.uncertainty.prediction_error gives a job of workload w on arch with these kernels
    (its table_key, else the workload's pooled entry)."""
    return tab[table_key(tab, w, arch, kernels) or (w, None, None)]


def model_misses(residuals: dict[str, tuple[list, list]], tab: dict) -> dict:
    """Per (workload, model_key, GPU arch, kernel family) with MIN_MODEL_ROWS rows or more: the model's own residuals where
    their median lies outside the 80 % interval the table gives its rows (_base), i.e. the table's band
    would not cover that model's own published runs. Bias: their median; sigma: the larger of the table's
    and their own spread (a known miss is no reason for a narrower band); memory and ranking terms: the
    table's. Every residual is out of its source group, as the table's are."""
    out, catalog = {}, catalog_names()
    for w, (step, _) in residuals.items():
        by: dict[tuple, list] = {}
        for r, x in step:
            by.setdefault((model_key(r.model), r.cluster.gpu.arch, r.training.kernels), []).append((r, x))
        for (key, arch, kernels), rows in sorted(by.items(), key=str):
            if len(rows) < MIN_MODEL_ROWS:
                continue
            base = _base(tab, w, arch, kernels)
            xs = [x for _, x in rows]
            median = statistics.median(xs)
            if abs(median - base["step_time_bias"]) <= Z80 * base["step_time_sigma"]:
                continue
            out[(w, key, arch, kernels)] = dict(
                step_time_bias=median, step_time_sigma=max(base["step_time_sigma"], spread(xs)[1]),
                ranking_sigma=base["ranking_sigma"], memory_bias=base["memory_bias"], memory_sigma=base["memory_sigma"],
                rows=len(rows), groups=len({r.group for r, _ in rows}), name=catalog.get(key) or f"a {key[0]} model of {key[1]} layers, hidden {key[2]}",
                lo=math.exp(min(xs)), hi=math.exp(max(xs)), median=math.exp(median), arch=ARCH_NAMES.get(arch, f"arch {arch}"), kernels=kernels)
    return out


def speedup_pairs(residuals: dict[str, tuple[list, list]]) -> list[tuple[object, object, float, float]]:
    """(BF16 run, FP8 run, measured, predicted FP8-over-BF16 throughput ratio) of every published pair of one
    layout in both precisions, each run predicted out of its source group (its residual): the dense pairs
    fidelity.SPEEDUP_PAIRS names (BF16 among the dense residuals, FP8 among the low-precision ones), and the MoE
    rows whose ids differ only in their last word (the precision) with equal layouts, one BF16
    (fidelity.same_layout_pairs). With x = ln(predicted / measured throughput), the predicted ratio is
    the measured one times exp(x_fp8 - x_bf16). And the pairs published only as a ratio (fidelity.ratio_pairs:
    parts the catalog cannot price), at the catalog's prediction, which nothing fitted on them."""
    x = {r.id: e for w in ("dense", "low-precision", "moe") for r, e in residuals[w][0]}
    dense = {r.id: r for r, _ in residuals["dense"][0]}
    low = {r.id: r for r, _ in residuals["low-precision"][0]}
    pairs = [(dense[b], low[f]) for b, f in SPEEDUP_PAIRS if b in dense and f in low]
    pairs += same_layout_pairs(r for r, _ in residuals["moe"][0])
    return [(rb, rf, m, m * math.exp(x[rf.id] - x[rb.id]))
            for rb, rf in pairs for m in [rf.tokens_per_s_per_gpu / rb.tokens_per_s_per_gpu]] + ratio_pairs()


def speedup_checks(residuals: dict[str, tuple[list, list]]) -> dict:
    """Per (workload, GPU arch, kernel family, recipe scaling: specs.FP8_SCALING) of the FP8 runs: how the published
    FP8-over-BF16 speedups of speedup_pairs compare with the model's, in points (100 x (predicted - measured)):
    median, range, the pairs."""
    by: dict[tuple, list] = {}
    for rb, rf, measured, predicted in speedup_pairs(residuals):
        w = "moe" if rf.model.moe is not None else "dense"
        key = (w, rf.cluster.gpu.arch, rf.training.kernels, FP8_SCALING[rf.training.fp8])
        by.setdefault(key, []).append((rf, measured, predicted))
    out = {}
    for key, rows in sorted(by.items(), key=str):
        points = [100 * (p - m) for _, m, p in rows]
        out[key] = dict(pairs=len(rows), median_points=statistics.median(points), lo_points=min(points),
                        hi_points=max(points), groups=len({r.group for r, _, _ in rows}),
                        measured=[m for _, m, _ in rows])
    return out


def _speedup_basis(key: tuple, v: dict) -> str:
    w, arch, kernels, scaling = key
    return (f"{v['pairs']} published FP8/BF16 pair{'s' * (v['pairs'] > 1)} of one layout ({WHAT_PAIR[w]} on "
            f"{ARCH_NAMES.get(arch, f'arch {arch}')} with {kernels} kernels and {scaling} scaling, {v['groups']} source "
            f"group{'s' * (v['groups'] > 1)}; measured {', '.join(f'{m:.2f}x' for m in v['measured'])}), each run "
            "predicted out of its source group")


WHAT_PAIR = {"dense": "dense models", "moe": "MoE models"}


def tables(residuals: dict[str, tuple[list, list]]) -> dict:
    """table() of every workload, one dict."""
    return {k: v for w, (step, mem) in residuals.items() for k, v in table(step, mem, w).items()}


def coverage_rows(step, level_z: float) -> float:
    """Share of rows inside intervals built from the other half of the rows (even/odd cross-fit):
    tests how the interval is built; the residuals themselves are all out of their source group."""
    inside = 0
    halves = (step[0::2], step[1::2])
    for build, test in (halves, halves[::-1]):
        bias, sigma, _ = hierarchy(build)
        inside += sum(abs(x - bias) <= level_z * sigma for _, x in test)
    return inside / len(step)


def coverage(step, level_z: float) -> tuple[float, float]:
    """(share of rows, mean share per group) inside intervals built without the row's source group."""
    inside, shares = 0, []
    for g in sorted({r.group for r, _ in step}):
        bias, sigma, _ = hierarchy([(r, x) for r, x in step if r.group != g])
        held = [x for r, x in step if r.group == g]
        n = sum(abs(x - bias) <= level_z * sigma for x in held)
        inside += n
        shares.append(n / len(held))
    return inside / len(step), statistics.mean(shares)


WHAT = {"dense": "published runs", "low-precision": "published FP8 runs", "moe": "published MoE runs"}


def _miss_basis(w: str, v: dict) -> str:
    return (f"{v['name']}: {v['rows']} {WHAT[w]} on {v['arch']} with {v['kernels']} kernels ({v['groups']} source group{'s' * (v['groups'] > 1)}) took "
            f"{v['lo']:.2f}-{v['hi']:.2f}x the predicted step time (median {v['median']:.2f}x), each predicted out of its source group")


def write(tab: dict, misses: dict, speedups: dict) -> None:
    path = ROOT / "planner" / "uncertainty.py"
    text = path.read_text()
    rows = ["FP8_SPEEDUPS: dict[tuple[Literal['dense', 'moe'], int, str, Fp8Scaling], SpeedupCheck] = {"]
    for key, v in speedups.items():
        rows.append(f"    {key!r}: SpeedupCheck(pairs={v['pairs']}, median_points={v['median_points']:.1f}, "
                    f"lo_points={v['lo_points']:.1f}, hi_points={v['hi_points']:.1f}, "
                    f"basis=\"{_speedup_basis(key, v)}\"),")
    rows.append("}")
    text = re.sub(r"FP8_SPEEDUPS: dict\[.*?\n\}\n", lambda _: "\n".join(rows) + "\n", text, count=1, flags=re.S)
    rows = ["MODELS: dict[tuple[Workload, ModelKey, int, str], PredictionError] = {"]
    for (w, key, arch, kernels), v in misses.items():
        rows.append(f"    {(w, key, arch, kernels)!r}: PredictionError(step_time_bias={v['step_time_bias']:.4f}, "
                    f"step_time_sigma={v['step_time_sigma']:.4f}, ranking_sigma={v['ranking_sigma']:.4f}, "
                    f"memory_bias={v['memory_bias']:.4f}, memory_sigma={v['memory_sigma']:.4f}, "
                    f"basis=\"{_miss_basis(w, v)}\"),")
    rows.append("}")
    text = re.sub(r"MODELS: dict\[.*?\n\}\n", lambda _: "\n".join(rows) + "\n", text, count=1, flags=re.S)
    lines = ["PUBLISHED: dict[tuple[Workload, int | None, str | None], PredictionError] = {"]
    for (w, arch, kernels), v in tab.items():
        where = (f"arch {arch}, {kernels} kernels" if arch is not None else
                 f"all GPUs, memory from {kernels}-kernel peaks" if kernels is not None else "all GPUs and kernels")
        lines.append(f"    {(w, arch, kernels)!r}: PredictionError(step_time_bias={v['step_time_bias']:.4f}, "
                     f"step_time_sigma={v['step_time_sigma']:.4f}, ranking_sigma={v['ranking_sigma']:.4f}, "
                     f"memory_bias={v['memory_bias']:.4f}, memory_sigma={v['memory_sigma']:.4f}, "
                     f"basis=\"{v['rows']} {WHAT[w]} ({v['groups']} source groups; {where}), each predicted out of its source group\"),")
    lines.append("}")
    lines.append('POOLED = PUBLISHED[("dense", None, None)]')
    new = re.sub(r"PUBLISHED: dict\[.*?\n\}\nPOOLED = [^\n]*\n", lambda _: "\n".join(lines) + "\n", text, flags=re.S)
    assert new != text or "PUBLISHED" in text
    path.write_text(new)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write the table into planner/uncertainty.py")
    ap.add_argument("--one-run", action="store_true", help="also: calibrate on one run of a sweep, predict the rest")
    ap.add_argument("--moe-stack", action="store_true",
                    help="also: calibrate on a release's other MoE models on one GPU, predict the one left out")
    a = ap.parse_args(argv)
    residuals = workload_residuals()
    tab = tables(residuals)
    print(f"{'key':34s} {'rows':>5s} {'groups':>6s} {'bias':>7s} {'sigma':>7s} {'ranking':>8s} {'mem bias':>9s} {'mem sigma':>9s}")
    for k, v in tab.items():
        print(f"{str(k):34s} {v['rows']:5d} {v['groups']:6d} {v['step_time_bias']:+7.3f} {v['step_time_sigma']:7.3f} "
              f"{v['ranking_sigma']:8.3f} {v['memory_bias']:+9.3f} {v['memory_sigma']:9.3f}")
    print("memory rows: " + ", ".join(f"{w} {len(mem)}" for w, (_, mem) in residuals.items()))
    for w, (step, _) in residuals.items():
        (r80, g80), (r95, g95) = coverage(step, Z80), coverage(step, 1.959963984540054)
        print(f"{w}: coverage, intervals from the other half of the rows: "
              f"80 %: {coverage_rows(step, Z80):.1%}, 95 %: {coverage_rows(step, 1.959963984540054):.1%}; "
              f"built without the row's source group (rows / groups weighted alike): "
              f"80 %: {r80:.1%} / {g80:.1%}, 95 %: {r95:.1%} / {g95:.1%}")
    runs = load_runs()
    if a.one_run:
        errs = one_run_calibration(runs)
        print(f"\n{'calibrated on one run of its group':40s} {'predictions':>11s} {'median |err|':>12s} {'p80':>6s}")
        every = []
        for g, xs in errs.items():
            every += xs
            print(f"{g:40s} {len(xs):11d} {statistics.median(xs):12.1%} {_quantile(xs, 0.8):6.1%}")
        print(f"{'all':40s} {len(every):11d} {statistics.median(every):12.1%} {_quantile(every, 0.8):6.1%}")
    if a.moe_stack:
        print_same_stack(same_stack_calibration(load_moe_runs()[0]))
    misses = model_misses(residuals, tab)
    print(f"\nmodels whose own published runs fall outside their table's 80 % interval ({len(misses)}):")
    for (w, _, _, _), v in misses.items():
        print(f"  {w:14s} {_miss_basis(w, v)}")
    speedups = speedup_checks(residuals)
    print(f"\nFP8-over-BF16 speedups of published pairs, predicted - measured ({len(speedups)} stacks):")
    for key, v in speedups.items():
        print(f"  {str(key):28s} median {v['median_points']:+5.1f} points, {v['lo_points']:+.1f} to {v['hi_points']:+.1f}: "
              f"{_speedup_basis(key, v)}")
    if a.write:
        write(tab, misses, speedups)
        print("wrote planner/uncertainty.py")
    return 0



def measured_step(run) -> float:
    """A published row's step time in seconds, from its throughput: GBS x seq / (tokens/s/GPU x GPUs)."""
    return run.training.global_batch_size * run.training.seq_length / (run.tokens_per_s_per_gpu * run.layout.world_size)


def one_run_calibration(runs, per_group: int = 5) -> dict[str, list[float]]:
    """Calibrate on one row of a source group (a sweep run on one stack), predict the group's other
    rows on the same GPU: |ln(measured / predicted)| per prediction. Up to `per_group` calibration
    rows per group, spread over the group."""
    from planner.calibration import Observation, apply_factors, calibrate
    from planner.plans import evaluate

    out: dict[str, list[float]] = {}
    usable = [r for r in runs if not r.oom]
    for g in sorted({r.group for r in usable}):
        rows = [r for r in usable if r.group == g]
        picks = rows[:: max(1, len(rows) // per_group)][:per_group]
        for cal in picks:
            res = calibrate(cal.cluster, [Observation(cal.id, cal.model, cal.training, cal.layout, measured_step(cal))])
            for r in rows:
                if r is cal or r.cluster.gpu.name != cal.cluster.gpu.name:
                    continue
                c = apply_factors(r.cluster, res.factors)
                p = evaluate(r.model, c, r.training, r.layout)
                out.setdefault(g, []).append(abs(math.log(measured_step(r) / p.step_time_s)))
    return out


def _release(run) -> str:
    """The software release a published MoE row ran (its id's source and version: mbridge_26.04.01, dgxc, ...)."""
    m = re.match(r"(mbridge_[0-9.]+|dgxc|nemo_[0-9.]+)_", run.id)
    return m.group(1) if m else run.id


def same_stack_calibration(runs) -> dict[str, list[tuple[str, float]]]:
    """What calibrating on one's own MoE runs buys: for each release and GPU with two or more models (one
    software stack on one cluster), calibrate on the other models' rows and predict each model's: signed
    ln(measured / predicted) per prediction, with the catalog, with all of PARAMETERS but the
    host stall and the dispatch speed (ep_comm, moe_stall; expert_call, the host's time per expert GEMM, is among
    them), with all of them, and with either of those two alone."""
    from planner.calibration import PARAMETERS, Observation, apply_factors, calibrate
    from planner.plans import evaluate

    moe = {p.name: p for p in PARAMETERS if p.name in ("ep_comm", "moe_stall")}
    dense = tuple(p for p in PARAMETERS if p.name not in moe)
    sets = {"catalog": None, "without the stall and dispatch speed": dense, "all parameters": PARAMETERS,
            "+ ep_comm only": (*dense, moe["ep_comm"]), "+ moe_stall only": (*dense, moe["moe_stall"])}
    usable = [r for r in runs if r.tokens_per_s_per_gpu]
    stacks: dict[tuple[str, str], list] = {}
    for r in usable:
        stacks.setdefault((_release(r), r.cluster.gpu.name), []).append(r)
    out: dict[str, list[tuple[str, float]]] = {k: [] for k in sets}
    for rows in stacks.values():
        if len({r.model.name for r in rows}) < 2:
            continue
        for held in rows:
            fit = [Observation(r.id, r.model, r.training, r.layout, measured_step(r)) for r in rows
                   if r.model.name != held.model.name]
            for label, params in sets.items():
                c = held.cluster if params is None else apply_factors(held.cluster, calibrate(held.cluster, fit, params).factors)
                out[label].append((held.id, math.log(measured_step(held) / evaluate(held.model, c, held.training, held.layout).step_time_s)))
    return out


def print_same_stack(errs: dict[str, list[tuple[str, float]]]) -> None:
    print(f"\n{'MoE, calibrated on the same stack':40s} {'predictions':>11s} {'median |err|':>12s} {'p80':>6s} {'bias':>7s}")
    print("(bias: median predicted over measured throughput, minus 1)")
    for label, xs in errs.items():
        a = [abs(x) for _, x in xs]
        print(f"{label:40s} {len(a):11d} {statistics.median(a):12.1%} {_quantile(a, 0.8):6.1%} "
              f"{math.exp(statistics.median(x for _, x in xs)) - 1:+7.1%}")


if __name__ == "__main__":
    sys.exit(main())
