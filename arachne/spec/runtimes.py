"""Runtime presets (``arachne plan --runtime``, formats v2 section 10): what each training framework executes
as released, as :class:`~arachne.spec.constraints.Constraints` plus the few rules the constraints file has no
key for. One place: the planners' selection (``arachne.planners.harness``) and ``arachne export`` use the
same :func:`legality_errors`.

Each preset names the release its rules were written against and, in ``checked``, which rules were read
from a retrieved page (and which were recalled) when this module was written (2026-12-02); none was
re-checked against a tagged release's source. A preset that is wrong for a newer release is a bug to report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from arachne.errors import InputError
from arachne.spec.constraints import Constraints, constraint_errors, intersect

if TYPE_CHECKING:
    from arachne.plan import Plan
    from arachne.spec.cluster import Cluster


@dataclass(frozen=True)
class RuntimePreset:
    """One framework's limits."""

    name: str
    """The ``--runtime`` value."""
    framework: str
    """The framework and the release the rules describe."""
    checked: str
    """How the rules were checked (the documentation and when)."""
    constraints: Constraints
    """The limits the constraints file can also express."""
    one_structure: bool = False
    """Every pipeline has the same stages, layer split, tp, dp and ep (one structure for all replicas; which
    GPU type runs a replica does not matter to the framework, only to its speed)."""
    equal_pipelines_work: bool = False
    """Every pipeline runs the same number of micro-batches (data-parallel replicas split the batch evenly)."""
    one_tp_dp: bool = False
    """One tensor-parallel and one data-parallel degree for every stage of a pipeline."""
    megatron_split: bool = False
    """Layer counts per stage: the first and last stage may differ, the middle stages are equal (Megatron's
    ``--decoder-first/last-pipeline-num-layers``)."""
    expert_tp_is_tp: bool = False
    """Routed experts run at the stage's own tp (no separate expert tensor parallelism)."""
    pipeline_max_zero: int | None = None
    """With more than one stage, ZeRO stages above this are not available (DeepSpeed's pipeline engine)."""
    memory_settings: tuple[str, ...] = ()
    """Which of the plan's optional memory settings (``plan_rules.MEMORY_SETTINGS``: ``recompute_modules``,
    ``fp8_params``, ``master_weights``, ``optimizer_state_dtype``, ``loss``) the framework executes; a plan that
    sets another is refused, naming the field. With ``one_tp_dp`` a stage setting is one value for the model."""
    moe_comm_overlap: bool = False
    """The framework can overlap the experts' all-to-alls of one micro-batch with another's compute (the plan's
    ``overlap_moe_comm``)."""
    moe_kernels: tuple[str, ...] = ("grouped",)
    """The MoE layer implementations the framework runs (the plan's ``moe_kernels``; unset reads ``grouped``)."""
    notes: tuple[str, ...] = field(default=())
    """What the preset leaves out, one sentence each."""


RUNTIMES: dict[str, RuntimePreset] = {
    "arachne": RuntimePreset(
        "arachne", "arachne's own runtime (arachne.runtime, this version)", "this repository",
        Constraints(virtual_stages=False, max_cp=1, fp8=False), expert_tp_is_tp=True,
        notes=("what arachne run executes: no interleaving, context parallelism, expert tp or fp8; overlap, "
               "sequence parallelism, ZeRO-2/3 and selective recomputation run as their same-math "
               "equivalents (plan_rules.same_math_plan); none of the optional memory settings (its model keeps "
               "fp32 master weights and Adam state, and runs torch's cross-entropy on fp32 logits)",)),
    "megatron": RuntimePreset(
        "megatron", "Megatron-LM (megatron-core 0.12 era, 2025)",
        "Megatron-LM arguments guide (--tensor/--pipeline/--context/--expert-model-parallel-size, "
        "--num-layers-per-virtual-pipeline-stage, --use-distributed-optimizer, --recompute-granularity, "
        "--decoder-first/last-pipeline-num-layers, --fp8-format), as recalled 2026-12, not re-read",
        Constraints(zero_stages=(0, 1), one_micro_batch_size=True),
        one_structure=True, equal_pipelines_work=True, one_tp_dp=True, megatron_split=True,
        memory_settings=("recompute_modules", "fp8_params", "optimizer_state_dtype", "loss"),
        moe_comm_overlap=True,
        notes=("ZeRO-1 is the distributed optimizer; Megatron's own FSDP is left out",
               "overlap_moe_comm is --overlap-moe-expert-parallel-comm with --delay-wgrad-compute (what "
               "Megatron-Bridge v0.3.0's moe_a2a_overlap sets, scripts/performance/utils/overrides.py); it needs "
               "ep > 1, an interleaved pipeline when pp > 1 and no full recomputation (moe_overlap_errors)",
               "one pipeline structure, tp, dp and micro-batch size for all replicas")),
    "torchtitan": RuntimePreset(
        "torchtitan", "torchtitan (PyTorch FSDP2 + TP + PP + CP, 2025 releases)",
        "torchtitan README (pypi.org/project/custom-torchtitan, read 2026-12-02: FSDP2 with per-parameter "
        "sharding, tensor parallel, pipeline parallel, context parallel, selective layer/op activation "
        "checkpointing, Float8); interleaved pipeline schedules and FSDP2's reshard_after_forward=False "
        "(ZeRO-2-like) as recalled",
        Constraints(zero_stages=(0, 2, 3), one_micro_batch_size=True),
        one_structure=True, equal_pipelines_work=True, one_tp_dp=True, memory_settings=("loss",),
        notes=("ZeRO-3 is FSDP2 sharding, 2 FSDP2 without resharding after forward, 0 plain replication; "
               "ZeRO-1 has no torchtitan equivalent",
               "loss fused: training.compile compiles the loss (torchtitan/components/loss.py, mid-2025 releases)")),
    "deepspeed": RuntimePreset(
        "deepspeed", "DeepSpeed (ZeRO 0-3 and its PipelineModule engine, 0.16 era, 2025)",
        "DeepSpeed's PipelineEngine asserts 'ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism' "
        "(deepspeed/runtime/pipe/engine.py, seen in a 2022 EleutherAI training log, read 2026-12-02); 1F1B "
        "without interleaving and per-layer activation checkpointing as recalled",
        Constraints(zero_stages=(0, 1, 2, 3), one_micro_batch_size=True, virtual_stages=False,
                    max_cp=1, recompute=("none", "full"), fp8=False),
        one_structure=True, equal_pipelines_work=True, one_tp_dp=True, pipeline_max_zero=1,
        notes=("tensor parallelism comes from Megatron-DeepSpeed; DeepSpeed-Ulysses is not the plan's cp",)),
}


def runtime_preset(name: str) -> RuntimePreset:
    """The preset ``name``; :class:`InputError` naming ``--runtime`` when unknown."""
    if name not in RUNTIMES:
        raise InputError("", "--runtime", f"unknown runtime {name!r} (one of {', '.join(RUNTIMES)})")
    return RUNTIMES[name]


@dataclass(frozen=True)
class Legality:
    """The rules every returned plan must satisfy: a runtime preset narrowed by a constraints file."""

    runtime: RuntimePreset = RUNTIMES["arachne"]
    constraints: Constraints = Constraints()
    """The preset's constraints intersected with the file's."""

    @classmethod
    def of(cls, runtime: str = "arachne", extra: Constraints | None = None, source: str = "") -> Legality:
        """The preset ``runtime`` narrowed by ``extra`` (read from ``source``, named when they conflict)."""
        preset = runtime_preset(runtime)
        if extra is None:
            return cls(preset, preset.constraints)
        try:
            return cls(preset, intersect(preset.constraints, extra))
        except InputError as err:
            raise InputError(source, err.field, f"{err.reason} (the {runtime} runtime's and this file's)") from None

    @property
    def free(self) -> bool:
        """Nothing is restricted (the default): no plan needs checking."""
        r = self.runtime
        return self.constraints == Constraints() and not (r.one_structure or r.equal_pipelines_work or r.one_tp_dp
                                                          or r.megatron_split or r.pipeline_max_zero is not None
                                                          or r.expert_tp_is_tp)

    def errors(self, plan: Plan, cluster: Cluster | None = None) -> list[tuple[str, str]]:
        """Every rule ``plan`` breaks, as ``(field, reason)`` pairs (empty: legal)."""
        return legality_errors(plan, self, cluster)


def megatron_split_error(counts: list[int]) -> str | None:
    """Why Megatron's first/last-stage flags cannot express these per-stage layer counts (None: they can)."""
    if len(counts) > 2 and len(set(counts[1:-1])) > 1:
        return f"uneven middle stages {counts} (Megatron sets only the first and last stage's layers)"
    return None


def legality_errors(plan: Plan, legality: Legality, cluster: Cluster | None = None) -> list[tuple[str, str]]:
    """The constraints' errors (:func:`constraint_errors`), then the runtime's own rules."""
    errs = constraint_errors(plan, legality.constraints, cluster)
    r = legality.runtime
    who = f"the {r.name} runtime"
    pipes = plan.pipelines
    if r.one_structure:
        shape = [[(s.ranges, s.tp, s.dp_size, s.ep, s.cp, len(s.devices)) for s in p.stages] for p in pipes]
        if (bad := next((i for i, x in enumerate(shape) if x != shape[0]), None)) is not None:
            errs.append((f"pipelines[{bad}].stages", f"differs from pipelines[0] (stages, layer split, tp, dp or "
                                                     f"ep); {who} runs one pipeline structure for all replicas"))
    if r.equal_pipelines_work and len({p.micro_batches for p in pipes}) > 1:
        errs.append(("pipelines", f"micro_batches {sorted({p.micro_batches for p in pipes})} differ; {who} "
                                  "splits the batch evenly over replicas"))
    for pi, p in enumerate(pipes):
        if r.one_tp_dp and (len({s.tp for s in p.stages}) > 1 or len({s.dp_size for s in p.stages}) > 1):
            errs.append((f"pipelines[{pi}].stages", f"per-stage tp {[s.tp for s in p.stages]} / dp "
                                                    f"{[s.dp_size for s in p.stages]}; {who} has one of each"))
            break
        if r.megatron_split and (why := megatron_split_error([s.num_layers for s in p.stages])):
            errs.append((f"pipelines[{pi}].stages", f"{why}"))
            break
    if r.expert_tp_is_tp:
        bad = next(((pi, si) for pi, p in enumerate(pipes) for si, s in enumerate(p.stages)
                    if s.etp is not None and s.etp != s.tp), None)
        if bad is not None:
            errs.append((f"pipelines[{bad[0]}].stages[{bad[1]}].etp", f"expert tp differs from tp; {who} runs the "
                                                                      "experts at the stage's tp"))
    if plan.overlap_moe_comm and not r.moe_comm_overlap:
        errs.append(("overlap_moe_comm", f"overlapped expert all-to-alls; {who} does not execute them"))
    elif plan.overlap_moe_comm:
        errs += moe_overlap_errors(plan, who)
    if (plan.moe_kernels or "grouped") not in r.moe_kernels:
        errs.append(("moe_kernels", f"{plan.moe_kernels}; {who} runs the {' or '.join(r.moe_kernels)} MoE layer"))
    errs += _memory_settings_errors(plan, r, who)
    if r.pipeline_max_zero is not None and plan.zero_stage > r.pipeline_max_zero \
            and any(len(p.stages) > 1 for p in pipes):
        errs.append(("zero_stage", f"{plan.zero_stage} with pipeline parallelism; {who}'s pipeline engine "
                                   f"supports ZeRO stage {r.pipeline_max_zero} at most"))
    return errs


def moe_overlap_errors(plan: Plan, who: str) -> list[tuple[str, str]]:
    """What the combined 1F1B schedule behind ``overlap_moe_comm`` needs (Megatron-Core, as Megatron-Bridge
    v0.3.0 checks it before launch: src/megatron/bridge/training/comm_overlap.py): expert parallelism, an
    interleaved pipeline when there is more than one stage, and no full or partial recomputation (selective
    is allowed)."""
    errs: list[tuple[str, str]] = []
    if all(st.ep == 1 for p in plan.pipelines for st in p.stages):
        errs.append(("overlap_moe_comm", f"no stage has ep > 1; {who} overlaps only expert-parallel all-to-alls"))
    for pi, p in enumerate(plan.pipelines):
        if len(p.stages) > 1 and p.virtual_stages == 1:
            errs.append((f"pipelines[{pi}].virtual_stages", f"1 with {len(p.stages)} stages and overlap_moe_comm; "
                                                            f"{who} overlaps them only in an interleaved pipeline"))
            break
        bad = next((si for si, st in enumerate(p.stages) if st.recompute is True), None)
        if bad is not None:
            errs.append((f"pipelines[{pi}].stages[{bad}].recompute",
                         f"full recomputation with overlap_moe_comm; {who} allows selective recomputation only"))
            break
    return errs


def _memory_settings_errors(plan: Plan, r: RuntimePreset, who: str) -> list[tuple[str, str]]:
    """The plan's optional memory settings the runtime does not execute (:attr:`RuntimePreset.memory_settings`)."""
    from arachne.plan_rules import FEATURES, MEMORY_SETTINGS, v2_fields_used

    errs: list[tuple[str, str]] = []
    if not (plan.fp8_params or plan.master_weights is not None or plan.optimizer_state_dtype is not None
            or plan.loss is not None or any(st.recompute_modules is not None for p in plan.pipelines
                                            for st in p.stages)):
        return errs  # the common case, kept cheap: the planners check every candidate
    for name, feature in v2_fields_used(plan):
        if feature in MEMORY_SETTINGS and feature not in r.memory_settings:
            errs.append((name, f"{FEATURES[feature]}; {who} does not execute it"))
            break
    if r.one_tp_dp and "recompute_modules" in r.memory_settings:
        for pi, p in enumerate(plan.pipelines):
            if len({st.recompute_modules for st in p.stages}) > 1:
                errs.append((f"pipelines[{pi}].stages", f"per-stage recompute_modules; {who} has one list"))
                break
    return errs
