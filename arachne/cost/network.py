"""Communication time: alpha-beta links (message-size-dependent effective bandwidth) and collectives.

A transfer of ``x`` bytes over a link costs ``latency + x / bandwidth``, so small messages see
a lower effective bandwidth. Inside a node the link is the GPU's peer bandwidth (NVLink/PCIe);
between nodes each node offers ``inter_node_bw`` shared by its concurrent flows, and a single
flow reaches one NIC's share. Collectives are rings (hierarchical when members share nodes);
the slowest member link sets the pace.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from arachne.cost.calibration import NetworkCalibration
from arachne.spec.cluster import Cluster, Node


@dataclass(frozen=True)
class Link:
    bandwidth: float  # bytes/s
    latency: float    # s

    def time(self, nbytes: float) -> float:
        return self.latency + nbytes / self.bandwidth if nbytes > 0 else 0.0


class Network:
    """Links between devices and nodes of one cluster, and collective timings over them."""

    def __init__(self, cluster: Cluster, cal: NetworkCalibration):
        self.cluster = cluster
        self.cal = cal

    def node_of(self, device: str) -> Node:
        return self.cluster.devices[device].node

    def intra_link(self, node: Node) -> Link:
        return Link(node.intra_node_bw, self.cal.intra_node_latency_s)

    def inter_link(self, a: Node, b: Node, flows: int = 1) -> Link:
        """``flows`` parallel flows between nodes a and b, as one aggregate link."""
        bw = min(a.inter_node_bw, b.inter_node_bw, flows * a.per_flow_bw, flows * b.per_flow_bw)
        return Link(bw, self.cal.inter_node_latency_s)

    def p2p_time(self, src: list[str], dst: list[str], nbytes: float) -> float:
        """Send ``nbytes`` from a group of devices to another, spread over parallel device pairs."""
        if nbytes <= 0:
            return 0.0
        pairs = max(1, min(len(src), len(dst)))
        share = nbytes / pairs
        per_node_pair: Counter[tuple[str, str]] = Counter()
        worst = 0.0
        for i in range(pairs):
            a, b = self.node_of(src[i]), self.node_of(dst[i])
            per_node_pair[(a.name, b.name)] += 1
        for (an, bn), k in per_node_pair.items():
            a, b = self.cluster.node_by_name[an], self.cluster.node_by_name[bn]
            if an == bn:
                t = self.intra_link(a).time(share)
            else:
                t = self.inter_link(a, b, k).time(share * k)
            worst = max(worst, t)
        return worst

    def _layout(self, devices) -> tuple[dict[str, int], float]:
        """Members per node of a ring, and the slowest intra-node link among them."""
        nodes = Counter(self.node_of(d).name for d in devices)
        intra = min(self.cluster.node_by_name[n].intra_node_bw for n in nodes)
        return nodes, intra

    def _node_bw(self, nodes: dict[str, int], concurrent: int) -> float:
        """Slowest node NIC rate available to ``concurrent`` rings with k members each on that node."""
        bw = float("inf")
        for name, k in nodes.items():
            n = self.cluster.node_by_name[name]
            bw = min(bw, min(n.inter_node_bw, k * concurrent * n.per_flow_bw) / concurrent)
        return bw

    def all_reduce_time(self, devices, nbytes: float, concurrent: int = 1) -> float:
        """All-reduce of ``nbytes`` on each member of one ring; ``concurrent`` such rings share the nodes.

        Members on one node reduce-scatter over the intra-node link first, the shards are
        all-reduced across nodes, then gathered back (hierarchical); one node: a plain ring."""
        if len(devices) <= 1 or nbytes <= 0:
            return 0.0
        return self.ring_all_reduce_time(len(devices), Counter(self.node_of(d).name for d in devices), nbytes,
                                         concurrent)

    def ring_all_reduce_time(self, n: int, nodes: dict[str, int], nbytes: float, concurrent: int = 1) -> float:
        """:meth:`all_reduce_time` for a ring of ``n`` members given as members per node."""
        if n <= 1 or nbytes <= 0:
            return 0.0
        intra_bw = min(self.cluster.node_by_name[name].intra_node_bw for name in nodes)
        lat_i, lat_x = self.cal.intra_node_latency_s, self.cal.inter_node_latency_s
        k = max(nodes.values())
        t = 0.0
        if k > 1:
            t += 2 * (k - 1) / k * nbytes / intra_bw + 2 * (k - 1) * lat_i
        N = len(nodes)
        if N > 1:
            t += 2 * (N - 1) / N * nbytes / self._node_bw(nodes, concurrent) + 2 * (N - 1) * lat_x
        return t

    def all_to_all_time(self, devices, nbytes: float, concurrent: int = 1) -> float:
        """All-to-all where each member sends ``nbytes`` in total (``(n-1)/n`` of it leaves the device)."""
        n = len(devices)
        if n <= 1 or nbytes <= 0:
            return 0.0
        nodes, intra_bw = self._layout(devices)
        k = max(nodes.values())
        t_intra = nbytes * (k - 1) / n / intra_bw
        lat = (n - 1) * (self.cal.intra_node_latency_s if len(nodes) == 1 else self.cal.inter_node_latency_s)
        if len(nodes) == 1:
            return t_intra + lat
        cross = nbytes * (n - k) / n  # bytes each member sends off its node
        t_inter = k * cross / self._node_bw(nodes, concurrent)
        return max(t_intra, t_inter) + lat
