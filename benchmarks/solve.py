"""Search scaling: CP-SAT solve time against the exhaustive enumerator, 1B on 8 GPUs to 70B on 144,000.

    python benchmarks/solve.py [--enumerate-limit N]

For each case: status, the size of the candidate space, CP-SAT time for the best plan (top-1)
and for the top-10 ranking, and the enumerator's time (run when the space has at most
--enumerate-limit layouts, else extrapolated from its per-layout rate and marked '~').
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import planner
from planner.oracle import enumerate_plans
from planner.search import plan
from planner.specs import TrainingSpec

CASES = [
    # model, cluster, nodes, global batch, seq
    ("gpt3-1.3b", "dgx-h100", 1, 256, 2048),
    ("llama3-8b", "dgx-h100", 1, 128, 8192),
    ("llama2-7b", "dgx-a100-80g", 4, 512, 4096),
    ("mistral-7b", "mi300x", 2, 256, 8192),
    ("llama3-70b", "dgx-h100", 8, 128, 8192),
    ("llama3-70b", "gb200-nvl72", 18, 288, 8192),
    ("qwen2.5-72b", "hgx-h200", 16, 512, 8192),
    ("gpt3-175b", "dgx-a100-80g", 128, 1536, 2048),
    ("llama3.1-405b", "dgx-b200", 64, 1024, 8192),
    ("llama3.1-405b", "dgx-h100", 2048, 2048, 8192),
    ("llama3.1-405b", "dgx-h100", 2048, 128, 131072),
    ("megatron-gpt-1t", "dgx-h100", 4096, 4096, 2048),
    # scale: 131,072 and 144,000 GPUs (linear-time topology; the time limit bounds the whole call)
    ("llama3-8b", "dgx-h100", 16384, 16384, 8192),
    ("llama3-70b", "gb200-nvl72", 36000, 9000, 8192),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--enumerate-limit", type=int, default=40000, help="largest space the enumerator runs on")
    args = ap.parse_args(argv)
    print(f"{'case':44s} {'GPUs':>6s} {'status':>8s} {'space':>8s} {'top-1 s':>8s} {'top-10 s':>9s} {'enum s':>9s}  best layout")
    top1, top10 = [], []
    rate = None
    for mref, cref, nodes, gbs, seq in CASES:
        model, cluster = planner.load_model(mref), planner.load_cluster(cref, nodes=nodes)
        tr = TrainingSpec(global_batch_size=gbs, seq_length=seq)
        t0 = time.perf_counter()
        r = plan(model, cluster, tr, top_k=1, structural=False)
        t1 = time.perf_counter() - t0
        t0 = time.perf_counter()
        r10 = plan(model, cluster, tr, top_k=10, structural=False)
        t10 = time.perf_counter() - t0
        top1.append(t1)
        top10.append(t10)
        if r.space_size <= args.enumerate_limit:
            t0 = time.perf_counter()
            ranked = enumerate_plans(model, cluster, tr)
            te = time.perf_counter() - t0
            rate = te / max(1, r.space_size)
            agree = "" if not ranked or ranked[0].time.objective_us == r.best.time.objective_us else " MISMATCH"
            enum = f"{te:9.2f}{agree}"
        else:
            enum = f"~{r.space_size * rate:8.0f}" if rate else "        -"
        best = r.best.layout.short() if r.best else "-"
        name = f"{mref} s{seq} gbs{gbs} on {cref}"
        print(f"{name:44s} {cluster.world_size:6d} {r.status:>8s} {r.space_size:8d} {t1:8.2f} {t10:9.2f} {enum}  {best}")
        assert len(r10.alternatives) + 1 <= 10
    print(f"\nCP-SAT top-1: median {statistics.median(top1):.2f} s, max {max(top1):.2f} s; "
          f"top-10: median {statistics.median(top10):.2f} s, max {max(top10):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
