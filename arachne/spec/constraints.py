"""The ``--constraints`` file (formats v2 section 10): limits that narrow which plans a planner may return.

Every key is optional; an unknown key is bad input (exit 2, naming it). :func:`constraint_errors`
checks one plan against a :class:`Constraints`, naming the plan field that breaks each limit.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from arachne.errors import InputError, from_validation_error, load_document
from arachne.plan import ZeroStage

if TYPE_CHECKING:
    from arachne.plan import Plan, Stage
    from arachne.spec.cluster import Cluster

RecomputeKind = Literal["none", "selective", "full"]


class Constraints(BaseModel):
    """What every returned plan must satisfy. A key left out constrains nothing."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    max_tp: int | None = Field(default=None, ge=1, strict=True)
    """Largest tensor-parallel degree of any stage (``tp`` and, for experts, ``etp``)."""
    max_pp: int | None = Field(default=None, ge=1, strict=True)
    """Most stages in any pipeline."""
    max_cp: int | None = Field(default=None, ge=1, strict=True)
    """Largest context-parallel degree of any stage."""
    max_ep: int | None = Field(default=None, ge=1, strict=True)
    """Largest expert-parallel degree of any stage."""
    zero_stages: tuple[ZeroStage, ...] | None = Field(default=None, min_length=1)
    """The ZeRO stages a plan may use."""
    recompute: tuple[RecomputeKind, ...] | None = Field(default=None, min_length=1)
    """The recomputation kinds a stage may use (``full`` includes partial ``recompute_layers``)."""
    virtual_stages: bool | None = Field(default=None, strict=True)
    """``false``: no interleaved pipelines (every ``virtual_stages`` is 1)."""
    uniform_pipelines: bool | None = Field(default=None, strict=True)
    """``true``: every pipeline has the same stages, layer split, tp and GPU types."""
    one_micro_batch_size: bool | None = Field(default=None, strict=True)
    """``true``: every pipeline uses the same micro-batch size."""
    allow_cross_node_tp: bool | None = Field(default=None, strict=True)
    """``false``: no tensor-parallel group spans nodes, whatever a stage's own flag says."""
    fp8: bool | None = Field(default=None, strict=True)
    """``false``: no ``fp8`` precision."""


def constraints_from_dict(data: Any, source: str = "") -> Constraints:
    """Validate a constraints document; bad input raises :class:`InputError` naming the key."""
    if not isinstance(data, dict):
        raise InputError(source, "", "expected a mapping of constraint keys")
    try:
        return Constraints(**data)
    except ValidationError as err:
        raise from_validation_error(source, err) from None
    except TypeError as err:  # a non-string key
        raise InputError(source, "", f"malformed constraints document ({err})") from None


def load_constraints(path: str | Path) -> Constraints:
    """Read a ``--constraints`` YAML/JSON file."""
    return constraints_from_dict(load_document(path), str(path))


def recompute_kind(stage: Stage) -> str:
    """``none``, ``selective`` or ``full`` for a stage."""
    if stage.recompute == "selective":
        return "selective"
    return "full" if stage.recompute else "none"


def _pipeline_shape(plan: Plan, pi: int, cluster: Cluster | None) -> tuple:
    out = []
    for st in plan.pipelines[pi].stages:
        gpus = tuple(sorted(cluster.devices[d].gpu.name for d in st.devices if d in cluster.devices)) \
            if cluster is not None else ()
        out.append((st.ranges, st.tp, st.cp, len(st.devices), gpus))
    return tuple(out)


def constraint_errors(plan: Plan, constraints: Constraints, cluster: Cluster | None = None) -> list[tuple[str, str]]:
    """Every constraint ``plan`` breaks, as ``(field, reason)`` pairs. With ``cluster``, GPU types
    (``uniform_pipelines``) and tensor-parallel groups across nodes (``allow_cross_node_tp``) are checked
    on the actual devices; without it, only the plan's own fields are."""
    c = constraints
    errs: list[tuple[str, str]] = []
    if c.zero_stages is not None and plan.zero_stage not in c.zero_stages:
        errs.append(("zero_stage", f"{plan.zero_stage} is not among the allowed zero_stages {list(c.zero_stages)}"))
    if c.fp8 is False and plan.precision == "fp8":
        errs.append(("precision", "fp8 is not allowed by the constraints"))
    if c.one_micro_batch_size and len({plan.mbs(p) for p in plan.pipelines}) > 1:
        sizes = sorted({plan.mbs(p) for p in plan.pipelines})
        errs.append(("pipelines", f"micro-batch sizes {sizes} differ; the constraints ask for one"))
    if c.uniform_pipelines:
        first = _pipeline_shape(plan, 0, cluster)
        for pi in range(1, len(plan.pipelines)):
            if _pipeline_shape(plan, pi, cluster) != first:
                errs.append((f"pipelines[{pi}].stages", "differs from pipelines[0] (stages, layer split, tp or GPU "
                                                        "types); the constraints ask for uniform pipelines"))
                break
    for pi, pipe in enumerate(plan.pipelines):
        pfx = f"pipelines[{pi}]"
        if c.max_pp is not None and len(pipe.stages) > c.max_pp:
            errs.append((f"{pfx}.stages", f"{len(pipe.stages)} stages exceed max_pp {c.max_pp}"))
        if c.virtual_stages is False and pipe.virtual_stages != 1:
            errs.append((f"{pfx}.virtual_stages", f"{pipe.virtual_stages}: interleaving is not allowed by the "
                                                  "constraints"))
        for si, st in enumerate(pipe.stages):
            sfx = f"{pfx}.stages[{si}]"
            if c.max_tp is not None:
                if st.tp > c.max_tp:
                    errs.append((f"{sfx}.tp", f"{st.tp} exceeds max_tp {c.max_tp}"))
                if st.etp is not None and st.etp > c.max_tp:
                    errs.append((f"{sfx}.etp", f"{st.etp} exceeds max_tp {c.max_tp}"))
            if c.max_cp is not None and st.cp > c.max_cp:
                errs.append((f"{sfx}.cp", f"{st.cp} exceeds max_cp {c.max_cp}"))
            if c.max_ep is not None and st.ep > c.max_ep:
                errs.append((f"{sfx}.ep", f"{st.ep} exceeds max_ep {c.max_ep}"))
            if c.recompute is not None and (kind := recompute_kind(st)) not in c.recompute:
                errs.append((f"{sfx}.recompute", f"{kind} is not among the allowed recompute kinds "
                                                 f"{list(c.recompute)}"))
            if c.allow_cross_node_tp is False and st.tp > 1:
                if cluster is None:
                    if st.allow_cross_node_tp:
                        errs.append((f"{sfx}.allow_cross_node_tp", "tensor parallelism across nodes is not allowed "
                                                                   "by the constraints"))
                    continue
                for g, group in enumerate(st.groups()):
                    nodes = {cluster.devices[d].node.name for d in group if d in cluster.devices}
                    if len(nodes) > 1:
                        errs.append((f"{sfx}.devices", f"TP group {g} spans nodes {sorted(nodes)}; the constraints "
                                                       "do not allow tensor parallelism across nodes"))
                        break
    return errs


def intersect(a: Constraints, b: Constraints) -> Constraints:
    """What satisfies both ``a`` and ``b``: the smaller of each limit, the common allowed values, and each
    boolean at its tighter setting (``uniform_pipelines``/``one_micro_batch_size`` true wins, the others
    false wins). An empty set of allowed values (``zero_stages``, ``recompute``) is bad input: nothing can
    satisfy it, so :class:`InputError` names the key."""
    out: dict[str, Any] = {}
    for key in ("max_tp", "max_pp", "max_cp", "max_ep"):
        vals = [v for v in (getattr(a, key), getattr(b, key)) if v is not None]
        out[key] = min(vals) if vals else None
    for key in ("zero_stages", "recompute"):
        x, y = getattr(a, key), getattr(b, key)
        if x is None or y is None:
            out[key] = x if y is None else y
            continue
        both = tuple(v for v in x if v in y)
        if not both:
            raise InputError("", key, f"{list(x)} and {list(y)} have nothing in common: no plan can satisfy both")
        out[key] = both
    for key in ("uniform_pipelines", "one_micro_batch_size"):  # true is the tighter setting
        x, y = getattr(a, key), getattr(b, key)
        out[key] = True if (x or y) else (False if False in (x, y) else None)
    for key in ("virtual_stages", "allow_cross_node_tp", "fp8"):  # false is the tighter setting
        x, y = getattr(a, key), getattr(b, key)
        out[key] = False if False in (x, y) else (True if True in (x, y) else None)
    return Constraints(**out)
