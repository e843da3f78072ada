"""Collective and point-to-point times: t = alpha + f_op(n) * S / busbw(tier, op, S).

References:
    [NCCLTests] NVIDIA/nccl-tests doc/PERFORMANCE.md: busbw = algbw * 2(n-1)/n for all-reduce,
        (n-1)/n for all-gather and reduce-scatter (S = the full array).
    [HwRef] shared/reference/hardware-and-comm.md §2 (measured busbw by message size, NVLS, NICs).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from planner.specs import ClusterSpec
from planner.topology import GroupPlacement

__all__ = ["busbw", "collective_time", "p2p_time", "OPS"]

OPS = ("allreduce", "allgather", "reducescatter")


@lru_cache(maxsize=64)
def _curve(points: tuple[tuple[float, float], ...]) -> tuple[np.ndarray, np.ndarray]:
    sizes = np.log(np.array([p[0] for p in points]))
    frac = np.array([p[1] for p in points]) / max(p[1] for p in points)
    return sizes, frac


def _size_fraction(cluster: ClusterSpec, nbytes: float) -> float:
    """Fraction of saturated busbw a message of `nbytes` reaches, log-interpolated on the measured
    all-reduce curve [HwRef §2.2, S26]; clamped at the smallest and largest measured sizes.
    ASSUMPTION: every op and tier follows the shape of the measured NVLink all-reduce curve
    (no per-NIC size sweep was published).
    """
    sizes, frac = _curve(tuple(tuple(p) for p in cluster.nvlink.busbw_curve))
    return float(np.interp(math.log(max(nbytes, 1.0)), sizes, frac))


def busbw(cluster: ClusterSpec, group: GroupPlacement, op: str, nbytes: float) -> float:
    """Bus bandwidth (bytes/s) one group of `group` reaches for `op` on messages of `nbytes`.

    NVLink: NVLS all-reduce gains grow from none at 4 GPUs to full at 8 (NVIDIA/nccl#1455, [HwRef §2.2]);
    other ops use the ring busbw. Across domains: a ring with k members per node drives k NICs,
    so busbw = min(NVLink ring, k * NICs-per-GPU * NIC busbw) [HwRef §2.3 'rule that fits the data'].
    """
    nvl = cluster.nvlink
    if group.tier == "nvlink":
        peak = nvl.ring_busbw
        if op == "allreduce" and nvl.allreduce_busbw > nvl.ring_busbw:
            gain = min(1.0, max(0.0, (group.size - 4) / 4))
            peak += (nvl.allreduce_busbw - nvl.ring_busbw) * gain
    else:
        peak = min(nvl.ring_busbw, group.per_node * group.nics_per_gpu * cluster.scaleout.nic_busbw)
    return peak * _size_fraction(cluster, nbytes)


def collective_time(cluster: ClusterSpec, group: GroupPlacement, op: str, nbytes: float) -> float:
    """Seconds for one collective over `group` on an array of `nbytes` (the full, unsharded size).

    Reference: [NCCLTests] t = S / algbw, algbw = busbw / f_op(n); plus the tier's latency alpha.
    """
    n = group.size
    if n <= 1 or nbytes <= 0:
        return 0.0
    if op not in OPS:
        raise ValueError(f"unknown collective {op!r}")
    factor = 2 * (n - 1) / n if op == "allreduce" else (n - 1) / n
    alpha = cluster.nvlink.latency if group.tier == "nvlink" else cluster.scaleout.latency
    return alpha + factor * nbytes / busbw(cluster, group, op, nbytes)


def p2p_time(cluster: ClusterSpec, tier: str, nbytes: float) -> float:
    """Seconds to send `nbytes` to a neighbour on `tier` (NVLink p2p, or one NIC across nodes)."""
    if nbytes <= 0 or tier == "local":
        return 0.0
    if tier == "nvlink":
        return cluster.nvlink.latency + nbytes / (cluster.nvlink.p2p_bandwidth * _size_fraction(cluster, nbytes))
    return cluster.scaleout.latency + nbytes / (cluster.scaleout.nic_busbw * _size_fraction(cluster, nbytes))
