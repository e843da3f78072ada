"""Prediction intervals and out-of-memory risk.

A prediction is off by a factor exp(r) where r = ln(measured / predicted). Out of sample, r is
centred on `bias` with spread `sigma` (a normal in log space; PredictionError). The numbers come
from, in order: the cluster's own `prediction_error` (written by planner calibrate from the
user's logs), else the leave-one-source-group-out residuals of the published runs of the same
GPU generation and kernel family (PUBLISHED, written by benchmarks/intervals.py), else all
published runs pooled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from planner.specs import ClusterSpec, PredictionError, TrainingSpec

__all__ = ["Interval", "prediction_error", "interval", "oom_risk", "peak_for_risk", "LEVELS", "PUBLISHED", "POOLED"]

LEVELS = (0.8, 0.95)
"""The interval levels reported."""

_N = NormalDist()

# Written by `python benchmarks/intervals.py --write` from the leave-one-source-group-out residuals of
# benchmarks/data/published_runs.yaml (step time: every row; memory: the rows that publish a peak, per kernel family:
# only eager-kernel (torchtitan) peaks are published, so the pooled entry keeps memory bias 0).
# Keyed by (GPU arch, kernels): 8 = A100, 9 = H100/H200; 'fused' = Megatron/NeMo, 'unfused' = eager
# PyTorch trainers (torchtitan, MPT/LLM Foundry, DeepSpeed).
PUBLISHED: dict[tuple[int, str], PredictionError] = {
    (8, 'unfused'): PredictionError(step_time_bias=0.0013, step_time_sigma=0.0851, ranking_sigma=0.0774, memory_bias=0.0883, memory_sigma=0.0500, basis="89 published runs (3 source groups), arch 8, unfused kernels, leave-one-source-group-out"),
    (9, 'unfused'): PredictionError(step_time_bias=-0.0315, step_time_sigma=0.2265, ranking_sigma=0.2077, memory_bias=0.0883, memory_sigma=0.0500, basis="66 published runs (3 source groups), arch 9, unfused kernels, leave-one-source-group-out"),
}
POOLED = PredictionError(step_time_bias=0.0013, step_time_sigma=0.1184, ranking_sigma=0.1064, memory_bias=0.0000, memory_sigma=0.0500, basis="165 published runs of 5 source groups, leave-one-source-group-out")


@dataclass(frozen=True)
class Interval:
    """A central prediction interval: the measured value falls in [lo, hi] with probability `level`."""

    level: float
    lo: float
    hi: float

    def contains(self, value: float) -> bool:
        return self.lo <= value <= self.hi


def prediction_error(cluster: ClusterSpec, training: TrainingSpec) -> PredictionError:
    """The error model for predictions on `cluster` with `training`'s kernels (see the module doc)."""
    if cluster.prediction_error is not None:
        return cluster.prediction_error
    return PUBLISHED.get((cluster.gpu.arch, training.kernels), POOLED)


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
