"""The exhaustive reference: evaluate() every candidate of the space and rank the ones that fit.

Slow by design (one evaluate() per candidate layout); used by the tests to check the CP-SAT search
and by benchmarks/solve.py to show the two scale curves side by side.
"""

from __future__ import annotations

from typing import Any

from planner.plans import MEM_UNIT_BYTES, Plan, evaluate
from planner.space import build_space
from planner.specs import ClusterSpec, ModelSpec, TrainingSpec

__all__ = ["enumerate_plans", "best_plan"]


def enumerate_plans(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    *,
    framework: str | None = "megatron",
    allow_idle: bool = False,
    constraints: dict[str, Any] | None = None,
) -> list[Plan]:
    """Every candidate that fits, ranked as the search ranks them: step time (integer microseconds),
    then peak memory (MiB), then the candidate order of the space."""
    space = build_space(model, cluster, training, framework=framework, allow_idle=allow_idle, constraints=constraints)
    cap_units = int(cluster.gpu.memory // MEM_UNIT_BYTES)
    ranked = []
    for si, shape in enumerate(space.shapes):
        key = (shape.pp, shape.vpp)
        for ui, split in enumerate(space.splits[key]):
            for ri, rc in enumerate(space.recomputes[key]):
                for zero in space.zeros[shape.pp]:
                    p = evaluate(model, cluster, training, space.layouts(shape, split, rc, zero), allow_idle=allow_idle)
                    if p.fits:
                        peak_units = cap_units - p.memory_margin_units
                        ranked.append(((p.time.objective_us, peak_units, si, ui, ri, zero), p))
    ranked.sort(key=lambda kp: kp[0])
    return [p for _, p in ranked]


def best_plan(model, cluster, training, **kw) -> Plan | None:
    """The enumerator's optimum (None when nothing fits)."""
    plans = enumerate_plans(model, cluster, training, **kw)
    return plans[0] if plans else None
