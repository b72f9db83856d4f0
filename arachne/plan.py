"""The one plan type (formats v1 section 4): pipelines of stages, with precise validation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from arachne.errors import InputError, from_validation_error, load_document
from arachne.spec.cluster import Cluster
from arachne.spec.job import MAX_GLOBAL_BATCH_SIZE, Job, Precision, sequence_error
from arachne.spec.model import ModelSpec, load_model

PLAN_FORMAT = "arachne-plan/1"


class Stage(BaseModel):
    """Blocks ``[start, end)`` on ``dp`` groups of ``tp`` devices."""

    model_config = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False)

    layers: tuple[int, int]
    devices: tuple[str, ...] = Field(min_length=1)
    tp: int = Field(default=1, ge=1)
    dp: int | None = Field(default=None, ge=1)
    ep: int = Field(default=1, ge=1)
    recompute: bool = False
    allow_cross_node_tp: bool = False

    @property
    def start(self) -> int:
        return self.layers[0]

    @property
    def end(self) -> int:
        return self.layers[1]

    @property
    def num_layers(self) -> int:
        return self.layers[1] - self.layers[0]

    @property
    def dp_size(self) -> int:
        return self.dp if self.dp is not None else max(1, len(self.devices) // self.tp)

    def groups(self) -> list[tuple[str, ...]]:
        """The ``dp`` tensor-parallel groups of this stage."""
        return [self.devices[i * self.tp:(i + 1) * self.tp] for i in range(self.dp_size)]

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"layers": list(self.layers), "devices": list(self.devices), "tp": self.tp}
        if self.dp is not None:
            doc["dp"] = self.dp
        if self.ep != 1:
            doc["ep"] = self.ep
        if self.recompute:
            doc["recompute"] = True
        if self.allow_cross_node_tp:
            doc["allow_cross_node_tp"] = True
        return doc


class Pipeline(BaseModel):
    """One data-parallel replica: a chain of stages and its share of the global batch."""

    model_config = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False)

    micro_batches: int = Field(ge=1, strict=True)
    stages: tuple[Stage, ...] = Field(min_length=1)
    micro_batch_size: int | None = Field(default=None, ge=1)

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"micro_batches": self.micro_batches, "stages": [s.to_doc() for s in self.stages]}
        if self.micro_batch_size is not None:
            doc["micro_batch_size"] = self.micro_batch_size
        return doc


class Plan(BaseModel):
    """A complete parallelism plan. Every planner returns this; the cost model prices it."""

    model_config = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False)

    format: str = PLAN_FORMAT
    model: str | dict[str, Any]
    global_batch_size: int = Field(ge=1, le=MAX_GLOBAL_BATCH_SIZE, strict=True)
    sequence_length: int = Field(ge=1, strict=True)
    micro_batch_size: int = Field(ge=1, strict=True)
    precision: Precision = "bf16"
    zero_stage: Literal[0, 1] = 0
    schedule: Literal["1f1b", "gpipe"] = "1f1b"
    pipelines: tuple[Pipeline, ...] = Field(min_length=1)
    optimizer: Literal["adam", "sgd"] = "adam"
    planner: str | None = None
    planning_time_s: float | None = None
    estimate: dict[str, Any] | None = None

    @field_validator("format")
    @classmethod
    def _format(cls, v: str) -> str:
        if v != PLAN_FORMAT:
            raise ValueError(f"unsupported format {v!r}, expected {PLAN_FORMAT!r}")
        return v

    def __hash__(self) -> int:  # dict fields (inline model, estimate) are not hashable
        return hash(self.model_dump_json(exclude={"planner", "planning_time_s", "estimate"}))

    def mbs(self, pipeline: Pipeline) -> int:
        return pipeline.micro_batch_size or self.micro_batch_size

    @property
    def job(self) -> Job:
        return Job(global_batch_size=self.global_batch_size, sequence_length=self.sequence_length,
                   precision=self.precision, optimizer=self.optimizer)

    @property
    def devices(self) -> list[str]:
        return [d for p in self.pipelines for s in p.stages for d in s.devices]

    @property
    def model_name(self) -> str:
        return self.model if isinstance(self.model, str) else str(self.model.get("name", "inline"))

    def resolve_model(self, source: str = "") -> ModelSpec:
        return load_model(self.model, source, "model", allow_files=False)

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "format": self.format, "model": self.model,
            "global_batch_size": self.global_batch_size, "sequence_length": self.sequence_length,
            "micro_batch_size": self.micro_batch_size, "precision": self.precision,
            "zero_stage": self.zero_stage, "schedule": self.schedule,
            "pipelines": [p.to_doc() for p in self.pipelines],
        }
        if self.optimizer != "adam":
            doc["optimizer"] = self.optimizer
        for key in ("planner", "planning_time_s", "estimate"):
            val = getattr(self, key)
            if val is not None:
                doc[key] = val
        return doc

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_doc(), indent=indent)

    def save(self, path: str | Path) -> None:
        """Write the plan without ever leaving a half-written file."""
        from arachne.fileio import write_text_safely

        write_text_safely(path, self.to_json() + "\n")


def plan_from_dict(data: dict[str, Any], source: str = "") -> Plan:
    try:
        return Plan(**data)
    except ValidationError as err:
        raise from_validation_error(source, err) from None
    except TypeError as err:
        raise InputError(source, "", str(err)) from None


def load_plan(path: str | Path) -> Plan:
    """Read a plan JSON file; structural problems raise :class:`InputError`."""
    return plan_from_dict(load_document(path), str(path))


def plan_errors(plan: Plan, cluster: Cluster, model: ModelSpec) -> list[tuple[str, str]]:
    """Every rule of formats v1 the plan breaks, as ``(field, reason)`` pairs."""
    errs: list[tuple[str, str]] = []
    if (why := sequence_error(plan.sequence_length, model)) is not None:
        errs.append(("sequence_length", why))
    seen: dict[str, str] = {}
    L = model.num_layers
    total = 0
    for pi, pipe in enumerate(plan.pipelines):
        pfx = f"pipelines[{pi}]"
        mbs = plan.mbs(pipe)
        total += pipe.micro_batches * mbs
        expect = 0
        for si, st in enumerate(pipe.stages):
            sfx = f"{pfx}.stages[{si}]"
            a, b = st.layers
            if a != expect:
                errs.append((f"{sfx}.layers", f"starts at {a}, expected {expect} (ranges must be contiguous, in order)"))
            if b <= a:
                errs.append((f"{sfx}.layers", f"empty or reversed range [{a}, {b})"))
            expect = max(b, expect)
            for d in st.devices:
                if d not in cluster.devices:
                    errs.append((f"{sfx}.devices", f"unknown device {d!r} (not in the cluster)"))
                elif d in seen:
                    errs.append((f"{sfx}.devices", f"device {d!r} is already used by {seen[d]}"))
                else:
                    seen[d] = sfx
            n = len(st.devices)
            if n % st.tp:
                errs.append((f"{sfx}.tp", f"{st.tp} does not divide the stage's {n} devices"))
            if st.dp is not None and st.dp * st.tp != n:
                errs.append((f"{sfx}.dp", f"dp*tp = {st.dp}*{st.tp} != {n} devices"))
            if (why := model.tp_error(st.tp)) is not None:
                errs.append((f"{sfx}.tp", why))
            dp = st.dp_size
            if dp > 1 and mbs % dp:
                errs.append((f"{sfx}.dp", f"stage dp {dp} does not divide the micro-batch size {mbs}"))
            if st.ep > 1:
                if (why := model.ep_error(st.ep)) is not None:
                    errs.append((f"{sfx}.ep", why))
                if dp % st.ep:
                    errs.append((f"{sfx}.ep", f"ep {st.ep} does not divide the stage's dp {dp}"))
            if not st.allow_cross_node_tp and n % st.tp == 0:
                for g, group in enumerate(st.groups()):
                    nodes = {d.split(":")[0] for d in group if d in cluster.devices}
                    if len(nodes) > 1:
                        errs.append((f"{sfx}.devices",
                                     f"TP group {g} spans nodes {sorted(nodes)}; set allow_cross_node_tp to allow it"))
                        break
        if expect != L:
            errs.append((f"{pfx}.stages", f"layers end at {expect}, the model has {L} blocks"))
    if total != plan.global_batch_size:
        errs.append(("pipelines", f"sum of micro_batches * micro_batch_size = {total} != global_batch_size "
                                  f"{plan.global_batch_size}"))
    return errs


def validate_plan(plan: Plan, cluster: Cluster, model: ModelSpec | None = None, source: str = "") -> ModelSpec:
    """Raise :class:`InputError` on the first broken rule; return the plan's model."""
    model = model or plan.resolve_model(source)
    errs = plan_errors(plan, cluster, model)
    if errs:
        field, reason = errs[0]
        more = f" (and {len(errs) - 1} more problem{'s' if len(errs) > 2 else ''})" if len(errs) > 1 else ""
        raise InputError(source, field, reason + more)
    return model
