"""Piecewise-linear interpolation on measured curves, clamped at their ends (numpy.interp's rule and
arithmetic, bit for bit, without its per-call array overhead: the search reads these curves some
10^5 times per plan)."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

__all__ = ["interp"]


def interp(x: float, xs: Sequence[float], ys: Sequence[float]) -> float:
    """ys at x, linear between the two nearest of the ascending xs; ys[0] / ys[-1] outside them."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    j = bisect_right(xs, x) - 1
    return (ys[j + 1] - ys[j]) / (xs[j + 1] - xs[j]) * (x - xs[j]) + ys[j]
