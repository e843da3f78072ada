"""The exhaustive reference: evaluate() every candidate of the space -- every configuration with
every layer split -- and rank the configurations that fit by their best split.

Slow by design (one evaluate() per candidate layout; the splits of L layers over p ranks number
C(L-1, p-1)); used by the tests on small instances to check the CP-SAT search.
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

from planner.plans import MEM_UNIT_BYTES, Plan, evaluate
from planner.space import build_space, first_rank_min_layers, framework_training, last_rank_min_layers
from planner.specs import ClusterSpec, ModelSpec, TrainingSpec

__all__ = ["enumerate_plans", "best_plan", "compositions"]


def enumerate_plans(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    *,
    framework: str | None = "megatron",
    allow_idle: bool = False,
    constraints: dict[str, Any] | None = None,
) -> list[Plan]:
    """For every configuration (shape, recompute, ZeRO stage) with a split that fits, its best
    split (step time in integer ns, then peak MiB, then the split's order), ranked as the search
    ranks configurations: step time, then peak memory, then the configuration order of the space."""
    training = framework_training(training, framework)
    space = build_space(model, cluster, training, framework=framework, allow_idle=allow_idle, constraints=constraints)
    cap_units = int(cluster.gpu.memory // MEM_UNIT_BYTES)
    ranked = []
    for si, shape in enumerate(space.shapes):
        splits = (list(compositions(model.num_layers, shape.pp)) if space.free_split
                  else list(space.fixed_splits(shape.pp, shape.vpp)))
        if space.first_last_only:
            splits = [c for c in splits if len(set(c[1:-1])) <= 1]
        if space.free_split and shape.pp > 1:  # leading dense / BF16 layers on the first rank, BF16 last ones on the last
            splits = [c for c in splits if c[0] >= first_rank_min_layers(model, training, shape.vpp)
                      and c[-1] >= last_rank_min_layers(training, shape.vpp)]
        for ri, rc in enumerate(space.rc_options(shape)):
            for zero in space.zeros[shape.pp]:
                best = None
                for ui, split in enumerate(splits):
                    p = evaluate(model, cluster, training, space.layouts(shape, split, rc, zero), allow_idle=allow_idle)
                    if p.fits:
                        k = (p.time.objective_us, cap_units - p.memory_margin_units, si, ri, zero, ui)
                        if best is None or k < best[0]:
                            best = (k, p)
                if best is not None:
                    ranked.append(best)
    ranked.sort(key=lambda kp: kp[0])
    return [p for _, p in ranked]


def compositions(total: int, parts: int):
    """Every way to write `total` as an ordered sum of `parts` positive integers."""
    for cuts in combinations(range(1, total), parts - 1):
        edges = (0, *cuts, total)
        yield tuple(b - a for a, b in zip(edges, edges[1:]))


def best_plan(model, cluster, training, **kw) -> Plan | None:
    """The enumerator's optimum (None when nothing fits)."""
    plans = enumerate_plans(model, cluster, training, **kw)
    return plans[0] if plans else None
