"""Plain-data views of plans and results for the CLI, JSON output and reports (no printing here)."""

from __future__ import annotations

from typing import Any

from planner.calibration import PARAMETERS
from planner.plans import Plan
from planner.memory import moe_static_memory
from planner.search import PlanResult
from planner.specs import ModelSpec
from planner.uncertainty import LEVELS

__all__ = ["plan_row", "workload_tags", "plan_dict", "result_dict", "ledger_rows", "term_deltas", "calibration_dict", "GiB"]

GiB = 2.0**30
DAY = 86400.0


def plan_row(p: Plan, best: Plan | None = None) -> dict[str, Any]:
    """One table row: layout, memory against capacity, step time, MFU, throughput, delta, time to train."""
    i80 = p.step_time_interval(0.8)
    row = {
        "layout": p.layout.short(),
        "peak_gib": p.peak_memory_bytes / GiB,
        "capacity_gib": p.memory.capacity / GiB,
        "peak_stage": p.memory.peak_stage.stage,
        "dominant": p.memory.peak_stage.dominant.name,
        "step_s": p.step_time_s,
        "mfu": p.mfu,
        "tokens_per_s": p.tokens_per_second,
        "delta": (p.step_time_s / best.step_time_s - 1) if best is not None else 0.0,
        "step_s_80": (i80.lo, i80.hi),
        "oom_risk": p.oom_risk,
        "tied": best is not None and p is not best and p.tied_with(best),
    }
    if p.training.token_budget:
        row["days_to_train"] = p.time_to_train_s() / DAY
        row["gpu_hours"] = p.time_to_train_s() * p.num_gpus / 3600
    return row


WORKLOAD_TAGS = {"fp8": "fp8", "optimizer_states": "states", "optimizer_offload": "offload"}
"""The TrainingSpec fields a workload-choice search varies (planner.choices), by their short tag."""


def workload_tags(plans) -> list[str]:
    """Per plan, the workload-choice fields in which the listed plans differ ('offload=1 fp8=delayed'),
    so that rows of one layout priced with two workloads can be told apart; '' where none differ."""
    varied = [f for f in WORKLOAD_TAGS if len({getattr(p.training, f) for p in plans}) > 1]

    def word(v) -> str:
        return "none" if v is None else f"{v:g}" if isinstance(v, float) else str(v)
    return [" ".join(f"{WORKLOAD_TAGS[f]}={word(getattr(p.training, f))}" for f in varied) for p in plans]


def plan_dict(p: Plan) -> dict[str, Any]:
    """Everything about a plan as JSON-ready data."""
    return {
        "model": p.model.name,
        "cluster": p.cluster.name,
        "num_gpus": p.num_gpus,
        "layout": p.layout.model_dump(mode="json"),
        "fits": p.fits,
        "peak_memory_bytes": p.peak_memory_bytes,
        "peak_stage": p.memory.peak_stage.stage,
        "memory_stages": [{"stage": s.stage, "layers": s.layers, "items": {i.name: i.bytes for i in s.items}}
                          for s in p.memory.stages],
        "fp8": p.training.fp8,  # the workload-choice fields (planner.choices): rows of a choice search differ in them
        "fp8_attention": p.training.fp8_attention,
        "optimizer_states": p.training.optimizer_states,
        "optimizer_offload": p.training.optimizer_offload,
        "host_memory_stages_bytes": list(p.memory.host),
        "host_memory_capacity_bytes": p.memory.host_capacity,
        "step_time_s": p.step_time_s,
        "step_time_interval_s": {f"{int(lv * 100)}": [i.lo, i.hi] for lv in LEVELS for i in [p.step_time_interval(lv)]},
        "peak_memory_interval_bytes": {f"{int(lv * 100)}": [i.lo, i.hi] for lv in LEVELS for i in [p.memory_interval(lv)]},
        "oom_risk": p.oom_risk,
        "error_basis": p.error_model.basis,
        "time_breakdown_s": p.time.breakdown(),
        "tokens_per_second": p.tokens_per_second,
        "mfu": p.mfu,
        "hfu": p.hfu,
        "time_to_train_s": p.time_to_train_s() if p.training.token_budget else None,
        "warnings": list(p.warnings),
    }


def term_deltas(yours: Plan, other: Plan) -> list[tuple[str, float, float]]:
    """Where two plans' step times differ: (term, your seconds, the other's seconds) for every
    step-time term that differs, largest difference first. The differences sum to the gap."""
    a, b = yours.time.breakdown(), other.time.breakdown()
    rows = [(k, a[k], b[k]) for k in a if abs(a[k] - b[k]) > 1e-9]
    return sorted(rows, key=lambda r: -abs(r[1] - r[2]))


def result_dict(r: PlanResult, *, timing: bool = True) -> dict[str, Any]:
    """A PlanResult as JSON-ready data. Wall-clock figures sit under "timing" alone, which
    timing=False leaves out, so identical problems give identical documents."""
    out = {
        "status": r.status,
        "gap": r.gap,
        "space_size": r.space_size,
        "space_bounds": list(r.bounds),
        "best": plan_dict(r.best) if r.best else None,
        "alternatives": [dict(plan_dict(p), tied_with_best=p.tied_with(r.best)) for p in r.alternatives],
        "structural": [{"label": a.label, "delta": a.delta, "binds": a.binds,
                        "plan": plan_dict(a.plan) if a.plan else None} for a in r.structural],
        "explanation": list(r.explanation),
        "infeasibility": None if r.infeasibility is None else {
            "min_peak_bytes": r.infeasibility.min_peak_bytes,
            "min_peak_layout": r.infeasibility.min_peak_plan.layout.model_dump(mode="json")
            if r.infeasibility.min_peak_plan else None,
            "dominant_item": r.infeasibility.dominant_item,
            "min_gpus_that_fit": r.infeasibility.min_gpus_that_fit,
            "message": r.infeasibility.message,
        },
    }
    if timing:
        out["timing"] = {"solve_time_s": r.solve_time_s}
    return out


def ledger_rows(model: ModelSpec, grad_dtype: str = "bf16", splits=((1, 1), (8, 1), (8, 8)),
                shard: int = 8, ep: int = 1, etp: int | None = None) -> list[dict[str, Any]]:
    """The seed's static-memory table for a model: per ZeRO stage (over `shard` data-parallel ranks)
    and per TP x PP split; an MoE model's routed experts split by ep x etp (moe_static_memory)."""
    rows = []
    for tp, pp in splits:
        for z in range(4):
            st = moe_static_memory(model, tp=tp, pp=pp, dp=shard, ep=ep, etp=etp, grad_dtype=grad_dtype, zero_stage=z)
            rows.append({"tp": tp, "pp": pp, "ep": ep, "zero": z, "shard": shard if z else 1, "params_gb": st.params / 1e9,
                         "grads_gb": st.grads / 1e9, "optimizer_gb": st.optimizer / 1e9, "total_gb": st.total / 1e9})
    return rows


def calibration_dict(result, path: str) -> dict[str, Any]:
    """A CalibrationResult as JSON-ready data: the factors on the cluster's values apart from the amounts
    added to them (seconds: the MoE host stall, the host's time per expert GEMM; shares: FSDP's overlap)."""
    seconds = {p.name for p in PARAMETERS if p.unit is not None and not p.share}
    shares = {p.name for p in PARAMETERS if p.share}
    return {
        "cluster_file": path,
        "factors": {k: v for k, v in result.factors.items() if k not in seconds | shares},
        "added_seconds": {k: v for k, v in result.factors.items() if k in seconds},
        "added_shares": {k: v for k, v in result.factors.items() if k in shares},
        "memory_overhead_bytes": {"before": result.overhead_before, "after": result.overhead_after},
        "runs": [{"label": r.label, "measured_s": r.measured_s, "catalog_s": r.before_s, "calibrated_s": r.after_s,
                  "left_out_s": r.left_out_s, "measured_peak_bytes": r.measured_peak,
                  "calibrated_peak_bytes": r.after_peak} for r in result.runs],
        "median_abs_error": {k: result.median_error(k) for k in ("before", "after", "left_out")},
        "prediction_error": result.error.model_dump(mode="json"),
        "notes": list(result.notes),
    }
