"""The one plan type (formats v1 section 4, v2 section 7): pipelines of stages, with precise validation.

The version-2 rules (virtual stages, cp, sequence parallelism, selective recomputation, etp, ZeRO-2/3,
fp8) live in :mod:`arachne.plan_rules`; this module holds the types, reading and writing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_serializer,
)

from arachne.errors import InputError, from_validation_error, load_document
from arachne.spec.cluster import Cluster
from arachne.spec.job import MAX_GLOBAL_BATCH_SIZE, Job, sequence_error
from arachne.spec.model import ModelSpec, load_model

PLAN_FORMAT = "arachne-plan/1"
PLAN_FORMAT_V2 = "arachne-plan/2"
PLAN_FORMATS = (PLAN_FORMAT, PLAN_FORMAT_V2)
PlanPrecision = Literal["bf16", "fp16", "fp32", "fp8"]
RecomputeModule = Literal["core_attn", "layernorm", "mla_up_proj", "mlp", "moe", "moe_act", "shared_experts"]
"""Megatron-Core's ``--recompute-modules`` names (formats section 4.3, ``recompute_modules``)."""
_BLOCK = Annotated[int, Strict()]  # "17" and true are not block indices
_RANGE = TypeAdapter(tuple[_BLOCK, _BLOCK])
_RANGES = TypeAdapter(tuple[tuple[_BLOCK, _BLOCK], ...])


def _exact_int(value: Any) -> Any:
    """Refuse ``true`` and ``1.0`` where a small integer code is meant (pydantic cannot make a Literal strict)."""
    if type(value) is not int:
        raise ValueError(f"expected an integer, got {value!r}")
    return value


ZeroStage = Annotated[Literal[0, 1, 2, 3], BeforeValidator(_exact_int)]
"""A ZeRO stage: 0 (none), 1 (optimizer state sharded), 2 (and gradients), 3 (and parameters)."""


class _V1Dump(BaseModel):
    """Drops version-2 fields at their defaults from ``model_dump``: a version-1 plan dumps (and hashes)
    exactly as before version 2 existed."""

    V2_DEFAULTS: ClassVar[dict[str, Any]] = {}

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        out = handler(self)
        for key, default in self.V2_DEFAULTS.items():
            if key in out and out[key] == default and type(out[key]) is type(default):
                del out[key]
        return out


class Stage(_V1Dump):
    """Blocks ``[start, end)`` (or, interleaved, ``virtual_stages`` ranges) on ``dp`` groups of ``cp * tp``
    devices."""

    model_config = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False)

    layers: Any
    """``[start, end)``; with ``virtual_stages > 1`` a list of such ranges, one per chunk, in model order."""
    devices: tuple[str, ...] = Field(min_length=1)
    """``dp`` groups of ``cp * tp`` devices, tp fastest, then cp."""
    tp: int = Field(strict=True, default=1, ge=1)
    """Tensor-parallel degree."""
    dp: int | None = Field(strict=True, default=None, ge=1)
    """Stage data parallelism (default ``len(devices) / (cp * tp)``): each micro-batch is split dp ways."""
    ep: int = Field(strict=True, default=1, ge=1)
    """Expert-parallel degree of the stage's MoE blocks."""
    recompute: bool | Literal["selective"] = False
    """``False`` (``"none"``), ``True`` (``"full"``: every block, or the first ``recompute_layers``) or
    ``"selective"`` (the attention core only)."""
    allow_cross_node_tp: bool = Field(default=False, strict=True)
    """Allow a tensor-parallel group to span nodes."""
    cp: int = Field(strict=True, default=1, ge=1)
    """v2: context-parallel degree (each sequence split over cp ranks in load-balanced halves)."""
    sequence_parallel: bool = Field(default=False, strict=True)
    """v2: Megatron sequence parallelism inside the tp group (needs ``tp > 1``)."""
    recompute_layers: int | None = Field(strict=True, default=None, ge=1)
    """v2, with ``recompute: "full"``: only the stage's first k blocks are recomputed."""
    etp: int | None = Field(strict=True, default=None, ge=1)
    """v2: tensor-parallel degree of the routed experts (default ``tp``)."""
    recompute_modules: tuple[RecomputeModule, ...] | None = None
    """v2 (optional, an arachne addition; Megatron-Core's ``--recompute-modules``), with ``recompute: "selective"``:
    the block parts whose activations are dropped in forward and recomputed in backward. Unset: ``["core_attn"]``
    (the attention core, what ``"selective"`` always meant); an empty list recomputes nothing."""
    V2_DEFAULTS: ClassVar[dict[str, Any]] = {"cp": 1, "sequence_parallel": False, "recompute_layers": None, "etp": None,
                                             "recompute_modules": None}

    @field_validator("layers", mode="before")
    @classmethod
    def _layers(cls, v: Any) -> Any:
        nested = isinstance(v, (list, tuple)) and len(v) > 0 and all(isinstance(x, (list, tuple)) for x in v)
        try:
            return _RANGES.validate_python(v) if nested else _RANGE.validate_python(v)
        except ValidationError as err:
            what = "a list of [start, end] ranges" if nested else "[start, end], two integers"
            raise ValueError(f"expected {what} ({err.errors()[0]['msg']})") from None

    @field_validator("recompute", mode="before")
    @classmethod
    def _recompute(cls, v: Any) -> Any:
        return {"none": False, "full": True}.get(v, v) if isinstance(v, str) else v

    @field_validator("recompute_modules")
    @classmethod
    def _modules(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if v is not None and len(set(v)) != len(v):
            dup = next(m for m in v if v.count(m) > 1)
            raise ValueError(f"{dup!r} is listed twice")
        return v

    @property
    def ranges(self) -> tuple[tuple[int, int], ...]:
        """The stage's block ranges: one, or one per virtual stage (chunk)."""
        return self.layers if isinstance(self.layers[0], tuple) else (self.layers,)

    @property
    def start(self) -> int:
        return self.ranges[0][0]

    @property
    def end(self) -> int:
        return self.ranges[-1][1]

    @property
    def num_layers(self) -> int:
        return sum(b - a for a, b in self.ranges)

    @property
    def dp_size(self) -> int:
        dp = self.dp
        if dp is not None:
            return dp
        return len(self.devices) // (self.tp * self.cp) or 1  # max(1, that) without the call (a hot property)

    @property
    def etp_size(self) -> int:
        """The routed experts' tensor-parallel degree (``etp``, else ``tp``)."""
        return self.etp if self.etp is not None else self.tp

    def groups(self) -> list[tuple[str, ...]]:
        """The tensor-parallel groups of this stage (``dp * cp`` of them)."""
        return [self.devices[i * self.tp:(i + 1) * self.tp] for i in range(self.dp_size * self.cp)]

    def to_doc(self) -> dict[str, Any]:
        layers = [list(r) for r in self.layers] if isinstance(self.layers[0], tuple) else list(self.layers)
        doc: dict[str, Any] = {"layers": layers, "devices": list(self.devices), "tp": self.tp}
        if self.dp is not None:
            doc["dp"] = self.dp
        if self.cp != 1:
            doc["cp"] = self.cp
        if self.ep != 1:
            doc["ep"] = self.ep
        if self.etp is not None:
            doc["etp"] = self.etp
        if self.sequence_parallel:
            doc["sequence_parallel"] = True
        if self.recompute == "selective":
            doc["recompute"] = "selective"
        elif self.recompute:
            doc["recompute"] = True if self.recompute_layers is None else "full"
        if self.recompute_layers is not None:
            doc["recompute_layers"] = self.recompute_layers
        if self.recompute_modules is not None:
            doc["recompute_modules"] = list(self.recompute_modules)
        if self.allow_cross_node_tp:
            doc["allow_cross_node_tp"] = True
        return doc


class Pipeline(_V1Dump):
    """One data-parallel replica: a chain of stages and its share of the global batch."""

    model_config = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False)

    micro_batches: int = Field(ge=1, strict=True)
    """Micro-batches this replica runs per iteration."""
    stages: tuple[Stage, ...] = Field(min_length=1)
    """Stages in pipeline order."""
    micro_batch_size: int | None = Field(strict=True, default=None, ge=1)
    """This replica's micro-batch size (default: the plan's)."""
    virtual_stages: int = Field(strict=True, default=1, ge=1, le=10_000)
    """v2: interleaved 1F1B chunks per stage (chunk j of stage s is range ``j * S + s``)."""
    V2_DEFAULTS: ClassVar[dict[str, Any]] = {"virtual_stages": 1}

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"micro_batches": self.micro_batches, "stages": [s.to_doc() for s in self.stages]}
        if self.micro_batch_size is not None:
            doc["micro_batch_size"] = self.micro_batch_size
        if self.virtual_stages != 1:
            doc["virtual_stages"] = self.virtual_stages
        return doc


class Plan(_V1Dump):
    """A complete parallelism plan. Every planner returns this; the cost model prices it."""

    model_config = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False)

    format: str = PLAN_FORMAT
    model: str | dict[str, Any]
    global_batch_size: int = Field(ge=1, le=MAX_GLOBAL_BATCH_SIZE, strict=True)
    sequence_length: int = Field(ge=1, strict=True)
    micro_batch_size: int = Field(ge=1, strict=True)
    precision: PlanPrecision = "bf16"
    """Training precision; ``fp8`` (v2) only on GPUs whose catalog entry has an FP8 rate."""
    zero_stage: ZeroStage = 0
    """ZeRO: 1 shards optimizer state, 2 (v2) also gradients, 3 (v2) also parameters."""
    schedule: Literal["1f1b", "gpipe"] = "1f1b"
    pipelines: tuple[Pipeline, ...] = Field(min_length=1)
    optimizer: Literal["adam", "sgd"] = "adam"
    planner: str | None = None
    planning_time_s: float | None = None
    estimate: dict[str, Any] | None = None
    overlap_grad_reduce: bool = Field(default=False, strict=True)
    """v2: gradient reduction runs bucket by bucket during the backward pass."""
    overlap_param_gather: bool = Field(default=False, strict=True)
    """v2, with ``zero_stage >= 1``: the next iteration's parameter all-gather overlaps the forward pass."""
    framework: Literal["megatron", "torch"] | None = None
    """v2 (optional, an arachne addition): how the training code keeps memory. ``megatron``: Megatron-Core
    with Transformer Engine (fused norms and cross-entropy, fp32 main gradients); ``torch``: plain PyTorch
    modules (torchtitan, FSDP on Hugging Face models: composite norms, torch cross-entropy). Unset: ``torch``
    with ``zero_stage`` 3, else ``megatron``."""
    grad_reduce_in_fp32: bool | None = Field(default=None, strict=True)
    """v2 (optional, an arachne addition; Megatron-Core's flag of that name): gradients accumulated and reduced
    in fp32 (4 bytes per parameter) or, ``false``, in the 16-bit type (2). Unset: fp32, the default of
    Megatron-LM with bf16 and of torchtitan's FSDP (``reduce_dtype``)."""
    fp8_params: bool = Field(default=False, strict=True)
    """v2 (optional, an arachne addition; Megatron-LM's ``--fp8-param-gather``), with ``precision: fp8`` under the
    ``megatron`` convention: the GEMM weights are kept only in fp8 (Transformer Engine's fp8 model parameters), the
    16-bit copy is dropped; the fp32 master weights stay in the optimizer."""
    master_weights: Literal["fp32", "none"] | None = None
    """v2 (optional, an arachne addition): ``none``: the optimizer steps the 16-bit parameters themselves (no fp32
    master copy; the parameters' gradients are 16-bit too), as a model built in bf16 under plain PyTorch / FSDP2.
    Unset: ``fp32``."""
    optimizer_state_dtype: Literal["fp32", "bf16"] | None = None
    """v2 (optional, an arachne addition): the type of Adam's two moment estimates (``bf16``: what ``torch.optim``
    keeps for bf16 parameters; Megatron-LM's ``--exp-avg-dtype``/``--exp-avg-sq-dtype``). Unset: ``fp32``."""
    loss: Literal["standard", "fused"] | None = None
    """v2 (optional, an arachne addition): ``fused``: a fused or compiled cross-entropy that never materialises
    an fp32 copy of the logits (the logits and their gradient in the activation type only). Unset: ``standard``
    (the framework convention's loss)."""
    attention_kernel: Literal["cudnn", "flash2"] | None = None
    """v2 (optional, an arachne addition), 16-bit precisions: the fused attention kernel the training code runs.
    ``cudnn``: cuDNN's fused attention (Transformer Engine's on Hopper and Blackwell; FlashAttention-3 runs within
    5% of it); ``flash2``: FlashAttention-2 (the ``flash-attn`` 2.x package; PyTorch SDPA's flash backend, what
    SDPA runs on Hopper from torch 2.5.1 until torch 2.10 with cuDNN 9.15.1). Unset: ``cudnn`` on Hopper and
    Blackwell, ``flash2`` elsewhere. fp32 has no fused kernel: its scores are materialised."""
    elementwise_kernels: Literal["fused", "eager"] | None = None
    """v2 (optional, an arachne addition): how the blocks' element-wise ops (norms, rotary embedding) run.
    ``fused``: fused kernels (Transformer Engine, apex, ``torch.compile``); ``eager``: eager PyTorch, one kernel per
    op with fp32 upcasts (torchtitan without ``compile``). Unset: ``fused``. Priced for 16-bit activations."""
    overlap_moe_comm: bool = Field(default=False, strict=True)
    """v2 (optional, an arachne addition), MoE models with ep > 1: the experts' all-to-alls of one micro-batch run
    while another micro-batch computes (Megatron-Core's ``--overlap-moe-expert-parallel-comm`` with
    ``--delay-wgrad-compute``: the steady 1F1B phase pairs a forward with a backward and interleaves them), so a
    forward's dispatch and combine hide behind a backward's compute and the other way round."""
    moe_kernels: Literal["grouped", "fused"] | None = None
    """v2 (optional, an arachne addition), MoE models: how the routed-expert layer runs. ``grouped``: token
    permutation, grouped expert GEMMs and separate activation and aggregation kernels (Megatron-Core's MoE layer);
    ``fused``: IO-aware kernels that gather tokens inside the expert GEMMs and fuse the activation and the
    aggregation (SonicMoE). Unset: ``grouped``. Dense models ignore it."""
    V2_DEFAULTS: ClassVar[dict[str, Any]] = {"overlap_grad_reduce": False, "overlap_param_gather": False,
                                             "framework": None, "grad_reduce_in_fp32": None, "fp8_params": False,
                                             "master_weights": None, "optimizer_state_dtype": None, "loss": None,
                                             "attention_kernel": None, "elementwise_kernels": None,
                                             "overlap_moe_comm": False, "moe_kernels": None}

    @field_validator("format")
    @classmethod
    def _format(cls, v: str) -> str:
        if v not in PLAN_FORMATS:
            raise ValueError(f"unsupported format {v!r}, expected {PLAN_FORMAT!r} or {PLAN_FORMAT_V2!r}")
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

    @property
    def written_format(self) -> str:
        """``arachne-plan/2`` when the plan uses a version-2 field, else ``arachne-plan/1``."""
        from arachne.plan_rules import uses_v2

        return PLAN_FORMAT_V2 if uses_v2(self) else PLAN_FORMAT

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "format": self.written_format, "model": self.model,
            "global_batch_size": self.global_batch_size, "sequence_length": self.sequence_length,
            "micro_batch_size": self.micro_batch_size, "precision": self.precision,
            "zero_stage": self.zero_stage, "schedule": self.schedule,
            "pipelines": [p.to_doc() for p in self.pipelines],
        }
        for key in ("overlap_grad_reduce", "overlap_param_gather", "fp8_params"):
            if getattr(self, key):
                doc[key] = True
        for key in ("framework", "grad_reduce_in_fp32", "master_weights", "optimizer_state_dtype", "loss",
                    "attention_kernel"):
            if getattr(self, key) is not None:
                doc[key] = getattr(self, key)
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
    """A plan document (``arachne-plan/1`` or ``/2``); a version-1 document that uses a version-2 key or
    value is refused, naming it."""
    from arachne.plan_rules import v1_document_error

    if isinstance(data, dict) and (found := v1_document_error(data)) is not None:
        raise InputError(source, *found)
    try:
        return Plan(**data)
    except ValidationError as err:
        raise from_validation_error(source, err) from None
    except TypeError as err:
        raise InputError(source, "", str(err)) from None


def load_plan(path: str | Path) -> Plan:
    """Read a plan JSON file; structural problems raise :class:`InputError`."""
    return plan_from_dict(load_document(path), str(path))


def _tp_groups_may_span(devices: tuple[str, ...], tp: int, node_of: dict[str, str]) -> bool:
    """False where every TP group's devices (``tp`` consecutive) are on one node (each device's node equal to
    the one before it in its group: ``tp - 1`` list comparisons instead of a set per group)."""
    nodes = list(map(node_of.get, devices))
    return any(nodes[k::tp] != nodes[k - 1::tp] for k in range(1, tp))


def plan_errors(plan: Plan, cluster: Cluster, model: ModelSpec) -> list[tuple[str, str]]:
    """Every rule of formats v1 (and v2) the plan breaks, as ``(field, reason)`` pairs."""
    from arachne.plan_rules import plan_v2_errors, stage_v2_errors

    errs: list[tuple[str, str]] = []
    if (why := sequence_error(plan.sequence_length, model)) is not None:
        errs.append(("sequence_length", why))
    errs += plan_v2_errors(plan)
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
            if pipe.virtual_stages == 1 and len(st.ranges) == 1:
                a, b = st.ranges[0]
                if a != expect:
                    errs.append((f"{sfx}.layers", f"starts at {a}, expected {expect} (ranges must be contiguous, in order)"))
                if b <= a:
                    errs.append((f"{sfx}.layers", f"empty or reversed range [{a}, {b})"))
                expect = max(b, expect)
            devs = st.devices
            if seen.keys().isdisjoint(devs) and cluster.devices.keys() >= (own := set(devs)) and \
                    len(own) == len(devs):  # every device known and new (the usual case, without a loop here)
                seen.update(dict.fromkeys(devs, sfx))
                devs = ()
            for d in devs:
                if d not in cluster.devices:
                    errs.append((f"{sfx}.devices", f"unknown device {d!r} (not in the cluster)"))
                elif d in seen:
                    errs.append((f"{sfx}.devices", f"device {d!r} is already used by {seen[d]}"))
                else:
                    seen[d] = sfx
            n = len(st.devices)
            if n % st.tp:
                errs.append((f"{sfx}.tp", f"{st.tp} does not divide the stage's {n} devices"))
            elif n % (st.cp * st.tp):
                errs.append((f"{sfx}.cp", f"cp*tp = {st.cp}*{st.tp} does not divide the stage's {n} devices"))
            if st.dp is not None and st.dp * st.cp * st.tp != n:
                if st.cp == 1:
                    errs.append((f"{sfx}.dp", f"dp*tp = {st.dp}*{st.tp} != {n} devices"))
                else:
                    errs.append((f"{sfx}.dp", f"dp*cp*tp = {st.dp}*{st.cp}*{st.tp} != {n} devices"))
            if (why := model.tp_error(st.tp, etp=st.etp)) is not None:
                errs.append((f"{sfx}.etp" if why.startswith("etp") else f"{sfx}.tp", why))
            dp = st.dp_size
            if dp > 1 and mbs % dp:
                errs.append((f"{sfx}.dp", f"stage dp {dp} does not divide the micro-batch size {mbs}"))
            if st.ep > 1:
                if (why := model.ep_error(st.ep)) is not None:
                    errs.append((f"{sfx}.ep", why))
                if st.etp is None and st.cp == 1:
                    if dp % st.ep:
                        errs.append((f"{sfx}.ep", f"ep {st.ep} does not divide the stage's dp {dp}"))
                elif (dp * st.cp * st.tp) % (st.ep * st.etp_size):
                    errs.append((f"{sfx}.ep", f"ep*etp = {st.ep}*{st.etp_size} does not divide the stage's "
                                              f"dp*cp*tp = {dp}*{st.cp}*{st.tp} devices"))
            errs += stage_v2_errors(plan, pipe, st, sfx, cluster, model)
            if not st.allow_cross_node_tp and n % st.tp == 0 and st.tp > 1 and \
                    _tp_groups_may_span(st.devices, st.tp, cluster.device_node):
                node_of = cluster.device_node
                for g, group in enumerate(st.groups()):
                    nodes = set(map(node_of.get, group))
                    nodes.discard(None)  # an unknown device: reported above
                    if len(nodes) > 1:
                        errs.append((f"{sfx}.devices",
                                     f"TP group {g} spans nodes {sorted(nodes)}; set allow_cross_node_tp to allow it"))
                        break
        if pipe.virtual_stages == 1:
            if expect != L:
                errs.append((f"{pfx}.stages", f"layers end at {expect}, the model has {L} blocks"))
        else:
            from arachne.plan_rules import interleaved_errors

            errs += interleaved_errors(plan, pipe, pfx, L)
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
