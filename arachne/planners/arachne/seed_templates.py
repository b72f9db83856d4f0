"""Lock-step seed templates over several device classes: one pipeline whose stages span a GPU type's node sizes or
several types (Megatron's grid over the GPUs it picks), and one whose consecutive stages run on each GPU type in
turn. Templates only, no pricing (:mod:`.seeds` completes and prices them)."""

from __future__ import annotations

from dataclasses import replace

from arachne.planners.arachne.completion.place import stage_orders
from arachne.planners.arachne.context import PlanningContext
from arachne.planners.arachne.seed_scope import lockstep_dp, pools
from arachne.planners.arachne.template import Group, Slot, Template, ep_options, slot_fits_nodes, span_classes

MIXED_LOCKSTEP_DEGREES = 2
"""Data-parallel degrees of the mixed lock-step pipeline tried per (class subset, tp): the largest that work."""


def spanning_lockstep_templates(ctx: PlanningContext, subset: tuple[int, ...], tp: int, stages: int) -> list[Template]:
    """Lock-step pipelines whose stages span device classes (``Slot.span``: each stage's tp groups from each class
    in turn), at the most replicas that divide the batch, where no one class holds as many: (1) as
    :func:`~.seeds.lockstep_template`, a GPU type over several node sizes as one pipeline over all of them; (2) the
    type-oblivious form, one pipeline over the classes of ``subset`` largest nodes first (fewer nodes for the
    experts' all-to-alls and the gradient sync), then fastest, as Megatron's grid runs the GPUs it picks. Fresh
    hold-out seed87/rob-010 (GPT-OSS-120B, a batch of 96; 108 MI300X in nodes of 8 and 4, 88 H200 in nodes of 8):
    Megatron's dp 96 at ep 16 over the 56 MI300X and 40 of the H200 in nodes of 8; the lock-step form on one
    class had dp 48, 0.69x of it. Empty for a dense model (its replicas are pipelines of their own,
    :func:`uniform_template` pools them)."""
    if not ctx.model.is_moe:
        return []
    gbs, out = ctx.job.global_batch_size, []

    def widest(span: tuple[int, ...], floor: int) -> Slot | None:  # the most replicas over ``span`` beyond ``floor``
        total = sum(ctx.classes[j].count // tp * tp for j in span)
        dp = next((d for d in range(total // (stages * tp), floor, -1) if gbs % d == 0), 0)
        return Slot(span[0], tp, dp=dp, ep=max(ep_options(ctx.model, dp)), span=span) if dp else None

    groups, wider = [], False
    for first, _ in pools(ctx, subset, tp):
        span = tuple(j for j in span_classes(ctx.classes[first], tp) if j in subset)
        one = max((lockstep_dp(ctx, j, tp, stages) for j in span), default=1)
        slot = widest(span, one) if len(span) > 1 else None
        if slot is None and one > 1:
            slot = Slot(next(j for j in span if lockstep_dp(ctx, j, tp, stages) == one), tp, dp=one,
                        ep=max(ep_options(ctx.model, one)))
        wider = wider or (slot is not None and bool(slot.span))
        groups += [Group((slot,) * stages, 1)] if slot is not None else []
    if wider:
        out.append(Template(tuple(groups)))
    prec = ctx.job.precision
    order = tuple(sorted((i for i in subset if ctx.classes[i].node_size % tp == 0),
                         key=lambda i: (-ctx.classes[i].node_size, -ctx.classes[i].gpu.peak_flops(prec), i)))
    one = max((lockstep_dp(ctx, j, tp, stages) for j in order), default=1)
    slot = widest(order, one) if len({ctx.classes[i].gpu.name for i in order}) > 1 else None
    if slot is not None:
        used, left = [], slot.gpus * stages
        for j in order:  # the classes it reaches
            if left > 0:
                used.append(j)
                left -= ctx.classes[j].count // tp * tp
        slot = replace(slot, span=tuple(used))
        if len({ctx.classes[i].gpu.name for i in used}) > 1:
            out.append(Template((Group((slot,) * stages, 1),)))
    return [t for t in out if t.fits_counts(ctx.classes)]

def mixed_lockstep_templates(ctx: PlanningContext, subset: tuple[int, ...], tp: int,
                             count: int = MIXED_LOCKSTEP_DEGREES, dense: bool = False,
                             in_nodes: bool = False) -> list[Template]:
    """An MoE model's Megatron form over every GPU type of ``subset`` at once (what ``megatron-oblivious`` runs):
    one pipeline whose stages are data parallel over ``d`` replicas of ``tp`` GPUs, each type serving
    ``GPUs // (tp d)`` consecutive stages on its first class (the fastest types first; after every such form, as
    :func:`~.completion.place.stage_orders` tries for the search's pipelines, the slowest first: the last stage
    also runs the output layer, which on the slower type can set the pace), the experts parallel over the largest
    degree allowed; ``d`` the ``count`` largest that divide the batch, pack into every type's nodes and leave
    every type at least one stage, at most one stage per layer. Empty for one type, and for a dense model unless
    ``dense``: then ``d`` also keeps each stage inside one node (no experts to spread; its stages go over the nodes,
    as ``megatron-oblivious`` runs LLaMA-3-8B on seed169/rob-014's H100, L40S and A100 nodes of 8); ``in_nodes``:
    an MoE model's stages kept so too (its all-to-alls and gradient sync on each node's links, only the pipeline's
    sends between nodes: Megatron's grid on seed175/rob-024, Qwen3-235B-A22B over 47 A100 and H100 nodes of 8 on
    1.25 GB/s NICs, runs one pipeline of 47 such stages of tp 2 x dp 4)."""
    pl = pools(ctx, subset, tp)
    if not (ctx.model.is_moe or dense) or len(pl) < 2:
        return []
    gbs, L, out = ctx.job.global_batch_size, ctx.model.num_layers, []
    top = min(n for _, n in pl) // tp
    if in_nodes or not ctx.model.is_moe:
        top = min(top, min(ctx.classes[first].node_size for first, _ in pl) // tp)
    for d in range(top, 1, -1):
        if len(out) == count:
            break
        if gbs % d or not all(slot_fits_nodes(tp * d, ctx.classes[first].node_size) for first, _ in pl):
            continue
        stages = [(first, n // (tp * d)) for first, n in pl]
        if sum(k for _, k in stages) > L:
            break  # smaller degrees only deepen it
        ep = max(ep_options(ctx.model, d))
        tpl = Template((Group(tuple(Slot(first, tp, dp=d, ep=ep) for first, k in stages for _ in range(k)), 1),))
        if tpl.fits_counts(ctx.classes):
            out.append(tpl)
    return out + [stage_orders(tpl)[1] for tpl in out]
