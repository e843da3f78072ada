"""Prediction intervals and out-of-memory risk.

A prediction is off by a factor exp(r) where r = ln(measured / predicted). Out of sample, r is
centred on `bias` with spread `sigma` (a normal in log space; PredictionError). The numbers come
from, in order: the cluster's own `prediction_error` (written by planner calibrate from the
user's logs), else the out-of-sample residuals of the published runs of the same workload (dense
BF16/FP16, dense low precision, MoE: workload()), GPU generation and kernel family, else of the
same workload pooled (PUBLISHED, written by benchmarks/intervals.py) -- with the memory error of the
dense runs of that kernel family where none of the workload's ran it -- else the dense runs pooled.
An MoE or FP8 job therefore carries the error measured on MoE or FP8 runs, not the dense one.

FP8_SPEEDUPS, from the same residuals, says how the model's FP8-over-BF16 speedup compared with the measured one
where a source published one layout in both precisions (fp8_speedup_note words it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from typing import Literal

from planner.specs import FP8_SCALING, ClusterSpec, Fp8Scaling, ModelSpec, PredictionError, TrainingSpec

__all__ = ["Interval", "Workload", "workload", "model_key", "model_error", "table_key", "prediction_error", "interval",
           "oom_risk", "peak_for_risk", "LEVELS", "PUBLISHED", "POOLED", "MODELS", "SpeedupCheck", "FP8_SPEEDUPS",
           "fp8_speedup_check", "fp8_speedup_note"]

LEVELS = (0.8, 0.95)
"""The interval levels reported."""

_N = NormalDist()

Workload = Literal["dense", "low-precision", "moe"]


def workload(model: ModelSpec | None, training: TrainingSpec) -> Workload:
    """Which published runs speak for a job: an MoE model's (any precision), a dense FP8/MXFP8
    job's, or the dense BF16/FP16 ones (also where no model is given)."""
    if model is not None and model.moe is not None:
        return "moe"
    return "low-precision" if training.fp8 is not None else "dense"


ModelKey = tuple[str, int, int, int, int, int, int | None, int | None, int | None, int | None]


def model_key(model: ModelSpec) -> ModelKey:
    """What identifies a model across catalog ids, YAML files, Hugging Face configs and published rows: its
    family and shapes (layers, hidden size, heads, KV heads, vocabulary; the dense FFN width, or the
    experts, top-k and expert width of an MoE model), not its name."""
    e = model.moe
    return (model.family.value, model.num_layers, model.hidden_size, model.num_attention_heads, model.kv_heads,
            model.vocab_size, None if e else model.ffn_hidden_size, e.num_experts if e else None,
            e.top_k if e else None, e.expert_ffn_hidden_size if e else None)


# Written by `python benchmarks/intervals.py --write` from the out-of-sample residuals of benchmarks/data/
# published_runs.yaml (dense BF16/FP16 rows: leave-one-source-group-out refits; its FP8 rows) and
# moe_runs.yaml, predicted with the BF16 rows' parameters refitted without the row's group. Memory: the
# rows that publish a peak, per kernel family: only eager-kernel (torchtitan) peaks are published, so
# fused-kernel entries keep memory bias 0. Keyed by (workload, GPU arch, kernels): 8 = A100, 9 = H100/H200,
# 10 = Blackwell; 'fused' = Megatron/NeMo, 'unfused' = eager PyTorch trainers (torchtitan, MPT/LLM Foundry,
# DeepSpeed); arch None: every GPU (the step-time terms of every row of the workload, the memory terms of
# that kernel family's peaks); arch and kernels None: every row of the workload.
PUBLISHED: dict[tuple[Workload, int | None, str | None], PredictionError] = {
    ('dense', 8, 'unfused'): PredictionError(step_time_bias=-0.0127, step_time_sigma=0.0445, ranking_sigma=0.0416, memory_bias=0.0333, memory_sigma=0.0500, basis="89 published runs (3 source groups; arch 8, unfused kernels), each predicted out of its source group"),
    ('dense', 9, 'unfused'): PredictionError(step_time_bias=-0.1027, step_time_sigma=0.1306, ranking_sigma=0.1063, memory_bias=0.0333, memory_sigma=0.0500, basis="66 published runs (3 source groups; arch 9, unfused kernels), each predicted out of its source group"),
    ('dense', None, 'unfused'): PredictionError(step_time_bias=-0.0127, step_time_sigma=0.0917, ranking_sigma=0.0870, memory_bias=0.0333, memory_sigma=0.0500, basis="165 published runs (5 source groups; all GPUs, memory from unfused-kernel peaks), each predicted out of its source group"),
    ('dense', None, None): PredictionError(step_time_bias=-0.0127, step_time_sigma=0.0917, ranking_sigma=0.0870, memory_bias=0.0000, memory_sigma=0.0500, basis="165 published runs (5 source groups; all GPUs and kernels), each predicted out of its source group"),
    ('low-precision', None, 'unfused'): PredictionError(step_time_bias=-0.1147, step_time_sigma=0.1864, ranking_sigma=0.0611, memory_bias=0.0540, memory_sigma=0.0939, basis="26 published FP8 runs (4 source groups; all GPUs, memory from unfused-kernel peaks), each predicted out of its source group"),
    ('low-precision', None, None): PredictionError(step_time_bias=-0.1147, step_time_sigma=0.1864, ranking_sigma=0.0611, memory_bias=0.0000, memory_sigma=0.0500, basis="26 published FP8 runs (4 source groups; all GPUs and kernels), each predicted out of its source group"),
    ('moe', 10, 'fused'): PredictionError(step_time_bias=0.1032, step_time_sigma=0.2170, ranking_sigma=0.2001, memory_bias=0.0000, memory_sigma=0.0500, basis="79 published MoE runs (3 source groups; arch 10, fused kernels), each predicted out of its source group"),
    ('moe', None, None): PredictionError(step_time_bias=0.0945, step_time_sigma=0.2202, ranking_sigma=0.2043, memory_bias=0.0000, memory_sigma=0.0500, basis="95 published MoE runs (3 source groups; all GPUs and kernels), each predicted out of its source group"),
}
POOLED = PUBLISHED[("dense", None, None)]

# Written by `python benchmarks/intervals.py --write`: the models whose published runs on one GPU architecture
# (at least MIN_MODEL_ROWS of them, each predicted out of its source group, as PUBLISHED's are) have a median
# ln(measured / predicted step time) outside the 80 % interval the table above would give them. Keyed by
# (workload, model_key, GPU arch, kernel family: one stack's miss says nothing of another's); bias the median,
# sigma the larger of the table's and the rows' own spread.
MODELS: dict[tuple[Workload, ModelKey, int, str], PredictionError] = {
    ('dense', ('gpt', 48, 7168, 56, 56, 50368, 28672, None, None, None), 8, 'unfused'): PredictionError(step_time_bias=-0.1080, step_time_sigma=0.0779, ranking_sigma=0.0416, memory_bias=0.0333, memory_sigma=0.0500, basis="a gpt model of 48 layers, hidden 7168: 7 published runs on A100 with unfused kernels (1 source group) took 0.88-1.27x the predicted step time (median 0.90x), each predicted out of its source group"),
    ('moe', ('llama', 36, 2880, 64, 8, 201088, None, 128, 4, 2880), 10, 'fused'): PredictionError(step_time_bias=0.5012, step_time_sigma=0.2170, ranking_sigma=0.2001, memory_bias=0.0000, memory_sigma=0.0500, basis="gpt-oss-120b: 13 published MoE runs on Blackwell with fused kernels (1 source group) took 1.50-2.38x the predicted step time (median 1.65x), each predicted out of its source group"),
    ('moe', ('llama', 88, 4096, 32, 2, 131072, None, 512, 22, 2688), 10, 'fused'): PredictionError(step_time_bias=0.4078, step_time_sigma=0.2170, ranking_sigma=0.2001, memory_bias=0.0000, memory_sigma=0.0500, basis="nemotron-3-super-120b-a12b: 8 published MoE runs on Blackwell with fused kernels (1 source group) took 1.01-1.59x the predicted step time (median 1.50x), each predicted out of its source group"),
}


@dataclass(frozen=True)
class SpeedupCheck:
    """How the model's FP8-over-BF16 speedup compared with the measured one on the published pairs (one layout
    run in both precisions by one source) of a stack: points = 100 x (predicted - measured speedup), each run
    predicted out of its source group."""

    pairs: int
    median_points: float
    lo_points: float
    hi_points: float
    basis: str


# Written by `python benchmarks/intervals.py --write` (speedup_checks) from the same out-of-sample residuals as
# PUBLISHED. Keyed by (dense or MoE, GPU arch, kernel family, the recipe's scaling: specs.FP8_SCALING) of the FP8
# run: how far explain's FP8 sensitivity and plan's FP8 choice can be trusted, where someone published both
# precisions of one layout on that stack with a recipe that scales the same way (torchao's row-wise and
# tensor-wise gains of one layout missed in opposite directions).
FP8_SPEEDUPS: dict[tuple[Literal['dense', 'moe'], int, str, Fp8Scaling], SpeedupCheck] = {
    ('dense', 10, 'unfused', 'block'): SpeedupCheck(pairs=3, median_points=-5.7, lo_points=-10.6, hi_points=-2.8, basis="3 published FP8/BF16 pairs of one layout (dense models on Blackwell with unfused kernels and block scaling, 2 source groups; measured 1.16x, 1.28x, 1.32x), each run predicted out of its source group"),
    ('dense', 10, 'unfused', 'per-tensor'): SpeedupCheck(pairs=1, median_points=-7.1, lo_points=-7.1, hi_points=-7.1, basis="1 published FP8/BF16 pair of one layout (dense models on Blackwell with unfused kernels and per-tensor scaling, 1 source group; measured 1.25x), each run predicted out of its source group"),
    ('dense', 10, 'unfused', 'row-wise'): SpeedupCheck(pairs=1, median_points=10.4, lo_points=10.4, hi_points=10.4, basis="1 published FP8/BF16 pair of one layout (dense models on Blackwell with unfused kernels and row-wise scaling, 1 source group; measured 1.04x), each run predicted out of its source group"),
    ('dense', 9, 'unfused', 'per-tensor'): SpeedupCheck(pairs=4, median_points=-13.8, lo_points=-31.9, hi_points=-5.7, basis="4 published FP8/BF16 pairs of one layout (dense models on Hopper with unfused kernels and per-tensor scaling, 3 source groups; measured 1.28x, 1.29x, 1.62x, 1.25x), each run predicted out of its source group"),
    ('dense', 9, 'unfused', 'row-wise'): SpeedupCheck(pairs=1, median_points=5.8, lo_points=5.8, hi_points=5.8, basis="1 published FP8/BF16 pair of one layout (dense models on Hopper with unfused kernels and row-wise scaling, 1 source group; measured 1.10x), each run predicted out of its source group"),
    ('moe', 10, 'fused', 'block'): SpeedupCheck(pairs=1, median_points=10.6, lo_points=10.6, hi_points=10.6, basis="1 published FP8/BF16 pair of one layout (MoE models on Blackwell with fused kernels and block scaling, 1 source group; measured 1.13x), each run predicted out of its source group"),
    ('moe', 10, 'fused', 'per-tensor'): SpeedupCheck(pairs=3, median_points=-10.5, lo_points=-10.6, hi_points=-7.5, basis="3 published FP8/BF16 pairs of one layout (MoE models on Blackwell with fused kernels and per-tensor scaling, 1 source group; measured 1.38x, 1.41x, 1.41x), each run predicted out of its source group"),
    ('moe', 10, 'unfused', 'block'): SpeedupCheck(pairs=1, median_points=-36.0, lo_points=-36.0, hi_points=-36.0, basis="1 published FP8/BF16 pair of one layout (MoE models on Blackwell with unfused kernels and block scaling, 1 source group; measured 1.43x), each run predicted out of its source group"),
    ('moe', 9, 'fused', 'per-tensor'): SpeedupCheck(pairs=1, median_points=-2.7, lo_points=-2.7, hi_points=-2.7, basis="1 published FP8/BF16 pair of one layout (MoE models on Hopper with fused kernels and per-tensor scaling, 1 source group; measured 1.15x), each run predicted out of its source group"),
}


def fp8_speedup_check(cluster: ClusterSpec, training: TrainingSpec, model: ModelSpec | None) -> SpeedupCheck | None:
    """The published FP8/BF16 pairs of this kind of model (dense or MoE) on this GPU architecture with these
    kernels and a recipe of the training's scaling (FP8_SPEEDUPS); None where none was published or the
    training is not low precision."""
    if training.fp8 is None:
        return None
    kind = "moe" if model is not None and model.moe is not None else "dense"
    return FP8_SPEEDUPS.get((kind, cluster.gpu.arch, training.kernels, FP8_SCALING[training.fp8]))


@dataclass(frozen=True)
class Interval:
    """A central prediction interval: the measured value falls in [lo, hi] with probability `level`."""

    level: float
    lo: float
    hi: float

    def contains(self, value: float) -> bool:
        return self.lo <= value <= self.hi


def table_key(table: dict, w: Workload, arch: int, kernels: str) -> tuple | None:
    """The most specific key a workload table (PUBLISHED, or benchmarks/intervals.py's before it is written) has
    for a job of workload `w` on GPU `arch` with `kernels`: (w, arch, kernels), else (w, None, kernels), else None
    (the workload's pooled entry, or prediction_error's fallbacks, apply)."""
    return next((key for key in ((w, arch, kernels), (w, None, kernels)) if key in table), None)


def model_error(cluster: ClusterSpec, training: TrainingSpec, model: ModelSpec | None) -> PredictionError | None:
    """The error measured on the published runs of this very model (model_key) on this GPU architecture with
    these kernels, of this workload, where they missed beyond the workload table's 80 % interval (MODELS);
    None where there is none, and on a cluster calibrated on the user's own logs, whose error replaces it."""
    if model is None or cluster.prediction_error is not None:
        return None
    return MODELS.get((workload(model, training), model_key(model), cluster.gpu.arch, training.kernels))


def prediction_error(cluster: ClusterSpec, training: TrainingSpec, model: ModelSpec | None) -> PredictionError:
    """The error model for predictions of `model` on `cluster` with `training`'s kernels (see the
    module doc; model None: a dense job's)."""
    if cluster.prediction_error is not None:
        return cluster.prediction_error
    own = model_error(cluster, training, model)
    if own is not None:
        return own
    w = workload(model, training)
    key = table_key(PUBLISHED, w, cluster.gpu.arch, training.kernels)
    if key is not None:
        return PUBLISHED[key]
    pooled = PUBLISHED.get((w, None, None), POOLED)
    memory = PUBLISHED.get(("dense", None, training.kernels))
    if w == "dense" or memory is None:
        return pooled
    # no run of this workload used these kernels (torchtitan's MoE): the step error pooled over the workload's
    # runs, the memory error of the dense runs that published peaks with them
    return PredictionError(**{
        **pooled.model_dump(), "memory_bias": memory.memory_bias, "memory_sigma": memory.memory_sigma,
        "basis": f"{pooled.basis}, none with {training.kernels} kernels; memory from the dense runs' "
                 f"{training.kernels}-kernel peaks"})


def fp8_speedup_note(check: SpeedupCheck | None) -> str:
    """What the published FP8/BF16 pairs of a stack (fp8_speedup_check) say of an FP8-over-BF16 gain the model
    prices for it (explain's FP8 sensitivity, plan's FP8 choice): the model's speedup against the measured one, in
    points, and which way to lean where the median missed by more than 5."""
    if check is None:
        return ("no published FP8/BF16 pair of one layout on this GPU generation and kernel family, with a recipe "
                "that scales the same way, checks this gain")
    m = round(check.median_points)
    points = f"{abs(m)} point{'s' * (abs(m) != 1)}"
    off = (f"{points} below the measured one" if m < 0 else f"{points} above the measured one" if m > 0
           else "within a point of the measured one")
    where = "" if check.pairs == 1 else f" (median; {check.lo_points:+.0f} to {check.hi_points:+.0f})"
    verdict = "; expect more from FP8 than this" if m < -5 else "; expect less from FP8 than this" if m > 5 else ""
    return f"on {check.basis}, the model's FP8 speedup was {off}{where}{verdict}"


def interval(predicted: float, bias: float, sigma: float, level: float) -> Interval:
    """The `level` interval of a measurement whose ln(measured/predicted) ~ N(bias, sigma)."""
    if not 0 < level < 1:
        raise ValueError(f"level: expected a probability in (0, 1), got {level!r}")
    z = _N.inv_cdf(0.5 + level / 2)
    return Interval(level, predicted * math.exp(bias - z * sigma), predicted * math.exp(bias + z * sigma))


def oom_risk(peak: float, capacity: float, error: PredictionError) -> float:
    """Probability that the measured peak exceeds `capacity` given the predicted `peak`."""
    if peak <= 0:
        return 0.0
    return 1.0 - _N.cdf((math.log(capacity / peak) - error.memory_bias) / error.memory_sigma)


def peak_for_risk(capacity: float, error: PredictionError, risk: float) -> float:
    """The largest predicted peak whose OOM risk is at most `risk` (the search's memory budget)."""
    if not 0 < risk < 1:
        raise ValueError(f"risk: expected a probability in (0, 1), got {risk!r}")
    return capacity * math.exp(-error.memory_bias - _N.inv_cdf(1 - risk) * error.memory_sigma)
