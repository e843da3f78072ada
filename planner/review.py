"""A self-contained HTML review page: the alternatives, per-GPU memory by ledger item, step-time
terms, and the Pareto front of peak memory against step time (matplotlib figures, embedded)."""

from __future__ import annotations

import base64
import html
import io
from typing import Any

from planner.plans import Plan
from planner.report import GiB, plan_row, workload_tags
from planner.search import PlanResult, plan
from planner.units import count_text

__all__ = ["pareto_front", "review_html", "REPORT_MARKER"]

REPORT_MARKER = b'<meta name="generator" content="planner">'
"""Every review page carries it; planner.outputs rewrites only pages that do."""
_META = REPORT_MARKER.decode()

PARETO_FRACTIONS = (1.0, 0.85, 0.7, 0.55, 0.4, 0.3)


def pareto_front(model, cluster, training, *, framework: str | None = "megatron", time_limit_s: float = 10.0,
                 fractions=PARETO_FRACTIONS, **constraints: Any) -> list[Plan]:
    """The fastest plan under each of several memory budgets (fractions of GPU memory), keeping the
    non-dominated ones: a memory-vs-time Pareto front found by re-solving with a tighter capacity."""
    found: list[Plan] = []
    for f in fractions:
        gpu = cluster.gpu.model_copy(update={"memory": cluster.gpu.memory * f})
        r = plan(model, cluster.model_copy(update={"gpu": gpu}), training, top_k=1, structural=False,
                 framework=framework, time_limit_s=time_limit_s, **constraints)
        if r.best is not None:
            found.append(r.best)
    front: list[Plan] = []
    for p in sorted(found, key=lambda p: (p.step_time_s, p.peak_memory_bytes)):
        if not front or p.peak_memory_bytes < front[-1].peak_memory_bytes:
            front.append(p)
    return front


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def _figures(plans: list[Plan], labels: list[str], front: list[Plan]) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figs = {}
    items = []
    for p in plans:
        for i in p.memory.peak_stage.items:
            if i.name not in items:
                items.append(i.name)
    fig, ax = plt.subplots(figsize=(8, 3.2 + 0.25 * len(plans)))
    left = [0.0] * len(plans)
    for name in items:
        vals = [p.memory.peak_stage.get(name) / GiB for p in plans]
        ax.barh(labels, vals, left=left, label=name)
        left = [a + b for a, b in zip(left, vals)]
    ax.axvline(plans[0].memory.capacity / GiB, color="k", linestyle="--", linewidth=1, label="GPU memory")
    ax.invert_yaxis()
    ax.set_xlabel("GiB per GPU (peak stage)")
    ax.legend(fontsize=7, ncol=4, loc="lower center", bbox_to_anchor=(0.5, 1.0))
    figs["memory"] = _png(fig)
    plt.close(fig)

    terms = list(plans[0].time.breakdown())
    fig, ax = plt.subplots(figsize=(8, 3.2 + 0.25 * len(plans)))
    left = [0.0] * len(plans)
    for name in terms:
        vals = [p.time.breakdown()[name] for p in plans]
        if max(vals) <= 0:
            continue
        ax.barh(labels, vals, left=left, label=name)
        left = [a + b for a, b in zip(left, vals)]
    ax.invert_yaxis()
    ax.set_xlabel("seconds per step")
    ax.legend(fontsize=7, ncol=4, loc="lower center", bbox_to_anchor=(0.5, 1.0))
    figs["time"] = _png(fig)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.scatter([p.peak_memory_bytes / GiB for p in plans], [p.step_time_s for p in plans], label="ranked layouts", alpha=0.6)
    if front:
        ax.plot([p.peak_memory_bytes / GiB for p in front], [p.step_time_s for p in front], "o-", color="C3",
                label="Pareto front (fastest under each memory budget)")
        for p in front:
            ax.annotate(p.layout.short().replace(" rc=", "\nrc="), (p.peak_memory_bytes / GiB, p.step_time_s), fontsize=6)
    ax.set_xlabel("peak GiB per GPU")
    ax.set_ylabel("seconds per step")
    ax.legend(fontsize=8)
    figs["pareto"] = _png(fig)
    plt.close(fig)
    return figs


def review_html(result: PlanResult, front: list[Plan]) -> str:
    """The review page for a PlanResult (best + alternatives + structural options) and a Pareto front."""
    if result.best is None:
        msg = html.escape(result.infeasibility.message if result.infeasibility else "nothing fits")
        return f"<!doctype html><html><head><meta charset='utf-8'>{_META}<title>planner: infeasible</title></head><body>" \
               f"<h1>Nothing fits</h1><p id='infeasible'>{msg}</p></body></html>\n"
    best = result.best
    plans = [best, *result.alternatives] + [a.plan for a in result.structural if a.plan is not None and a.plan is not best]
    labels = [f"#{i}" for i in range(1, 1 + 1 + len(result.alternatives))] + \
             [a.label.replace("best ", "") for a in result.structural if a.plan is not None and a.plan is not best]
    figs = _figures(plans, labels, front)
    m, c, t = best.model, best.cluster, best.training
    rows = []
    for lab, p, tags in zip(labels, plans, workload_tags(plans)):
        r = plan_row(p, best)
        layout = r["layout"] + (f" [{tags}]" if tags else "")  # a choice search's rows name their workload
        rows.append(f"<tr><td>{html.escape(lab)}</td><td><code>{html.escape(layout)}</code></td>"
                    f"<td>{r['peak_gib']:.1f} / {r['capacity_gib']:.1f}</td><td>{r['oom_risk']:.1%}</td>"
                    f"<td>{r['step_s']:.3f}</td><td>{r['step_s_80'][0]:.4g}-{r['step_s_80'][1]:.4g}</td>"
                    f"<td>{r['delta']:+.1%}{' tied' if r['tied'] else ''}</td><td>{r['mfu']:.1%}</td><td>{r['tokens_per_s']:,.0f}</td>"
                    f"<td>{html.escape(r['dominant'])} (stage {r['peak_stage']})</td></tr>")
    expl = "".join(f"<li>{html.escape(line)}</li>" for line in result.explanation)
    host = ""
    if t.optimizer_offload:  # what the plan pins outside the GPU (planner.memory.stage_host_bytes)
        host = (f" Optimizer offload {t.optimizer_offload:g}: up to {max(best.memory.host) / GiB:.1f} GiB per GPU of "
                f"offloaded optimizer states in host memory (of {best.memory.host_capacity / GiB:.1f} GiB).")
    status = {"optimal": "proven optimal",
              "feasible": f"feasible, not proven optimal (proven gap at most {(result.gap or 0):.1%})"}.get(
        result.status, "unknown: the time limit ended the search (nothing proven)")
    return f"""<!doctype html>
<html><head><meta charset="utf-8">{_META}<title>planner review: {html.escape(m.name)} on {c.world_size} x {html.escape(c.gpu.name)}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:3px 8px;font-size:13px}} th{{background:#eee}} img{{max-width:100%}}</style></head>
<body>
<h1>{html.escape(m.name)} on {c.world_size} x {html.escape(c.gpu.name)} ({html.escape(c.name)})</h1>
<p id="summary">global batch {t.global_batch_size} x {t.seq_length} tokens; {status}; {count_text(result.space_size)} layouts searched in
{result.solve_time_s:.2f} s{html.escape(" (" + "; ".join(result.bounds) + ")") if result.bounds else ""}. Best: <code>{html.escape(best.layout.short())}</code>, {best.step_time_s:.3f} s/step, MFU {best.mfu:.1%}.{host}</p>
<h2 id="alternatives">Alternatives</h2>
<table><tr><th></th><th>layout</th><th>peak / capacity GiB</th><th>OOM risk</th><th>step s</th><th>80 % interval</th><th>vs best</th><th>MFU</th><th>tokens/s</th><th>largest item</th></tr>
{''.join(rows)}</table>
<p id="trust">Intervals and OOM risk from {html.escape(best.error_model.basis)}; "tied": closer to the best than the model can
rank ({best.error_model.ranking_sigma:.1%} spread between two layouts on one stack) — measure both, or calibrate
(<code>planner calibrate</code>) and re-plan.</p>
<h2 id="memory">Memory per GPU by ledger item</h2>
<img alt="memory per GPU" src="data:image/png;base64,{figs['memory']}">
<h2 id="time">Step-time breakdown</h2>
<img alt="step time" src="data:image/png;base64,{figs['time']}">
<h2 id="pareto">Pareto front: peak memory against step time</h2>
<img alt="pareto front" src="data:image/png;base64,{figs['pareto']}">
<h2 id="why">Why</h2>
<ul>{expl}</ul>
</body></html>
"""
