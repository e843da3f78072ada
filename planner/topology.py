"""The cluster as a networkx graph, and the tier, sharing and bandwidth of each parallel group.

Ranks are laid out in Megatron's order, innermost first: tp-cp-dp-pp by default, or tp-cp-pp-dp
with '--use-tp-pp-dp-mapping' (Layout.rank_order; megatron/training/initialize.py), and rank r
sits on GPU r.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

import networkx as nx

from planner.specs import ClusterSpec, Layout

__all__ = ["AXES", "cluster_graph", "GroupPlacement", "group_placement", "axis_stride", "placement"]

AXES = ("tp", "cp", "dp", "pp")  # the default order, innermost first (Megatron's tp-cp-ep-dp-pp without ep)


def cluster_graph(cluster: ClusterSpec) -> nx.Graph:
    """GPUs joined to their NVLink switch (one per domain) and to their node's NICs; NICs to the fabric.

    Edge attribute `bw` is bytes/s (ring busbw on NVLink, one NIC's busbw on the network).
    """
    return _graph(cluster.name, cluster.world_size, cluster.gpus_per_node, cluster.nvlink_domain_size,
                  cluster.nvlink.ring_busbw, cluster.scaleout.nics_per_node, cluster.scaleout.nic_busbw)


@lru_cache(maxsize=64)
def _graph(name, world, gpn, domain, nvl_bw, nics, nic_bw) -> nx.Graph:
    g = nx.Graph(name=name)
    g.add_node("fabric", kind="fabric")
    for gpu in range(world):
        node, dom = gpu // gpn, gpu // domain
        g.add_node(("gpu", gpu), kind="gpu", node=node, domain=dom)
        g.add_edge(("gpu", gpu), ("nvswitch", dom), bw=nvl_bw, tier="nvlink")
        nic = ("nic", node, (gpu % gpn) * nics // gpn)  # rail-optimised: NICs spread over the GPUs
        g.add_edge(("gpu", gpu), nic, bw=nic_bw, tier="scaleout")
        g.add_edge(nic, "fabric", bw=nic_bw, tier="scaleout")
    return g


def axis_stride(layout: Layout, axis: str) -> int:
    """Rank distance between neighbours of a group on `axis`, in the layout's rank order."""
    stride = 1
    for ax in layout.rank_order.split("-"):
        if ax == axis:
            return stride
        stride *= getattr(layout, ax)
    raise ValueError(f"unknown axis {axis!r}")


@dataclass(frozen=True)
class GroupPlacement:
    """Where one group of an axis lives."""

    size: int
    """GPUs in the group."""
    tier: str
    """'local' (size 1), 'nvlink' (inside one NVLink domain) or 'scaleout' (crosses domains)."""
    per_node: int
    """Members of the group on the same node (they share that node's NICs)."""
    nics_per_gpu: float
    """Share of the node's NICs each member can drive (concurrent groups use the others)."""
    nodes: int = 1
    """Nodes the group spans."""
    domains: int = 0
    """NVLink domains the group spans where a domain is several nodes (GB200/GB300 NVL72), else 0. NCCL
    counts them as its nodes there: under multi-node NVLink it fuses a domain's trays into one node, its
    clique [NVIDIA/nccl@5067397 src/graph/topo.cc: ncclTopoGetSystem, 'MNNVL clique support'; src/init.cc:
    initNvlDomainInfo, nNvlDomains = nNodes]."""
    per_domain: int = 0
    """Members of the group in the same NVLink domain where `domains` is set, else 0."""

    @property
    def nccl_nodes(self) -> int:
        """The nodes NCCL counts for this group: NVLink domains under multi-node NVLink, else nodes."""
        return self.domains or self.nodes

    @property
    def nic_drivers(self) -> int:
        """Members whose NICs carry one node's share of a ring that crosses nodes: NCCL's local ranks (a
        multi-node-NVLink domain's members, its channels' network crossings scattered over their GPUs' NICs
        [src/graph/search.cc: NCCL_MNNVL_SCATTER_NETS_ENABLE]), else the node's."""
        return self.per_domain or self.per_node


def group_placement(cluster: ClusterSpec, layout: Layout, axis: str) -> GroupPlacement:
    """Tier and NIC sharing of the groups of `axis` (all groups of an axis are alike).

    `axis` is one of AXES, or 'dpcp': the data-parallel x context-parallel group over which Megatron
    reduces gradients (cp sits just inside dp, so the two form one contiguous group).
    """
    axes = ("cp", "dp") if axis == "dpcp" else (axis,)
    return placement(cluster, *[(getattr(layout, ax), axis_stride(layout, ax)) for ax in axes])


def placement(cluster: ClusterSpec, *axes: tuple[int, int]) -> GroupPlacement:
    """Tier and NIC sharing of the group spanned by (size, stride) axes (the one holding rank 0)."""
    return _placement(cluster.name, cluster.world_size, cluster.gpus_per_node, cluster.nvlink_domain_size,
                      cluster.nvlink.ring_busbw, cluster.scaleout.nics_per_node, cluster.scaleout.nic_busbw,
                      tuple(axes))


@lru_cache(maxsize=4096)
def _placement(name, world, gpn, domain, nvl_bw, nics, nic_bw, axes) -> GroupPlacement:
    """Linear in the group size: members by arithmetic, per-node counts with one Counter.

    The group holding rank 0 stays on NVLink iff every member sits in rank 0's NVLink domain (in the
    graph of cluster_graph: the shortest path between two members then runs through their switch,
    never through the fabric).
    """
    members = [0]  # the group holding rank 0
    for size, stride in axes:
        members = [m + k * stride for m in members for k in range(size)]
    size = len(members)
    if size == 1:
        return GroupPlacement(1, "local", 1, nics / gpn)
    last = max(members)
    if last >= world:  # layout larger than the cluster: price it as crossing the fabric
        return GroupPlacement(size, "scaleout", 1, nics / gpn, size)
    tier = "nvlink" if last // domain == 0 else "scaleout"
    per_node = Counter(m // gpn for m in members)
    per_domain = Counter(m // domain for m in members) if domain > gpn else Counter()
    return GroupPlacement(size, tier, max(per_node.values()), nics / gpn, len(per_node), len(per_domain),
                          max(per_domain.values(), default=0))
