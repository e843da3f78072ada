"""Cost-model fidelity: predicted vs measured throughput (and peak memory) on published runs.

    python benchmarks/fidelity.py [--rows]

Prints one line per source group (median and max |error|), the overall figures, and with --rows
every row. Rows whose layout the planner rejects are listed with the rule they break.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runs import load_runs  # noqa: E402

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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", action="store_true", help="print every row")
    args = ap.parse_args(argv)
    results = evaluate_runs(load_runs())
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
    print(f"\n{'source group':34s} {'rows':>5s} {'median |err|':>13s} {'max |err|':>10s} {'bias':>7s}")
    meds, all_errs = [], []
    for g, errs in sorted(groups.items()):
        a = [abs(e) for e in errs]
        meds.append(statistics.median(a))
        all_errs += a
        print(f"{g:34s} {len(errs):5d} {statistics.median(a):13.1%} {max(a):10.1%} {statistics.median(errs):+7.1%}")
    print(f"{'all rows':34s} {len(all_errs):5d} {statistics.median(all_errs):13.1%} {max(all_errs):10.1%}")
    print(f"{'median of group medians':34s} {'':5s} {statistics.median(meds):13.1%}")
    if mem:
        print(f"\n{'peak memory (where published)':34s} {'rows':>5s} {'median err':>13s} {'max |err|':>10s} {'worst under':>12s}")
        for g, errs in sorted(mem.items()):
            print(f"{g:34s} {len(errs):5d} {statistics.median(errs):+13.1%} {max(abs(e) for e in errs):10.1%} {min(errs):+12.1%}")
    ooms = [(r, p) for r, p, _ in results if r.oom and p is not None]
    if ooms:
        agree = sum(not p.fits for _, p in ooms)
        print(f"\npublished out-of-memory runs the ledger also rejects: {agree}/{len(ooms)}")
    rejected = [r for r, p, _ in results if p is None]
    print(f"\nrows evaluated: {len(results) - len(rejected)}, rejected by the layout rules: {len(rejected)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
