"""The forms a seed plan is also priced in: its pipelines merged into Megatron's lock-step form, an MoE model's
experts parallel over several degrees, the gradient reduction overlapped, the batch shared evenly.

Rewrites of a completed :class:`~arachne.plan.Plan`, no search and no pricing (:mod:`.seeds` prices them)."""

from __future__ import annotations

from arachne.plan import PLAN_FORMAT_V2, Plan
from arachne.planners.arachne.context import PlanningContext
from arachne.planners.arachne.template import ep_options


def even_counts(counts: list[int]) -> list[int] | None:
    """The same micro-batch count for every pipeline (Megatron's data parallelism), or None where the total
    does not divide evenly (or the counts already are even)."""
    n, total = len(counts), sum(counts)
    if n == 0 or total % n or len(set(counts)) == 1:
        return None
    return [total // n] * n


def overlapped(plan: Plan) -> Plan:
    """``plan`` with the gradient reduction (and, with ZeRO, the parameter gather) overlapped where layers are
    replicated, as every modern framework runs data parallelism."""
    if len(plan.pipelines) < 2 and all(st.dp_size < 2 for p in plan.pipelines for st in p.stages):
        return plan
    return plan.model_copy(update={"overlap_grad_reduce": True, "overlap_param_gather": plan.zero_stage >= 1,
                                   "format": PLAN_FORMAT_V2})


def merged(plan: Plan) -> Plan | None:
    """Pipelines of one shape (stages, their tp, dp and ep, micro-batch count) as one pipeline whose stages are
    data parallel over all of them, on the last pipeline's layer split (the slowest class's: classes come fastest
    first): Megatron's form, where replicas of a stage run in lock step and the gradient reduction hides behind the
    slowest one's backward. None where the pipelines differ in shape (or there is only one)."""
    pipes = plan.pipelines
    if len(pipes) < 2:
        return None
    first = pipes[0]

    def shape(p) -> tuple:
        return (len(p.stages), p.micro_batches, p.micro_batch_size, p.virtual_stages,
                tuple((st.tp, st.dp_size, st.ep) for st in p.stages))

    if any(shape(p) != shape(first) for p in pipes) or first.micro_batch_size is not None:
        return None
    base = pipes[-1]
    stages = []
    for si, st in enumerate(base.stages):
        devices = tuple(d for p in pipes for d in p.stages[si].devices)
        dp = sum(p.stages[si].dp_size for p in pipes)
        stages.append(st.model_copy(update={"devices": devices, "dp": dp if dp > 1 else None}))
    pipe = base.model_copy(update={"stages": tuple(stages)})
    return plan.model_copy(update={"pipelines": (pipe,), "micro_batch_size": plan.micro_batch_size * len(pipes)})


SEED_EPS = (2, 4, 8, 16, 32, 64)
"""Expert-parallel degrees the lock-step form of an MoE seed is also priced at (where every stage's dp allows),
besides ep 1 and the largest degree allowed: Megatron's grid searches ep over its data-parallel replicas."""


def expert_parallel_forms(plan: Plan, ctx: PlanningContext) -> list[Plan]:
    """``plan`` (a lock-step seed of an MoE model) with its experts parallel over each degree of
    :data:`SEED_EPS` and the largest allowed (:func:`~.template.ep_options` of the smallest stage dp), largest
    first; none for a dense model."""
    if not ctx.model.is_moe:
        return []
    dps = [st.dp_size for p in plan.pipelines for st in p.stages]
    allowed = [e for e in ep_options(ctx.model, min(dps)) if e > 1 and all(d % e == 0 for d in dps)]
    eps = sorted({e for e in allowed if e in SEED_EPS} | set(allowed[-1:]), reverse=True)
    return [plan.model_copy(update={"pipelines": tuple(
        p.model_copy(update={"stages": tuple(st.model_copy(update={"ep": e}) for st in p.stages)})
        for p in plan.pipelines)}) for e in eps]


def sharded(plan: Plan) -> bool:
    """Whether some stage of ``plan`` runs its experts parallel (ep > 1)."""
    return any(st.ep > 1 for p in plan.pipelines for st in p.stages)


def layout_key(plan: Plan) -> tuple:
    """``plan``'s layout without its experts' parallel degrees: devices, tp, layers and recomputation per stage,
    and the micro-batches."""
    def stage(st) -> tuple:
        return st.devices, st.tp, tuple(tuple(r) for r in st.ranges), st.recompute, st.recompute_layers

    return plan.micro_batch_size, tuple((p.micro_batch_size, p.micro_batches, tuple(stage(st) for st in p.stages))
                                        for p in plan.pipelines)
