"""Workload choices: plan() over several TrainingSpec variants (FP8 recipe, Adam state dtype), one
proven search per combination, merged into one ranking whose status is only as proven as its
weakest search."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from planner.errors import PlannerError
from planner.plans import Plan
from planner.search import PlanResult, plan
from planner.space import check_workload, framework_training
from planner.specs import ClusterSpec, ModelSpec, TrainingSpec, format_validation_error
from planner.uncertainty import fp8_speedup_check, fp8_speedup_note

__all__ = ["plan_choices", "plan_precisions", "merged_status", "combo_label", "fp8_choice_note"]


def plan_choices(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, choices: dict[str, list], *,
                 time_limit_s: float = 10.0, top_k: int = 5, **kw: Any) -> tuple[PlanResult, dict]:
    """plan() over workload choices: one search per combination of the TrainingSpec fields in
    `choices` (e.g. {"fp8": [None, "delayed"], "optimizer_states": ["fp32", "bf16"]}), sharing the
    time limit; returns (the merged result, {combination: its own result}), a combination being a
    tuple of the values in the order of `choices`.

    The merged ranking takes every combination's layouts by step time. Its status is 'optimal' only
    when every search is proven (optimal or infeasible); 'unknown' when any ran out of time; else
    'feasible' with the gap to the smallest proven lower bound (merged_status).
    """
    names = list(choices)
    values = [list(dict.fromkeys(choices[n])) for n in names]
    if not names or any(not v for v in values):
        raise PlannerError("choices: give at least one value for each field")
    variants, refused = {}, []
    for combo in itertools.product(*values):  # validated: model_copy(update=...) would skip the cross-field rules
        try:
            variant = TrainingSpec.model_validate({**training.model_dump(exclude_unset=True), **dict(zip(names, combo))})
            # the target engine's rules (DeepSpeed's ZeRO-Offload), and what the cluster and its launch config run
            check_workload(model, cluster, framework_training(variant, kw.get("framework")), kw.get("framework"))
            variants[combo] = variant
        except ValidationError as e:
            refused.append(f"{combo_label(names, combo)} refused ({format_validation_error(e, 'TrainingSpec')})")
        except PlannerError as e:
            refused.append(f"{combo_label(names, combo)} refused ({e})")
    if not variants:
        raise PlannerError("choices: no combination is a valid workload: " + "; ".join(refused))
    combos = list(variants)
    start, results = time.perf_counter(), {}
    for i, combo in enumerate(combos):
        left = time_limit_s - (time.perf_counter() - start)
        share = max(left / (len(combos) - i), 1e-3)
        results[combo] = plan(model, cluster, variants[combo], top_k=top_k, time_limit_s=share, **kw)
    found = [r for r in results.values() if r.best is not None]
    if not found:
        first = next(iter(results.values()))
        status = "infeasible" if all(r.status == "infeasible" for r in results.values()) else "unknown"
        return replace(first, status=status, solve_time_s=time.perf_counter() - start,
                       space_size=sum(r.space_size for r in results.values()), refused_choices=tuple(refused)), results
    chosen = min(found, key=lambda r: (r.best.time.objective_us, r.best.peak_memory_bytes))
    ranked = sorted((p for r in found for p in (r.best, *r.alternatives)),
                    key=lambda p: (p.time.objective_us, p.peak_memory_bytes))[:top_k]
    status, gap = merged_status(list(results.values()), ranked[0].time.objective_us)
    line = "workload choice: " + ", ".join(
        [f"{combo_label(names, k)} " + (f"{r.best.step_time_s:.3f} s" if r.best else r.status) for k, r in results.items()]
        + refused) + ("; " + note if None in choices.get("fp8", ()) and (note := fp8_choice_note(
            model, cluster, chosen.best, found)) else "")
    return replace(chosen, status=status, gap=gap, best=ranked[0], alternatives=tuple(ranked[1:]),
                   solve_time_s=time.perf_counter() - start, space_size=sum(r.space_size for r in results.values()),
                   explanation=(*chosen.explanation, line), refused_choices=tuple(refused)), results


def fp8_choice_note(model: ModelSpec, cluster: ClusterSpec, chosen: Plan, results: Iterable[PlanResult]) -> str:
    """What the published FP8/BF16 pairs of the stack (its kernels, on this GPU generation, its recipe's scaling)
    say of the FP8 gain an FP8 choice was decided on (uncertainty.FP8_SPEEDUPS): the chosen plan's where it is
    low precision, else the fastest low-precision variant's (BF16 won against it); '' where no low-precision
    variant was planned (all refused or infeasible)."""
    fp8 = [chosen] if chosen.training.fp8 is not None else [
        r.best for r in results if r.best is not None and r.best.training.fp8 is not None]
    if not fp8:
        return ""
    weighed = min(fp8, key=lambda p: p.time.objective_us)
    return fp8_speedup_note(fp8_speedup_check(cluster, weighed.training, model))


def combo_label(names: list[str], combo: tuple) -> str:
    """'fp8=delayed/optimizer_states=bf16' for one combination of plan_choices."""
    return "/".join(f"{n}={'none' if v is None else v}" for n, v in zip(names, combo))


def plan_precisions(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, recipes, **kw: Any):
    """plan_choices over the FP8 recipe alone (None = no FP8); results keyed by recipe."""
    merged, results = plan_choices(model, cluster, training, {"fp8": list(recipes)}, **kw)
    return merged, {k[0]: v for k, v in results.items()}


def merged_status(results: list, best_us: int) -> tuple[str, float | None]:
    """(status, gap) of the union of several searches whose best is `best_us`: 'optimal' when each
    is proven (optimal or infeasible); 'unknown' when any ran out of time without a bound; else
    'feasible' with the gap to the smallest proven lower bound (a result's best x (1 - its gap))."""
    if any(r.status == "unknown" for r in results):
        return "unknown", None
    if all(r.status in ("optimal", "infeasible") for r in results):
        return "optimal", 0.0
    lower = min(r.best.time.objective_us * (1 - (r.gap or 0.0)) for r in results if r.best is not None)
    return "feasible", max(0.0, (best_us - lower) / best_us) if best_us else 0.0
