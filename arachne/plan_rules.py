"""Formats v2 plan rules (contract section 7): which version-2 fields a plan uses, their validation
(every message names ``pipelines[p].stages[s].field``), the version-1 document check and the
features the cost model does not price yet.

:mod:`arachne.plan` calls these; nothing here imports the cost model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from arachne.plan import Pipeline, Plan, Stage
    from arachne.spec.cluster import Cluster
    from arachne.spec.model import ModelSpec

V2_PLAN_KEYS = ("overlap_grad_reduce", "overlap_param_gather", "framework", "grad_reduce_in_fp32", "fp8_params",
                "master_weights", "optimizer_state_dtype", "loss", "attention_kernel", "elementwise_kernels",
                "overlap_moe_comm", "moe_kernels")
V2_PIPELINE_KEYS = ("virtual_stages",)
V2_STAGE_KEYS = ("cp", "sequence_parallel", "recompute_layers", "etp", "recompute_modules")
MEMORY_SETTINGS = ("recompute_modules", "fp8_params", "master_weights", "optimizer_state_dtype", "loss")
"""The optional v2 settings of how a framework keeps memory (not all runtimes execute them: spec/runtimes.py)."""
FEATURES = {  # v2_fields_used's feature names, as messages say them
    "fp8": "FP8 precision", "zero_stage": "ZeRO stage 2/3", "overlap_grad_reduce": "overlapped gradient reduction",
    "overlap_param_gather": "overlapped parameter gather", "virtual_stages": "interleaved pipeline",
    "cp": "context parallelism", "sequence_parallel": "sequence parallelism",
    "selective_recompute": "selective recomputation", "recompute_layers": "partial recomputation",
    "etp": "expert tensor parallelism other than tp", "framework": "the framework's memory convention",
    "grad_reduce_in_fp32": "the gradient reduction type", "recompute_modules": "recomputation of chosen modules",
    "fp8_params": "fp8 parameters", "master_weights": "no fp32 master weights",
    "optimizer_state_dtype": "16-bit optimizer state", "loss": "a fused cross-entropy",
    "attention_kernel": "a named attention kernel", "elementwise_kernels": "eager or fused element-wise kernels",
    "overlap_moe_comm": "overlapped expert all-to-alls", "moe_kernels": "a named MoE layer implementation",
}
NEEDS_V2 = 'needs "format": "arachne-plan/2" (this plan says arachne-plan/1)'


def v1_document_error(doc: dict[str, Any]) -> tuple[str, str] | None:
    """``(field, reason)`` for the first version-2 key or value in a plan document that says
    ``arachne-plan/1`` (or gives no format, which reads as version 1); None otherwise."""
    if doc.get("format", "arachne-plan/1") != "arachne-plan/1":
        return None
    for key in V2_PLAN_KEYS:
        if key in doc:
            return key, f"a version-2 key: {NEEDS_V2}"
    if doc.get("precision") == "fp8":
        return "precision", f"fp8 is a version-2 value: {NEEDS_V2}"
    if doc.get("zero_stage") in (2, 3) and type(doc.get("zero_stage")) is int:
        return "zero_stage", f"{doc['zero_stage']} is a version-2 value: {NEEDS_V2}"
    pipes = doc.get("pipelines")
    for pi, pipe in enumerate(pipes if isinstance(pipes, list) else []):
        if not isinstance(pipe, dict):
            continue
        for key in V2_PIPELINE_KEYS:
            if key in pipe:
                return f"pipelines[{pi}].{key}", f"a version-2 key: {NEEDS_V2}"
        stages = pipe.get("stages")
        for si, st in enumerate(stages if isinstance(stages, list) else []):
            if not isinstance(st, dict):
                continue
            sfx = f"pipelines[{pi}].stages[{si}]"
            for key in V2_STAGE_KEYS:
                if key in st:
                    return f"{sfx}.{key}", f"a version-2 key: {NEEDS_V2}"
            rec = st.get("recompute")
            if rec in ("none", "full", "selective"):
                return f"{sfx}.recompute", f"{rec!r} is a version-2 value: {NEEDS_V2}"
            layers = st.get("layers")
            if isinstance(layers, list) and layers and any(isinstance(x, list) for x in layers):
                return f"{sfx}.layers", f"a list of ranges is a version-2 value: {NEEDS_V2}"
    return None


def v2_fields_used(plan: Plan) -> list[tuple[str, str]]:
    """Every version-2 field the plan sets to a non-default value, as ``(field, feature)`` pairs, in
    document order. Features: ``fp8``, ``zero_stage``, ``overlap_grad_reduce``, ``overlap_param_gather``,
    ``virtual_stages``, ``cp``, ``sequence_parallel``, ``selective_recompute``, ``recompute_layers``,
    ``etp``. Empty for a version-1 plan."""
    out: list[tuple[str, str]] = []
    if plan.precision == "fp8":
        out.append(("precision", "fp8"))
    if plan.zero_stage >= 2:
        out.append(("zero_stage", "zero_stage"))
    for key in V2_PLAN_KEYS:
        if getattr(plan, key) != plan.V2_DEFAULTS[key]:
            out.append((key, key))
    for pi, pipe in enumerate(plan.pipelines):
        if pipe.virtual_stages != 1 or any(len(st.ranges) != 1 or st.layers is not st.ranges[0]
                                           for st in pipe.stages):
            out.append((f"pipelines[{pi}].virtual_stages", "virtual_stages"))
        for si, st in enumerate(pipe.stages):
            sfx = f"pipelines[{pi}].stages[{si}]"
            if st.cp != 1:
                out.append((f"{sfx}.cp", "cp"))
            if st.sequence_parallel:
                out.append((f"{sfx}.sequence_parallel", "sequence_parallel"))
            if st.recompute == "selective":
                out.append((f"{sfx}.recompute", "selective_recompute"))
            if st.recompute_layers is not None:
                out.append((f"{sfx}.recompute_layers", "recompute_layers"))
            if st.etp is not None:
                out.append((f"{sfx}.etp", "etp"))
            if st.recompute_modules is not None:
                out.append((f"{sfx}.recompute_modules", "recompute_modules"))
    return out


def unpriced_features(plan: Plan, priced: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """The version-2 features of ``plan`` whose pricing the cost model would get silently wrong, minus
    those in ``priced``: ``(field, feature)`` pairs. ``etp`` equal to ``tp`` and ``recompute_layers``
    covering the whole stage price exactly as version 1 does, so they are not listed."""
    out = []
    for field, feature in v2_fields_used(plan):
        if feature in priced:
            continue
        if feature in ("etp", "recompute_layers"):
            pi, si = _indices(field)
            st = plan.pipelines[pi].stages[si]
            if feature == "etp" and st.etp == st.tp:
                continue
            if feature == "recompute_layers" and st.recompute_layers >= st.num_layers:  # type: ignore[operator]
                continue
        out.append((field, feature))
    return out


def _indices(field: str) -> tuple[int, int]:
    pi = int(field.split("[", 1)[1].split("]", 1)[0])
    si = int(field.split("stages[", 1)[1].split("]", 1)[0])
    return pi, si


def memory_convention(plan: Plan) -> str:
    """The plan's memory convention: ``framework``, else ``torch`` with ``zero_stage`` 3 and ``megatron`` below."""
    return plan.framework or ("torch" if plan.zero_stage >= 3 else "megatron")


def plan_v2_errors(plan: Plan) -> list[tuple[str, str]]:
    """Top-level version-2 rules."""
    errs = []
    if plan.overlap_param_gather and plan.zero_stage < 1:
        errs.append(("overlap_param_gather", "needs zero_stage >= 1 (there is no sharded parameter gather to "
                                             "overlap)"))
    if plan.attention_kernel is not None and plan.precision == "fp32":
        errs.append(("attention_kernel", "fp32 has no fused attention kernel (its scores are materialised)"))
    if plan.fp8_params:
        if plan.precision != "fp8":
            errs.append(("fp8_params", f"needs precision fp8 (the plan's is {plan.precision})"))
        elif memory_convention(plan) != "megatron":
            errs.append(("fp8_params", ("needs the megatron convention (Transformer Engine's fp8 parameters; "
                                        "framework torch keeps its parameters in 16 or 32 bits)")))
    for key, value in (("master_weights", "none"), ("optimizer_state_dtype", "bf16")):
        if getattr(plan, key) == value and plan.precision == "fp32":
            errs.append((key, f"{value} needs 16-bit training (the plan's precision is fp32)"))
    return errs


MODULE_NEEDS = {"mla_up_proj": ("multi-head latent attention", lambda m: m.attention == "mla"),
                "moe": ("routed experts", lambda m: m.is_moe), "moe_act": ("routed experts", lambda m: m.is_moe),
                "shared_experts": ("shared experts", lambda m: m.is_moe and bool(m.num_shared_experts))}


def recompute_modules_errors(plan: Plan, st: Stage, sfx: str, model: ModelSpec) -> list[tuple[str, str]]:
    """Rules of a stage's ``recompute_modules``: only with selective recomputation, under the megatron convention,
    each module present in the model."""
    if st.recompute_modules is None:
        return []
    field = f"{sfx}.recompute_modules"
    if st.recompute != "selective":
        return [(field, 'only with recompute "selective"')]
    if memory_convention(plan) != "megatron":
        return [(field, ("Megatron-Core's modules need the megatron convention (framework torch: recompute "
                         "\"selective\" is torchtitan's op-level policy)"))]
    for name in st.recompute_modules:
        what, has = MODULE_NEEDS.get(name, ("", lambda m: True))
        if not has(model):
            return [(field, f"{name!r} on a model without {what}")]
    return []


def stage_v2_errors(plan: Plan, pipe: Pipeline, st: Stage, sfx: str, cluster: Cluster,
                    model: ModelSpec) -> list[tuple[str, str]]:
    """Version-2 rules of one stage (``sfx`` is its ``pipelines[p].stages[s]``)."""
    errs = []
    v = pipe.virtual_stages
    if v == 1 and st.layers is not st.ranges[0]:
        errs.append((f"{sfx}.layers", "with virtual_stages 1, layers is one [start, end] range"))
    elif v > 1 and len(st.ranges) != v:
        errs.append((f"{sfx}.layers", f"with virtual_stages {v}, layers is a list of {v} [start, end] ranges "
                                      f"(got {len(st.ranges)})"))
    if st.cp > 1 and plan.sequence_length % (2 * st.cp):
        errs.append((f"{sfx}.cp", f"sequence_length {plan.sequence_length} is not a multiple of 2*cp = "
                                  f"{2 * st.cp} (load-balanced halves per cp rank)"))
    if st.sequence_parallel and st.tp == 1:
        errs.append((f"{sfx}.sequence_parallel", "needs tp > 1 (it splits activations over the tp group)"))
    if st.recompute_layers is not None:
        if st.recompute is not True:
            errs.append((f"{sfx}.recompute_layers", 'only with recompute "full" (or true)'))
        elif st.recompute_layers > st.num_layers:
            errs.append((f"{sfx}.recompute_layers", f"{st.recompute_layers} exceeds the stage's "
                                                    f"{st.num_layers} blocks"))
    errs += recompute_modules_errors(plan, st, sfx, model)
    if st.etp is not None and not model.is_moe and st.etp != st.tp:
        errs.append((f"{sfx}.etp", f"etp {st.etp} on a dense model (no routed experts)"))
    if plan.precision == "fp8":
        for d in st.devices:
            dev = cluster.devices.get(d)
            if dev is not None and getattr(dev.gpu, "fp8_tflops", None) is None:
                errs.append((f"{sfx}.devices", f"device {d!r} ({dev.gpu.name}) has no FP8 rate in the catalog; "
                                               "precision fp8 needs one"))
                break
    return errs


def interleaved_errors(plan: Plan, pipe: Pipeline, pfx: str, num_layers: int) -> list[tuple[str, str]]:
    """Rules of an interleaved pipeline (``virtual_stages > 1``): chunk j of stage s is range ``j * S + s``;
    the ``S * v`` ranges are contiguous, non-empty and cover ``[0, num_layers)``."""
    errs = []
    v, S = pipe.virtual_stages, len(pipe.stages)
    if plan.schedule != "1f1b":
        errs.append((f"{pfx}.virtual_stages", f"interleaving needs schedule 1f1b (the plan's is {plan.schedule})"))
    if pipe.micro_batches % S:
        errs.append((f"{pfx}.micro_batches", f"{pipe.micro_batches} is not a multiple of the {S} stages "
                                             f"(interleaved 1F1B)"))
    if any(len(st.ranges) != v for st in pipe.stages):
        return errs  # reported per stage
    expect = 0
    for j in range(v):
        for si, st in enumerate(pipe.stages):
            a, b = st.ranges[j]
            field = f"{pfx}.stages[{si}].layers"
            if a != expect:
                errs.append((field, f"chunk {j} starts at {a}, expected {expect} (chunk j of stage s is range "
                                    f"j*{S}+s of the pipeline, contiguous in model order)"))
            if b <= a:
                errs.append((field, f"chunk {j} is an empty or reversed range [{a}, {b})"))
            expect = max(b, expect)
    if expect != num_layers:
        errs.append((f"{pfx}.stages", f"layers end at {expect}, the model has {num_layers} blocks"))
    return errs


def uses_v2(plan: Plan, sequence_parallel: bool = True) -> bool:
    """Whether ``plan`` sets any version-2 field (a fast test; :func:`v2_fields_used` names them);
    ``sequence_parallel=False``: any but sequence parallelism (which the arachne planner's completion turns on
    for every stage of tp > 1: its plans are otherwise version-1 plans)."""
    return (plan.precision == "fp8" or plan.zero_stage >= 2 or plan.overlap_grad_reduce
            or plan.overlap_param_gather or plan.framework is not None or plan.grad_reduce_in_fp32 is not None
            or plan.fp8_params or plan.master_weights is not None or plan.optimizer_state_dtype is not None
            or plan.loss is not None or plan.attention_kernel is not None or plan.elementwise_kernels is not None
            or plan.overlap_moe_comm or plan.moe_kernels is not None
            or any(p.virtual_stages != 1 or any(st.cp != 1 or (sequence_parallel and st.sequence_parallel)
                                                or st.recompute == "selective" or st.recompute_layers is not None
                                                or st.etp is not None or st.recompute_modules is not None
                                                or st.layers is not st.ranges[0] for st in p.stages)
                   for p in plan.pipelines))


def same_math_plan(plan: Plan) -> tuple[Plan, list[str]]:
    """``plan`` with the version-2 settings that change memory and communication but not the computed values
    replaced by what arachne's runtime executes, and one note per replacement: overlap flags off, sequence
    parallelism as plain tp, ZeRO-2/3 as the runtime's ZeRO-1, selective or partial recomputation as full
    recomputation of the stage (never more memory than the plan's), ``framework`` and
    ``grad_reduce_in_fp32`` dropped. What changes the structure (interleaving, cp, etp, fp8) is kept, for
    :func:`refuse_v2` to refuse."""
    notes: list[str] = []
    top: dict[str, Any] = {}
    if plan.overlap_grad_reduce or plan.overlap_param_gather:
        top.update(overlap_grad_reduce=False, overlap_param_gather=False)
        notes.append("overlap flags: gradients reduced after the backward pass")
    if plan.zero_stage >= 2:
        top["zero_stage"] = 1
        notes.append(f"zero_stage {plan.zero_stage}: run as ZeRO-1 (more memory per device than the plan's)")
    if plan.framework is not None or plan.grad_reduce_in_fp32 is not None:
        top.update(framework=None, grad_reduce_in_fp32=None)
        notes.append("framework / grad_reduce_in_fp32: the runtime's own memory layout")
    pipes, changed = [], False
    for p in plan.pipelines:
        stages = []
        for st in p.stages:
            upd: dict[str, Any] = {}
            if st.sequence_parallel:
                upd["sequence_parallel"] = False
            if st.recompute == "selective" or st.recompute_layers is not None:
                upd.update(recompute=True, recompute_layers=None, recompute_modules=None)
            stages.append(st.model_copy(update=upd) if upd else st)
            changed = changed or bool(upd)
        pipes.append(p.model_copy(update={"stages": tuple(stages)}))
    if any(st.sequence_parallel for p in plan.pipelines for st in p.stages):
        notes.append("sequence_parallel: run as plain tensor parallelism (all-reduces)")
    if any(st.recompute == "selective" or st.recompute_layers is not None for p in plan.pipelines
           for st in p.stages):
        notes.append("selective / partial recomputation: the whole stage recomputed")
    if changed:
        top["pipelines"] = tuple(pipes)
    return (plan.model_copy(update=top) if top else plan), notes


def refuse_v2(plan: Plan, model: ModelSpec, source: str, what: str) -> None:
    """Raise :class:`InputError` when ``plan`` or ``model`` uses a version-2 feature that ``what`` (the runtime,
    an export) does not carry out yet: better refused than run as something else."""
    from arachne.errors import InputError

    if uses_v2(plan):
        field, feature = v2_fields_used(plan)[0]
        raise InputError(source, field, f"not supported by {what} yet ({FEATURES[feature]})")
    refuse_v2_model(model, source, what)


def refuse_v2_model(model: ModelSpec, source: str, what: str) -> None:
    """:func:`refuse_v2` for the model shape alone (MLA, a head width of its own, relu/geglu, alibi)."""
    from arachne.errors import InputError

    shape = [("model.attention", model.attention != "mha"), ("model.head_dim", model.head_dim_field is not None),
             ("model.mlp", model.mlp in ("relu", "geglu")),
             ("model.position_embedding", model.position_embedding in ("alibi", "none"))]
    for field, used in shape:
        if used:
            raise InputError(source, field, f"not supported by {what} yet (a version-2 model shape)")
