"""The micro-batch sizes the seeds' uniform family prices a template at (:mod:`.seeds`), by the completion's own
time model."""

from __future__ import annotations

from arachne.planners.arachne.completion.batch import mbs_candidates
from arachne.planners.arachne.completion.place import cap_replicas, placements
from arachne.planners.arachne.completion.price import split_and_share
from arachne.planners.arachne.context import PlanningContext
from arachne.planners.arachne.template import Template

SEED_SIZES = 3
"""Micro-batch sizes per template (:func:`seed_sizes`)."""


def placed_once(t: Template, ctx: PlanningContext, cache: dict) -> list:
    """The placements of ``t`` (counted as work once per template, then cached)."""
    if t not in cache:
        ctx.work.placed_slots += sum(len(g.slots) * g.replicas for g in t.groups)
        cache[t] = placements(t, ctx)
    return cache[t]


def quick_time(tpl: Template, ctx: PlanningContext, mbs: int, cache: dict) -> float:
    """The completion's own time model of ``tpl`` at ``mbs`` (fill and steady state; no gradient sync), without
    recomputation or, if nothing fits without, with it; infinite when it cannot complete."""
    t = cap_replicas(tpl, ctx.job.global_batch_size // mbs)
    lays = placed_once(t, ctx, cache)
    for recompute in (False, True):
        r = split_and_share(t, ctx, mbs, recompute, lays[0]) if lays else None
        if r is not None:
            return r[2]
    return float("inf")


def seed_sizes(tpl: Template, ctx: PlanningContext, cache: dict, smallest: bool = False) -> list[int]:
    """Micro-batch sizes worth pricing: the two largest (the fewest micro-batches: the longest backward to hide
    the gradient reduction behind, as data-parallel plans want; the largest often only with recomputation), then
    the fastest others by :func:`quick_time` (many small micro-batches, as deep pipelines want). Without data
    parallelism (one pipeline, every stage dp 1) there is no reduction to hide: the fastest by
    :func:`quick_time` that fit, one fewer. ``smallest``: the smallest (one sequence per GPU of the
    widest stage: the most micro-batches, the smallest bubble, as Megatron's grid runs a deep pipeline)."""
    opts = sorted(mbs_candidates(tpl, ctx.job), reverse=True)
    if smallest:
        return opts[-1:]
    if not any(s.dp > 1 for g in tpl.groups for s in g.slots) and sum(g.replicas for g in tpl.groups) == 1:
        quick = sorted((quick_time(tpl, ctx, b, cache), -b) for b in opts)
        return [-b for q, b in quick[: SEED_SIZES - 1] if q < float("inf")]
    if len(opts) <= SEED_SIZES:
        return opts
    top = opts[:2]
    quick = sorted((quick_time(tpl, ctx, b, cache), b) for b in opts[2:])
    return top + [b for q, b in quick[: SEED_SIZES - 2] if q < float("inf")]
