"""Capacity planning: plan a grid of models x clusters x GPU counts x sequence lengths in parallel
worker processes; rows for a CSV, the minimum GPUs that fit, and a time-to-train plot."""

from __future__ import annotations

import csv
import io
import itertools
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, Callable

from planner import cpsat
from planner.outputs import write_file

__all__ = ["grid", "run_point", "run_sweep", "min_gpus_that_fit", "write_csv", "plot_sweep", "FIELDS", "CSV_MARKER",
           "PNG_MARKER"]

FIELDS = ["model", "cluster", "nodes", "gpus", "seq_length", "global_batch_size", "status", "layout", "step_s",
          "tokens_per_s", "mfu", "peak_gib", "days_to_train", "gpu_hours"]


def grid(models: list[str], clusters: list[str], nodes: list[int], seq_lengths: list[int], global_batch_size: int,
         tokens: float | None, framework: str | None, time_limit_s: float) -> list[dict[str, Any]]:
    """Every point of the grid, as keyword arguments of run_point (deterministic order)."""
    return [dict(model=m, cluster=c, nodes=n, seq_length=s, global_batch_size=global_batch_size, tokens=tokens,
                 framework=framework, time_limit_s=time_limit_s)
            for m, c, s, n in itertools.product(models, clusters, seq_lengths, sorted(nodes))]


def run_point(model: str, cluster: str, nodes: int, seq_length: int, global_batch_size: int, tokens: float | None,
              framework: str | None, time_limit_s: float) -> dict[str, Any]:
    """Plan one grid point; a row of the sweep (status 'infeasible' or 'error: ...' when nothing is planned)."""
    from planner.catalog import load_cluster, load_model
    from planner.errors import PlannerError
    from planner.search import plan
    from planner.specs import TrainingSpec

    row: dict[str, Any] = dict(model=model, cluster=cluster, nodes=nodes, seq_length=seq_length,
                               global_batch_size=global_batch_size)
    try:
        c = load_cluster(cluster, nodes=nodes)
        row["gpus"] = c.world_size
        r = plan(load_model(model), c, TrainingSpec(global_batch_size=global_batch_size, seq_length=seq_length,
                                                    token_budget=tokens),
                 top_k=1, structural=False, framework=framework, time_limit_s=time_limit_s)
    except PlannerError as e:
        return row | {"status": f"error: {e}"}
    row["status"] = r.status
    if r.best is not None:
        b = r.best
        row |= {"layout": b.layout.short(), "step_s": b.step_time_s, "tokens_per_s": b.tokens_per_second, "mfu": b.mfu,
                "peak_gib": b.peak_memory_bytes / 2**30}
        if tokens:
            row |= {"days_to_train": b.time_to_train_s() / 86400, "gpu_hours": b.time_to_train_s() * b.num_gpus / 3600}
    return row


def _price_in_process() -> None:
    """A sweep worker prices its plans' rows itself: the sweep's workers already share the CPUs."""
    cpsat.PRICING_WORKERS = 1


def run_sweep(points: list[dict[str, Any]], workers: int = 2, progress: Callable[[dict], None] | None = None) -> list[dict]:
    """Run every point in `workers` processes; rows come back in grid order."""
    rows: list[dict | None] = [None] * len(points)
    if workers <= 1:
        for i, p in enumerate(points):
            rows[i] = run_point(**p)
            if progress:
                progress(rows[i])
        return rows  # type: ignore[return-value]
    with ProcessPoolExecutor(max_workers=workers, initializer=_price_in_process) as pool:
        futures = {pool.submit(run_point, **p): i for i, p in enumerate(points)}
        for fut in as_completed(futures):
            rows[futures[fut]] = fut.result()
            if progress:
                progress(rows[futures[fut]])
    return rows  # type: ignore[return-value]


def min_gpus_that_fit(rows: list[dict]) -> dict[tuple[str, str, int], int | None]:
    """(model, cluster, seq) -> the fewest GPUs of the grid on which a layout fits (None: none did)."""
    out: dict[tuple[str, str, int], int | None] = {}
    for r in rows:
        key = (r["model"], r["cluster"], r["seq_length"])
        fits = r["status"] in ("optimal", "feasible")
        cur = out.get(key)
        if fits and (cur is None or r["gpus"] < cur):
            out[key] = r["gpus"]
        else:
            out.setdefault(key, None)
    return out


CSV_MARKER = (",".join(FIELDS) + "\r\n").encode()
"""The header line every sweep CSV starts with (planner.outputs rewrites only files that hold it)."""
PNG_MARKER = b"Software\x00planner"
"""The PNG text chunk every sweep plot carries."""


def write_csv(rows: list[dict], path: str, *, force: bool = False) -> None:
    """The rows as CSV with FIELDS as columns (never over a file planner did not write, unless force)."""
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=FIELDS, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: r.get(k, "") for k in FIELDS})
    write_file(path, buf.getvalue().encode("utf-8"), CSV_MARKER, force=force)


def plot_sweep(rows: list[dict], path: str, *, force: bool = False) -> None:
    """Time to train (or step time) against GPUs, one line per model / cluster / sequence length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    metric = "days_to_train" if any(r.get("days_to_train") for r in rows) else "step_s"
    keys = sorted({(r["model"], r["cluster"], r["seq_length"]) for r in rows})
    for k in keys:
        pts = sorted((r["gpus"], r[metric]) for r in rows
                     if (r["model"], r["cluster"], r["seq_length"]) == k and r.get(metric))
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"{k[0]} on {k[1]}, seq {k[2]}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("days to train the token budget" if metric == "days_to_train" else "seconds per step")
    ax.legend(fontsize=7)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": "planner"})
    plt.close(fig)
    write_file(path, buf.getvalue(), PNG_MARKER, force=force)
