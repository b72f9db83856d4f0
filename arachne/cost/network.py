"""Communication time: alpha-beta links (message-size-dependent effective bandwidth) and collectives as NCCL
runs them.

A transfer of ``x`` bytes over a link costs ``latency + x / bandwidth``, so small messages see a lower
effective bandwidth. Inside a node the link is the GPU's effective peer bandwidth (``Node.intra_node_bw``:
NVLink/PCIe line rate x 0.8 or 0.7, or a measured figure). Between nodes a node offers its NIC line rate
(``inter_node_bw``) times the share NCCL reaches on that fabric (``NetworkCalibration.*_nic_efficiency``), shared
by its concurrent flows; one flow reaches one NIC's share.

Collectives (docs/cost-model.md, "Network", with the measurements each term is checked against):

- all-reduce: NCCL's ring over all members, intra- and inter-node hops pipelined, so the slowest hop sets the
  pace: ``2(n-1)/n x size / min(intra, NIC share)``. On one NVSwitch board of Hopper/Blackwell GPUs, NVLink
  SHARP when faster; on two nodes, NCCL's tree when faster (it crosses the NICs with the buffer once).
- all-gather / reduce-scatter: one ring phase, ``(n-1)/n x size / min(intra, NIC share)``. NCCL keeps the ring
  for bandwidth: NVLS sends the whole size one way (``size / intra``), slower (priced when pinned).
- all-to-all: each member's off-node bytes at one NIC's share (NCCL does not aggregate NICs for it), its
  on-node bytes over the intra-node link at the same time, at NCCL's p2p share of it.
- send/recv: one link, at NCCL's p2p share of the intra-node bandwidth inside a node, one NIC's share across.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from arachne.cost.calibration import NetworkCalibration
from arachne.spec.cluster import Cluster, Node

GB = 1e9


@dataclass(frozen=True)
class Link:
    bandwidth: float  # bytes/s
    latency: float    # s

    def time(self, nbytes: float) -> float:
        return self.latency + nbytes / self.bandwidth if nbytes > 0 else 0.0


@dataclass(frozen=True)
class NodeRates:
    """What NCCL reaches on one node, bytes/s."""

    inter: float     # all NICs together: line rate x the fabric's NIC efficiency
    per_flow: float  # one NIC's share of that
    intra: float     # per-GPU ring bandwidth inside the node (Node.intra_node_bw)
    nvls: float      # NVLink SHARP all-reduce algbw; 0 where the board has none
    p2p: float       # per-GPU send/recv (and all-to-all) bandwidth inside the node: NCCL's p2p share of ``intra``


def nic_efficiency(cal: NetworkCalibration, network: str | None) -> float:
    """Share of a NIC's line rate NCCL's bus bandwidth reaches on a fabric kind (None: unspecified)."""
    return {"infiniband": cal.infiniband_nic_efficiency, "roce": cal.roce_nic_efficiency,
            "efa": cal.efa_nic_efficiency, "ethernet": cal.ethernet_nic_efficiency}.get(
        network or "", cal.unspecified_nic_efficiency)


def node_rates(node: Node, cal: NetworkCalibration) -> NodeRates:
    gpu = node.gpu
    eff = nic_efficiency(cal, node.network)
    nvls = 0.0
    if (gpu.generation in cal.nvls_generations and gpu.intra_node_link == "nvlink"
            and gpu.gpus_per_node >= cal.nvls_min_board_gpus):
        line = (node.intra_node_gbps or gpu.intra_node_gbps) / 2 * GB  # per direction
        nvls = cal.nvls_algbw_over_line * line * nvls_generation_scale(cal, gpu.generation)
    return NodeRates(node.inter_node_bw * eff, node.per_flow_bw * eff, node.intra_node_bw, nvls,
                     node.intra_node_bw * cal.p2p_intra_share)


def nvls_generation_scale(cal: NetworkCalibration, generation: str) -> float:
    """NVLS bandwidth of a generation relative to Hopper's (whose figure ``nvls_algbw_over_line`` is), from NCCL's
    own per-architecture NVLS efficiencies; 1 for a generation it does not list."""
    eff = dict(cal.nvls_efficiency)
    return eff[generation] / eff["hopper"] if generation in eff and eff.get("hopper") else 1.0


class Network:
    """Links between devices and nodes of one cluster, and collective timings over them."""

    def __init__(self, cluster: Cluster, cal: NetworkCalibration):
        self.cluster = cluster
        self.cal = cal
        self.rates = {n.name: node_rates(n, cal) for n in cluster.nodes}
        self._node_name = cluster.device_node  # each device's node name (read only)

    def node_of(self, device: str) -> Node:
        return self.cluster.devices[device].node

    def intra_link(self, node: Node) -> Link:
        """The node's intra-node link at the ring collectives' bandwidth."""
        return Link(node.intra_node_bw, self.cal.intra_node_latency_s)

    def p2p_intra_link(self, node: Node) -> Link:
        """The node's intra-node link as NCCL's send/recv reaches it (its p2p channels)."""
        return Link(self.rates[node.name].p2p, self.cal.intra_node_latency_s)

    def inter_link(self, a: Node, b: Node, flows: int = 1) -> Link:
        """``flows`` parallel flows between nodes a and b, as one aggregate link."""
        ra, rb = self.rates[a.name], self.rates[b.name]
        bw = min(ra.inter, rb.inter, flows * ra.per_flow, flows * rb.per_flow)
        return Link(bw, self.cal.inter_node_latency_s)

    def p2p_time(self, src: list[str], dst: list[str], nbytes: float) -> float:
        """Send ``nbytes`` from a group of devices to another, spread over parallel device pairs."""
        if nbytes <= 0:
            return 0.0
        pairs = max(1, min(len(src), len(dst)))
        share = nbytes / pairs
        node = self._node_name
        if pairs == 1:
            per_node_pair: dict[tuple[str, str], int] = {(node[src[0]], node[dst[0]]): 1}
        else:
            per_node_pair = Counter(zip(map(node.__getitem__, src[:pairs]), map(node.__getitem__, dst[:pairs])))
        worst = 0.0
        for (an, bn), k in per_node_pair.items():
            a, b = self.cluster.node_by_name[an], self.cluster.node_by_name[bn]
            if an == bn:
                t = self.p2p_intra_link(a).time(share)
            else:
                t = self.inter_link(a, b, k).time(share * k)
            worst = max(worst, t)
        return worst

    def _node_bw(self, nodes: dict[str, int], concurrent: int) -> float:
        """Slowest node NIC rate available to ``concurrent`` rings with k members each on that node."""
        bw = float("inf")
        for name, k in nodes.items():
            r = self.rates[name]
            bw = min(bw, min(r.inter, k * concurrent * r.per_flow) / concurrent)
        return bw

    def _ring_bw(self, nodes: dict[str, int], concurrent: int) -> float:
        """The pace of a ring over these members: its slowest hop, intra-node (where a node holds 2+) or NIC."""
        bw = float("inf")
        if max(nodes.values()) > 1:
            bw = min(self.rates[name].intra for name, k in nodes.items() if k > 1)
        if len(nodes) > 1:
            bw = min(bw, self._node_bw(nodes, concurrent))
        return bw

    def all_reduce_time(self, devices, nbytes: float, concurrent: int = 1, algorithm: str | None = None) -> float:
        """All-reduce of ``nbytes`` on each member; ``concurrent`` such groups share the nodes."""
        if len(devices) <= 1 or nbytes <= 0:
            return 0.0
        return self.ring_all_reduce_time(len(devices), Counter(self.node_of(d).name for d in devices), nbytes,
                                         concurrent, algorithm)

    def ring_all_reduce_time(self, n: int, nodes: dict[str, int], nbytes: float, concurrent: int = 1,
                             algorithm: str | None = None) -> float:
        """:meth:`all_reduce_time` for ``n`` members given as members per node: the fastest of NCCL's ring,
        NVLink SHARP (one node) and tree (two nodes) as this model prices them; ``algorithm="ring"`` prices the
        ring alone (``NCCL_ALGO=RING``)."""
        if n <= 1 or nbytes <= 0:
            return 0.0
        cal = self.cal
        k, N = max(nodes.values()), len(nodes)
        lat = self._ring_latency(2 * (n - 1), 2 * (N - 1))
        t = 2 * (n - 1) / n * nbytes / self._ring_bw(nodes, concurrent) + lat
        if algorithm == "ring":
            return t
        if N == 1:
            nvls = self.rates[next(iter(nodes))].nvls
            if nvls and n >= cal.nvls_min_ranks:
                t = min(t, nbytes / nvls + self._ring_latency(2, 0))
        elif N <= cal.tree_max_nodes and k > 1:
            chain = min(max(cal.tree_intra_share * self.rates[m].intra,
                            self.rates[m].nvls if nodes[m] >= cal.nvls_min_ranks else 0.0)
                        for m in nodes if nodes[m] > 1)
            t = min(t, nbytes / min(chain, self._node_bw(nodes, concurrent)) + lat)
        return t

    def tp_block_time(self, node: str, tp: int, nbytes: float) -> float:
        """Forward TP traffic of one block (two all-reduces) of a tp group inside node ``node``, as a stage's pricing
        charges it (the node's own links: an ``intra_node_gbps`` override, NVLink SHARP)."""
        return 2 * self.ring_all_reduce_time(tp, {node: tp}, nbytes) if tp > 1 else 0.0

    def all_gather_time(self, devices, nbytes: float, concurrent: int = 1, algorithm: str | None = None) -> float:
        """Ring all-gather whose result is ``nbytes`` on each member (nccl-tests ``size``); ``algorithm="nvls"``
        prices NVLink SHARP (``NCCL_ALGO=NVLS``) where the board has it."""
        return self._half_ring(devices, nbytes, concurrent, algorithm)

    def reduce_scatter_time(self, devices, nbytes: float, concurrent: int = 1, algorithm: str | None = None) -> float:
        """Ring reduce-scatter of ``nbytes`` on each member (nccl-tests ``size``) into ``1/n`` shards."""
        return self._half_ring(devices, nbytes, concurrent, algorithm)

    def _half_ring(self, devices, nbytes: float, concurrent: int, algorithm: str | None = None) -> float:
        """One ring phase: ``(n-1)/n`` of the buffer through every member's slowest hop. NVLS (only when pinned,
        one NVLS board): the multicast moves the whole buffer one way and ``1/n`` of it the other, so the full
        size crosses each GPU's NVLink (S. Jeaugey, NVIDIA/nccl#1083, #1506): slower than the ring, which is why
        NCCL keeps the ring for these two."""
        n = len(devices)
        if n <= 1 or nbytes <= 0:
            return 0.0
        nodes = Counter(self.node_of(d).name for d in devices)
        if algorithm == "nvls" and len(nodes) == 1 and self.rates[next(iter(nodes))].nvls:
            return nbytes / self.rates[next(iter(nodes))].intra + self._ring_latency(2, 0)
        return (n - 1) / n * nbytes / self._ring_bw(nodes, concurrent) + self._ring_latency(n - 1, len(nodes) - 1)

    def _ring_latency(self, steps: int, inter_steps: int) -> float:
        """NCCL's latency model of a ring: a fixed start, then ``steps`` steps of which ``inter_steps`` cross nodes."""
        c = self.cal
        return (c.ring_base_latency_s + (steps - inter_steps) * c.ring_step_latency_intra_s
                + inter_steps * c.ring_step_latency_inter_s)

    def all_to_all_time(self, devices, nbytes: float, concurrent: int = 1, cross_fraction: float = 1.0) -> float:
        """All-to-all where each member sends ``nbytes`` in total (``(n-1)/n`` of it leaves the device);
        ``cross_fraction`` scales what crosses nodes (an MoE dispatch that sends a token once per destination
        node, not once per chosen expert there)."""
        n = len(devices)
        if n <= 1 or nbytes <= 0:
            return 0.0
        nodes = Counter(self.node_of(d).name for d in devices)
        k = max(nodes.values())
        intra_bw = min(self.rates[name].p2p for name in nodes)  # NCCL runs all-to-all on its p2p channels
        t_intra = nbytes * (k - 1) / n / intra_bw
        c = self.cal
        lat = (n - 1) * c.a2a_peer_latency_intra_s if len(nodes) == 1 else \
            c.a2a_base_latency_inter_s + (n - 1) * c.a2a_peer_latency_inter_s
        if len(nodes) == 1:
            return t_intra + lat
        cross = nbytes * (n - k) / n * cross_fraction  # bytes each member sends off its node
        t_inter = k * cross / self._node_bw(nodes, concurrent)
        return max(t_intra, t_inter) + lat
