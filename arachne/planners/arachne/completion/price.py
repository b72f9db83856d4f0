"""Pricing: a template becomes full plans (placement, layer split, batch shares) for a small candidate set
(micro-batch size, recomputation where memory demands it, ZeRO-1 when layers are replicated, a per-group
micro-batch size, a wider last stage), each priced with CostModel.estimate; the best is kept."""

from __future__ import annotations

from dataclasses import replace

from arachne.cost import Estimate, StageEstimate
from arachne.plan import Pipeline, Plan, Stage
from arachne.planners.arachne.completion.batch import (
    group_sizes,
    mbs_candidates,
    share_micro_batches,
    share_samples,
)
from arachne.planners.arachne.completion.place import (
    cap_replicas,
    led_by_widest,
    place,
    placements,
    stage_orders,
)
from arachne.planners.arachne.completion.split import split_layers, stage_sends, trim_last_stage
from arachne.planners.arachne.context import PlanningContext
from arachne.planners.arachne.template import (
    Group,
    Template,
    tp_options,
)
from arachne.spec.model import model_ref

SEND_SHARE = 0.05  # blocking sends below this share of an even stage's compute leave the layer split alone
P2P_SHARE = 0.05  # ... and so do sends below this share of the priced step (the most rebalancing could gain)
ALT_WITHIN = 0.8  # ... and templates priced below this share of the fastest plan so far
TRIM_WITHIN = 0.95  # the split trimmed by the 1F1B timeline is priced for templates within this share of the best


def complete(template: Template, ctx: PlanningContext, mbs: int, recompute: bool = False,
             placement=None) -> Plan | None:
    """The template as a full plan at micro-batch size ``mbs`` (None if it cannot be completed)."""
    r = complete_with_time(template, ctx, mbs, recompute, placement)
    return r[0] if r else None


def complete_with_time(template: Template, ctx: PlanningContext, mbs: int, recompute: bool = False,
                       placement=None) -> tuple[Plan, float] | None:
    """:func:`complete`, plus the completion's own time model of the pipelines (fill + steady state),
    used only to decide which candidates are worth pricing."""
    placement = placement or place(template, ctx)
    if placement is None:
        return None
    r = split_and_share(template, ctx, mbs, recompute, placement)
    if r is None:
        return None
    plan = build_plan(template, ctx, mbs, recompute, placement, *r[:2])
    return (plan, r[2]) if plan is not None else None


def split_and_share(template: Template, ctx: PlanningContext, mbs: int | tuple[int, ...], recompute: bool,
                    placement, sends: bool = False, trim: bool = False) -> tuple[list, list[int], float] | None:
    """The rule part of completion: per group the layer split, per pipeline its micro-batches, and the
    completion's own time model (None if it cannot complete). ``mbs``: the micro-batch size, or one per
    group. ``placement`` explains a memory failure and, with ``sends``, gives each stage's blocking send
    time for the split to balance (None when no group's sends matter: the plain split is the answer).
    ``trim``: each split trimmed by the 1F1B timeline (:func:`trim_last_stage`; None when none changes)."""
    job, L = ctx.job, ctx.model.num_layers
    gbs = job.global_batch_size
    sizes = group_sizes(template, mbs)
    uniform = len(set(sizes)) == 1
    if gbs % min(sizes):
        return None
    M = gbs // sizes[0]
    if any(b % s.dp for g, b in zip(template.groups, sizes) for s in g.slots):
        return None
    n_pipes = sum(g.replicas for g in template.groups)
    if (n_pipes > M) if uniform else sum(g.replicas * b for g, b in zip(template.groups, sizes)) > gbs:
        return None
    zero = max(1, n_pipes)
    profiles = [[ctx.slot_profile(s.cls, s.tp, s.dp, s.ep, b, g.num_stages, zero * s.dp, recompute) for s in g.slots]
                for g, b in zip(template.groups, sizes)]
    group_sends: list[list[float] | None] = [None] * len(template.groups)
    if sends:
        for gi, (g, profs) in enumerate(zip(template.groups, profiles)):
            if g.num_stages > 1:
                x = stage_sends(ctx, placement[gi], sizes[gi])
                # sends negligible next to an even stage's compute leave the plain split standing
                if max(x) >= SEND_SHARE * min(p.time(0, L, False, False) for p in profs) / g.num_stages:
                    group_sends[gi] = x
        if not any(group_sends):
            return None
    splits, periods, fills, pipe_sizes = [], [], [], []
    trimmed = False
    for gi, (g, profs) in enumerate(zip(template.groups, profiles)):
        S = g.num_stages
        m = max(1, gbs // (n_pipes * sizes[gi]))
        r = split_layers(profs, L, m, ctx.work, group_sends[gi])
        if r is None:
            if uniform and not ctx.found_fit and ctx.even_split_notes < 8 and (
                    ctx.closest_unfit is None or ctx.closest_unfit[0] > 1):
                ctx.even_split_notes += 1
                _note_even_split(template, ctx, sizes[0], recompute, placement)
            return None
        split = r[0]
        if trim:
            split = trim_last_stage(profs, split, m, ctx.work, group_sends[gi])
            trimmed = trimmed or split != r[0]
        times = [p.time(a, z, i == 0, i == S - 1) for i, (p, (a, z)) in enumerate(zip(profs, split))]
        splits.append(split)
        periods.extend([max(times)] * g.replicas)
        fills.extend([sum(times)] * g.replicas)
        pipe_sizes.extend([sizes[gi]] * g.replicas)
    if trim and not trimmed:
        return None
    counts = share_micro_batches(periods, fills, M) if uniform else share_samples(periods, fills, pipe_sizes, gbs)
    if counts is None:
        return None
    quick = max(((m - 1) * p + f for m, p, f in zip(counts, periods, fills) if m > 0), default=float("inf"))
    return splits, counts, quick


def build_plan(template: Template, ctx: PlanningContext, mbs: int | tuple[int, ...], recompute: bool, placement,
               splits: list, counts: list[int]) -> Plan | None:
    """The plan of a completed template on one placement (pipelines of a group whose micro-batch size is not
    the first group's carry their own)."""
    job = ctx.job
    sizes = group_sizes(template, mbs)
    pipelines = []
    k = 0
    for gi, g in enumerate(template.groups):
        own = sizes[gi] if sizes[gi] != sizes[0] else None
        for r in range(g.replicas):
            m = counts[k]
            k += 1
            if m <= 0:
                continue
            stages = tuple(ctx.stage(ab, devs, s.tp, s.dp, s.ep, recompute)
                           for ab, devs, s in zip(splits[gi], placement[gi][r], g.slots))
            pipelines.append(ctx.pipeline(m, stages, own))
    if not pipelines:
        return None
    replicated = len(pipelines) > 1 or any(s.dp > 1 for g in template.groups for s in g.slots)
    return Plan(model=model_ref(ctx.model), global_batch_size=job.global_batch_size,
                sequence_length=job.sequence_length, micro_batch_size=sizes[0], precision=job.precision,
                zero_stage=1 if replicated else 0, optimizer=job.optimizer, pipelines=tuple(pipelines))


def _note_even_split(template: Template, ctx: PlanningContext, mbs: int, recompute: bool, placement) -> None:
    """Price the template with even layer splits, only to report how far memory is from fitting."""
    L = ctx.model.num_layers
    if any(g.num_stages > L for g in template.groups):
        return
    M = ctx.job.global_batch_size // mbs
    n = sum(g.replicas for g in template.groups)
    if n > M:
        return
    pipes = []
    for gi, g in enumerate(template.groups):
        S = g.num_stages
        edges = [round(i * L / S) for i in range(S + 1)]
        for r in range(g.replicas):
            stages = tuple(Stage(layers=(a, b), devices=devs, tp=s.tp, dp=s.dp if s.dp > 1 else None, ep=s.ep,
                                 recompute=recompute)
                           for a, b, devs, s in zip(edges, edges[1:], placement[gi][r], g.slots))
            pipes.append(Pipeline(micro_batches=M // n + (1 if len(pipes) < M % n else 0), stages=stages))
    plan = Plan(model=model_ref(ctx.model), global_batch_size=ctx.job.global_batch_size,
                sequence_length=ctx.job.sequence_length, micro_batch_size=mbs, precision=ctx.job.precision,
                zero_stage=1 if n > 1 else 0, pipelines=tuple(pipes))
    ctx.note_unfit(ctx.cost_model.estimate(plan, validate=False))


def price_template(template: Template, ctx: PlanningContext, mbs_options: list[int] | None = None,
                   max_priced: int | None = 2, screen: bool = False,
                   heads: bool = True, lead: bool = True) -> tuple[Plan, Estimate] | None:
    """Complete the template at every candidate micro-batch size, price the ``max_priced`` most promising
    (by the completion's own time model; all when None) with the cost model, on each placement and
    class order, with recomputation only where memory demands it; the fastest plan that fits, or None.

    ``screen``: a cheap first look (a few times cheaper): the most promising micro-batch size only, the
    reversed class order only if the first does not fit. With ``heads``, a plan whose pace is set by a
    one-layer last stage (the head) is priced again with a wider last stage (:func:`wide_head`); with ``lead``,
    a plan whose optimizer step takes ``LEAD_SHARE`` of the step is priced again led by the stage of another
    class that updates the embedding fastest (:func:`~.place.led_by_widest`)."""
    if screen:
        ctx.work.screens += 1
    else:
        ctx.work.prices += 1
    template = cap_replicas(template, ctx.job.global_batch_size)
    best: tuple[Plan, Estimate] | None = None
    for variant in stage_orders(template, ctx.classes):
        if screen and best is not None:
            break
        r = _price_variant(variant, ctx, mbs_options, 1 if screen else max_priced, alt_splits=not screen)
        if r is not None and (best is None or r[1].iteration_time_s < best[1].iteration_time_s):
            best = r
    if best is not None and heads and not screen and (head_bound(best[1]) or (
            best[1].tokens_per_s >= HEAD_WITHIN * ctx.best_tok_s and head_bound(best[1], even_share=True))):
        wide = wide_head(template, ctx)
        r = price_template(wide, ctx, mbs_options, max_priced, heads=False, lead=False) if wide is not None else None
        if r is not None and r[1].iteration_time_s < best[1].iteration_time_s:
            best = r
    if best is not None and lead and not screen and lead_bound(best[1], ctx.best_tok_s):
        led = led_by_widest(template, ctx.classes)
        r = price_template(led, ctx, mbs_options, max_priced, heads=heads, lead=False) if led is not None else None
        if r is not None and r[1].iteration_time_s < best[1].iteration_time_s:
            best = r
    if best is not None:
        ctx.best_tok_s = max(ctx.best_tok_s, best[1].tokens_per_s)
    return best


LEAD_SHARE = 0.03  # an optimizer step this share of the step is worth a pipeline led by faster-updating GPUs


def lead_bound(est: Estimate, best_tok_s: float) -> bool:
    """Whether the optimizer step takes ``LEAD_SHARE`` of the step and the plan, with all of it saved (the most a
    faster-updating first stage could save), would beat the best so far."""
    opt, it = est.breakdown["optimizer_s"], est.iteration_time_s
    return it > opt >= LEAD_SHARE * it and est.tokens_per_s * it / (it - opt) > best_tok_s


HEAD_BOUND = 1.25  # a one-layer last stage this much slower than its pipeline's other stages is worth widening
HEAD_WITHIN = 0.9  # ... judged against their mean only on templates within this share of the best so far


def head_bound(est: Estimate, even_share: bool = False) -> bool:
    """Whether some pipeline's last stage holds one layer and is ``HEAD_BOUND`` times slower than any other
    stage of it: the head (a large vocabulary's projection) sets the pace, and no split can move it. With
    ``even_share``, the slowest stage and that much slower than the other stages' mean: the split's greedy fill
    loads the earlier stages up to the head's bound, so the slowest of them can be near it while most hold far
    less."""
    last: dict[int, StageEstimate] = {}
    others: dict[int, list[float]] = {}
    for st in est.stages:
        if st.pipeline in last:
            others.setdefault(st.pipeline, []).append(last[st.pipeline].compute_s)
        last[st.pipeline] = st

    def paces(st: StageEstimate, rest: list[float]) -> bool:
        if even_share:  # the slowest stage, and well above the even share
            return st.compute_s >= max(rest) and st.compute_s >= HEAD_BOUND * sum(rest) / len(rest)
        return st.compute_s >= HEAD_BOUND * max(rest)

    return any(st.layers[1] - st.layers[0] == 1 and st.stage >= 2 and paces(st, others[pi]) for pi, st in last.items())


def wide_head(template: Template, ctx: PlanningContext) -> Template | None:
    """The template with each group's last two stages, where they are alike, merged into one stage of twice
    the tensor parallelism: the same GPUs, one stage fewer, the head's stage twice as fast (Sailor's plan
    for DeepSeek-MoE-16B on an H100 and an H800 node: 14 one-GPU stages, then the last layer and the head
    at tp 2). None if no group has such a tail."""
    groups, changed = [], False
    for g in template.groups:
        a, b = (g.slots[-2], g.slots[-1]) if len(g.slots) >= 3 else (None, None)
        if a is not None and a == b and 2 * b.tp in tp_options(ctx.model, ctx.classes[b.cls].node_size):
            groups.append(Group(g.slots[:-2] + (replace(b, tp=2 * b.tp),), g.replicas))
            changed = True
        else:
            groups.append(g)
    return Template(tuple(groups)) if changed else None


def _price_variant(template: Template, ctx: PlanningContext, mbs_options: list[int] | None,
                   max_priced: int | None, alt_splits: bool = True) -> tuple[Plan, Estimate] | None:
    gbs = ctx.job.global_batch_size
    options = mbs_options or mbs_candidates(template, ctx.job, allow_fewer_pipelines=True)
    # a micro-batch size with fewer micro-batches than pipelines keeps as many pipelines as it feeds
    layouts_of: dict[Template, list] = {}
    capped: dict[int, tuple[Template, list]] = {}
    for mbs in options:
        t = cap_replicas(template, gbs // mbs)
        if t not in layouts_of:
            ctx.work.placed_slots += sum(len(g.slots) * g.replicas for g in t.groups)
            layouts_of[t] = placements(t, ctx)
        capped[mbs] = (t, layouts_of[t])
    best: tuple[Plan, Estimate] | None = None
    for recompute in (False, True):
        cands = []
        for mbs in options:
            t, layouts = capped[mbs]
            if not layouts:
                continue
            r = split_and_share(t, ctx, mbs, recompute, layouts[0])
            if r is not None:
                cands.append((r[2], mbs, r))
        cands.sort(key=lambda c: c[0])
        priced = 0
        for _, mbs, (splits, counts, _) in cands:
            if max_priced is not None and priced >= max_priced and best is not None:
                break
            priced += 1
            t, layouts = capped[mbs]
            variants = [p for p in (build_plan(t, ctx, mbs, recompute, lay, splits, counts) for lay in layouts)
                        if p is not None]
            sends_matter = False
            for cand in variants:
                est = ctx.cost_model.estimate(cand, validate=False)
                sends_matter = sends_matter or est.breakdown["p2p_s"] >= P2P_SHARE * est.iteration_time_s
                if not est.fits:
                    ctx.note_unfit(est)
                elif best is None or est.iteration_time_s < best[1].iteration_time_s:
                    best = (cand, est)
                    ctx.found_fit = True
            promising = best is None or best[1].tokens_per_s >= ALT_WITHIN * ctx.best_tok_s
            if alt_splits and ctx.balance_sends and sends_matter and promising:
                # blocking sends take a real share of the step: the split that balances them too is priced
                alt = split_and_share(t, ctx, mbs, recompute, layouts[0], sends=True)
                if alt is not None and alt[0] != splits:
                    best = _price_alt(t, ctx, mbs, recompute, layouts, alt, best)
            if alt_splits and ctx.trim_last and best is not None and \
                    best[1].tokens_per_s >= TRIM_WITHIN * ctx.best_tok_s:
                # few micro-batches per stage: the split with the last stage trimmed by the 1F1B timeline
                alt = split_and_share(t, ctx, mbs, recompute, layouts[0], trim=True)
                if alt is not None:
                    best = _price_alt(t, ctx, mbs, recompute, layouts, alt, best)
        if best is not None:
            if alt_splits and ctx.group_sizes and len(template.groups) > 1 and \
                    best[1].tokens_per_s >= ctx.group_within * ctx.best_tok_s:
                best = _price_group_sizes(ctx, capped, best, recompute)
            break  # recomputation only when nothing fits without it
    return best


GROUP_SIZE_GAIN = 0.005  # a per-group micro-batch size is priced when the completion's time model gains this


def _price_group_sizes(ctx: PlanningContext, capped: dict[int, tuple[Template, list]],
                       best: tuple[Plan, Estimate], recompute: bool) -> tuple[Plan, Estimate]:
    """From the best plan at one micro-batch size ``b``, each group in turn at another size (b/4 ... 4b; the
    fast GPUs of one group take larger micro-batches than memory lets the others): the change the
    completion's time model likes best is priced, and kept where the cost model agrees."""
    b = best[0].micro_batch_size
    if b not in capped or any(p.micro_batch_size for p in best[0].pipelines):
        return best
    t, layouts = capped[b]
    base = split_and_share(t, ctx, b, recompute, layouts[0]) if len(t.groups) > 1 and layouts else None
    if base is None:
        return best
    gbs = ctx.job.global_batch_size
    trials = []
    for gi, g in enumerate(t.groups):
        for a in mbs_candidates(Template((g,)), ctx.job, allow_fewer_pipelines=True):
            if a == b or not b <= 4 * a <= 16 * b or gbs % a:
                continue
            sizes = tuple(a if j == gi else b for j in range(len(t.groups)))
            r = split_and_share(t, ctx, sizes, recompute, layouts[0])
            if r is not None and r[2] < base[2] * (1 - GROUP_SIZE_GAIN):
                trials.append((r[2], sizes, r))
    if not trials:
        return best
    _, sizes, (splits, counts, _) = min(trials, key=lambda x: x[0])
    for lay in layouts:
        cand = build_plan(t, ctx, sizes, recompute, lay, splits, counts)
        est = ctx.cost_model.estimate(cand, validate=False) if cand is not None else None
        if est is not None and est.fits and est.iteration_time_s < best[1].iteration_time_s:
            best = (cand, est)
    return best


def _price_alt(t: Template, ctx: PlanningContext, mbs: int, recompute: bool, layouts: list, alt: tuple,
               best: tuple[Plan, Estimate] | None) -> tuple[Plan, Estimate] | None:
    """A second layer split (``alt``: splits and micro-batch counts) priced on every placement: the faster of it
    and ``best`` (only a plan that fits)."""
    for cand in (build_plan(t, ctx, mbs, recompute, lay, alt[0], alt[1]) for lay in layouts):
        est = ctx.cost_model.estimate(cand, validate=False) if cand is not None else None
        if est is not None and est.fits and est.iteration_time_s < best_time(best):
            best = (cand, est)
            ctx.found_fit = True
    return best


def best_time(best: tuple[Plan, Estimate] | None) -> float:
    return best[1].iteration_time_s if best is not None else float("inf")
