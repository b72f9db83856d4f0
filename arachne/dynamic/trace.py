"""Traces of a cluster that changes while a job runs: the ``arachne-trace/1`` format (a starting cluster and
timed join/leave events, docs/formats.md "Trace format"), and Sailor's GPU availability traces read as they
are (``sailor:spot``, ``sailor:grow``, or a Sailor trace file).

Reading a trace resolves it completely: every event is applied in order and the cluster between two events
is built, so a bad trace fails (one line naming the file and the field) before anything is planned.
GPUs are followed by identity: a node that loses one GPU is rebuilt with its remaining GPUs renumbered
``0..k-1``, and :class:`Snapshot` maps each of its devices to the GPU's id in the trace (``node:index`` at join).
"""

from __future__ import annotations

import itertools
import json
import os
import random
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from arachne.errors import (
    InputError,
    from_validation_error,
    load_document,
    parse_document,
)
from arachne.spec.cluster import Cluster, NodeGroupSpec, cluster_from_dict
from arachne.spec.job import MAX_GLOBAL_BATCH_SIZE
from arachne.spec.names import DisplayName

TRACE_FORMAT = "arachne-trace/1"
MAX_EVENTS = 1_000  # each event re-plans with every planner: more is hours of planning
MAX_TRACE_S = 1e9  # the latest time a trace may name, s
MAX_SAILOR_GPUS = 100_000  # a Sailor trace's GPUs of one kind at one time (a spot VM is a node: as a cluster's count)
SAILOR_NAMES = ("sailor:spot", "sailor:grow")


class JobDefaults(BaseModel):
    """The job a trace suggests (``arachne replay`` options override each field)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: str | None = Field(default=None, min_length=1)
    """Catalog model name (as ``--model``)."""
    global_batch_size: int | None = Field(default=None, ge=1, le=MAX_GLOBAL_BATCH_SIZE, strict=True)
    """Sequences per iteration (as ``--global-batch-size``)."""
    sequence_length: int | None = Field(default=None, ge=1, strict=True)
    """Tokens per sequence (as ``--sequence-length``)."""


class EventSpec(BaseModel):
    """One entry of ``events``: at ``t_s``, the nodes or GPUs of ``leave`` go, then the nodes of ``join`` come."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    t_s: float = Field(gt=0)
    """Seconds since the start of the job; strictly increasing over the events, below ``end_s``."""
    join: list[NodeGroupSpec] = Field(default_factory=list, max_length=10_000)
    """Node groups that join, as in a cluster document (``{i}`` expands from 0); names must be new."""
    leave: list[str] = Field(default_factory=list, max_length=100_000)
    """Node names (the whole node leaves) or device ids ``node:index`` (one GPU of a node leaves)."""
    label: str = Field(default="", max_length=200)
    """What happened, shown in reports (optional)."""


class TraceSpec(BaseModel):
    """A trace document (``format: arachne-trace/1``)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    format: Literal["arachne-trace/1"]
    """The format tag."""
    name: DisplayName = "trace"
    """Shown in reports."""
    cluster: str | dict[str, Any]
    """The cluster at time 0: an inline cluster document, or the path of one relative to the trace file's folder
    (it must stay inside that folder)."""
    end_s: float = Field(gt=0)
    """When the replay ends, seconds since the start; after the last event."""
    events: list[EventSpec] = Field(default_factory=list, max_length=MAX_EVENTS)
    """The changes, in time order."""
    job: JobDefaults = Field(default_factory=JobDefaults)
    """The job the trace suggests (optional)."""


@dataclass(frozen=True)
class TraceEvent:
    """A change of the cluster at ``t_s``: ``leave`` (node names or device ids) first, then ``join`` (one node
    entry per node, ``{i}`` expanded, as in a cluster document)."""

    t_s: float
    join: tuple[dict[str, Any], ...] = ()
    leave: tuple[str, ...] = ()
    label: str = ""

    def describe(self) -> str:
        """The label, else what leaves and joins."""
        if self.label:
            return self.label
        parts = [f"{len(self.leave)} leave"] if self.leave else []
        return ", ".join(parts + ([f"{len(self.join)} node(s) join"] if self.join else []))


@dataclass(frozen=True)
class Snapshot:
    """The cluster from ``start_s`` to ``end_s``, and the trace id (``node:index`` at join) of each device."""

    start_s: float
    end_s: float
    cluster: Cluster
    trace_ids: dict[str, str] = field(repr=False)  # cluster device name -> trace id
    event: TraceEvent | None = None  # the event that starts it (None: the start)

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class Trace:
    """A resolved trace: its events and the cluster between every two of them."""

    name: str
    source: str
    events: tuple[TraceEvent, ...]
    end_s: float
    snapshots: tuple[Snapshot, ...]
    job: JobDefaults = field(default_factory=JobDefaults)
    cluster_file: str | None = None  # the starting cluster's file, when the trace names one

    @property
    def event_times(self) -> list[float]:
        return [e.t_s for e in self.events]

    def to_doc(self) -> dict[str, Any]:
        """Name, source and one row per snapshot (what reports and ``--json`` show of the trace)."""
        return {"name": self.name, "source": self.source, "end_s": self.end_s,
                "snapshots": [{"start_s": s.start_s, "end_s": s.end_s, "gpus": s.cluster.num_gpus,
                               "gpu_counts": s.cluster.gpu_counts,
                               "event": s.event.describe() if s.event else "start"} for s in self.snapshots]}


# ---- resolving: events applied in order ------------------------------------------------------------------------------
class _State:
    """The live nodes (entries of one node each, in join order) and, per node, its live GPU indices."""

    def __init__(self, source: str, gpu_types: list[Any]):
        self.source, self.gpu_types = source, gpu_types
        self.entries: dict[str, dict[str, Any]] = {}
        self.live: dict[str, list[int]] = {}

    def _resolve(self, groups: list[dict[str, Any]], field_: str) -> Cluster:
        """The groups as a cluster (names expanded, GPU types resolved) with this trace's custom GPU types."""
        try:
            return cluster_from_dict({"name": "trace", "nodes": groups, "gpu_types": self.gpu_types},
                                     self.source)
        except InputError as e:  # name the trace's field, not the temporary cluster's
            where = e.field.replace("nodes", field_, 1) if e.field.startswith("nodes") else field_
            raise InputError(self.source, where, e.reason) from None

    def add(self, groups: list[dict[str, Any]], field_: str, forbid: frozenset[str] = frozenset()) -> None:
        """Add node groups (their names must be new, and not in ``forbid``: the nodes leaving at that time)."""
        if not groups:
            return
        cl = self._resolve(groups, field_)
        expanded = [(gi, g) for gi, g in enumerate(groups) for _ in range(g.get("count", 1))]
        for node, (gi, group) in zip(cl.nodes, expanded):
            if node.name in self.entries or node.name in forbid:
                why = "is already in the cluster" if node.name in self.entries else "leaves at the same time"
                raise InputError(self.source, f"{field_}[{gi}].name", f"node {node.name!r} {why}")
            self.entries[node.name] = {**group, "name": node.name, "count": 1, "gpus_per_node": node.num_gpus}
            self.live[node.name] = list(range(node.num_gpus))

    def remove(self, what: str, field_: str) -> None:
        node, sep, index = what.partition(":")
        if node not in self.entries:
            raise InputError(self.source, field_, f"{what!r} is not in the cluster at this time (unknown node)")
        if not sep:
            del self.entries[node], self.live[node]
            return
        if not index.isdigit() or int(index) not in self.live[node]:
            raise InputError(self.source, field_, f"{what!r} is not a GPU of node {node!r} at this time")
        self.live[node].remove(int(index))
        if not self.live[node]:
            del self.entries[node], self.live[node]

    def snapshot(self, name: str, start: float, end: float, event: TraceEvent | None, field_: str) -> Snapshot:
        if not self.entries:
            raise InputError(self.source, field_, "no GPU would be left in the cluster")
        nodes = [{**e, "gpus_per_node": len(self.live[n])} for n, e in self.entries.items()]
        cl = cluster_from_dict({"name": name, "nodes": nodes, "gpu_types": self.gpu_types}, self.source)
        ids = {f"{n}:{k}": f"{n}:{i}" for n in self.entries for k, i in enumerate(self.live[n])}
        return Snapshot(start, end, cl, ids, event)


def build_trace(name: str, source: str, cluster_doc: dict[str, Any], events: list[TraceEvent], end_s: float,
                job: JobDefaults | None = None, cluster_file: str | None = None) -> Trace:
    """Apply ``events`` to the starting cluster in order; every problem is an :class:`InputError` naming
    ``source`` and the field (``events[3].leave[0]``), or ``cluster_file`` when the starting cluster is bad."""
    try:
        start = cluster_from_dict(cluster_doc, cluster_file or source)
    except InputError as e:
        if cluster_file:
            raise
        raise InputError(source, f"cluster.{e.field}" if e.field else "cluster", e.reason) from None
    state = _State(source, cluster_doc.get("gpu_types") or [])
    state.add(list(cluster_doc["nodes"]), "cluster.nodes")
    times = [0.0] + [e.t_s for e in events] + [end_s]
    for i in range(1, len(times)):
        where = f"events[{i - 1}].t_s" if i < len(times) - 1 else "end_s"
        if times[i] <= times[i - 1]:
            raise InputError(source, where, f"{times[i]:g} s is not after {times[i - 1]:g} s: events must be in "
                                            "time order, one per time, between 0 and end_s")
        if times[i] > MAX_TRACE_S:  # tokens over the trace must stay finite
            raise InputError(source, where, f"{times[i]:g} s is past {MAX_TRACE_S:g} s (about 30 years)")
    snaps = [state.snapshot(f"{start.name}@0s", 0.0, times[1], None, "cluster")]
    for i, ev in enumerate(events):
        if not ev.join and not ev.leave:
            raise InputError(source, f"events[{i}]", "an event needs a join or a leave list")
        for j, what in enumerate(ev.leave):
            state.remove(what, f"events[{i}].leave[{j}]")
        gone = frozenset(x.partition(":")[0] for x in ev.leave) - set(state.entries)  # nodes that left whole
        state.add(list(ev.join), f"events[{i}].join", gone)
        snaps.append(state.snapshot(f"{start.name}@{ev.t_s:g}s", ev.t_s, times[i + 2], ev, f"events[{i}]"))
    return Trace(name, source, tuple(events), end_s, tuple(snaps), job or JobDefaults(), cluster_file)


# ---- the arachne-trace/1 document ------------------------------------------------------------------------------------
def _cluster_path(text: str, trace_path: Path) -> Path:
    """The cluster file named by a trace: relative, inside the trace file's folder (symlinks resolved)."""
    src = str(trace_path)
    if not text or "\x00" in text:
        raise InputError(src, "cluster", "expected a cluster document or a relative path")
    p = Path(text)
    if p.is_absolute() or ".." in p.parts:
        raise InputError(src, "cluster", f"{text!r}: the path must be relative to the trace's folder and stay "
                                         "inside it")
    folder = Path(os.path.realpath(trace_path.parent))
    real = Path(os.path.realpath(trace_path.parent / p))
    if folder not in real.parents:
        raise InputError(src, "cluster", f"{text!r} leads outside the trace's folder")
    return trace_path.parent / p


def trace_from_dict(data: dict[str, Any], source: str = "", base: Path | None = None) -> Trace:
    """A trace document (already parsed) as a resolved :class:`Trace`; ``base`` is the trace file (for a cluster
    given as a path)."""
    if data.get("format") != TRACE_FORMAT:
        got = data.get("format")
        raise InputError(source, "format", f"expected {TRACE_FORMAT!r}" + (f", got {got!r}" if got else ""))
    try:
        spec = TraceSpec(**data)
    except ValidationError as err:
        raise from_validation_error(source, err) from None
    except TypeError as err:
        raise InputError(source, "", f"malformed trace document ({err})") from None
    if isinstance(spec.cluster, str):
        if base is None:
            raise InputError(source, "cluster", "a cluster path needs a trace file to be relative to")
        path = _cluster_path(spec.cluster, base)
        cluster_doc, cluster_file = load_document(path), str(path)
    else:
        cluster_doc, cluster_file = spec.cluster, None
    events = [TraceEvent(e.t_s, tuple(g.model_dump(exclude_none=True) for g in e.join), tuple(e.leave), e.label)
              for e in spec.events]
    return build_trace(spec.name, source, cluster_doc, events, spec.end_s, spec.job, cluster_file)


# ---- Sailor's traces, read as they are -------------------------------------------------------------------------------
def sailor_bundle() -> dict[str, Any]:
    """The shipped Sailor traces (``arachne/data/sailor_gpu_traces.json``)."""
    return json.loads(files("arachne.data").joinpath("sailor_gpu_traces.json").read_text())


def sailor_spot(points: list[list[float]], seed: int = 0, source: str = "sailor:spot") -> Trace:
    """Sailor's spot trace: A100 spot VMs of one GPU each whose count follows ``points`` ([t_s, GPUs]; which VMs
    leave is drawn with ``seed``, new ones get fresh names), beside four on-demand 4-GPU V100 nodes that stay.
    The last count holds for 630 s (the trace's first gap)."""
    rng = random.Random(seed)
    alive: list[str] = []
    fresh = 0
    events: list[TraceEvent] = []
    start: list[dict[str, Any]] = []
    for i, (t, n) in enumerate(points):
        gone, new = [], []
        while len(alive) > n:
            gone.append(alive.pop(alive.index(rng.choice(alive))))
        while len(alive) < n:
            alive.append(f"a100-spot-{fresh}")
            new.append({"name": alive[-1], "gpu": "A100-40", "gpus_per_node": 1, "inter_node_gbps": 3.0})
            fresh += 1
        if i == 0:
            start = new
        elif new or gone:
            events.append(TraceEvent(float(t), tuple(new), tuple(gone), f"{n} spot GPUs"))
    start.append({"name": "v100-{i}", "count": 4, "gpu": "V100-16", "gpus_per_node": 4, "inter_node_gbps": 6.25})
    end = float(points[-1][0]) + 630.0
    job = JobDefaults(model="GPT-3-2.7B", global_batch_size=256, sequence_length=2048)
    return build_trace("sailor-spot", source, {"name": "sailor-spot", "nodes": start}, events, end, job)


def sailor_grow(rows: list[dict[str, Any]], source: str = "sailor:grow") -> Trace:
    """Sailor's heterogeneous planner trace: per row the GPUs of each type (``<GPU>_<zone>``), A100 in 8-GPU nodes
    and others in 4-GPU nodes; nodes join (or the newest leave) as the counts change. Times count from the first
    row; the last row holds for the trace's last gap."""
    t0 = rows[0]["timestamp"]
    gaps = [b["timestamp"] - a["timestamp"] for a, b in itertools.pairwise(rows)]
    nodes: dict[str, list[str]] = {}
    events: list[TraceEvent] = []
    start: list[dict[str, Any]] = []
    for i, row in enumerate(rows):
        join, leave = [], []
        for key, count in row["gpus"].items():
            gpu = key.split("_")[0]
            size = 8 if gpu.startswith("A100") else 4
            have = nodes.setdefault(gpu, [])
            while len(have) > count // size:
                leave.append(have.pop())
            while len(have) < count // size:
                have.append(f"{gpu.lower()}-{len(have)}")
                join.append({"name": have[-1], "gpu": gpu, "gpus_per_node": size,
                             "inter_node_gbps": 12.5 if size == 8 else 6.25})
        if i == 0:
            start = join
        elif join or leave:
            events.append(TraceEvent(float(row["timestamp"] - t0), tuple(join), tuple(leave),
                                     f"{sum(row['gpus'].values())} GPUs"))
    end = float(rows[-1]["timestamp"] - t0) + (gaps[-1] if gaps else 600.0)
    job = JobDefaults(model="LLaMA-2-13B", global_batch_size=1024, sequence_length=2048)
    return build_trace("sailor-grow", source, {"name": "sailor-grow", "nodes": start}, events, end, job)


def _sailor_file(data: Any, source: str, seed: int) -> Trace | None:
    """A Sailor trace file (``points`` or ``rows``, as in the shipped bundle), or None if it is not one."""
    try:
        if isinstance(data, dict) and "points" in data and "rows" not in data:
            pts = [[float(t), int(n)] for t, n in data["points"]]
            if not pts or any(not 0 <= n <= MAX_SAILOR_GPUS for _, n in pts):
                raise ValueError(f"points must be [time_s, GPUs] pairs with 0 to {MAX_SAILOR_GPUS:,} GPUs")
            if len(pts) > MAX_EVENTS + 1:
                raise ValueError(f"more than {MAX_EVENTS + 1:,} points")
            return sailor_spot(pts, seed, source)
        if isinstance(data, dict) and "rows" in data and "points" not in data:
            rows = [{"timestamp": float(r["timestamp"]), "gpus": {str(k): int(v) for k, v in r["gpus"].items()}}
                    for r in data["rows"]]
            if not rows:
                raise ValueError("rows is empty")
            if len(rows) > MAX_EVENTS + 1:
                raise ValueError(f"more than {MAX_EVENTS + 1:,} rows")
            if any(not 0 <= n <= MAX_SAILOR_GPUS for r in rows for n in r["gpus"].values()):
                raise ValueError(f"gpus counts must be 0 to {MAX_SAILOR_GPUS:,}")
            return sailor_grow(rows, source)
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise InputError(source, "points" if "points" in data else "rows", f"not a Sailor trace ({e})") from None
    return None


def load_trace(ref: str | Path, seed: int = 0) -> Trace:
    """``sailor:spot``, ``sailor:grow``, an ``arachne-trace/1`` file (YAML or JSON) or a Sailor trace file
    (a JSON object with ``points`` or ``rows``). Bad input raises :class:`InputError` naming the file and field."""
    text = str(ref)
    if text == "sailor:spot":
        return sailor_spot(sailor_bundle()["a100_trace_original"]["points"], seed, text)
    if text == "sailor:grow":
        return sailor_grow(sailor_bundle()["gpu_trace_heterogeneous_imbalanced"]["rows"], text)
    if text.startswith("sailor:"):
        raise InputError(text, "--trace", f"unknown Sailor trace (available: {', '.join(SAILOR_NAMES)})")
    path = Path(text)
    data = load_document(path)
    if "format" not in data:
        if "a100_trace_original" in data and "gpu_trace_heterogeneous_imbalanced" in data:
            raise InputError(text, "", "this file holds Sailor's two traces: use --trace sailor:spot or sailor:grow")
        found = _sailor_file(data, text, seed)
        if found is not None:
            return found
    return trace_from_dict(data, text, path)


def parse_trace_text(text: str, source: str = "trace.yaml", base: Path | None = None) -> Trace:
    """A trace from YAML/JSON text (tests and tools)."""
    data = parse_document(text, source, as_json=source.endswith(".json"))
    if not isinstance(data, dict):
        raise InputError(source, "", "expected a mapping (an object) at the top level")
    return trace_from_dict(data, source, base)
