"""The knobs on the seeds (:mod:`.seeds`): which seeds start them, and how the time is shared among them."""

from __future__ import annotations

from collections.abc import Callable

from arachne.cost import Estimate
from arachne.plan import Plan
from arachne.planners.arachne.completion.modern import fp8_allowed, modernize
from arachne.planners.arachne.context import PlanningContext
from arachne.planners.arachne.seed_forms import layout_key
from arachne.planners.protocol import Deadline
from arachne.spec.runtimes import Legality

Priced = tuple[Plan, Estimate]

SEED_TOP = 2
"""The fastest seeds given the knobs."""
SEED_FASTEST = 2
"""The fastest seeds as priced also given the knobs (beside the :data:`SEED_TOP` by their bound)."""
SEED_ESTIMATES = 30
"""Estimates the knobs spend on one seed, at most."""


def seed_knobs(ctx: PlanningContext, seeds: list[Priced], deadline: Deadline, rules: Legality | None,
               score: Callable[[Estimate], float], bound: Callable[[Estimate], float], last: bool,
               top: int = SEED_TOP, fastest: int = SEED_FASTEST) -> list[Priced]:
    """The knobs (:func:`~.completion.modern.modernize`) on the ``top`` best of ``seeds`` by ``bound`` and the
    ``fastest`` by ``score``, one per price and layout, while ``deadline`` lasts; the starts, what the knobs made of
    them, and the fastest seed."""
    seeds = sorted(seeds, key=lambda r: bound(r[1]))
    distinct: dict[float, Priced] = {}  # one plan per price (a lock-step form often prices as its pipelines do)
    for r in seeds:
        distinct.setdefault(round(r[1].iteration_time_s, 9), r)
    # and one per layout: seeds that differ only in their experts' parallel degree are one start for the knobs,
    # which price every stage's expert layouts (fresh hold-out odd100-rerun/rob-012: the four starts were two
    # layouts at two degrees each, and the layout the knobs made the fastest plan of, fifth, got none; greedy,
    # the knobs can still end apart from two degrees of one layout: decision 0022)
    layouts: dict[tuple, Priced] = {}
    for r in distinct.values():
        layouts.setdefault(layout_key(r[0]), r)
    ranked = list(layouts.values())
    starts = ranked[:top]
    # and the fastest seeds as priced: a plan the bound favours for the recomputation it might drop can keep it
    # (no memory to spare), and the fastest must not be lost behind it; nor the next fastest, whose bubble the
    # interleaving knob may hide (a pipelined plan just behind one without a pipeline)
    for r in sorted(ranked, key=lambda r: score(r[1]))[:fastest]:
        if r not in starts:
            starts.append(r)
    quickest = min(seeds, key=lambda r: score(r[1]), default=None)  # (one layout's other degree may be it)
    out: list[Priced] = [quickest] if quickest is not None and quickest not in starts else []
    shares = len(starts) - (len(starts) > top + 1)  # a fourth plan gets only what the first three leave
    for i, (plan, est) in enumerate(starts):
        out.append((plan, est))
        if deadline.expired():
            continue
        sub = deadline.child(deadline.remaining / max(1, shares - i))
        better = modernize(plan, est, ctx.cost_model, legality=rules, allow_fp8=fp8_allowed(ctx.job), deadline=sub,
                           max_estimates=SEED_ESTIMATES, work=ctx.work, reshape=last)
        if better[0] is not plan:
            out.append(better)
    return out
