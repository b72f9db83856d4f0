"""Clusters: node groups with `{i}` expansion, custom GPU types, devices named ``node:index``."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from arachne.errors import InputError, from_validation_error, load_document
from arachne.spec.gpus import (
    GB,
    CustomGPUType,
    Gbps,
    GPUCatalog,
    GPUType,
    PricePerHour,
    gpu_catalog,
    normalize_name,
)
from arachne.spec.names import DisplayName, check_name


class NodeGroupSpec(BaseModel):
    """One entry of ``nodes`` in a cluster document."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(min_length=1)
    count: int = Field(default=1, ge=1, le=100_000, strict=True)
    gpu: str = Field(min_length=1)
    gpus_per_node: int | None = Field(default=None, ge=1, le=128, strict=True)  # one NVLink domain (GB200 NVL72: 72)
    inter_node_gbps: Gbps | None = None
    intra_node_gbps: Gbps | None = None
    zone: str | None = None
    price_per_gpu_hour: PricePerHour | None = None
    """Formats v2: USD per GPU-hour of these nodes (overrides the GPU type's price)."""
    network: Literal["infiniband", "roce", "efa", "ethernet"] | None = None
    """Formats v2: the fabric of ``inter_node_gbps`` (the share of its line rate NCCL reaches depends on it);
    none: priced as InfiniBand."""


class ClusterGPUType(CustomGPUType):
    """An entry of ``gpu_types``: a custom GPU type, plus (formats v2) its price."""

    price_per_gpu_hour: PricePerHour | None = None
    """USD per GPU-hour of nodes of this type that set no price of their own."""

    def to_gpu_type(self) -> GPUType:
        return GPUType(**self.model_dump(exclude={"price_per_gpu_hour"}), source="cluster gpu_types")


class ClusterSpec(BaseModel):
    """A cluster document (formats v1 section 1, v2 section 8)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: DisplayName = "cluster"
    nodes: list[NodeGroupSpec] = Field(min_length=1)
    gpu_types: list[ClusterGPUType] = Field(default_factory=list)


@dataclass(frozen=True)
class Node:
    """A concrete node: its GPUs are ``name:0 .. name:num_gpus-1``."""

    name: str
    index: int
    gpu: GPUType
    num_gpus: int
    inter_node_bw: float
    intra_node_bw: float
    nics: int
    zone: str | None = None
    intra_node_gbps: float | None = None  # the document's override, kept for round trips
    price_per_gpu_hour: float | None = None
    """USD per GPU-hour: the node's, else its ``gpu_types`` entry's, else the catalog's (if any)."""
    network: str | None = None
    """The document's ``network`` (fabric kind of the NICs), None when it names none."""

    @property
    def per_flow_bw(self) -> float:
        """Bandwidth one network flow of this node can reach (one NIC's share)."""
        return self.inter_node_bw / self.nics


@dataclass(frozen=True)
class Device:
    name: str
    node: Node
    local_index: int

    @property
    def gpu(self) -> GPUType:
        return self.node.gpu


@dataclass(frozen=True)
class Cluster:
    """A resolved cluster: nodes, devices and the GPU catalog it was resolved against."""

    name: str
    nodes: tuple[Node, ...]
    catalog: GPUCatalog = field(repr=False, compare=False)
    # figures the document left out and the GPU type supplied, one sentence each (the CLI prints them)
    assumed: tuple[str, ...] = field(default=(), repr=False, compare=False)

    @cached_property
    def devices(self) -> dict[str, Device]:
        return {f"{n.name}:{i}": Device(f"{n.name}:{i}", n, i) for n in self.nodes for i in range(n.num_gpus)}

    @cached_property
    def device_node(self) -> dict[str, str]:
        """Each device's node name."""
        return {d: dev.node.name for d, dev in self.devices.items()}

    @cached_property
    def node_by_name(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    @property
    def num_gpus(self) -> int:
        return sum(n.num_gpus for n in self.nodes)

    @cached_property
    def gpu_types(self) -> dict[str, GPUType]:
        out: dict[str, GPUType] = {}
        for n in self.nodes:
            out.setdefault(n.gpu.name, n.gpu)
        return out

    @cached_property
    def gpu_counts(self) -> dict[str, int]:
        c: Counter[str] = Counter()
        for n in self.nodes:
            c[n.gpu.name] += n.num_gpus
        return dict(c)

    @property
    def total_memory_bytes(self) -> float:
        return sum(n.gpu.memory_bytes * n.num_gpus for n in self.nodes)

    def device(self, name: str) -> Device:
        return self.devices[name]

    def subset(self, node_names: list[str] | set[str], name: str | None = None) -> "Cluster":
        """The cluster restricted to some nodes (re-indexed)."""
        wanted = set(node_names)  # (a list would make this quadratic: 100,000 nodes took a minute)
        keep = [n for n in self.nodes if n.name in wanted]
        nodes = tuple(Node(n.name, i, n.gpu, n.num_gpus, n.inter_node_bw, n.intra_node_bw, n.nics, n.zone,
                           n.intra_node_gbps, n.price_per_gpu_hour, n.network) for i, n in enumerate(keep))
        return Cluster(name or self.name, nodes, self.catalog)

    def to_spec(self) -> dict[str, Any]:
        """A cluster document (one node entry per node) that loads back to this cluster."""
        nodes = []
        for n in self.nodes:
            entry: dict[str, Any] = {"name": n.name, "count": 1, "gpu": n.gpu.name, "gpus_per_node": n.num_gpus,
                                     "inter_node_gbps": n.inter_node_bw / GB}
            if n.zone:
                entry["zone"] = n.zone
            if n.intra_node_gbps is not None:
                entry["intra_node_gbps"] = n.intra_node_gbps
            if n.price_per_gpu_hour is not None:
                entry["price_per_gpu_hour"] = n.price_per_gpu_hour
            if n.network is not None:
                entry["network"] = n.network
            nodes.append(entry)
        custom = [g for g in self.gpu_types.values() if gpu_catalog().get(g.name) != g]
        doc: dict[str, Any] = {"name": self.name, "nodes": nodes}
        if custom:
            doc["gpu_types"] = [CustomGPUType(**{k: v for k, v in g.model_dump().items()
                                                 if k in CustomGPUType.model_fields}).model_dump()
                                for g in custom]
        return doc


def build_cluster(spec: ClusterSpec, source: str = "") -> Cluster:
    """Resolve GPU names, expand ``{i}`` and check node names are unique."""
    total = sum(g.count * (g.gpus_per_node or 8) for g in spec.nodes)
    if total > 1_000_000:
        raise InputError(source, "nodes", f"{total} GPUs is more than arachne plans for (1,000,000)")
    seen_types: dict[str, int] = {}
    for ti, g in enumerate(spec.gpu_types):  # two entries of one name: which one the nodes meant is a guess
        if (first := seen_types.setdefault(normalize_name(g.name), ti)) != ti:
            raise InputError(source, f"gpu_types[{ti}].name", f"{g.name!r} is declared twice (also gpu_types[{first}])")
    catalog = gpu_catalog().with_types([g.to_gpu_type() for g in spec.gpu_types])
    nodes: list[Node] = []
    seen: set[str] = set()
    assumed: list[str] = []
    type_price = {normalize_name(g.name): g.price_per_gpu_hour for g in spec.gpu_types}
    for gi, group in enumerate(spec.nodes):
        gpu = catalog.get(group.gpu)
        if gpu is None:
            raise InputError(source, f"nodes[{gi}].gpu",
                             f"unknown GPU type {group.gpu!r} (see `arachne gpus`, or declare it in gpu_types)")
        if "{i}" not in group.name and group.count != 1:
            raise InputError(source, f"nodes[{gi}].name", "a group with count > 1 needs '{i}' in its name")
        per_node = group.gpus_per_node or gpu.gpus_per_node
        where = f"nodes[{gi}] ({group.name}" + (f", {group.count} nodes)" if group.count > 1 else ")")
        if group.gpus_per_node is None:
            assumed.append(f"{where}: gpus_per_node not given, assumed {per_node}, the {gpu.name} default")
        if group.inter_node_gbps is None:
            assumed.append(f"{where}: inter_node_gbps not given, assumed {gpu.inter_node_gbps:g} GB/s, "
                           f"the {gpu.name} default")
        inter = (group.inter_node_gbps or gpu.inter_node_gbps) * GB
        intra = group.intra_node_gbps * GB / 2 * 0.8 if group.intra_node_gbps else gpu.collective_bandwidth
        nics = min(gpu.nics_per_node, per_node)
        price = group.price_per_gpu_hour
        if price is None:
            price = type_price.get(normalize_name(gpu.name))
        if price is None:
            price = getattr(gpu, "price_per_gpu_hour", None)  # a catalog default, where the catalog has one
        for i in range(group.count):
            name = group.name.replace("{i}", str(i))
            if ":" in name:
                raise InputError(source, f"nodes[{gi}].name", "node names must not contain ':'")
            check_name(name, source, f"nodes[{gi}].name")  # names reach launch scripts, file names, terminals
            if name in seen:
                raise InputError(source, f"nodes[{gi}].name", f"duplicate node name {name!r}")
            seen.add(name)
            nodes.append(Node(name, len(nodes), gpu, per_node, inter, intra, nics, group.zone, group.intra_node_gbps,
                              price, group.network))
    return Cluster(spec.name, tuple(nodes), catalog, tuple(assumed))


def cluster_from_dict(data: dict[str, Any], source: str = "") -> Cluster:
    try:
        spec = ClusterSpec(**data)
    except ValidationError as err:
        raise from_validation_error(source, err) from None
    except TypeError as err:  # e.g. a non-string key at the top level
        raise InputError(source, "", f"malformed cluster document ({err})") from None
    return build_cluster(spec, source)


def load_cluster(path: str | Path) -> Cluster:
    """Load and resolve a cluster YAML/JSON file; bad input raises :class:`InputError`."""
    return cluster_from_dict(load_document(path), str(path))
