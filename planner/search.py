"""CP-SAT search for the fastest layout that fits, with ranked alternatives and infeasibility answers.

Tables first (planner.space enumerates the legal candidates; planner.cost / planner.memory price
them, the same functions evaluate() uses):
    pipeline rows: one per (shape, split, rc) -> pipeline time (us) and non-static memory (MiB)
    static rows:   one per (shape, split, zero) -> DP + optimizer time (us) and static memory (MiB)
where shape = (tp, pp, dp, cp, micro-batch, vpp, sp) is legal by planner.space (product = world,
divisibility, NVLink: tp divides the NVLink domain, user and framework constraints), split is the
uneven first/last stage layers, rc the recompute mode and recomputed layers per stage.

Model (section order as in the OR-Tools samples: variables, constraints, objective, solve): one
Boolean per row; exactly one pipeline row and one static row, from the same (shape, split) group;
the degree variables tp, pp, dp, cp, mbs, vpp, zero as linear expressions of the choice; for the
first, second and last stage (the only ones that can peak: middle stages hold fewer micro-batches
than the second) non-static + static memory <= capacity; objective = pipeline + DP/optimizer time in
integer microseconds (or-tools #3639: no floats). Every returned plan is re-evaluated and must
reproduce the solver's objective exactly.
Ties are broken by a second solve: lower peak memory, then the earlier candidate in the space's
order (smaller tp, then cp, pp, micro-batch, ...; see planner.space.build_space).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from ortools.sat.python import cp_model

from planner.cost import dp_time, optimizer_time, pipeline_time
from planner.errors import PlannerError
from planner.plans import MEM_UNIT_BYTES, TIME_UNIT_S, Plan, _ceil_units, evaluate
from planner.memory import stage_activation_items, stage_layers, stage_static_items, static_memory
from planner.space import Space, build_space
from planner.specs import MAX_GPUS, ClusterSpec, ModelSpec, TrainingSpec

__all__ = ["PlanResult", "Alternative", "Infeasibility", "plan", "build_tables", "Tables", "STATUSES"]

NUM_WORKERS = 8
RANDOM_SEED = 0


@dataclass
class Tables:
    """The integer tables the CP-SAT model reads (built from the shared cost and memory functions)."""

    space: Space
    splits: list[tuple[int | None, int | None]]
    recomputes: list[tuple[str, int | None]]
    pipe_rows: list[tuple[int, int, int]] = field(default_factory=list)  # (shape, split, rc)
    pipe_us: list[int] = field(default_factory=list)
    pipe_mib: list[tuple[int, int, int]] = field(default_factory=list)  # first, second, last stage
    static_rows: list[tuple[int, int, int]] = field(default_factory=list)  # (shape, split, zero)
    static_us: list[int] = field(default_factory=list)
    static_mib: list[tuple[int, int, int]] = field(default_factory=list)
    capacity_mib: int = 0
    complete: bool = True
    """False when the deadline stopped tabulation: the rows then cover only part of the space."""
    too_slow: int = 0
    """Rows dropped because one step would take longer than TIME_CAP_US."""


TIME_CAP_US = 2**50
"""Rows slower than 2^50 us (35 years per step) are dropped: they keep CP-SAT's sums far from int64."""
MEM_CAP_MIB = 2**40
"""Memory figures are clamped at 2^40 MiB (1 EiB) for the same reason (only unpruned tables reach it)."""
TABLE_SHARE = 0.7
"""Share of the time limit that tabulation may use before the solver runs on the rows built so far."""


def _slots(pp: int) -> tuple[int, int, int]:
    return 0, min(1, pp - 1), pp - 1


def _mib(items) -> int:
    return min(MEM_CAP_MIB, _ceil_units(sum(i.bytes for i in items), MEM_UNIT_BYTES))


def _us(seconds: float) -> int:
    return _ceil_units(seconds, TIME_UNIT_S) if seconds < TIME_CAP_US * TIME_UNIT_S else TIME_CAP_US + 1


def build_tables(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, space: Space,
                 *, prune: bool = True, deadline: float | None = None) -> Tables:
    """Tabulate pipeline time and memory per (shape, split, rc), DP/optimizer time and static
    memory per (shape, split, zero). With prune, rows that cannot fit on their own are dropped.
    With a deadline (time.perf_counter() value), tabulation stops there and marks the tables incomplete."""
    splits = sorted({u for v in space.splits.values() for u in v}, key=lambda u: (u[0] is not None, u))
    recs = sorted({r for v in space.recomputes.values() for r in v}, key=lambda r: (r[0] != "none", r[0], r[1] or 0))
    split_idx = {u: i for i, u in enumerate(splits)}
    rc_idx = {r: i for i, r in enumerate(recs)}
    t = Tables(space, splits, recs, capacity_mib=int(cluster.gpu.memory // MEM_UNIT_BYTES))
    cap = t.capacity_mib
    for si, sh in enumerate(space.shapes):
        if deadline is not None and time.perf_counter() > deadline:
            t.complete = False
            break
        slots = _slots(sh.pp)
        for u in space.splits[(sh.pp, sh.vpp)]:
            layers = stage_layers(model, space.layouts(sh, u, ("none", None), 0))  # depends on (shape, split) only
            for z in space.zeros[sh.pp]:
                lay = space.layouts(sh, u, ("none", None), z)
                mib = tuple(_mib(stage_static_items(model, training, lay, k, layers[k])) for k in slots)
                if prune and max(mib) > cap:
                    continue
                us = _us(dp_time(model, cluster, training, lay) + optimizer_time(model, cluster, training, lay))
                if us > TIME_CAP_US:
                    t.too_slow += 1
                    continue
                t.static_rows.append((si, split_idx[u], z))
                t.static_mib.append(mib)
                t.static_us.append(us)
            for r in space.recomputes[(sh.pp, sh.vpp)]:
                lay = space.layouts(sh, u, r, 0)
                mib = tuple(_mib(stage_activation_items(model, cluster, training, lay, k, layers[k])) for k in slots)
                if prune and max(mib) > cap:
                    continue
                us = _us(pipeline_time(model, cluster, training, lay).total)
                if us > TIME_CAP_US:
                    t.too_slow += 1
                    continue
                t.pipe_rows.append((si, split_idx[u], rc_idx[r]))
                t.pipe_mib.append(mib)
                t.pipe_us.append(us)
    return t


@dataclass
class _Handles:
    x: list
    """x[i] = 1 when pipeline row i is chosen."""
    y: list
    """y[j] = 1 when static row j is chosen."""
    degrees: dict
    objective: Any
    peak: Any
    rank: Any


def _usable_rows(t: Tables, memory: bool, bound: int | None = None) -> tuple[list[int], list[int]]:
    """Rows that can be part of a fitting layout no slower than `bound` microseconds.

    A row survives when its group has both kinds of row, when (with memory) it fits beside the
    smallest row of the other kind in its group, and when its time plus the fastest row of the
    other kind stays within the bound. These are necessary conditions, so no optimum is lost.
    """
    lo_static: dict[tuple[int, int], tuple[list[int], int]] = {}
    lo_pipe: dict[tuple[int, int], tuple[list[int], int]] = {}
    for rows, mibs, times, lo in ((t.static_rows, t.static_mib, t.static_us, lo_static),
                                  (t.pipe_rows, t.pipe_mib, t.pipe_us, lo_pipe)):
        for r, mib, us in zip(rows, mibs, times):
            cur = lo.get(r[:2])
            lo[r[:2]] = (list(mib), us) if cur is None else ([min(a, b) for a, b in zip(cur[0], mib)], min(cur[1], us))
    cap = t.capacity_mib

    def keep(key, mib, us, other) -> bool:
        if key not in other:
            return False
        omib, ous = other[key]
        if memory and any(a + b > cap for a, b in zip(mib, omib)):
            return False
        return bound is None or us + ous <= bound

    xs = [i for i, r in enumerate(t.pipe_rows) if keep(r[:2], t.pipe_mib[i], t.pipe_us[i], lo_static)]
    ys = [j for j, r in enumerate(t.static_rows) if keep(r[:2], t.static_mib[j], t.static_us[j], lo_pipe)]
    return xs, ys


def _build(t: Tables, cluster: ClusterSpec, *, memory: bool = True, bound: int | None = None,
           forbidden: tuple[tuple[int, int], ...] = ()) -> tuple[cp_model.CpModel, _Handles] | None:
    """The CP-SAT model over the tables (see the module docstring).

    One Boolean per table row; exactly one pipeline row and one static row are chosen, and they
    must share their (shape, split) group. Time and per-stage memory are then linear in the
    Booleans, which gives CP-SAT a tight LP relaxation.
    """
    m = cp_model.CpModel()
    shapes = t.space.shapes
    rows_x, rows_y = _usable_rows(t, memory, bound)
    if not rows_x or not rows_y:
        return None
    # variables: one Boolean per usable row (None for rows that can never be chosen)
    x: list = [None] * len(t.pipe_rows)
    y: list = [None] * len(t.static_rows)
    for i in rows_x:
        x[i] = m.new_bool_var(f"x_{i}")
    for j in rows_y:
        y[j] = m.new_bool_var(f"y_{j}")
    # constraints: one choice of each, linked through their (shape, split) group
    m.add_exactly_one([x[i] for i in rows_x])
    m.add_exactly_one([y[j] for j in rows_y])
    groups: dict[tuple[int, int], tuple[list[int], list[int]]] = {}
    for i in rows_x:
        groups.setdefault(t.pipe_rows[i][:2], ([], []))[0].append(i)
    for j in rows_y:
        groups.setdefault(t.static_rows[j][:2], ([], []))[1].append(j)
    for xs, ys in groups.values():
        if not xs or not ys:  # a group with only one side can never be completed
            for v in [x[i] for i in xs] + [y[j] for j in ys]:
                m.add(v == 0)
            continue
        chosen = m.new_bool_var("")
        m.add(sum(x[i] for i in xs) == chosen)
        m.add(sum(y[j] for j in ys) == chosen)
        if memory:  # per group: the chosen pair's stage memory within capacity (tight LP relaxation)
            for k in range(3):
                m.add(sum(t.pipe_mib[i][k] * x[i] for i in xs)
                      + sum(t.static_mib[j][k] * y[j] for j in ys) <= t.capacity_mib * chosen)
    # the degrees, as linear expressions of the choice (legal tuples come from planner.space:
    # product = world, divisibility, and the NVLink rule tp | nvlink_domain_size)
    degrees = {}
    for name in ("tp", "pp", "dp", "cp", "mbs", "vpp"):
        var = m.new_int_var(1, max(getattr(sh, name) for sh in shapes), name)
        m.add(var == sum(getattr(shapes[t.pipe_rows[i][0]], name) * x[i] for i in rows_x))
        degrees[name] = var
    m.add(degrees["tp"] <= cluster.nvlink_domain_size)  # TP never leaves an NVLink domain
    zero = m.new_int_var(0, 3, "zero")
    m.add(zero == sum(t.static_rows[j][2] * y[j] for j in rows_y))
    degrees["zero"] = zero
    # memory of the first, second and last stage, in MiB (the per-group rows above bound it)
    slots = [sum(t.pipe_mib[i][k] * x[i] for i in rows_x) + sum(t.static_mib[j][k] * y[j] for j in rows_y)
             for k in range(3)]
    peak = m.new_int_var(0, max(r[0] for r in t.pipe_mib) + max(max(r) for r in t.static_mib) + 3 * 2**20, "peak")
    for expr in slots:
        m.add(peak >= expr)
    # objective: integer microseconds
    objective = m.new_int_var(0, max(t.pipe_us) + max(t.static_us), "objective")
    m.add(objective == sum(t.pipe_us[i] * x[i] for i in rows_x) + sum(t.static_us[j] * y[j] for j in rows_y))
    rank = sum(4 * i * x[i] for i in rows_x) + zero
    for q, w in forbidden:  # no-goods: layouts already ranked
        if x[q] is not None and y[w] is not None:
            m.add_bool_or([x[q].Not(), y[w].Not()])
    return m, _Handles(x, y, degrees, objective, peak, rank)


def _solver(time_limit_s: float) -> cp_model.CpSolver:
    s = cp_model.CpSolver()
    s.parameters.max_time_in_seconds = max(0.001, time_limit_s)
    s.parameters.num_workers = NUM_WORKERS
    s.parameters.random_seed = RANDOM_SEED
    # The tables are small once presolved; deep probing costs more than it saves here (measured in
    # benchmarks/solve.py: 2.7 s -> 1.0 s on Llama-3-70B / 64 H100).
    s.parameters.cp_model_probing_level = 0
    s.parameters.max_presolve_iterations = 1
    return s


def _chosen(solver: cp_model.CpSolver, h: _Handles) -> tuple[int, int]:
    q = next(i for i, v in enumerate(h.x) if v is not None and solver.boolean_value(v))
    w = next(j for j, v in enumerate(h.y) if v is not None and solver.boolean_value(v))
    return q, w


def _solve_lexicographic(t: Tables, cluster: ClusterSpec, deadline: float, *, bound: int | None = None,
                         forbidden: tuple[tuple[int, int], ...] = ()):
    """Minimise time; then, among layouts of that time, peak memory and the candidate order.

    Returns (status, (q, w), objective, lower bound), or (status, None, None, None) when no layout
    within `bound` remains. The second solve is built on only the rows that can reach the optimum.
    """
    built = _build(t, cluster, bound=bound, forbidden=forbidden)
    if built is None:
        return cp_model.INFEASIBLE, None, None, None
    if deadline - time.perf_counter() <= 0:
        return cp_model.UNKNOWN, None, None, None
    m, h = built
    if bound is not None:  # rows were kept only if they can reach the bound: solutions above it are not complete
        m.add(h.objective <= bound)
    m.minimize(h.objective)
    s = _solver(deadline - time.perf_counter())
    st = s.solve(m)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return st, None, None, None
    # read the integer objective variable: objective_value is a double and can sit just below it
    best, lower = int(s.value(h.objective)), math.ceil(s.best_objective_bound - 1e-6)
    qw = _chosen(s, h)
    if st != cp_model.OPTIMAL:  # no proof: keep the solver's layout
        return st, qw, best, lower
    if deadline - time.perf_counter() <= 0:  # optimal, but no time left for the tie-break
        return st, qw, best, lower
    m2, h2 = _build(t, cluster, bound=best, forbidden=forbidden)
    m2.add(h2.objective <= best)
    m2.add_hint(h2.x[qw[0]], 1)
    m2.add_hint(h2.y[qw[1]], 1)
    m2.minimize(h2.peak * (4 * len(h2.x) + 4) + h2.rank)
    s2 = _solver(deadline - time.perf_counter())
    st2 = s2.solve(m2)
    if st2 == cp_model.OPTIMAL:
        return st2, _chosen(s2, h2), best, lower
    return cp_model.FEASIBLE, qw, best, lower


def _to_plan(model, cluster, training, t: Tables, qw: tuple[int, int]) -> Plan:
    si, ui, ri = t.pipe_rows[qw[0]]
    z = t.static_rows[qw[1]][2]
    lay = t.space.layouts(t.space.shapes[si], t.splits[ui], t.recomputes[ri], z)
    return evaluate(model, cluster, training, lay, allow_idle=t.space.allow_idle)


@dataclass(frozen=True)
class Alternative:
    """A structurally different option for review."""

    label: str
    plan: Plan | None
    delta: float | None
    """Step-time ratio to the best minus one (None when nothing fits)."""
    binds: str
    """What limits it: memory headroom, a rule, or nothing fitting."""


@dataclass(frozen=True)
class Infeasibility:
    """The answer when nothing fits."""

    min_peak_bytes: float
    min_peak_plan: Plan | None
    dominant_item: str
    min_gpus_that_fit: int | None
    message: str


@dataclass(frozen=True)
class PlanResult:
    """What plan() returns."""

    status: str
    """One of STATUSES: 'optimal' (proven); 'feasible' (a layout, with a proven relative gap);
    'unknown' (the time limit ended the search first: `best` is the best layout found, or None, and
    nothing is proven); 'infeasible' (proven: no legal layout fits)."""
    best: Plan | None
    alternatives: tuple[Plan, ...]
    """The next-best distinct layouts, ranked (best excluded)."""
    structural: tuple[Alternative, ...]
    gap: float | None
    """Proven relative gap of `best` (0 when optimal; None when unknown or infeasible)."""
    solve_time_s: float
    space_size: int
    """Full candidate layouts the model ranges over."""
    explanation: tuple[str, ...]
    infeasibility: Infeasibility | None = None


def _constraints(kw: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in kw.items() if v is not None}


RANK_SLACK = 0.05  # ranking re-solves first look within 5 % of the best time, widening as needed


def _solve_space(model, cluster, training, space, deadline, top_k):
    """Best plus top_k - 1 alternatives by `deadline` (a time.perf_counter() value).

    Returns (status, plans, gap, tables). 'infeasible' only when the tables are complete and no row,
    or no combination CP-SAT proves impossible, fits; 'unknown' whenever time ran out first."""
    start = time.perf_counter()
    t = build_tables(model, cluster, training, space, deadline=start + TABLE_SHARE * (deadline - start))
    if (not t.pipe_rows or not t.static_rows) and t.complete:
        if t.too_slow:
            raise PlannerError(f"every layout that fits would take more than {TIME_CAP_US * TIME_UNIT_S / 3.15e7:.0f} "
                               "years per step: check global_batch_size, seq_length and the model's sizes")
        return "infeasible", [], None, t
    st, qw, obj, lower = _solve_lexicographic(t, cluster, deadline) if t.pipe_rows and t.static_rows \
        else (cp_model.UNKNOWN, None, None, None)
    if qw is None:
        proven = st == cp_model.INFEASIBLE and t.complete
        return ("infeasible" if proven else "unknown"), [], None, t
    if not t.complete:
        status, gap = "unknown", None
    else:
        status = "optimal" if st == cp_model.OPTIMAL else "feasible"
        gap = (obj - lower) / obj if obj else 0.0
    found, plans, slack = [qw], [], RANK_SLACK
    best_obj = obj
    while True:
        p = _to_plan(model, cluster, training, t, qw)
        if p.time.objective_us != obj or not p.fits:
            raise PlannerError(f"internal: the solver's plan re-evaluates to {p.time.objective_us} us "
                               f"(solver {obj} us, fits={p.fits}); please report this")
        plans.append(p)
        if len(plans) == top_k or time.perf_counter() > deadline:
            break
        while True:  # the next layout, searched among rows that can stay within the slack
            bound = None if slack > 4 else int(best_obj * (1 + slack)) + 1
            st, qw, obj, _ = _solve_lexicographic(t, cluster, deadline, bound=bound, forbidden=tuple(found))
            if qw is not None or bound is None or time.perf_counter() > deadline:
                break
            slack *= 4
        if qw is None:
            break
        found.append(qw)
    return status, plans, gap, t


STATUSES = ("optimal", "feasible", "unknown", "infeasible")
MAX_TIME_LIMIT_S = 86400.0
MAX_TOP_K = 1000


def _check_arguments(model, cluster, training, top_k, time_limit_s, allow_idle, structural) -> None:
    """Refuse API arguments of the wrong type or range with one line naming the argument
    (constraints and the framework are checked by planner.space.build_space)."""
    for name, value, kind in (("model", model, ModelSpec), ("cluster", cluster, ClusterSpec),
                              ("training", training, TrainingSpec)):
        if not isinstance(value, kind):
            raise PlannerError(f"{name}: expected a {kind.__name__} (see planner.load_{name}), got {type(value).__name__}"
                               if name != "training" else
                               f"training: expected a TrainingSpec, got {type(value).__name__}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= MAX_TOP_K:
        raise PlannerError(f"top_k: expected a whole number from 1 to {MAX_TOP_K}, got {top_k!r}")
    if isinstance(time_limit_s, bool) or not isinstance(time_limit_s, (int, float)) \
            or not math.isfinite(time_limit_s) or not 0 < time_limit_s <= MAX_TIME_LIMIT_S:
        raise PlannerError(f"time_limit_s: expected seconds in (0, {MAX_TIME_LIMIT_S:g}], got {time_limit_s!r}")
    for name, value in (("allow_idle", allow_idle), ("structural", structural)):
        if not isinstance(value, bool):
            raise PlannerError(f"{name}: expected True or False, got {value!r}")


def plan(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    *,
    top_k: int = 5,
    time_limit_s: float = 10.0,
    framework: str | None = "megatron",
    allow_idle: bool = False,
    structural: bool = True,
    **constraints: Any,
) -> PlanResult:
    """Find the fastest layout that fits, proven optimal by CP-SAT, with ranked alternatives.

    Args:
        model, cluster, training: the problem.
        top_k: how many distinct layouts to rank (the best included), 1 to 1000.
        time_limit_s: wall-clock budget in seconds for the whole call: tables, solves, ranking,
            structural options and the infeasibility analysis.
        framework: the launch target, 'megatron' (default), 'deepspeed', 'torchtitan', or 'any'/None
            (every ZeRO stage at every pipeline degree); restricts what the target can run.
        allow_idle: allow tp*pp*dp*cp < world size.
        structural: also report the best without PP, without recompute and on half the GPUs.
        **constraints: fix a degree (tp=8), bound it (pp=(1, 8)) or list allowed values
            (recompute=["none", "selective"]); keys: tp, pp, dp, cp, zero_stage, micro_batch_size,
            recompute, vpp, sequence_parallel, uneven_stages, rank_order.

    Returns:
        A PlanResult whose status is one of STATUSES; 'infeasible' (proven) carries an
        Infeasibility answer; 'unknown' means the time limit ended the search (raise it).

    Raises:
        PlannerError: an argument or constraint of the wrong type or range (one line naming it).
    """
    _check_arguments(model, cluster, training, top_k, time_limit_s, allow_idle, structural)
    start = time.perf_counter()
    deadline = start + time_limit_s
    cons = _constraints(constraints)
    space = build_space(model, cluster, training, framework=framework, allow_idle=allow_idle, constraints=cons)
    status, plans, gap, _ = _solve_space(model, cluster, training, space, deadline, top_k)
    if not plans:
        if status == "infeasible":
            inf = explain_infeasible(model, cluster, training, space, framework=framework, constraints=cons,
                                     deadline=deadline)
            lines = (inf.message,)
        else:
            inf = None
            lines = (f"no layout found within the time limit of {time_limit_s:g} s (nothing proven); "
                     f"raise the time limit",)
        return PlanResult(status, None, (), (), gap, time.perf_counter() - start, space.size(), lines, inf)
    best = plans[0]
    alts: list[Alternative] = []
    if structural:
        alts = _structural(model, cluster, training, best, framework, cons, deadline)
    return PlanResult(status, best, tuple(plans[1:]), tuple(alts), gap, time.perf_counter() - start, space.size(),
                      _explain(best, plans, status))


def _binds(p: Plan) -> str:
    head = p.memory_margin_units * MEM_UNIT_BYTES / p.memory.capacity
    if head < 0.05:
        return f"memory: {head:.1%} headroom on stage {p.memory.peak_stage.stage}"
    return f"time: {head:.0%} memory headroom left"


def _structural(model, cluster, training, best: Plan, framework, cons, deadline: float) -> list[Alternative]:
    out = []
    variants = [("best without pipeline parallelism", dict(cons, pp=1), cluster, best.layout.pp == 1),
                ("best without recomputation", dict(cons, recompute="none"), cluster, best.layout.recompute == "none")]
    if cluster.num_nodes >= 2 and cluster.num_nodes % 2 == 0:
        half = cluster.model_copy(update={"num_nodes": cluster.num_nodes // 2})
        variants.append(("best on half the GPUs", cons, half, False))
    for label, c, cl, best_qualifies in variants:
        if best_qualifies:
            out.append(Alternative(label, best, 0.0, "the best plan already qualifies"))
            continue
        left = deadline - time.perf_counter()
        if left <= 0:
            out.append(Alternative(label, None, None, "not computed: the time limit was reached"))
            continue
        try:
            sp = build_space(model, cl, training, framework=framework, constraints=c)
            st, plans, _, _ = _solve_space(model, cl, training, sp, time.perf_counter() + left / 2, 1)
        except PlannerError as err:
            out.append(Alternative(label, None, None, str(err)))
            continue
        if not plans:
            why = "nothing fits in memory under this restriction" if st == "infeasible" else \
                "none found within the time limit (not proven)"
            out.append(Alternative(label, None, None, why))
            continue
        p = plans[0]
        proof = "" if st == "optimal" else f" ({st}: not proven optimal)"
        out.append(Alternative(label, p, p.step_time_s / best.step_time_s - 1, _binds(p) + proof))
    return out


def _explain(best: Plan, plans: list[Plan], status: str) -> tuple[str, ...]:
    m, c, lay = best.model, best.cluster, best.layout
    static16 = static_memory(m.num_params, grad_dtype=best.training.grad_dtype).total
    lines = [
        f"static memory {static16 / 1e9:.0f} GB ({static16 / m.num_params:.0f} B/param) vs {c.gpu.memory / 1e9:.0f} GB "
        f"per GPU: {'sharding or model parallelism needed' if static16 > c.usable_memory else 'fits unsharded'}",
        f"chosen {lay.short()}: {best.step_time_s:.3f} s/step, MFU {best.mfu:.1%}, "
        f"peak {best.peak_memory_bytes / 2**30:.1f} GiB of {c.gpu.memory / 2**30:.1f} GiB ({_binds(best)})",
        f"TP {lay.tp} within the {c.nvlink_domain_size}-GPU NVLink domain",
    ]
    if lay.pp > 1:
        bub = best.time.pipeline.bubble / best.step_time_s
        lines.append(f"pipeline bubble {bub:.1%} of the step (pp {lay.pp}, vpp {lay.vpp}, "
                     f"{best.time.pipeline.num_microbatches} micro-batches)")
    if len(plans) > 1:
        lines.append(f"runner-up {plans[1].layout.short()} is {plans[1].step_time_s / best.step_time_s - 1:+.1%}")
    lines.append(f"status {status}")
    return tuple(lines)


def _min_peak(model, cluster, training, space: Space, deadline: float, stop_at: int | None = None):
    """The smallest peak (MiB, counted as the search counts it) any candidate of `space` reaches.

    A pass over the same stage functions the tables use, keeping only the best, so memory stays
    flat at any scale. Returns ((peak_mib, layout) or None, complete); with stop_at it returns as
    soon as a candidate's peak is within stop_at MiB.
    """
    best = None
    for sh in space.shapes:
        if time.perf_counter() > deadline:
            return best, False
        slots = _slots(sh.pp)
        for u in space.splits[(sh.pp, sh.vpp)]:
            layers = stage_layers(model, space.layouts(sh, u, ("none", None), 0))
            statics = [(z, [_mib(stage_static_items(model, training, space.layouts(sh, u, ("none", None), z), k,
                                                    layers[k])) for k in slots]) for z in space.zeros[sh.pp]]
            for r in space.recomputes[(sh.pp, sh.vpp)]:
                lay = space.layouts(sh, u, r, 0)
                pipe = [_mib(stage_activation_items(model, cluster, training, lay, k, layers[k])) for k in slots]
                for z, st in statics:
                    peak = max(a + b for a, b in zip(pipe, st))
                    if best is None or peak < best[0]:
                        best = (peak, space.layouts(sh, u, r, z))
            if stop_at is not None and best is not None and best[0] <= stop_at:
                return best, True
    return best, True


def _why_no_candidate(space: Space, framework: str | None) -> str:
    if not space.shapes:
        return ("no legal layout: no (tp, pp, dp, cp, micro-batch) combination meets the product, divisibility "
                "and NVLink rules under the constraints")
    return (f"no legal layout: the ZeRO stages the constraints allow are not available at the pipeline degrees "
            f"left for framework '{framework or 'any'}' (Megatron and DeepSpeed: ZeRO 2/3 only with pp = 1)")


def explain_infeasible(model, cluster, training, space: Space | None = None, *, framework=None,
                       constraints=None, max_doublings: int = 8, deadline: float | None = None) -> Infeasibility:
    """For a proven-infeasible problem: the smallest reachable peak memory (and its layout), the
    dominant ledger item, and the smallest power-of-two multiple of the node count on which some
    layout fits. Bounded by `deadline` (default: 10 s from now) and by MAX_GPUS; what the time does
    not allow is said in the message, never guessed."""
    deadline = deadline if deadline is not None else time.perf_counter() + 10.0
    space = space or build_space(model, cluster, training, framework=framework, constraints=constraints)
    cap = int(cluster.gpu.memory // MEM_UNIT_BYTES)
    found, complete = _min_peak(model, cluster, training, space, deadline)
    min_plan = evaluate(model, cluster, training, found[1], allow_idle=space.allow_idle) if found else None
    min_peak = min_plan.peak_memory_bytes if min_plan else math.inf
    dominant = min_plan.memory.peak_stage.dominant.name if min_plan else "n/a"
    fit_gpus, searched, timed_out = None, cluster.world_size, not complete
    for k in range(1, max_doublings + 1):
        nodes = cluster.num_nodes * 2**k
        if timed_out or nodes * cluster.gpus_per_node > MAX_GPUS:
            break
        if time.perf_counter() > deadline:
            timed_out = True
            break
        bigger = cluster.model_copy(update={"num_nodes": nodes})
        sp = build_space(model, bigger, training, framework=framework, constraints=constraints)
        hit, done = _min_peak(model, bigger, training, sp, deadline, stop_at=cap)
        if hit is not None and hit[0] <= cap:
            fit_gpus = bigger.world_size
            break
        if not done:
            timed_out = True
            break
        searched = bigger.world_size
    if min_plan is None and complete:
        msg = _why_no_candidate(space, framework)
    elif min_plan is None:
        msg = "nothing fits (proven); the smallest reachable peak was not determined within the time limit"
    else:
        scope = "" if complete else " found within the time limit"
        msg = (f"nothing fits: the smallest peak any layout{scope} reaches is {min_peak / 2**30:.1f} GiB "
               f"({min_plan.layout.short()}) > {cluster.gpu.memory / 2**30:.1f} GiB; dominated by {dominant}")
    if fit_gpus:
        msg += f"; fits on {fit_gpus} GPUs"
    elif timed_out:
        msg += f"; nothing fits on up to {searched} GPUs (larger clusters not searched within the time limit)"
    else:
        msg += f"; nothing fits even on {searched} GPUs"
    return Infeasibility(min_peak, min_plan, dominant, fit_gpus, msg)
