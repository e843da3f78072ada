"""The search: the fastest layout that fits, proven by CP-SAT, with ranked alternatives and
answers when nothing fits.

The model is planner.cpsat's: one Boolean per configuration (shape, recompute, ZeRO stage) and
one integer per pipeline rank for its layers, so arbitrary layer splits are searched inside the
solver. The best time is found first; among layouts of that time, the lowest peak memory, then
the earlier configuration in the space's order (smaller tp, then cp, pp, micro-batch, ...; see
planner.space.build_space) is returned. Rankings list distinct configurations, each with its
best split. Every returned plan is re-evaluated: a proven optimum must reproduce the solver's
objective exactly, any other solution may only be cheaper (slack; see checked_plan).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any

from ortools.sat.python import cp_model

from planner.cpsat import MEM_CAP_MIB, TIME_CAP_US, Model, Rows, build_model, build_rows, solver
from planner.errors import PlannerError
from planner.plans import MEM_UNIT_BYTES, Plan, evaluate
from planner.memory import adam_bytes, offload_host_note, static_memory
from planner.space import FRAMEWORK_ENGINES, Space, build_space, empty_space_reasons, framework_training, offloaded
from planner.specs import MAX_GPUS, ClusterSpec, ModelSpec, TrainingSpec
from planner.uncertainty import peak_for_risk, prediction_error

__all__ = ["PlanResult", "SearchStats", "Alternative", "Infeasibility", "plan", "STATUSES"]

TABLE_SHARE = 0.7
"""Share of the time limit that tabulation may use before the solver runs on the rows built so far."""


@dataclass(frozen=True)
class _Found:
    """One solution read back: the rows chosen and each rank's layers."""

    pipe: int
    static: int
    split: tuple[int, ...]
    objective: int


def _read(s: cp_model.CpSolver, h: Model, rows: Rows) -> _Found:
    q = next(i for i, v in h.x.items() if s.boolean_value(v))
    w = next(j for j, v in h.y.items() if s.boolean_value(v))
    pp = rows.space.shapes[rows.pipe[q].shape].pp
    return _Found(q, w, tuple(int(s.value(v)) for v in h.layers[pp]), int(s.value(h.objective)))


CHUNK = 10
"""Configurations per CP-SAT solve: they are taken in lower-bound order, and a solve proves its
chunk's optimum (splits included); the search stops when the next lower bound passes the best.
Small chunks pay once the bounds are tight (cpsat._pipe_lower): the best is usually in the first
few configurations, and a small capped solve proves the rest away (benchmarks/solve.py: GPT 1T on
32,768 GPUs 4.5 s to proof with chunks of 120, 0.6 s with 10)."""


def _solve(rows: Rows, pairs, deadline: float, limit: int | None, *, workers: int | None = None,
           tie_break: int | None = None):
    """One CP-SAT solve over `pairs`: minimise time (objective <= limit when given), or with
    tie_break = t, among layouts of time t the lowest peak, then the configuration order."""
    h = build_model(rows, pairs)
    if h is None:
        return cp_model.INFEASIBLE, None, None
    if limit is not None:
        h.model.add(h.objective <= limit)
    if tie_break is None:
        h.model.minimize(h.objective)
    else:
        h.model.add(h.objective == tie_break)
        h.model.minimize(h.peak * (4 * len(rows.pipe) + 4) + h.rank)
    s = solver(deadline - time.perf_counter(), **({} if workers is None else {"workers": workers}))
    st = s.solve(h.model)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return st, None, None
    return st, _read(s, h, rows), math.ceil(s.best_objective_bound - 1e-6)


def _best(rows: Rows, deadline: float, stats: SearchStats | None = None, start: float = 0.0):
    """The fastest configuration and split, ties broken by peak memory and then the configuration
    order.

    Returns (status, found, lower bound); status is a cp_model status: OPTIMAL (proven),
    FEASIBLE (a layout and a proven lower bound), UNKNOWN (time ran out before any layout),
    INFEASIBLE (nothing fits). Configurations go to CP-SAT in chunks of CHUNK, in lower-bound
    order, skipping those no split fits (Rows.fits); each chunk is solved with the objective
    capped by the best so far, until the next lower bound exceeds it."""
    pairs = rows.pairs()
    first = [rows.first_lower(*ij) for ij in pairs]  # sorted; materialising can only raise a bound
    best, ties, pos = None, [], 0
    while True:
        limit = best.objective if best else None
        chunk = []
        while pos < len(pairs) and len(chunk) < CHUNK:
            if limit is not None and first[pos] > limit:
                pos = len(pairs)  # every later bound is larger still
                break
            if time.perf_counter() > deadline:
                return _out_of_time(rows, pairs, pos - len(chunk), best)
            if (limit is None or rows.lower(*pairs[pos]) <= limit) and rows.fits(*pairs[pos]):
                chunk.append(pairs[pos])
            pos += 1
        if not chunk:
            break
        if time.perf_counter() > deadline:
            return _out_of_time(rows, pairs, pos - len(chunk), best)
        st, found, _ = _solve(rows, chunk, deadline, limit)
        if stats is not None:
            stats.solved += len(chunk)
            stats.solves += 1
            if found is not None and stats.first_solution_s is None:
                stats.first_solution_s = time.perf_counter() - start
        if st == cp_model.OPTIMAL:
            if best is None or found.objective < best.objective:
                best, ties = found, list(chunk)
            elif found.objective == best.objective:
                ties += chunk
        elif st != cp_model.INFEASIBLE:  # the time limit ended this chunk's solve
            if found is not None and (best is None or found.objective < best.objective):
                best = found
            return _out_of_time(rows, pairs, pos - len(chunk), best)
    if best is None:
        return cp_model.INFEASIBLE, None, None
    if len(ties) > 1 and time.perf_counter() < deadline:
        st, found, _ = _solve(rows, ties, deadline, None, workers=1, tie_break=best.objective)
        if stats is not None:
            stats.solves += 1
        if st == cp_model.OPTIMAL:
            best = found
    if stats is not None:
        stats.proof_s = time.perf_counter() - start
    return cp_model.OPTIMAL, best, best.objective


def _out_of_time(rows: Rows, pairs, pos: int, best):
    if best is None:
        return cp_model.UNKNOWN, None, None
    rest = [rows.lower(*ij) for ij in pairs[pos:]]
    lower = min([best.objective, *rest])
    return cp_model.FEASIBLE, best, lower


def _runners_up(rows: Rows, deadline: float, best: _Found, count: int) -> list[_Found]:
    """The next `count` configurations after `best`, each with its best split, ranked by time
    (then the configuration order). Configurations are taken in lower-bound order and CP-SAT
    solves each one's split on its own; the walk stops when the next bound exceeds the count-th
    time found (or at the deadline, with what it has)."""
    if count <= 0:
        return []
    out: list[_Found] = []
    for i, j in rows.pairs():
        if (i, j) == (best.pipe, best.static):
            continue
        kth = sorted(f.objective for f in out)[count - 1] if len(out) >= count else None
        if kth is not None and rows.lower(i, j) > kth:
            if rows.first_lower(i, j) > kth:
                break
            continue
        if time.perf_counter() > deadline:
            break
        if not rows.fits(i, j):
            continue
        st, f, _ = _solve(rows, [(i, j)], deadline, kth, workers=1)
        if st == cp_model.OPTIMAL:
            out.append(f)
    return sorted(out, key=lambda f: (f.objective, f.pipe, f.static))[:count]


def _to_plan_layout(rows: Rows, f: _Found):
    pr = rows.pipe[f.pipe]
    sh = rows.space.shapes[pr.shape]
    rc = rows.space.rc_options(sh)[pr.rc]
    return rows.space.layouts(sh, f.split, rc, rows.static[f.static].zero)


def _to_plan(model, cluster, training, rows: Rows, f: _Found) -> Plan:
    return evaluate(model, cluster, training, _to_plan_layout(rows, f), allow_idle=rows.space.allow_idle)


@dataclass(frozen=True)
class Alternative:
    """A structurally different option for review."""

    label: str
    plan: Plan | None
    delta: float | None
    """Step-time ratio to the best minus one (None when nothing fits)."""
    binds: str
    """What limits it: memory headroom, a rule, or nothing fitting."""
    cut_short: bool = False
    """The time limit ended its search first: not computed, none found, or the best found not proven optimal."""


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
    stats: SearchStats | None = None
    """How the best was found and proven (None when nothing was searched)."""
    refused_choices: tuple[str, ...] = ()
    """A workload-choice search (planner.choices.plan_choices): the combinations that are not a workload
    the target runs, each with the rule it breaks."""
    bounds: tuple[str, ...] = ()
    """The default caps that cut candidates from the space (Space.bounds): 'optimal' is over what they leave."""


@dataclass
class SearchStats:
    """What the search for the best layout did (the ranking's re-solves not included)."""

    configurations: int = 0
    """Configurations (shape, recompute, ZeRO stage) in the space; each ranges over every split."""
    solved: int = 0
    """Configurations handed to CP-SAT (the others: no split fits, or their lower bound is above the best)."""
    solves: int = 0
    """CP-SAT solves (chunks of CHUNK configurations, plus the tie-break)."""
    first_solution_s: float | None = None
    """Seconds from the start of plan() to the first layout."""
    proof_s: float | None = None
    """Seconds from the start of plan() to the proof of optimality (None without one)."""


def _constraints(kw: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in kw.items() if v is not None}


def _solve_space(model, cluster, training, space, deadline, top_k, stats: SearchStats | None = None,
                 start: float | None = None, rows: Rows | None = None):
    """Best plus top_k - 1 alternatives by `deadline` (a time.perf_counter() value), over `rows` where
    given (a sub-space of rows already priced: Rows.restricted), else over space's, priced here.

    Returns (status, plans, gap, rows). 'infeasible' only when the rows are complete and no
    configuration has a split that fits; 'unknown' whenever time ran out before a proof."""
    start = time.perf_counter() if start is None else start
    if rows is None:
        rows = build_rows(model, cluster, training, space, deadline=start + TABLE_SHARE * (deadline - start))
    if not rows.pipe and rows.too_slow and rows.complete:
        raise PlannerError(f"every layout would take more than {TIME_CAP_US * 1e-6 / 86400:.0f} days per step: "
                           "check global_batch_size, seq_length and the model's sizes")
    if stats is not None:
        stats.configurations = len(rows.pairs())
    st, found, lower = _best(rows, deadline, stats=stats, start=start)
    if found is None:
        proven = st == cp_model.INFEASIBLE and rows.complete
        return ("infeasible" if proven else "unknown"), [], None, rows
    if not rows.complete:
        status, gap = "unknown", None
    else:
        status = "optimal" if st == cp_model.OPTIMAL else "feasible"
        gap = (found.objective - lower) / found.objective if found.objective else 0.0
    plans = []
    for k, f in enumerate([found, *_runners_up(rows, deadline, found, top_k - 1)]):
        plans.append(checked_plan(_to_plan(model, cluster, training, rows, f), f.objective,
                                  exact=k == 0 and status == "optimal"))
    if status != "optimal":  # a solution not proven optimal may carry slack: rank and bound by the evaluated times
        plans.sort(key=lambda p: (p.time.objective_us, p.peak_memory_bytes))
        if gap is not None:
            best = plans[0].time.objective_us
            gap = max(0.0, (best - lower) / best) if best else 0.0
    return status, plans, gap, rows


def checked_plan(p: Plan, solver_objective: int, *, exact: bool) -> Plan:
    """The solver's objective bounds its plan's evaluated one from above: its stage-time variables
    are lower-bounded by the cost terms, so a solution CP-SAT has not proven optimal may carry slack
    (seen on Llama-3.1-405B, 1,024 GPUs, 5 s). A proven optimum carries none (exact). A plan
    priced above the solver, or one that does not fit, is a bug in the encoding."""
    got = p.time.objective_us
    if not p.fits or got > solver_objective or (exact and got != solver_objective):
        raise PlannerError(f"internal: the solver's plan re-evaluates to {got} us "
                           f"(solver {solver_objective} us, fits={p.fits}); please report this")
    return p


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
    max_oom_risk: float | None = None,
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
        max_oom_risk: keep only layouts whose probability of running out of memory (from the
            memory prediction interval, planner.uncertainty) is at most this, e.g. 0.05.
        **constraints: fix a degree (tp=8), bound it (pp=(1, 8)) or list allowed values
            (recompute=["none", "selective"]); keys: tp, pp, dp, cp, zero_stage, micro_batch_size,
            recompute, vpp, sequence_parallel, uneven_stages (False: even layer splits only), rank_order.

    Returns:
        A PlanResult whose status is one of STATUSES; 'infeasible' (proven) carries an
        Infeasibility answer; 'unknown' means the time limit ended the search (raise it).

    Raises:
        PlannerError: an argument or constraint of the wrong type or range (one line naming it).
    """
    _check_arguments(model, cluster, training, top_k, time_limit_s, allow_idle, structural)
    if framework in (None, "any"):  # an engine named: its launch target's rules (ZeRO stages, overlaps, ...)
        framework = next((fw for fw, impl in FRAMEWORK_ENGINES.items() if impl == training.optimizer_impl), framework)
    training = framework_training(training, framework)
    if max_oom_risk is not None:
        return _with_oom_risk(model, cluster, training, max_oom_risk, top_k=top_k, time_limit_s=time_limit_s,
                              framework=framework, allow_idle=allow_idle, structural=structural, **constraints)
    start = time.perf_counter()
    deadline = start + time_limit_s
    cons = _constraints(constraints)
    space = build_space(model, cluster, training, framework=framework, allow_idle=allow_idle, constraints=cons)
    stats = SearchStats()
    status, plans, gap, rows = _solve_space(model, cluster, training, space, deadline, top_k, stats, start)
    if not plans:
        if status == "infeasible":
            inf = explain_infeasible(model, cluster, training, space, framework=framework, constraints=cons,
                                     deadline=deadline)
            lines = (inf.message,)
        else:
            inf = None
            lines = (f"no layout found within the time limit of {time_limit_s:g} s (nothing proven); "
                     f"raise the time limit",)
        return PlanResult(status, None, (), (), gap, time.perf_counter() - start, space.size(), lines, inf, stats)
    best = plans[0]
    alts: list[Alternative] = []
    if structural:
        alts = _structural(model, cluster, training, best, framework, cons, deadline, rows)
    return PlanResult(status, best, tuple(plans[1:]), tuple(alts), gap, time.perf_counter() - start, space.size(),
                      _explain(best, plans, status), None, stats, bounds=space.bounds)


def _with_oom_risk(model, cluster, training, risk, **kw) -> PlanResult:
    """plan() under the memory budget whose OOM risk is `risk`, re-priced on the real GPU memory."""
    if isinstance(risk, bool) or not isinstance(risk, (int, float)) or not 0 < risk < 1:
        raise PlannerError(f"max_oom_risk: expected a probability in (0, 1), e.g. 0.05, got {risk!r}")
    budget = min(cluster.gpu.memory, peak_for_risk(cluster.gpu.memory, prediction_error(cluster, training, model), risk))
    derated = cluster.model_copy(update={"gpu": cluster.gpu.model_copy(update={"memory": budget})})
    r = plan(model, derated, training, **kw)

    def real(p: Plan | None) -> Plan | None:  # on its own cluster (the half-GPU alternative's), real memory
        return None if p is None else evaluate(model, p.cluster.model_copy(update={"gpu": cluster.gpu}), training,
                                               p.layout, allow_idle=kw.get("allow_idle", False))

    note = (f"memory budget {budget / 2**30:.1f} of {cluster.gpu.memory / 2**30:.1f} GiB: "
            f"the largest predicted peak with an OOM risk of at most {risk:.1%}")
    inf = r.infeasibility
    if inf is not None:
        inf = replace(inf, min_peak_plan=real(inf.min_peak_plan), message=f"{inf.message} ({note})")
    return replace(r, best=real(r.best), alternatives=tuple(real(p) for p in r.alternatives),
                   structural=tuple(replace(a, plan=real(a.plan)) for a in r.structural),
                   explanation=(*r.explanation, note), infeasibility=inf)


def _binds(p: Plan) -> str:
    head = p.memory_margin_units * MEM_UNIT_BYTES / p.memory.capacity
    if head < 0.05:
        return f"memory: {head:.1%} headroom on stage {p.memory.peak_stage.stage}"
    return f"time: {head:.0%} memory headroom left"


def _structural(model, cluster, training, best: Plan, framework, cons, deadline: float,
                rows: Rows | None = None) -> list[Alternative]:
    """The best without PP, without recompute (searched over the main search's own rows where they are complete:
    Rows.restricted) and on half the GPUs (searched afresh)."""
    out = []
    reuse = rows is not None and rows.complete
    variants = [("best without pipeline parallelism", dict(cons, pp=1), cluster, best.layout.pp == 1,
                 rows.restricted(lambda sh, rc: sh.pp == 1) if reuse else None),
                ("best without recomputation", dict(cons, recompute="none"), cluster, best.layout.recompute == "none",
                 rows.restricted(lambda sh, rc: rc[0] == "none") if reuse else None)]
    if cluster.num_nodes >= 2 and cluster.num_nodes % 2 == 0:
        half = cluster.model_copy(update={"num_nodes": cluster.num_nodes // 2})
        variants.append(("best on half the GPUs", cons, half, False, None))
    for label, c, cl, best_qualifies, sub in variants:
        if best_qualifies:
            out.append(Alternative(label, best, 0.0, "the best plan already qualifies"))
            continue
        left = deadline - time.perf_counter()
        if left <= 0:
            out.append(Alternative(label, None, None, "not computed: the time limit was reached", cut_short=True))
            continue
        sub = sub if sub is not None and sub.pipe else None  # an empty restriction is searched afresh
        try:
            sp = sub.space if sub else build_space(model, cl, training, framework=framework, constraints=c)
            st, plans, _, _ = _solve_space(model, cl, training, sp, time.perf_counter() + left / 2, 1, rows=sub)
        except PlannerError as err:
            out.append(Alternative(label, None, None, str(err)))
            continue
        if not plans:
            why = "nothing fits in memory under this restriction" if st == "infeasible" else \
                "none found within the time limit (not proven)"
            out.append(Alternative(label, None, None, why, cut_short=st != "infeasible"))
            continue
        p = plans[0]
        proof = "" if st == "optimal" else f" ({st}: not proven optimal)"
        out.append(Alternative(label, p, p.step_time_s / best.step_time_s - 1, _binds(p) + proof, cut_short=bool(proof)))
    return out


def _explain(best: Plan, plans: list[Plan], status: str) -> tuple[str, ...]:
    m, c, lay = best.model, best.cluster, best.layout
    static16 = static_memory(m.num_params, grad_dtype=best.training.grad_dtype,
                             optimizer_bytes=adam_bytes(best.training)).total
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
    """The smallest peak (MiB, counted as the search counts it) any candidate of `space` reaches,
    splits included, from the model's own memory coefficients: per configuration, the least M
    for which the ranks' layer caps at M add up to L (Rows.fits at capacity M).

    Returns ((peak_mib, layout) or None, complete); with stop_at it only asks whether some
    candidate fits within stop_at MiB (and returns one that does)."""
    start = time.perf_counter()
    rows = build_rows(model, cluster, training, space, deadline=start + TABLE_SHARE * (deadline - start))
    cap = rows.capacity_mib
    best = None
    for i, j in rows.pairs():
        if time.perf_counter() > deadline:
            return _peak_answer(model, cluster, training, rows, best), False
        if stop_at is not None:
            if rows.fits(i, j):
                return _peak_answer(model, cluster, training, rows, (cap, i, j, cap)), rows.complete
            continue
        lo, hi = 0, best[0] if best else MEM_CAP_MIB
        if not rows.fits_within(i, j, hi):
            continue
        while lo < hi:  # the least capacity at which some split fits
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if rows.fits_within(i, j, mid) else (mid + 1, hi)
        if best is None or lo < best[0]:
            best = (lo, i, j, lo)
    return _peak_answer(model, cluster, training, rows, best), rows.complete


def _peak_answer(model, cluster, training, rows: Rows, best):
    """(peak MiB, a layout reaching it) for the configuration and capacity in `best`."""
    if best is None:
        return None
    peak, i, j, cap = best
    split = rows.split_within(i, j, cap)
    f = _Found(i, j, split, 0)
    return peak, _to_plan_layout(rows, f)


def _why_no_candidate(model, cluster, training, space: Space, framework: str | None, constraints,
                      deadline: float) -> str:
    if not space.shapes:
        msg = ("no legal layout: no (tp, pp, dp, cp, micro-batch) combination meets the product, divisibility "
               "and NVLink rules under the constraints")
        reasons = empty_space_reasons(model, cluster, training, framework=framework, allow_idle=space.allow_idle,
                                      constraints=constraints, deadline=deadline)
        return msg + ("; " + "; ".join(reasons) if reasons else "")
    return (f"no legal layout: the ZeRO stages the constraints allow are not available at the pipeline degrees "
            f"left for framework '{framework or 'any'}' (Megatron and DeepSpeed: ZeRO 2/3 only with pp = 1)")


def explain_infeasible(model, cluster, training, space: Space | None = None, *, framework=None,
                       constraints=None, max_doublings: int = 8, deadline: float | None = None) -> Infeasibility:
    """For a proven-infeasible problem: the smallest reachable peak memory (and its layout), the
    dominant ledger item, and the smallest power-of-two multiple of the node count on which some
    layout fits. Bounded by `deadline` (default: 10 s from now) and by MAX_GPUS; what the time does
    not allow is said in the message, never guessed."""
    deadline = deadline if deadline is not None else time.perf_counter() + 10.0
    training = framework_training(training, framework)
    space = space or build_space(model, cluster, training, framework=framework, constraints=constraints)
    cap = int(cluster.gpu.memory // MEM_UNIT_BYTES)
    found, complete = _min_peak(model, cluster, training, space, deadline)
    min_plan = evaluate(model, cluster, training, found[1], allow_idle=space.allow_idle) if found else None
    min_peak = min_plan.peak_memory_bytes if min_plan else math.inf
    dominant = min_plan.memory.peak_stage.dominant.name if min_plan else "n/a"
    fit_gpus, searched, timed_out, legal = None, cluster.world_size, not complete, space.size() > 0
    for k in range(1, max_doublings + 1):
        nodes = cluster.num_nodes * 2**k
        if timed_out or nodes * cluster.gpus_per_node > MAX_GPUS:
            break
        if time.perf_counter() > deadline:
            timed_out = True
            break
        bigger = cluster.model_copy(update={"num_nodes": nodes})
        sp = build_space(model, bigger, training, framework=framework, constraints=constraints)
        legal = legal or sp.size() > 0
        hit, done = _min_peak(model, bigger, training, sp, deadline, stop_at=cap)
        if hit is not None and hit[0] <= cap:
            fit_gpus = bigger.world_size
            break
        if not done:
            timed_out = True
            break
        searched = bigger.world_size
    # with offload, the smallest-peak search respects host memory too: finding nothing (or a layout the
    # GPUs hold) means the host memory the offloaded states need is what lacks
    host_bound = bool(training.optimizer_offload and complete and space.shapes
                      and (min_plan is None or min_plan.memory_margin_units >= 0))
    if host_bound:
        msg = (f"nothing fits in host memory: with optimizer_offload={training.optimizer_offload:g} every layout's "
               f"offloaded optimizer states ({offload_host_note(training)}) exceed the {cluster.host_memory_per_gpu / 2**30:.1f} GiB "
               f"of host memory per GPU (cluster.host); offload less, or use more GPUs")
    elif min_plan is None and complete:
        msg = _why_no_candidate(model, cluster, training, space, framework, constraints, deadline)
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
    elif not legal:  # a rule, not memory: more GPUs give no legal layout either
        msg += f"; no cluster of up to {searched} GPUs has a legal one either"
    else:
        msg += f"; nothing fits even on {searched} GPUs"
    if dominant == "optimizer":  # what offload moves off the GPU binds: worth one more search
        msg += _offload_hint(model, cluster, training, framework, constraints, deadline)
    return Infeasibility(min_peak, min_plan, dominant, fit_gpus, msg)


def _offload_hint(model, cluster, training, framework, constraints, deadline: float) -> str:
    """Where nothing fits on the GPUs and Adam's states are the largest item of the smallest peak,
    whether the same GPUs fit with the whole optimizer shard on the host (space.offloaded: Megatron's
    optimizer CPU offload or DeepSpeed's ZeRO-Offload): '' when the cluster has no host spec, the
    workload or its target cannot offload, or time ran out first."""
    off = offloaded(cluster, training, framework)
    if off is None or time.perf_counter() >= deadline:
        return ""
    try:
        sp = build_space(model, cluster, off, framework=framework, constraints=constraints)
        status, plans, _, _ = _solve_space(model, cluster, off, sp, deadline, 1)
    except PlannerError:
        return ""
    if not plans:
        return "; not even with the optimizer offloaded to the host" if status == "infeasible" else ""
    best = plans[0]
    proven = "" if status == "optimal" else " (not proven the fastest)"
    return (f"; with the optimizer offloaded to the host (optimizer_offload=1) {best.layout.short()} fits at "
            f"{best.step_time_s:.2f} s/step{proven}")
