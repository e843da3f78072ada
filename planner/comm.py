"""Collective and point-to-point times: t = alpha + f_op(n) * S / busbw(tier, op, S).

References:
    [NCCLTests] NVIDIA/nccl-tests doc/PERFORMANCE.md: busbw = algbw * 2(n-1)/n for all-reduce,
        (n-1)/n for all-gather and reduce-scatter (S = the full array).
    [HwRef] shared/reference/hardware-and-comm.md §2 (measured busbw by message size, NVLS, NICs).
"""

from __future__ import annotations

import math

from planner._interp import interp
from planner._memo import memo
from planner.specs import ClusterSpec
from planner.topology import GroupPlacement

__all__ = ["busbw", "collective_time", "latency", "pat_latency", "p2p_time", "alltoall_time", "node_dedup_alltoall_time", "remote_nodes",
           "OPS"]

OPS = ("allreduce", "allgather", "reducescatter")


@memo()
def _curve(cluster: ClusterSpec) -> tuple[list[float], list[float]]:
    """The measured all-reduce curve as (log size, fraction of its saturated busbw)."""
    points = cluster.nvlink.busbw_curve
    top = max(p[1] for p in points)
    return [math.log(p[0]) for p in points], [p[1] / top for p in points]


def _size_fraction(cluster: ClusterSpec, nbytes: float) -> float:
    """Fraction of saturated busbw a message of `nbytes` reaches, log-interpolated on the measured
    all-reduce curve [HwRef §2.2, S26]; clamped at the smallest and largest measured sizes.
    ASSUMPTION: every op and tier follows the shape of the measured NVLink all-reduce curve
    (no per-NIC size sweep was published).
    """
    return interp(math.log(max(nbytes, 1.0)), *_curve(cluster))


def busbw(cluster: ClusterSpec, group: GroupPlacement, op: str, nbytes: float) -> float:
    """Bus bandwidth (bytes/s) one group of `group` reaches for `op` on messages of `nbytes`.

    NVLink: NVLS all-reduce gains grow from none at 4 GPUs to full at 8 (NVIDIA/nccl#1455, [HwRef §2.2]);
    other ops use the ring busbw. Across domains: a ring with k members per node drives k NICs,
    so busbw = min(NVLink ring, k * NICs-per-GPU * NIC busbw) [HwRef §2.3 'rule that fits the data'];
    under multi-node NVLink k is the members per NVLink domain, NCCL's node there
    (GroupPlacement.nic_drivers).
    """
    nvl = cluster.nvlink
    if group.tier == "nvlink":
        peak = nvl.ring_busbw
        if op == "allreduce" and nvl.allreduce_busbw > nvl.ring_busbw:
            gain = min(1.0, max(0.0, (group.size - 4) / 4))
            peak += (nvl.allreduce_busbw - nvl.ring_busbw) * gain
    else:
        peak = min(nvl.ring_busbw, group.nic_drivers * group.nics_per_gpu * cluster.scaleout.nic_busbw)
    return peak * _size_fraction(cluster, nbytes)


NCCL_NET_RING_HOP_S = 14e-6
NCCL_NET_TREE_HOP_S = 14e-6
NCCL_NVLINK_RING_HOP_S = 3.4e-6
NCCL_NVLINK_TREE_HOP_S = 4.0e-6
# NCCL's latency model for the Simple protocol [NVIDIA/nccl src/graph/tuning.cc: ncclTopoTuneModel
# and ncclTunerConstantsDefaults, the same from v2.23.4 to v2.30.7]: a ring collective makes nsteps
# = 2 (n - 1) steps (all-reduce) or n - 1 (all-gather, reduce-scatter); nInterSteps = 2 (nodes - 1)
# or nodes - 1 of them cross nodes at hwLat[NET][Ring] = 14 us, and the other nsteps - nInterSteps
# hop between GPUs of one node at intraLat = max(hwLat[NVLINK][Ring] = 3.4 us, 3 x the host's
# network overhead, 1 us on Intel and Arm hosts). A tree all-reduce crosses 2 log2(nodes) levels at
# hwLat[NET][Tree] = 14 us and 2 (ppn - 1) intra-node hops at hwLat[NVLINK][Tree] = 4 us. NCCL
# picks the faster. (ASSUMPTION: Intel or Arm hosts; NCCL's AMD-host overhead is 2 us, i.e. 6 us
# per intra-node ring step.)


def latency(cluster: ClusterSpec, group: GroupPlacement, op: str) -> float:
    """Alpha of one collective: the tier's latency, plus NCCL's per-step latency for every further
    step of the ring or tree (the constants above); the first inter-node crossing is the tier's own
    latency (ScaleOut.latency). A group inside one NVLink domain costs the domain's measured alpha.
    NCCL's nodes are NVLink domains under multi-node NVLink (GroupPlacement.nccl_nodes): a ring
    crosses the network once per domain and hops between trays over NVLink."""
    if group.tier == "nvlink":
        return cluster.nvlink.latency
    base, nodes = cluster.scaleout.latency, max(2, group.nccl_nodes)
    twice = 2 if op == "allreduce" else 1
    inter = twice * (nodes - 1)
    intra = max(0, twice * (group.size - 1) - inter)
    ring = base + (inter - 1) * NCCL_NET_RING_HOP_S + intra * NCCL_NVLINK_RING_HOP_S
    if op != "allreduce":
        return ring
    ppn = group.size / nodes
    tree = base + (2 * math.log2(nodes) - 1) * NCCL_NET_TREE_HOP_S + 2 * (ppn - 1) * NCCL_NVLINK_TREE_HOP_S
    return min(ring, tree)


NCCL_PAT_LOG_HOP_S = 14e-6 / 3.5
NCCL_PAT_RANK_S = 2.8e-6
NCCL_PAT_BUSBW = 0.75
# PAT (NCCL >= 2.23), the all-gather / reduce-scatter algorithm for one GPU per node: latency
# log2(nodes) x hwLat[NET][PAT] / 3.5 + nRanks x 2.8 us ("still a linear part"), bus bandwidth 0.75
# of the ring's [NVIDIA/nccl src/graph/tuning.cc: ncclTopoTuneModel, ncclPatEnable (nNodes == nRanks)].


def pat_latency(cluster: ClusterSpec, group: GroupPlacement) -> float:
    """Alpha of a PAT all-gather or reduce-scatter (the constants above; the first inter-node
    crossing is the tier's own latency, as for the ring)."""
    return cluster.scaleout.latency + math.log2(group.nccl_nodes) * NCCL_PAT_LOG_HOP_S + group.size * NCCL_PAT_RANK_S


def collective_time(cluster: ClusterSpec, group: GroupPlacement, op: str, nbytes: float) -> float:
    """Seconds for one collective over `group` on an array of `nbytes` (the full, unsharded size).

    Reference: [NCCLTests] t = S / algbw, algbw = busbw / f_op(n); plus latency() (alpha). An
    all-gather or reduce-scatter over one GPU per node (per NVLink domain under multi-node NVLink)
    takes the faster of the ring and PAT, as NCCL's tuner does.
    """
    n = group.size
    if n <= 1 or nbytes <= 0:
        return 0.0
    if op not in OPS:
        raise ValueError(f"unknown collective {op!r}")
    factor = 2 * (n - 1) / n if op == "allreduce" else (n - 1) / n
    wire = factor * nbytes / busbw(cluster, group, op, nbytes)
    ring = latency(cluster, group, op) + wire
    if op == "allreduce" or group.tier == "nvlink" or group.nccl_nodes != n or n < 2:
        return ring
    return min(ring, pat_latency(cluster, group) + wire / NCCL_PAT_BUSBW)


def p2p_time(cluster: ClusterSpec, tier: str, nbytes: float) -> float:
    """Seconds to send `nbytes` to a neighbour on `tier` (NVLink p2p, or one NIC across nodes)."""
    if nbytes <= 0 or tier == "local":
        return 0.0
    if tier == "nvlink":
        return cluster.nvlink.latency + nbytes / (cluster.nvlink.p2p_bandwidth * _size_fraction(cluster, nbytes))
    return cluster.scaleout.latency + nbytes / (cluster.scaleout.nic_busbw * _size_fraction(cluster, nbytes))


def alltoall_time(cluster: ClusterSpec, group: GroupPlacement, nbytes: float) -> float:
    """Seconds for one all-to-all over `group` in which every member sends `nbytes` in all (nbytes / n
    to each member, itself included).

    Every member sends at once: the (n - k)/n that leaves its node goes out on its own share of the
    node's NICs while the (k - 1)/n for the other k - 1 members on its node (its NVLink domain's under
    multi-node NVLink, GroupPlacement.per_domain) crosses NVLink; the slower
    path sets the time [NCCLTests: all-to-all busbw = algbw (n - 1)/n]. Inside one NVLink domain the
    whole (n - 1)/n crosses NVLink at the ring busbw. Size efficiency is read at the whole buffer
    (NCCL moves all peers' chunks at once).
    """
    n = group.size
    if n <= 1 or nbytes <= 0:
        return 0.0
    frac = _size_fraction(cluster, nbytes)
    nvl = cluster.nvlink.ring_busbw * frac
    if group.tier == "nvlink":
        return cluster.nvlink.latency + nbytes * (n - 1) / n / nvl
    k = group.per_domain or group.per_node  # the members NVLink reaches (a multi-node-NVLink domain's)
    net = group.nics_per_gpu * cluster.scaleout.nic_busbw * frac
    return cluster.scaleout.latency + max(nbytes * (n - k) / n / net, nbytes * (k - 1) / n / nvl)


def _miss(total: float, pick: int, hole: float) -> float:
    """C(total - hole, pick) / C(total, pick) as a product: the chance that `pick` draws without
    replacement from `total` all avoid a subset of `hole`."""
    p = 1.0
    for i in range(pick):
        p *= max(0.0, (total - hole - i) / (total - i))
    return p


def remote_nodes(num_experts: int, top_k: int, nodes: int, groups: int | None = None,
                 group_topk: int | None = None) -> float:
    """Expected number of other nodes one token's top_k experts sit on, the experts spread evenly over
    `nodes` nodes and chosen evenly (balanced routing, as NVIDIA's benchmarks force it). Unlimited: a
    node is missed with probability C(E - E/G, k) / C(E, k). Group-limited routing (MoESpec.router_groups)
    where whole groups sit on each node: a node is reached when one of its groups is among the
    group_topk chosen, 1 - C(g - g/G, t) / C(g, t) (ASSUMPTION: every chosen group receives at least one
    of the k experts); where each group spans several nodes: its group is chosen (t / g) and one of the
    k experts, drawn from the chosen groups' t E / g, lands on it. Other shapes fall back to unlimited."""
    if nodes <= 1:
        return 0.0
    per_node = num_experts / nodes
    if groups and group_topk and groups % nodes == 0:
        reach = 1 - _miss(groups, group_topk, groups // nodes)
    elif groups and group_topk and nodes % groups == 0:
        reach = group_topk / groups * (1 - _miss(group_topk * num_experts / groups, top_k, per_node))
    else:
        reach = 1 - _miss(num_experts, top_k, per_node)
    return (nodes - 1) * reach


def node_dedup_alltoall_time(cluster: ClusterSpec, group: GroupPlacement, tokens: float, row_bytes: float,
                             top_k: int, num_experts: int, groups: int | None = None,
                             group_topk: int | None = None) -> float:
    """Seconds for one DeepEP dispatch (or combine) over `group`: each of the GPU's `tokens` goes to
    top_k experts spread evenly over the group; across nodes a token crosses the network once per
    remote node holding any of its experts and is forwarded over NVLink there [deepseek-ai/DeepEP
    README, normal kernels: RDMA between nodes, NVLink forwarding inside them; Megatron-LM@d98e8a6
    megatron/core/transformer/moe/token_dispatcher.py: _DeepepManager]: remote_nodes of them a token,
    fewer under group-limited routing (`groups`, `group_topk`). Every copy for another GPU also crosses NVLink once
    (ASSUMPTION: the NVLink leg is priced as the copies' (n - 1)/n share); the slower path sets the time.
    """
    n = group.size
    if n <= 1 or tokens <= 0:
        return 0.0
    copies = tokens * top_k * row_bytes
    nvl_bytes = copies * (n - 1) / n
    nvl = cluster.nvlink.ring_busbw * _size_fraction(cluster, copies)
    if group.tier == "nvlink":
        return cluster.nvlink.latency + nvl_bytes / nvl
    net_bytes = tokens * row_bytes * remote_nodes(num_experts, top_k, group.nodes, groups, group_topk)
    net = group.nics_per_gpu * cluster.scaleout.nic_busbw * _size_fraction(cluster, net_bytes)
    return cluster.scaleout.latency + max(net_bytes / net, nvl_bytes / nvl)
