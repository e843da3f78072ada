"""The CP-SAT model: configurations as Booleans, each pipeline rank's layer count as an integer.

Rows first (integer coefficients from the same functions evaluate() uses, planner.cost and
planner.memory; nothing here prices a whole layout):
    pipeline rows, one per (shape, recompute) -- and per group of ZeRO stages where the stage changes
        the micro-batch time (DeepSpeed's BF16_Optimizer accumulates gradients at ZeRO-1 only; such a
        row pairs with its stages' static rows only): per rank, the micro-batch time as
        StageCoefficients (per layer, per recomputed layer, fixed, exposed p2p) and the
        activation memory as KiB per layer + fixed KiB (its in-flight micro-batches included);
    static rows, one per (shape, ZeRO stage): per rank, weights/gradients/optimizer KiB per
        layer + fixed KiB, and the update time (DP communication + optimizer) as a table over
        the rank's layer count (bucketing makes it a step function).
shape = (tp, pp, dp, cp, micro-batch, vpp, sp) is legal by planner.space.

Model (variables, constraints, objective, as in the OR-Tools samples), per pipeline degree p:
    n_r in [1, L - p + 1], sum n_r = L; n_1 <= ... <= n_(p-2) (middle ranks are interchangeable
        but for their in-flight micro-batches, which fall with the rank: giving the later ranks
        the larger counts loses no optimum -- an exchange argument, see _add_group);
    T_r >= per_layer n_r + per_recomputed rc(n_r) + fixed + e_r,  e_r >= p2p - hidden n_r, e_r >= 0
        (enforced by the chosen pipeline row); T_max >= T_r;
    v PIPE >= (v m - 1) T_max + sum T_r     (1F1B fill and drain; interleaving shrinks them v-fold)
    UPD >= table_j[n_r] for every rank (the slowest rank's update), read through the value
        encoding of n_r (one Boolean per count, shared by the group's static rows);
    1024 ACT_r >= act KiB, 1024 STAT_r >= static KiB, ACT_r + STAT_r <= capacity (MiB).
One pipeline row and one static row of the same shape are chosen; objective = PIPE + UPD in
integer microseconds (or-tools #3639: no floats). evaluate() rebuilds the same integers from a Layout
(Plan.time.objective_us), so every returned plan re-evaluates to the solver's objective exactly.
Memory coefficients are rounded up to whole KiB, so a plan the model accepts always fits.
"""

from __future__ import annotations

import math
import multiprocessing
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ortools.sat.python import cp_model

from planner._cpus import usable_cpus
from planner.cost import (StageCoefficients, accumulates_apart, accumulation_bytes, ranks_coefficients,
                          stage_optimizer_time, stage_update_time, us_units)
from planner.memory import in_flight_microbatches, stage_activation_items, stage_host_bytes, stage_static_items
from planner.plans import MEM_UNIT_BYTES
from planner.space import Space, first_rank_min_layers, last_rank_min_layers
from planner.specs import ClusterSpec, ModelSpec, Recompute, TrainingSpec, num_microbatches

__all__ = ["Rows", "build_rows", "Model", "build_model", "solver", "TIME_CAP_US", "MEM_CAP_MIB"]

TIME_CAP_US = 2**42
"""Steps slower than 2^42 us (51 days) are dropped: they keep CP-SAT's sums far from int64. The
units are chosen small on purpose: with times in ns (coefficients 1e10, domains 2^52) CP-SAT 9.15's
presolve reported a worse objective as optimal on GPT-1T / 32,768 GPUs."""
STAGE_CAP_US = 2**36
"""A rank's micro-batch time above 2^36 us (19 h) drops the row, for the same reason."""
MEM_CAP_MIB = 2**30
"""Memory figures are clamped at 2^30 MiB (1 PiB per GPU)."""
KIB_PER_MIB = 1024
"""Memory coefficients are whole KiB (rounded up): with bytes (1e10 per layer) CP-SAT 9.15 proved
wrong optima on the largest cases; the magnitudes, not the model, were at fault (see TIME_CAP_US)."""
NUM_WORKERS = 8
RANDOM_SEED = 0


@dataclass
class PipeRow:
    """One (shape, recompute) choice."""

    shape: int
    rc: int
    m: int
    v: int
    min_layers: int
    """Layers every rank must hold (a partial recompute of R layers needs n >= R)."""
    first_min: int
    """Layers the first rank must hold (>= min_layers): an MoE model's leading dense layers and the
    BF16 first layers (planner.space.first_rank_min_layers)."""
    recompute: str
    """'none' (rc(n) = 0), 'all' (rc(n) = n) or 'fixed' (rc(n) = min_layers)."""
    time: tuple[StageCoefficients, ...]
    lower: int
    """A lower bound on the pipeline term over every split (see _pipe_lower)."""
    act: tuple[tuple[int, int], ...] | None = None
    """Per rank: (KiB per layer, fixed KiB) of the non-static items (None until materialised)."""
    zeros: frozenset[int] | None = None
    """The ZeRO stages whose static rows this row pairs with, where the micro-batch time depends on
    the stage (DeepSpeed's BF16_Optimizer accumulates at ZeRO-1 only: _zero_classes); None: every one."""
    last_min: int = 1
    """Layers the last rank must hold (>= min_layers): the BF16 last layers
    (planner.space.last_rank_min_layers)."""

    @property
    def zero(self) -> int:
        """The ZeRO stage of the layout that priced the row (the smallest it pairs with; 0 for all)."""
        return min(self.zeros) if self.zeros else 0

    def pairs_with(self, zero: int) -> bool:
        """Whether a static row of this ZeRO stage goes with this row."""
        return self.zeros is None or zero in self.zeros


@dataclass
class StaticRow:
    """One (shape, ZeRO stage) choice."""

    shape: int
    zero: int
    lower: int
    """A lower bound on the update term: the least optimizer step of any rank holding ceil(L/p) layers
    (some rank holds at least that many, its step grows with them, and the DP term is never negative)."""
    mem: tuple[tuple[int, int], ...] | None = None
    """Per rank: (KiB per layer, fixed KiB) of weights, gradients, optimizer states."""
    update: tuple[tuple[int, ...], ...] | None = None
    """Per rank: update microseconds for n = 0 .. L - p + 1 layers (entries a rank cannot hold are padded)."""
    host_most: tuple[int, ...] | None = None
    """Per rank: the most layers whose offloaded optimizer states fit its share of host memory
    (planner.memory.stage_host_bytes); None without optimizer offload."""


@dataclass
class Rows:
    """What the CP-SAT model reads: every configuration's time coefficients and lower bounds, and
    -- materialised for the configurations a bound leaves in play -- memory and update tables."""

    space: Space
    problem: tuple[ModelSpec, ClusterSpec, TrainingSpec]
    pipe: list[PipeRow] = field(default_factory=list)
    static: list[StaticRow] = field(default_factory=list)
    capacity_mib: int = 0
    complete: bool = True
    """False when the deadline stopped tabulation: the rows then cover only part of the space."""
    too_slow: int = 0
    """Rows dropped because a step would take longer than TIME_CAP_US."""
    _updates: dict = field(default_factory=dict)
    _pairs: list | None = None
    _first: dict = field(default_factory=dict)

    @property
    def num_layers(self) -> int:
        """L."""
        return self.problem[0].num_layers

    def restricted(self, keep) -> Rows:
        """The rows of a sub-space of this one, sharing the row objects (and what materialise fills in):
        the pipeline rows whose (shape, recompute option) `keep` accepts, and the static rows of their
        shapes. A search over them is a search over build_space's rows under the added constraint (pp = 1,
        or no recompute) where these rows are complete."""
        shape_of = self.space.shapes
        pipe = [r for r in self.pipe if keep(shape_of[r.shape], self.space.rc_options(shape_of[r.shape])[r.rc])]
        shapes = {r.shape for r in pipe}
        return Rows(self.space, self.problem, pipe, [r for r in self.static if r.shape in shapes], self.capacity_mib,
                    self.complete, 0, self._updates)

    def pairs(self) -> list[tuple[int, int]]:
        """Every (pipeline row, static row) pair of the same shape, by lower bound, then row order."""
        if self._pairs is None:
            by_shape: dict[int, list[int]] = {}
            for j, row in enumerate(self.static):
                by_shape.setdefault(row.shape, []).append(j)
            out = [(i, j) for i, row in enumerate(self.pipe) for j in by_shape.get(row.shape, ())
                   if row.pairs_with(self.static[j].zero)]
            self._first = {ij: self.lower(*ij) for ij in out}
            self._pairs = sorted(out, key=lambda ij: (self._first[ij], ij))
        return self._pairs

    def lower(self, i: int, j: int) -> int:
        """A lower bound on the objective of configuration (i, j) over every split."""
        return self.pipe[i].lower + self.static[j].lower

    def first_lower(self, i: int, j: int) -> int:
        """The lower bound pairs() sorted by (materialising rows can only raise lower())."""
        return self._first[(i, j)]

    def fits(self, i: int, j: int) -> bool:
        """Whether some split of configuration (i, j) fits in GPU memory (see fits_within)."""
        return self.fits_within(i, j, self.capacity_mib)

    def fits_within(self, i: int, j: int, cap_mib: int) -> bool:
        """Whether some split of configuration (i, j) keeps every rank within cap_mib -- exact for
        the model's memory constraints: they only cap each rank's layers, so a split exists iff
        every rank can hold the minimum and the caps add up to L. Materialises the memory rows."""
        return self.split_within(i, j, cap_mib) is not None

    def split_within(self, i: int, j: int, cap_mib: int) -> tuple[int, ...] | None:
        """A split of configuration (i, j) within cap_mib per rank (the caps filled from the first
        rank on; the even one where the space has no other), or None."""
        self.materialise([(i, j)], update=False)
        pr, sr = self.pipe[i], self.static[j]
        L = self.num_layers
        p = len(pr.time)
        caps = [_most_layers(pr.act[r], sr.mem[r], cap_mib, L - p + 1) for r in range(p)]
        if sr.host_most is not None:
            caps = [min(c, h) for c, h in zip(caps, sr.host_most)]
        if not self.space.free_split:  # the target's splits only (build_space checked the first rank's minimum)
            return next((fixed for fixed in self.space.fixed_splits(p, pr.v)
                         if all(c >= max(n, pr.min_layers) for c, n in zip(caps, fixed))), None)
        mins = [pr.first_min] + [pr.min_layers] * (p - 2) + [pr.last_min] if p > 1 else [pr.first_min]
        if any(c < lo for c, lo in zip(caps, mins)) or sum(caps) < L or sum(mins) > L:
            return None
        if self.space.first_last_only and p > 2:  # equal middle ranks: the largest middle count that leaves a fit
            lo = pr.min_layers
            for k in range(min(caps[1:-1]), lo - 1, -1):
                rest = L - (p - 2) * k
                first = min(caps[0], rest - lo)
                if first >= pr.first_min and max(lo, pr.last_min) <= rest - first <= caps[-1]:
                    return (first, *[k] * (p - 2), rest - first)
            return None
        split, left = mins, L - sum(mins)
        for r in range(p):
            extra = min(caps[r] - split[r], left)
            split[r] += extra
            left -= extra
        return tuple(split)

    def materialise(self, pairs: list[tuple[int, int]], *, update: bool = True) -> None:
        """Fill in the memory coefficients (and, with update, the update tables) of these rows."""
        model, cluster, training = self.problem
        L = model.num_layers
        for i in sorted({i for i, _ in pairs}):
            row = self.pipe[i]
            if row.act is None:
                sh = self.space.shapes[row.shape]
                lay = self.space.layouts(sh, None, self.space.rc_options(sh)[row.rc], row.zero)
                row.act = _activation_rows(model, cluster, training, lay, row.min_layers)
        for j in sorted({j for _, j in pairs}):
            row = self.static[j]
            sh = self.space.shapes[row.shape]
            p, hi = sh.pp, L - sh.pp + 1
            lay = self.space.layouts(sh, None, ("none", None), row.zero)
            if row.mem is None:
                kinds = {r: _linear(lambda n, r=r: _bytes(stage_static_items(model, training, lay, r, n)), 1)
                         for r in _positions(p)}
                row.mem = tuple(kinds[_position(r, p)] for r in range(p))
                if training.optimizer_offload:
                    host = {r: _host_most(model, cluster, training, lay, r, hi) for r in _positions(p)}
                    row.host_most = tuple(host[_position(r, p)] for r in range(p))
            if update and row.update is None:
                # one table serves every vpp, unless the rank's layer kinds follow its virtual stages (a
                # hybrid pattern, dense layers between MoE ones: planner.memory.symbols_on, dense_layers_on)
                key = (lay if model.kinds_follow_split else lay.model_copy(update={"vpp": 1, "overlap_p2p": None}), p)
                if key not in self._updates:
                    upd = {}
                    for r in _positions(p):
                        most = _most_layers((0, 0), row.mem[r], self.capacity_mib, hi)
                        vals = [stage_update_time(model, cluster, training, lay, r, n).units
                                for n in range(1, max(1, most) + 1)]
                        upd[r] = tuple([vals[0]] + vals + [max(vals)] * (hi - max(1, most)))
                    self._updates[key] = upd
                upd = self._updates[key]
                row.update = tuple(upd[_position(r, p)] for r in range(p))
                floor = max(min(u[1:]) for u in upd.values())  # the slowest rank's update is at least each rank's least
                row.lower = max(row.lower, floor)


def _host_most(model, cluster, training, lay, r: int, hi: int) -> int:
    """The most layers (<= hi) rank r holds with its offloaded optimizer states within its share of
    host memory (the bytes grow with the layers; 0 when even one layer does not fit)."""
    cap = cluster.host_memory_per_gpu

    def fits(n: int) -> bool:
        return stage_host_bytes(model, training, lay, r, n) <= cap

    one = stage_host_bytes(model, training, lay, r, 1)
    per = stage_host_bytes(model, training, lay, r, 2) - one
    n = hi if per <= 0 else max(0, min(hi, 1 + int((cap - one) // per)))  # affine in n: a guess, then exact
    while n > 0 and not fits(n):
        n -= 1
    while n < hi and fits(n + 1):
        n += 1
    return n


def _most_layers(act: tuple[int, int], mem: tuple[int, int], cap_mib: int, hi: int) -> int:
    """The most layers (<= hi) a rank holds within cap_mib, with both parts rounded up to MiB as
    the model rounds them (0 when even one layer does not fit)."""
    def mib(per_fixed, n):
        return -(-(per_fixed[0] * n + per_fixed[1]) // KIB_PER_MIB)

    per = act[0] + mem[0]
    n = hi if per <= 0 else min(hi, max(0, (cap_mib * KIB_PER_MIB - act[1] - mem[1]) // per))
    while n > 0 and mib(act, n) + mib(mem, n) > cap_mib:
        n -= 1
    while n < hi and mib(act, n + 1) + mib(mem, n + 1) <= cap_mib:
        n += 1
    return n


def _activation_rows(model, cluster, training, lay, n0: int) -> tuple[tuple[int, int], ...]:
    """Per rank (KiB per layer, fixed KiB) of stage_activation_items, linear in the layers from
    n0 on. Middle ranks differ only in their in-flight micro-batches, in which the items are
    affine, so two middle ranks with different counts give every middle rank's coefficients."""
    p = lay.pp
    m = num_microbatches(training, lay)

    def at(r):
        return _linear(lambda n: _bytes(stage_activation_items(model, cluster, training, lay, r, n)), n0)

    out = {r: at(r) for r in _positions(p)}
    if p > 3:
        flight = [in_flight_microbatches(lay, r, m) for r in range(p)]
        r2 = next((r for r in range(2, p - 1) if flight[r] != flight[1]), None)
        if r2 is not None:
            out[r2] = at(r2)
            f1, f2 = flight[1], flight[r2]
            for r in range(2, p - 1):
                if r not in out:
                    out[r] = tuple(math.ceil(a + (flight[r] - f1) * (b - a) / (f2 - f1) - 1e-9)
                                   for a, b in zip(out[1], out[r2]))
        else:
            for r in range(2, p - 1):
                out[r] = out[1]
    return tuple(out[r] for r in range(p))


def _linear(f, n0: int) -> tuple[int, int]:
    """(per layer, fixed) whole KiB of an affine function of the layer count (bytes), rounded up."""
    a, b = f(n0), f(n0 + 1)
    slope = b - a
    return math.ceil(slope / 1024 - 1e-9), math.ceil((a - slope * n0) / 1024 - 1e-9)


def _bytes(items) -> float:
    return sum(i.bytes for i in items)


def _rc_kind(rc: tuple[str, int | None]) -> tuple[str, int]:
    """('none' | 'all' | 'fixed', the layers every rank must hold: R for a partial recompute, else 1)."""
    if rc[0] == Recompute.NONE.value:
        return "none", 1
    if rc[0] == Recompute.FULL.value and rc[1] is not None:
        return "fixed", max(1, rc[1])
    return "all", 1


def build_rows(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, space: Space,
               *, deadline: float | None = None) -> Rows:
    """Every configuration's time coefficients and lower bounds (see the module docstring); memory
    and update tables come later, for the rows a bound keeps (Rows.materialise). With a deadline
    (time.perf_counter() value) tabulation stops there and marks the rows incomplete: the rows then
    come from the space's first shapes. A large space is priced by PRICING_WORKERS processes
    (_priced_shapes), shape by shape as here, into the same rows in the same order."""
    t = Rows(space, (model, cluster, training), capacity_mib=int(cluster.gpu.memory // MEM_UNIT_BYTES))
    priced = _priced_shapes(model, cluster, training, space, deadline)
    for pipe, static, too_slow in priced:
        t.pipe.extend(pipe)
        t.static.extend(static)
        t.too_slow += too_slow
    t.complete = len(priced) == len(space.shapes)
    return t


ShapeRows = tuple[list[PipeRow], list[StaticRow], int]
"""One shape's pipeline rows, static rows and the rows dropped as too slow."""


def _shape_rows(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, space: Space, si: int) -> ShapeRows:
    """The rows of shape `si` (build_rows)."""
    L = model.num_layers
    sh = space.shapes[si]
    p = sh.pp
    pipe, static, too_slow = [], [], 0
    for ri, rc in enumerate(space.rc_options(sh)):
        kind, lo = _rc_kind(rc)
        first = max(lo, first_rank_min_layers(model, training, sh.vpp)) if p > 1 else lo
        last = max(lo, last_rank_min_layers(training, sh.vpp)) if p > 1 else lo
        for zeros in _zero_classes(training, space, sh, rc):
            lay = space.layouts(sh, None, rc, min(zeros) if zeros else 0)
            coef = ranks_coefficients(model, cluster, training, lay, tuple(_positions(p)))
            times = tuple(coef[_position(r, p)] for r in range(p))
            row = PipeRow(si, ri, num_microbatches(training, lay), sh.vpp, lo, first, kind, times, 0, zeros=zeros,
                          last_min=last)
            row.lower = _pipe_lower(L, row)
            if row.lower > TIME_CAP_US or any(c.units(lo, lo) > STAGE_CAP_US for c in times):
                too_slow += 1
                continue
            pipe.append(row)
    for z in space.zeros[p]:
        lay = space.layouts(sh, None, ("none", None), z)
        # some rank holds ceil(L/p) layers or more, and a rank's step grows with its layers; which
        # rank is open (the first, with leading dense layers, may step less than a middle one)
        lower = min(us_units(stage_optimizer_time(model, cluster, training, lay, r, -(-L // p))) for r in _positions(p))
        static.append(StaticRow(si, z, lower))
    return pipe, static, too_slow


PRICING_WORKERS = min(8, usable_cpus())
"""Processes that price a large space's rows (build_rows); 1 prices every space in this process.
planner.sweep's workers set it to 1 (they run side by side already)."""
PARALLEL_MIN_SHAPES = 3000
"""Spaces with fewer shapes are priced in this process. Measured on 2 cores (2026-12-07): DeepSeek-V3 on
1,024 H100, 6,052 shapes, 3.0-3.7 s of pricing in one process, 2.2-2.5 s in two; Mixtral-8x7B on 32 H100
(1,848 shapes, 0.6 s) and Llama-3-70B on 64 (1,532, 0.5 s) gain nothing: forking, sending rows back and
the parent's caches left cold cost what the second CPU saves."""
PRICING_CHUNKS_PER_WORKER = 4
"""Consecutive runs of shapes handed out per worker: shapes differ in cost (pipeline degrees, recompute
options), so several runs a worker keep the workers' loads level."""

_JOB: tuple | None = None
"""(model, cluster, training, space, deadline) of the pricing in progress: forked workers inherit it, so
nothing is pickled on the way in."""


def _priced_shapes(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, space: Space,
                   deadline: float | None) -> list[ShapeRows]:
    """_shape_rows of the space's shapes in order, up to the first the deadline cut off. Where the space has
    PARALLEL_MIN_SHAPES shapes or more, PRICING_WORKERS > 1, the platform forks (Linux; a daemonic
    process may not have children) and no other Python thread runs (a fork copies the locks another thread
    may hold: a caller's threads keep the pricing in-process), forked workers price consecutive runs of
    shapes, each stopping at the deadline; their runs come back in order, so the rows are the serial ones
    (time.perf_counter is the system's monotonic clock there, the same in every process)."""
    n = len(space.shapes)
    workers = min(PRICING_WORKERS, max(1, n // (PARALLEL_MIN_SHAPES // 2)))
    if (n < PARALLEL_MIN_SHAPES or workers <= 1 or not sys.platform.startswith("linux")
            or multiprocessing.current_process().daemon or threading.active_count() > 1):
        return _price_run(model, cluster, training, space, deadline, 0, n)
    global _JOB
    size = -(-n // (workers * PRICING_CHUNKS_PER_WORKER))
    runs = [(lo, min(n, lo + size)) for lo in range(0, n, size)]
    _JOB = (model, cluster, training, space, deadline)
    try:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            parts = pool.map(_price_job_run, runs, chunksize=1)
    except OSError:  # the system refused the processes (limits, memory): price here
        return _price_run(model, cluster, training, space, deadline, 0, n)
    finally:
        _JOB = None
    out: list[ShapeRows] = []
    for (lo, hi), part in zip(runs, parts):
        out.extend(part)
        if len(part) < hi - lo:  # the deadline stopped this run: later runs would leave a gap
            break
    return out


def _price_run(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, space: Space, deadline: float | None,
               lo: int, hi: int) -> list[ShapeRows]:
    """_shape_rows of shapes lo .. hi - 1, stopping at the deadline."""
    out = []
    for si in range(lo, hi):
        if deadline is not None and time.perf_counter() > deadline:
            break
        out.append(_shape_rows(model, cluster, training, space, si))
    return out


def _price_job_run(run: tuple[int, int]) -> list[ShapeRows]:
    """_price_run of one run of shapes in a forked worker, on the job it inherited (_JOB)."""
    assert _JOB is not None
    model, cluster, training, space, deadline = _JOB
    return _price_run(model, cluster, training, space, deadline, *run)


def _zero_classes(training: TrainingSpec, space: Space, sh, rc) -> list[frozenset[int] | None]:
    """The shape's ZeRO stages grouped by what they add to the micro-batch time (the gradient
    accumulation, cost.accumulation_bytes): [None] where no stage adds anything, so one
    pipeline row serves every static row; else one row per group."""
    zs = space.zeros[sh.pp]
    if not accumulates_apart(training):  # no stage adds anything: skip building the layouts
        return [None]
    per = {z: accumulation_bytes(training, space.layouts(sh, None, rc, z)) for z in zs}
    if not any(per.values()):
        return [None]
    return [frozenset(z for z in zs if per[z] == v) for v in dict.fromkeys(per[z] for z in zs)]


def _positions(p: int) -> list[int]:
    """Ranks whose coefficients differ by position: the first, a middle one, the last."""
    return sorted({0, min(1, p - 1), p - 1})


def _position(r: int, p: int) -> int:
    """The rank of _positions(p) that rank r has the coefficients of."""
    return 0 if r == 0 else (p - 1 if r == p - 1 else 1)


@dataclass
class Model:
    """A built CP-SAT model and the handles the search reads back."""

    model: cp_model.CpModel
    x: dict[int, Any]
    """pipeline row index -> Boolean."""
    y: dict[int, Any]
    """static row index -> Boolean."""
    layers: dict[int, list]
    """pp -> the per-rank layer-count variables."""
    objective: Any
    peak: Any
    rank: Any


def build_model(rows: Rows, pairs: list[tuple[int, int]]) -> Model | None:
    """The CP-SAT model over the configurations `pairs` (pipeline row, static row) and every split
    (see the module docstring); None when there is none."""
    space = rows.space
    shapes = space.shapes
    xs = list(pairs)
    if not xs:
        return None
    rows.materialise(xs)
    px = sorted({i for i, _ in xs})
    sy = sorted({j for _, j in xs})
    m = cp_model.CpModel()
    x = {i: m.new_bool_var(f"x{i}") for i in px}
    y = {j: m.new_bool_var(f"y{j}") for j in sy}
    m.add_exactly_one(x.values())
    by_shape: dict[int, tuple[list[int], list[int]]] = {}
    for i in px:
        by_shape.setdefault(rows.pipe[i].shape, ([], []))[0].append(i)
    for j in sy:
        by_shape.setdefault(rows.static[j].shape, ([], []))[1].append(j)
    for pi, sj in by_shape.values():
        m.add(sum(x[i] for i in pi) == sum(y[j] for j in sj))
    cap = rows.capacity_mib
    groups: dict[int, tuple[list[int], list[int]]] = {}
    for i in px:
        groups.setdefault(shapes[rows.pipe[i].shape].pp, ([], []))[0].append(i)
    for j in sy:
        groups.setdefault(shapes[rows.static[j].shape].pp, ([], []))[1].append(j)
    layers, pipes, updates, peaks = {}, [], [], []
    for p, (pi, sj) in sorted(groups.items()):
        n, pipe, upd, peak = _add_group(m, rows, p, pi, sj, x, y, cap)
        layers[p] = n
        pipes.append(pipe)
        updates.append(upd)
        peaks.append(peak)
    objective = m.new_int_var(0, 2 * TIME_CAP_US, "objective")
    m.add(objective == sum(pipes) + sum(updates))
    # each configuration's lower bound over all splits, as a cut: it gives the relaxation the
    # bound the enforced constraints alone do not
    m.add(objective >= sum(rows.pipe[i].lower * x[i] for i in px) + sum(rows.static[j].lower * y[j] for j in sy))
    peak = m.new_int_var(0, 2 * MEM_CAP_MIB, "peak")
    for q in peaks:
        m.add(peak >= q)
    allowed = set(xs)
    for i in px:  # a pipeline row goes only with the static rows it is paired with here
        for j in by_shape[rows.pipe[i].shape][1]:
            if (i, j) not in allowed:
                m.add_bool_or([x[i].Not(), y[j].Not()])
    rank = sum(4 * i * x[i] for i in px) + sum(rows.static[j].zero * y[j] for j in sy)
    return Model(m, x, y, layers, objective, peak, rank)


def _add_group(m: cp_model.CpModel, rows: Rows, p: int, pi: list[int], sj: list[int], x, y, cap: int):
    """Variables and constraints of one pipeline degree (shared by its rows: one row is chosen)."""
    L = rows.num_layers
    hi = L - p + 1
    options = {} if rows.space.free_split else {v: rows.space.fixed_splits(p, v) for v in {rows.pipe[i].v for i in pi}}
    alts = list(dict.fromkeys(c for v in sorted(options) for c in options[v]))
    if rows.space.free_split or not alts:
        n = [m.new_int_var(1, hi, f"n{p}_{r}") for r in range(p)]
    elif len(alts) == 1:  # the target places the layers itself: its split only (Space.fixed_splits)
        n = [m.new_int_var(k, k, f"n{p}_{r}") for r, k in enumerate(alts[0])]
    else:  # one of the splits the target makes (torchtitan's weights), those of the chosen row's vpp
        z = [m.new_bool_var(f"s{p}_{k}") for k in range(len(alts))]
        m.add_exactly_one(z)
        n = [m.new_int_var(min(c[r] for c in alts), max(c[r] for c in alts), f"n{p}_{r}") for r in range(p)]
        for r in range(p):
            m.add(n[r] == sum(c[r] * zk for c, zk in zip(alts, z)))
        for i in pi:
            made = set(options[rows.pipe[i].v])
            for c, zk in zip(alts, z):
                if c not in made:
                    m.add_implication(x[i], zk.Not())
    m.add(sum(n) == L)
    # Middle ranks differ only in in-flight micro-batches, which do not rise with the rank, so the
    # later the rank, the fewer bytes per layer. Swapping two middle ranks' counts so the later
    # one holds more keeps every time term (they are the same function of n) and keeps memory
    # within capacity: the larger count moves to the rank with the smaller per-layer bytes.
    for r in range(1, p - 2) if rows.space.free_split else ():
        if rows.space.first_last_only:
            m.add(n[r] == n[r + 1])
        else:
            m.add(n[r] <= n[r + 1])
    tcap = min(STAGE_CAP_US, 2**56 // max(rows.pipe[i].v * rows.pipe[i].m for i in pi)) if pi else STAGE_CAP_US
    t = [m.new_int_var(0, tcap, f"t{p}_{r}") for r in range(p)]
    tmax = m.new_int_var(0, tcap, f"tmax{p}")
    for r in range(p):
        m.add(tmax >= t[r])
    pipe = m.new_int_var(0, TIME_CAP_US, f"pipe{p}")
    need_e = any(rows.pipe[i].time[r].p2p_hidden > 0 for i in pi for r in range(p))
    e = [m.new_int_var(0, tcap, f"e{p}_{r}") for r in range(p)] if need_e else None
    act = [m.new_int_var(0, MEM_CAP_MIB, f"act{p}_{r}") for r in range(p)]
    stat = [m.new_int_var(0, MEM_CAP_MIB, f"stat{p}_{r}") for r in range(p)]
    for i in pi:
        row, lit = rows.pipe[i], x[i]
        if row.min_layers > 1:
            for r in range(p):
                m.add(n[r] >= row.min_layers).only_enforce_if(lit)
        if row.first_min > row.min_layers:
            m.add(n[0] >= row.first_min).only_enforce_if(lit)
        if row.last_min > row.min_layers:
            m.add(n[p - 1] >= row.last_min).only_enforce_if(lit)
        for r in range(p):
            c = row.time[r]
            rc = {"none": 0, "all": c.per_recomputed * n[r], "fixed": c.per_recomputed * row.min_layers}[row.recompute]
            if c.p2p_hidden > 0:
                m.add(e[r] >= c.p2p - c.p2p_hidden * n[r]).only_enforce_if(lit)
                exposed = e[r]
            else:
                exposed = c.p2p
            m.add(t[r] >= c.per_layer * n[r] + rc + c.fixed + exposed).only_enforce_if(lit)
            per, fixed = row.act[r]
            m.add(KIB_PER_MIB * act[r] >= per * n[r] + fixed).only_enforce_if(lit)
        m.add(row.v * pipe >= (row.v * row.m - 1) * tmax + sum(t)).only_enforce_if(lit)
    m.add(pipe >= sum(rows.pipe[i].lower * x[i] for i in pi))
    upd = m.new_int_var(0, TIME_CAP_US, f"upd{p}")
    m.add(upd >= sum(rows.static[j].lower * y[j] for j in sj))
    # the update tables read n through its value encoding (one Boolean per count, shared by every
    # static row of the group): a linear form, tight in the relaxation, instead of one element each
    eq: dict[int, list] = {}
    for j in sj:
        row, lit = rows.static[j], y[j]
        for r in _update_ranks(row, p, rows.space.free_split):
            if r not in eq:
                eq[r] = [m.new_bool_var("") for _ in range(hi + 1)]
                m.add(eq[r][0] == 0)
                m.add_exactly_one(eq[r])
                m.add(n[r] == sum(k * b for k, b in enumerate(eq[r])))
            base = min(row.update[r][1:])
            m.add(upd >= base + sum((v - base) * b for v, b in zip(row.update[r], eq[r]) if v != base)).only_enforce_if(lit)
        for r in range(p):
            per, fixed = row.mem[r]
            m.add(KIB_PER_MIB * stat[r] >= per * n[r] + fixed).only_enforce_if(lit)
            if row.host_most is not None:  # the offloaded optimizer states within host memory
                m.add(n[r] <= row.host_most[r]).only_enforce_if(lit)
    peak = m.new_int_var(0, 2 * MEM_CAP_MIB, f"peak{p}")
    for r in range(p):
        m.add(peak >= act[r] + stat[r])
        m.add(act[r] + stat[r] <= cap)
    return n, pipe, upd, peak


def _update_ranks(row: StaticRow, p: int, sorted_middle: bool) -> list[int]:
    """Ranks whose update term can be the largest: all, unless the middle ranks' counts are sorted
    (a free split, whose symmetry constraint sorts them; the splits DeepSpeed and torchtitan make
    put their extra layers first) and their table is monotone: then the middle rank with the fewest
    or the most layers speaks for them."""
    if p <= 3 or not sorted_middle:
        return list(range(p))
    mid = row.update[1]
    if all(a <= b for a, b in zip(mid, mid[1:])):
        return [0, p - 2, p - 1]
    if all(a >= b for a, b in zip(mid, mid[1:])):
        return [0, 1, p - 1]
    return list(range(p))


def _pipe_lower(L: int, row: PipeRow) -> int:
    """A lower bound on the pipeline term over every split, v PIPE >= (v m - 1) T_max + sum T_r:

    each rank r with n_r layers costs at least a_r n_r + b_r (a_r: per layer, plus the recompute
    term when every layer recomputes; b_r: the fixed terms, plus R recomputed layers under a
    partial recompute; the p2p term only adds). sum T_r >= the least sum over integer splits with
    n_r >= min_layers (the cheapest slope takes the spare layers), and T_max >= the least
    achievable maximum (water-filling: the smallest T with sum_r floor((T - b_r) / a_r) >= L).
    Each is a bound on its own term for every split, so the combination bounds the objective."""
    p, lo = len(row.time), row.min_layers  # lo * p > L: no split at all (Rows.fits says so), any bound holds
    every = row.recompute == "all"
    a = [c.per_layer + (c.per_recomputed if every else 0) for c in row.time]
    b = [c.fixed + (c.per_recomputed * lo if row.recompute == "fixed" else 0) for c in row.time]
    total = sum(a_r * lo + b_r for a_r, b_r in zip(a, b)) + min(a) * (L - lo * p)
    hi_n = L - lo * (p - 1)

    kinds: dict[tuple[int, int], int] = {}  # ranks share coefficients by position: few distinct (a, b)
    for ab in zip(a, b):
        kinds[ab] = kinds.get(ab, 0) + 1

    def fits(t: int) -> bool:  # can every rank stay within t while the counts add up to L?
        room = 0
        for (a_r, b_r), count in kinds.items():
            n = min(hi_n, (t - b_r) // a_r) if a_r > 0 else hi_n
            if n < lo:
                return False
            room += count * n
        return room >= L

    t_lo, t_hi = max(a_r * lo + b_r for a_r, b_r in kinds), max(a_r * hi_n + b_r for a_r, b_r in kinds)
    slopes = [(a_r, b_r, count) for (a_r, b_r), count in kinds.items() if a_r > 0]
    if slopes:  # bracket the search: room(t) <= sum count (t - b_r) / a_r, so t_lo >= where that reaches L;
        # without a cap binding, room(t) > sum count ((t - b_r) / a_r - 1), so t_c + sum count / sum (count / a_r) fits
        rate = sum(c / a_r for a_r, _, c in slopes)
        t_c = (L - sum(count * hi_n for (a_r, _), count in kinds.items() if a_r <= 0)
               + sum(c * b_r / a_r for a_r, b_r, c in slopes)) / rate
        t_lo = min(t_hi, max(t_lo, math.floor(t_c)))
        guess = math.ceil(t_c + sum(c for _, _, c in slopes) / rate) + 1
        if t_lo < guess < t_hi and fits(guess):
            t_hi = guess
    while t_lo < t_hi:
        mid = (t_lo + t_hi) // 2
        if fits(mid):
            t_hi = mid
        else:
            t_lo = mid + 1
    return ((row.v * row.m - 1) * t_lo + total) // row.v


def solver(time_limit_s: float, *, workers: int = NUM_WORKERS) -> cp_model.CpSolver:
    """A CP-SAT solver with the search's fixed parameters."""
    s = cp_model.CpSolver()
    s.parameters.max_time_in_seconds = max(0.001, time_limit_s)
    s.parameters.num_workers = workers
    s.parameters.random_seed = RANDOM_SEED
    return s
