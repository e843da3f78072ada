"""Cost-model fidelity: predicted vs measured throughput (and peak memory) on published runs.

    python benchmarks/fidelity.py [--rows] [--no-logo] [--moe] [--row TEXT]

Prints one line per source group (median and max |error|), the overall figures, and with --rows
every row. Rows whose layout the planner rejects are listed with the rule they break.

Then the out-of-sample figure: leave one source group out, refit the calibrated parameters of
every GPU generation on the other groups' rows (benchmarks/calibrate.py: same grid, ties to the
catalog's value), and predict the held-out group. In-sample figures flatter the model; this one
is the estimate of its error on a stack it has not seen; with --rows, its 30 worst rows follow.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from dataclasses import replace
from functools import cache
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibrate import FP8_GRID, GRID, fit, generation, prior_of, row_error  # noqa: E402
from runs import load_moe_runs, load_ratio_pairs, load_runs  # noqa: E402

from planner.errors import PlannerError  # noqa: E402
from planner.plans import evaluate  # noqa: E402


def evaluate_runs(runs):
    out = []
    for r in runs:
        try:
            plan = evaluate(r.model, r.cluster, r.training, r.layout)
        except PlannerError as err:
            out.append((r, None, str(err)))
            continue
        out.append((r, plan, None))
    return out


def summarise(results):
    groups: dict[str, list[float]] = {}
    mem: dict[str, list[float]] = {}
    for r, plan, _ in results:
        if plan is None or r.oom:
            continue
        pred = plan.tokens_per_second / plan.num_gpus
        groups.setdefault(r.group, []).append(pred / r.tokens_per_s_per_gpu - 1)
        if r.peak_mem_bytes:
            mem.setdefault(r.group, []).append(plan.peak_memory_bytes / r.peak_mem_bytes - 1)
    return groups, mem


def _with(cluster, update):
    return cluster.model_copy(update={"calibration": cluster.calibration.model_copy(update=update)})


_REFITS: dict[tuple, dict] = {}


def _refit(rows, prior: dict, grid: dict = GRID, base: dict | None = None) -> dict:
    """fit(rows, prior, grid, base)'s parameters, once per set of rows, prior and base (the FP8 and
    MoE groups, absent from the BF16 rows, all refit on the same ones); the prior without rows."""
    if not rows:
        return prior
    key = (tuple(sorted(r.id for r in rows)), tuple(sorted(prior.items())), tuple(sorted((base or {}).items())))
    if key not in _REFITS:
        _REFITS[key] = fit(rows, prior, grid, base)[1]
    return _REFITS[key]


def leave_one_group_out(runs, fit_runs=None, fp8_runs=None) -> dict[str, list[tuple]]:
    """(run, signed throughput error) of each source group's rows, predicted with parameters refitted
    without the group: on the other groups of `runs`, or of `fit_runs` where given (the BF16/FP16
    rows, for predicting FP8 or MoE rows); with `fp8_runs` (the FP8 rows) fp8_gemm_in_training is
    refitted on their other groups too (the MoE rows keep the catalog's; the three parameters fitted on them are
    held out by moe_held_out)."""
    usable = [r for r in runs if not r.oom]
    pool = usable if fit_runs is None else [r for r in fit_runs if not r.oom]
    out: dict[str, list[tuple]] = {}
    for group in sorted({r.group for r in usable}):
        held = [r for r in usable if r.group == group]
        refit: dict[str, dict] = {}
        for gen in sorted({generation(r.cluster.name) for r in held}):
            rest = [r for r in pool if r.group != group and generation(r.cluster.name) == gen]
            cluster = next(r.cluster for r in held if generation(r.cluster.name) == gen)
            refit[gen] = _refit(rest, prior_of(cluster))
            if fp8_runs is not None:
                others = [r for r in fp8_runs if not r.oom and r.group != group and generation(r.cluster.name) == gen]
                refit[gen] = {**refit[gen], **_refit(others, prior_of(cluster, FP8_GRID), FP8_GRID, refit[gen])}
        for r in held:
            p = evaluate(r.model, _with(r.cluster, refit[generation(r.cluster.name)]), r.training, r.layout)
            out.setdefault(group, []).append((r, p.tokens_per_second / p.num_gpus / r.tokens_per_s_per_gpu - 1))
    return out


def kendall_tau(pairs: list[tuple[float, float]]) -> float | None:
    """Kendall's tau-a over the pairs whose measured values differ: (concordant - discordant) / pairs."""
    conc = disc = 0
    for i, (m1, p1) in enumerate(pairs):
        for m2, p2 in pairs[i + 1:]:
            if m1 == m2:
                continue
            s = (m1 - m2) * (p1 - p2)
            conc += s > 0
            disc += s < 0
    return (conc - disc) / (conc + disc) if conc + disc else None


def sweep_taus(errors: list[tuple]) -> list[tuple[str, int, float]]:
    """Ranking within each layout sweep: rows of one source group, model, GPU and sequence length
    (throughput per GPU, so GPU counts compare), three or more with distinct layouts. Returns
    (sweep, rows, Kendall tau of predicted against measured)."""
    sweeps: dict[tuple, list[tuple[float, float]]] = {}
    for r, e in errors:
        m = r.model
        key = (r.group, f"{m.num_layers}L h{m.hidden_size}", r.cluster.gpu.name, r.training.seq_length, r.training.fp8)
        sweeps.setdefault(key, []).append((r.tokens_per_s_per_gpu, r.tokens_per_s_per_gpu * (1 + e)))
    out = []
    for key, pairs in sorted(sweeps.items(), key=lambda kv: str(kv[0])):
        tau = kendall_tau(pairs) if len(pairs) >= 3 else None
        if tau is not None:
            out.append((f"{key[0]} {key[1]} {key[2]} s{key[3]}", len(pairs), tau))
    return out


def print_taus(title: str, errors: list[tuple]) -> None:
    taus = sweep_taus(errors)
    if not taus:
        return
    print(f"\n{title:60s} {'rows':>5s} {'tau':>6s}")
    for name, n, tau in taus:
        print(f"{name[:60]:60s} {n:5d} {tau:+6.2f}")
    weights = [n * (n - 1) / 2 for _, n, _ in taus]
    mean = sum(w * t for w, (_, _, t) in zip(weights, taus)) / sum(weights)
    print(f"{'pair-weighted mean':60s} {sum(n for _, n, _ in taus):5d} {mean:+6.2f}; "
          f"median {statistics.median(t for _, _, t in taus):+.2f} over {len(taus)} sweeps")


def print_held_out_rows(logo: dict[str, list[tuple]], most: int = 30) -> None:
    """The `most` rows worst predicted with their source group held out (leave_one_group_out): the held-out tail."""
    rows = sorted((x for v in logo.values() for x in v), key=lambda x: -abs(x[1]))
    print(f"\nleave one source group out, the {min(most, len(rows))} worst rows")
    for r, err in rows[:most]:
        print(f"{r.id:60s} {err:+7.1%}")


def print_table(title: str, groups: dict[str, list[float]]) -> None:
    """Per group: rows, median and max |error|, median signed error (bias; + predicts too fast); then all
    rows and the median of the group medians (every group weighted alike)."""
    print(f"\n{title:34s} {'rows':>5s} {'median |err|':>13s} {'max |err|':>10s} {'bias':>7s}")
    meds, all_errs, signed = [], [], []
    for g, errs in sorted(groups.items()):
        a = [abs(e) for e in errs]
        meds.append(statistics.median(a))
        all_errs += a
        signed += errs
        print(f"{g:34s} {len(errs):5d} {statistics.median(a):13.1%} {max(a):10.1%} {statistics.median(errs):+7.1%}")
    print(f"{'all rows':34s} {len(all_errs):5d} {statistics.median(all_errs):13.1%} {max(all_errs):10.1%} "
          f"{statistics.median(signed):+7.1%}")
    print(f"{'median of group medians':34s} {'':5s} {statistics.median(meds):13.1%}")


PRESSURE_BINS = (0.0, 0.8, 0.9, 0.95, float("inf"))
"""Edges of the predicted peak / GPU capacity bins memory_pressure groups the rows into."""


def memory_pressure(results) -> list[tuple[float, float, list[tuple[object, float, float]]]]:
    """The evaluated rows (not out-of-memory ones) by how close their predicted peak comes to the GPU's capacity:
    per PRESSURE_BINS bin (lo, hi, [(run, predicted peak / capacity, predicted / measured throughput - 1)])."""
    bins = [(lo, hi, []) for lo, hi in zip(PRESSURE_BINS, PRESSURE_BINS[1:])]
    for r, plan, _ in results:
        if plan is None or r.oom:
            continue
        share = plan.peak_memory_bytes / plan.memory.capacity
        err = plan.tokens_per_second / plan.num_gpus / r.tokens_per_s_per_gpu - 1
        next(rows for lo, hi, rows in bins if lo <= share < hi).append((r, share, err))
    return bins


def print_memory_pressure(title: str, results) -> None:
    """memory_pressure's bins: rows, median signed error and range; the rows of the last bin by name."""
    bins = memory_pressure(results)
    print(f"\n{title:40s} {'rows':>5s} {'median err':>11s} {'range':>17s}")
    for lo, hi, rows in bins:
        if rows:
            errs = [e for _, _, e in rows]
            top = "+" if hi == float("inf") else f"-{hi:.2f}"
            print(f"{'predicted peak / capacity ' + f'{lo:.2f}' + top:40s} {len(rows):5d} {statistics.median(errs):+11.1%} "
                  f"{min(errs):+8.1%} {max(errs):+8.1%}")
    for r, share, err in sorted(bins[-1][2], key=lambda x: x[1]):
        print(f"  {r.id:60s} {share:6.1%} {err:+7.1%}")


def print_memory(title: str, mem: dict[str, list[float]]) -> None:
    """Per group: rows that publish a peak, the ledger's median and largest signed error against them."""
    if not mem:
        return
    print(f"\n{title:34s} {'rows':>5s} {'median err':>13s} {'max |err|':>10s} {'worst under':>12s}")
    for g, errs in sorted(mem.items()):
        print(f"{g:34s} {len(errs):5d} {statistics.median(errs):+13.1%} {max(abs(e) for e in errs):10.1%} {min(errs):+12.1%}")


def print_table_p90(title: str, results) -> None:
    """print_errors_p90 of the evaluated rows."""
    print_errors_p90(title, summarise(results)[0])


def print_errors_p90(title: str, groups: dict[str, list[float]]) -> None:
    """print_table, then the p90 of |error| over every row."""
    print_table(title, groups)
    every = sorted(abs(e) for v in groups.values() for e in v)
    print(f"{'p90 |error|':34s} {'':5s} {every[int(0.9 * (len(every) - 1))]:13.1%}")


def explain_rows(text: str) -> int:
    """Every row (dense, FP8, MoE) whose id contains `text`: measured against predicted throughput, the
    step-time terms, one layer's forward and backward, the last rank's output layer and loss, and the
    peak stage's memory items -- what to look at when a row is off."""
    from planner.cost import _layer_time, output_time  # noqa: PLC0415 (a diagnostic reads the private layer term)
    from planner.specs import HYBRID_SYMBOLS  # noqa: PLC0415
    rows = [r for r in load_runs() + load_runs(low_precision=True) + load_moe_runs()[0] if text in r.id]
    if not rows:
        print(f"no row id contains {text!r}")
        return 1
    for r in rows:
        try:
            p = evaluate(r.model, r.cluster, r.training, r.layout)
        except PlannerError as err:
            print(f"{r.id}: REJECTED: {err}")
            continue
        pred, meas = p.tokens_per_second / p.num_gpus, r.tokens_per_s_per_gpu
        measured = (f"measured {meas:,.0f} tokens/s/GPU, predicted {pred:,.0f} ({pred / meas - 1:+.1%})" if meas
                    else f"no throughput published (an out-of-memory run), predicted {pred:,.0f} tokens/s/GPU")
        print(f"{r.id}  {r.layout.short()}\n  {measured}; step {p.step_time_s:.3f} s")
        print("  terms: " + ", ".join(f"{k} {v:.3f} s" for k, v in p.time.breakdown().items() if v))
        out = output_time(r.model, r.cluster, r.training, r.layout)
        for symbol in sorted(set(r.model.layer_pattern)) if r.model.hybrid else (None,):
            lt = _layer_time(r.model, r.cluster, r.training, r.layout, symbol=symbol)
            kind = f"one {HYBRID_SYMBOLS[symbol]} layer" if symbol else "one layer"
            print(f"  {kind}, one micro-batch: forward {lt.fwd * 1e3:.2f} ms (attention {lt.attn_fwd * 1e3:.2f}, MoE block "
                  f"{lt.mlp_fwd * 1e3:.2f}), backward {lt.bwd * 1e3:.2f} ms")
        print(f"  last rank's output layer {out.gemm * 1e3:.2f} ms, loss {out.loss * 1e3:.2f} ms")
        stage = max(p.memory.stages, key=lambda st: st.total)
        print(f"  peak {p.peak_memory_bytes / 2**30:.1f} GiB" + (f" (published {r.peak_mem_bytes / 2**30:.1f})" if r.peak_mem_bytes else "")
              + ": " + ", ".join(f"{it.name} {it.bytes / 2**30:.1f}" for it in stage.items if it.bytes))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", action="store_true", help="print every row (and the rows worst predicted held out)")
    ap.add_argument("--no-logo", action="store_true", help="skip the leave-one-group-out refits")
    ap.add_argument("--moe", action="store_true", help="only the MoE rows")
    ap.add_argument("--row", metavar="TEXT", help="the rows whose id contains TEXT, term by term")
    args = ap.parse_args(argv)
    if args.row:
        return explain_rows(args.row)
    if args.moe:
        moe(args.rows)
        print_known_misses()
        return 0
    runs = load_runs()
    results = evaluate_runs(runs)
    if args.rows:
        print(f"{'id':44s} {'layout':52s} {'meas tok/s/gpu':>14s} {'pred':>9s} {'err':>7s}")
        for r, plan, err in results:
            if plan is None:
                print(f"{r.id:44s} REJECTED: {err}")
                continue
            if r.oom:
                print(f"{r.id:44s} {r.layout.short():52s} {'OOM':>14s} {'fits' if plan.fits else 'no fit':>9s}")
                continue
            pred = plan.tokens_per_second / plan.num_gpus
            print(f"{r.id:44s} {r.layout.short():52s} {r.tokens_per_s_per_gpu:14.0f} {pred:9.0f} {pred / r.tokens_per_s_per_gpu - 1:+7.1%}")
    groups, mem = summarise(results)
    print_errors_p90("in sample (catalog calibration)", groups)
    in_sample = [(r, p.tokens_per_second / p.num_gpus / r.tokens_per_s_per_gpu - 1)
                 for r, p, _ in results if p is not None and not r.oom]
    print_taus("ranking within sweeps, in sample (Kendall tau)", in_sample)
    if not args.no_logo:
        logo = leave_one_group_out(runs)
        print_errors_p90("leave one source group out", {g: [e for _, e in v] for g, v in logo.items()})
        print_taus("ranking within sweeps, leave group out", [x for v in logo.values() for x in v])
        if args.rows:
            print_held_out_rows(logo)
    print_memory("peak memory (where published)", mem)
    print_memory_pressure("step time by memory pressure, in sample", results)
    ooms = [(r, p) for r, p, _ in results if r.oom and p is not None]
    if ooms:
        agree = sum(not p.fits for _, p in ooms)
        print(f"\npublished out-of-memory runs the ledger also rejects: {agree}/{len(ooms)}")
    rejected = [r for r, p, _ in results if p is None]
    print(f"\nrows evaluated: {len(results) - len(rejected)}, rejected by the layout rules: {len(rejected)}")
    low_precision(args.rows, not args.no_logo)
    moe(args.rows)
    print_known_misses()
    return 0


def print_known_misses() -> None:
    """The models whose own published runs fall outside their workload's interval (planner.uncertainty.MODELS,
    written by benchmarks/intervals.py): their plans carry those runs' error and a warning."""
    from planner.uncertainty import MODELS  # noqa: PLC0415
    print(f"\nknown misses: intervals built from the model's own runs, and a warning ({len(MODELS)})")
    for (workload, _, _, _), err in MODELS.items():
        print(f"  {workload:14s} {err.basis}")


MOE_FIT_GROUP = "megatron_bridge_perf_summary_moe"
"""The source group calibration.mxfp8_gemm_in_training is fitted on (Blackwell: the Megatron-Bridge 25.11
DeepSeek-V3 GB300 BF16 / MXFP8 pair); its prior (None: the per-tensor share) prices that group held out."""
GROUPED_GEMM_CALL_MEASURED = 0.267e-3 / 8
"""Seconds of host per expert GEMM measured outside any training run: Transformer Engine's multi-stream
cuBLASLt grouped GEMM on SM100 (the path nvte_multi_tensor_gemm takes), 8 experts of 128 tokens at
N = K = 2048 with operands pre-quantised, 0.267 ms a call of 8 GEMMs whose kernels take ~1 us each
[NVIDIA/TransformerEngine PR #3134, 'Single-launch CUTLASS grouped GEMM for per-tensor NVFP4', table
'TN (fprop)', row '8e x 128 ... pure', column multi-stream]: 33 us. A lower bound on the fitted value:
a training step's grouped linear also splits, quantises and allocates per expert on the host."""

MOE_GRID = {"grouped_gemm_call": [30e-6, 35e-6, 40e-6, 45e-6, 50e-6, 60e-6],
            "moe_host_stall": [0.0, 0.5e-3, 1e-3, 1.25e-3, 1.5e-3, 1.75e-3, 2e-3, 2.5e-3, 3e-3, 4e-3]}
"""The host's two costs fitted on the MoE rows of every source group, one value each for every GPU: the floor
under each expert GEMM of a grouped linear (calibration.grouped_gemm_call) and the GPU's idle time at every
MoE layer forward's host sync (calibration.moe_host_stall)."""

MOE_PRIORS = {"grouped_gemm_call": GROUPED_GEMM_CALL_MEASURED, "moe_host_stall": 0.0}
"""What MOE_GRID's parameters are where rows cannot tell them apart (a fit's ties go here): the host's floor at
its microbenchmark (GROUPED_GEMM_CALL_MEASURED), no stall."""

def moe_fit(rows, base: dict | None = None) -> dict:
    """MOE_GRID's point with the lowest mean of the source groups' median |error| on `rows` (every group weighted
    alike, as benchmarks/calibrate.py weighs the dense ones), `base` held; ties go to the point nearer MOE_PRIORS."""
    base = base or {}
    grid = {k: sorted(set(v) | {MOE_PRIORS[k]}) for k, v in MOE_GRID.items()}
    best = None
    for values in itertools.product(*grid.values()):
        upd = dict(zip(grid, values))
        groups: dict[str, list[float]] = {}
        for r in rows:
            groups.setdefault(r.group, []).append(row_error(r, {**base, **upd}))
        score = statistics.mean(statistics.median(v) for v in groups.values())
        key = (round(score, 6), sum(upd[k] != MOE_PRIORS[k] for k in upd))
        if best is None or key < best[0]:
            best = (key, upd)
    return best[1]


def _moe_point(p: dict) -> str:
    return f"{p['grouped_gemm_call'] * 1e6:.1f} us an expert GEMM, {p['moe_host_stall'] * 1e3:.2f} ms a stall"


def moe_held_out(runs):
    """The MoE runs each priced out of its source group: MOE_GRID's parameters refitted on the other groups'
    rows (moe_fit), and in MOE_FIT_GROUP the MXFP8 share at its prior (None), so no group informs its own."""
    usable = [r for r in runs if r.tokens_per_s_per_gpu]
    refit = {}
    for g in sorted({r.group for r in runs}):
        base = {"mxfp8_gemm_in_training": None} if g == MOE_FIT_GROUP else {}
        refit[g] = {**base, **moe_fit([r for r in usable if r.group != g], base)}
    return [replace(r, cluster=_with(r.cluster, refit[r.group])) for r in runs]


def moe(rows: bool = False) -> None:
    """MoE rows (benchmarks/data/moe_runs.yaml): three parameters are fitted on them (Blackwell's MXFP8 share on
    Megatron-Bridge's rows; the host's cost per expert GEMM and its stall at every MoE forward's sync on every
    group's), so the table is printed twice: as shipped, and each group priced with them refitted without it
    (moe_held_out), out of sample; the rows the planner cannot price are counted by reason."""
    runs, skipped = load_moe_runs()
    results = evaluate_runs(runs)
    held = evaluate_runs(moe_held_out(runs))
    if rows:
        for r, plan, err in results:
            if plan is None:
                print(f"{r.id:56s} REJECTED: {err}")
            else:
                pred = plan.tokens_per_second / plan.num_gpus
                share = plan.time.breakdown()["ep_comm"] / plan.step_time_s
                print(f"{r.id:56s} {str(r.training.fp8):10s} {r.layout.short()[:50]:50s} {r.tokens_per_s_per_gpu:7.0f} "
                      f"{pred:7.0f} {pred / r.tokens_per_s_per_gpu - 1:+7.1%}  all-to-all {share:.0%}")
    print_table_p90("MoE rows (3 parameters fitted)", results)
    fitted = moe_fit([r for r in runs if r.tokens_per_s_per_gpu])
    print(f"the host's costs fitted on every group: {_moe_point(fitted)} (the catalog: "
          f"{_moe_point({k: getattr(runs[0].cluster.calibration, k) for k in MOE_GRID})})")
    for r in {r.group: r for r, _, _ in held}.values():
        print(f"  {r.group} held out: {_moe_point({k: getattr(r.cluster.calibration, k) for k in MOE_GRID})}")
    print_table_p90("MoE rows, each group held out", held)
    rejected = sum(p is None for _, p, _ in results)
    reasons: dict[str, int] = {}
    for _, why in skipped:
        reasons[why.split(" (")[0]] = reasons.get(why.split(" (")[0], 0) + 1
    unfit = sum(p is not None and not p.fits for _, p, _ in results)
    print(f"MoE rows evaluated: {len(results) - rejected}; refused by evaluate: {rejected}; predicted not to fit: {unfit}; "
          "not expressible: "
          + ", ".join(f"{n} {w}" for w, n in sorted(reasons.items(), key=lambda x: -x[1])))
    print_speedups("MoE FP8 speedup over BF16 (same layout)", moe_speedup_pairs(results))


def same_layout_pairs(runs) -> list[tuple[object, object]]:
    """(BF16 run, FP8 run) of each MoE row whose source publishes the same layout in BF16 too: ids equal but for
    their last word (the precision), layouts equal, one row BF16."""
    by_stem: dict[str, list] = {}
    for r in runs:
        by_stem.setdefault(r.id.rsplit("_", 1)[0], []).append(r)
    return [(rb, rf) for rows in by_stem.values() for rf in rows for rb in rows
            if rf.training.fp8 is not None and rb.training.fp8 is None and rf.layout == rb.layout]


def moe_speedup_pairs(results) -> list[tuple[str, float, float]]:
    """(FP8 row, measured, predicted FP8-over-BF16 throughput ratio) for each same_layout_pairs pair."""
    plans = {r.id: plan for r, plan, _ in results if plan is not None}
    return [(rf.id, rf.tokens_per_s_per_gpu / rb.tokens_per_s_per_gpu, plans[rb.id].step_time_s / plans[rf.id].step_time_s)
            for rb, rf in same_layout_pairs(r for r, plan, _ in results if plan is not None)]


def print_speedups(title: str, pairs: list[tuple[str, float, float]]) -> None:
    """The FP8-over-BF16 speedups, measured and predicted, and the difference in points."""
    print(f"\n{title:56s} {'measured':>9s} {'predicted':>9s} {'points':>7s}")
    for name, meas, pred in pairs:
        print(f"{name:56s} {meas:9.2f} {pred:9.2f} {100 * (pred - meas):+7.0f}")


SPEEDUP_PAIRS = [  # (BF16 row, FP8 row) of the same layout and stack
    ("torchtitan_8b_8gpu_FSDP_torchcompile", "torchtitan_8b_8gpu_FSDP_torchcompile_Float8"),
    ("torchtitan_8b_128gpu_FSDP_torchcompile", "torchtitan_8b_128gpu_FSDP_torchcompile_Float8"),
    ("torchtitan_h100_405b_128gpu_bf16", "torchtitan_h100_405b_128gpu_float8"),
]


def low_precision(rows: bool = False, logo: bool = True) -> None:
    """FP8 rows: in sample (the catalog's fp8_gemm_in_training is fitted on them, one number per GPU
    generation), leave one source group out (that number and the BF16 parameters refitted without
    the group), and the FP8-over-BF16 speedup where a source publishes both precisions of one layout."""
    runs = load_runs(low_precision=True)
    results = evaluate_runs(runs)
    if rows:
        for r, plan, err in results:
            if plan is None:
                print(f"{r.id:44s} REJECTED: {err}")
            elif not r.oom:
                pred = plan.tokens_per_second / plan.num_gpus
                print(f"{r.id:44s} {r.training.fp8:10s} {r.layout.short()[:52]:52s} {r.tokens_per_s_per_gpu:9.0f} "
                      f"{pred:9.0f} {pred / r.tokens_per_s_per_gpu - 1:+7.1%}")
    print_table_p90("FP8 rows, in sample (fp8_gemm_in_training fitted on them)", results)
    unfit = sum(p is not None and not p.fits and not r.oom for r, p, _ in results)
    print(f"FP8 rows evaluated: {len(results)}; refused by evaluate: {sum(p is None for _, p, _ in results)}; "
          f"predicted not to fit: {unfit}")
    print_memory("FP8 peak memory (where published)", summarise(results)[1])
    if logo:
        held = leave_one_group_out(runs, load_runs(), runs)
        print_errors_p90("FP8 rows, leave one source group out", {g: [e for _, e in v] for g, v in held.items()})
    hi = {r.id: r for r in load_runs()}
    lo = {r.id: r for r in runs}
    pairs = [speedup(hi[b], lo[f]) for b, f in SPEEDUP_PAIRS if b in hi and f in lo]
    print_speedups("FP8 speedup over BF16", [(rf.id, m, p) for _, rf, m, p in pairs])
    print_speedups("FP8 speedup over BF16, published as ratios only", [(rf.id, m, p) for _, rf, m, p in ratio_pairs()])
    print_memory("peak memory of those pairs (published)", ratio_pair_memory())
    print_speedups_absolute("throughput of those pairs on the catalog's own parts", ratio_pair_throughput())


def speedup(rb, rf, plans: tuple | None = None) -> tuple[object, object, float, float]:
    """(BF16 run, FP8 run, measured, predicted FP8-over-BF16 throughput ratio) at the catalog's prices (the two
    runs' plans where already evaluated)."""
    pb, pf = plans or tuple(evaluate(r.model, r.cluster, r.training, r.layout) for r in (rb, rf))
    return rb, rf, rf.tokens_per_s_per_gpu / rb.tokens_per_s_per_gpu, pb.step_time_s / pf.step_time_s


@cache
def _ratio_pair_plans() -> tuple[tuple[object, object, object, object], ...]:
    """(BF16 run, FP8 run, their plans at the catalog's prices) of each pair runs.load_ratio_pairs builds: read and
    evaluated once for the speedups, peaks and throughputs below."""
    return tuple((rb, rf, *(evaluate(r.model, r.cluster, r.training, r.layout) for r in (rb, rf)))
                 for rb, rf in load_ratio_pairs())


def ratio_pair_throughput() -> list[tuple[str, float, float]]:
    """(run, measured, predicted tokens/s/GPU) of the ratio-only pairs' runs on the catalog's own parts
    (runs.Run.catalog_part): out of sample, nothing fitted on them."""
    return [(r.id, r.tokens_per_s_per_gpu, p.tokens_per_second / p.num_gpus)
            for rb, rf, pb, pf in _ratio_pair_plans() for r, p in ((rb, pb), (rf, pf)) if r.catalog_part]


def print_speedups_absolute(title: str, rows: list[tuple[str, float, float]]) -> None:
    """Measured against predicted throughput, and the signed error."""
    if not rows:
        return
    print(f"\n{title:56s} {'measured':>9s} {'predicted':>9s} {'error':>7s}")
    for name, meas, pred in rows:
        print(f"{name:56s} {meas:9.0f} {pred:9.0f} {pred / meas - 1:+7.1%}")


def ratio_pair_memory() -> dict[str, list[float]]:
    """The ledger's signed error against the peaks the ratio-only pairs publish (runs.load_ratio_pairs), per
    source group, each run once (a BF16 run shared by two pairs counts once): out of sample, and a power limit
    does not move memory."""
    seen, out = set(), {}
    for rb, rf, pb, pf in _ratio_pair_plans():
        for r, plan in ((rb, pb), (rf, pf)):
            if r.peak_mem_bytes and (r.group, r.training, r.layout) not in seen:
                seen.add((r.group, r.training, r.layout))
                out.setdefault(r.group, []).append(plan.peak_memory_bytes / r.peak_mem_bytes - 1)
    return out


def ratio_pairs() -> list[tuple[object, object, float, float]]:
    """speedup of each pair published on parts the catalog does not price (runs.load_ratio_pairs): nothing is
    fitted on them, so the catalog's prediction is out of sample."""
    return [speedup(rb, rf, (pb, pf)) for rb, rf, pb, pf in _ratio_pair_plans()]


if __name__ == "__main__":
    sys.exit(main())
