"""Templates: the structure of a plan, the only thing arachne searches.

A template is a list of pipeline groups. A group is one pipeline shape (an ordered list of stage
slots) replicated ``replicas`` times. A slot names a device class (GPU type + node size +
network), its tensor-parallel degree ``tp``, stage-level data parallelism ``dp`` and expert
parallelism ``ep``; a *pooled* slot of a mixed group may also draw from later classes of its GPU
type once its own class is used up (14 replicas from 8 GPUs in 4-GPU nodes and 6 single-GPU nodes).
Layer splits, placement on nodes, micro-batch counts, micro-batch size, recomputation and ZeRO
follow by rule (:mod:`arachne.planners.completion`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from arachne.spec.cluster import Cluster
from arachne.spec.gpus import GPUType
from arachne.spec.model import ModelSpec


@dataclass(frozen=True)
class DeviceClass:
    """Nodes that are interchangeable for planning: same GPU type, node size, NIC bandwidth and intra-node link
    (a node's `intra_node_gbps` override: a PCIe board of a type the catalog knows on NVLink is another class)."""

    index: int
    gpu: GPUType
    node_size: int
    inter_node_bw: float
    nodes: tuple[str, ...]
    kin: tuple[tuple[int, int, int], ...] = ()  # (index, GPUs, node size) of every class of this GPU type
    offsets: tuple[int, ...] = ()  # first GPU of the class's part of each node (empty: whole nodes)

    @property
    def count(self) -> int:
        return self.node_size * len(self.nodes)

    def node_devices(self) -> list[list[str]]:
        """The class's device ids, node by node."""
        offs = self.offsets or (0,) * len(self.nodes)
        return [[f"{n}:{o + i}" for i in range(self.node_size)] for n, o in zip(self.nodes, offs)]

    @property
    def label(self) -> str:
        return f"{self.gpu.name}x{self.node_size}"


def node_parts(num_gpus: int) -> list[tuple[int, int]]:
    """(first GPU, GPUs) of a node's power-of-two parts, largest first: a node of 7 is planned as parts
    of 4, 2 and 1, so that tensor parallelism of 4 and 2 fits it (a node that lost a GPU, or an odd SKU)."""
    parts, off, k = [], 0, num_gpus
    while k:
        size = 1 << (k.bit_length() - 1)
        parts.append((off, size))
        off += size
        k -= size
    return parts


def device_classes(cluster: Cluster, precision: str = "bf16", parts: bool = True) -> list[DeviceClass]:
    """The cluster's device classes, fastest GPU type first (ties: larger nodes first). With ``parts``,
    nodes whose size is not a power of two join classes by parts (see :func:`node_parts`)."""
    groups: dict[tuple, list[tuple[str, int]]] = {}
    gpus: dict[tuple, GPUType] = {}
    for n in cluster.nodes:
        for off, size in node_parts(n.num_gpus) if parts else [(0, n.num_gpus)]:
            key = (n.gpu.name, size, n.inter_node_bw, n.intra_node_bw)
            groups.setdefault(key, []).append((n.name, off))
            gpus[key] = n.gpu
    keys = sorted(groups, key=lambda k: (-gpus[k].peak_flops(precision), -gpus[k].memory_gb, -k[1], -k[2], -k[3],
                                         k[0]))
    kin: dict[str, list[tuple[int, int, int]]] = {}
    for i, k in enumerate(keys):
        kin.setdefault(k[0], []).append((i, k[1] * len(groups[k]), k[1]))
    out = []
    for i, k in enumerate(keys):
        names, offs = zip(*groups[k])
        out.append(DeviceClass(i, gpus[k], k[1], k[2], names, tuple(kin[k[0]]), offs if any(offs) else ()))
    return out


def has_odd_nodes(cluster: Cluster) -> bool:
    """Some node's GPU count is not a power of two (its parts and its whole differ as classes)."""
    return any(n.num_gpus & (n.num_gpus - 1) for n in cluster.nodes)


def pool_classes(c: DeviceClass, slot_gpus: int, tp: int = 1) -> list[int]:
    """The later classes of ``c``'s GPU type that a pooled slot of ``slot_gpus`` GPUs in tp groups of ``tp`` can
    draw from: the slot packs into their nodes (:func:`slot_fits_nodes`) and each tp group inside one node
    (:func:`tp_fits_node`)."""
    return [j for j, _, size in c.kin if j > c.index and slot_fits_nodes(slot_gpus, size) and tp_fits_node(tp, size)]


def span_classes(c: DeviceClass, tp: int) -> tuple[int, ...]:
    """``c`` and the later classes of its GPU type whose nodes hold whole tp groups: what a lock-step stage of one
    GPU type over its node sizes draws from (``Slot.span``; 96 MI300X of 7 nodes of 8 and 13 of 4 at dp 96, as
    Megatron's grid runs them: no one class holds it)."""
    return (c.index,) + tuple(j for j, _, size in c.kin if j > c.index and size % tp == 0)


@dataclass(frozen=True)
class Slot:
    """One stage position: ``dp`` groups of ``tp`` GPUs of device class ``cls``."""

    cls: int
    tp: int
    dp: int = 1
    ep: int = 1
    pool: bool = False  # may draw from later classes of the same GPU type (see pool_classes)
    span: tuple[int, ...] = ()  # a lock-step stage over these classes (``cls`` first): tp groups from each in turn

    @property
    def gpus(self) -> int:
        return self.tp * self.dp


@dataclass(frozen=True)
class Group:
    slots: tuple[Slot, ...]
    replicas: int

    @property
    def num_stages(self) -> int:
        return len(self.slots)


@dataclass(frozen=True)
class Template:
    groups: tuple[Group, ...]

    def usage(self) -> Counter:
        """GPUs used per device class."""
        c: Counter[int] = Counter()
        for g in self.groups:
            for s in g.slots:
                c[s.cls] += s.gpus * g.replicas
        return c

    def fits_counts(self, classes: list[DeviceClass]) -> bool:
        """Every slot's GPUs exist: each class's own first, a pooled slot's shortfall from its kin (in
        group order, as placement takes them)."""
        if not any(s.pool or s.span for g in self.groups for s in g.slots):
            return all(n <= classes[c].count for c, n in self.usage().items())
        left = [c.count for c in classes]
        for g in self.groups:
            for s in g.slots:
                need = s.gpus * g.replicas
                if s.span:  # whole tp groups from each class in turn
                    for j in s.span:
                        take = min(need, left[j] // s.tp * s.tp)
                        left[j] -= take
                        need -= take
                    if need:
                        return False
                    continue
                take = min(need, left[s.cls])
                left[s.cls] -= take
                need -= take
                for j in pool_classes(classes[s.cls], s.gpus, s.tp) if s.pool and need else ():
                    take = min(need, left[j])
                    left[j] -= take
                    need -= take
                if need:
                    return False
        return True

    def describe(self, classes: list[DeviceClass]) -> str:
        parts = []
        for g in self.groups:
            slots = " | ".join(f"{classes[s.cls].gpu.name}{'+' if s.pool else ''}{'*' if s.span else ''} tp{s.tp}"
                               + (f" dp{s.dp}" if s.dp > 1 else "") + (f" ep{s.ep}" if s.ep > 1 else "")
                               for s in g.slots)
            parts.append(f"{g.replicas} x [{slots}]")
        return " + ".join(parts)


def slot_fits_nodes(slot_gpus: int, node_size: int) -> bool:
    """A slot packs into nodes: it divides a node, or covers whole nodes."""
    if slot_gpus <= node_size:
        return node_size % slot_gpus == 0
    return slot_gpus % node_size == 0


def tp_fits_node(tp: int, node_size: int) -> bool:
    """A tp group lies inside one node of ``node_size`` GPUs, as every plan the planner returns keeps it (a group
    across nodes needs ``allow_cross_node_tp``, which plan validation rejects otherwise)."""
    return node_size % tp == 0


def tp_options(model: ModelSpec, node_size: int) -> list[int]:
    """Tensor-parallel degrees inside one node: powers of two dividing the node that the model allows
    (:meth:`ModelSpec.tp_allowed`)."""
    out = []
    t = 1
    while t <= node_size:
        if node_size % t == 0 and model.tp_allowed(t):
            out.append(t)
        t *= 2
    return out


def ep_options(model: ModelSpec, dp: int) -> list[int]:
    """Expert-parallel degrees for a slot with ``dp`` groups (1 for dense models)."""
    if not model.is_moe:
        return [1]
    return [e for e in range(1, dp + 1) if dp % e == 0 and model.ep_allowed(e)]
