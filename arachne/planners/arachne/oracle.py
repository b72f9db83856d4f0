"""The exhaustive oracle: every template arachne can express, each completed with every candidate
(micro-batch size, recomputation) and, on small models, every layer split near the balanced one; then the
formats-v2 knobs (``completion.modern``) on its best plans, as the arachne planner ends, with no deadline of
their own. Exponential: for clusters of up to about 64 GPUs, with a time budget; it measures how far
planners are from optimal in the space arachne searches."""

from __future__ import annotations

from arachne.cost import CostModel
from arachne.planners.arachne.actions import State, class_actions, mix_replica_options
from arachne.planners.arachne.completion.modern import fp8_allowed, modern_variants
from arachne.planners.arachne.completion.polish import split_neighbours
from arachne.planners.arachne.context import PlanningContext
from arachne.planners.arachne.search.pricer import Pricer
from arachne.planners.protocol import (
    PlannerResult,
    SearchBudget,
    SearchStats,
    progress_bar,
)
from arachne.spec.cluster import Cluster
from arachne.spec.job import Job
from arachne.spec.model import ModelSpec


def all_states(ctx: PlanningContext):
    """Every decision sequence (the whole template space), depth first."""
    classes, model = ctx.classes, ctx.model

    def rec(st: State):
        if st.step() == len(classes):
            if not st.is_empty():
                yield st
            return
        for a in class_actions(st, model, classes[st.step()]):
            yield from rec(st.push(a))

    for r in mix_replica_options(classes, max_options=16):
        yield from rec(State(r))


class ExhaustivePlanner:
    """Enumerates the whole template space, then polishes the best plans' layer splits."""

    name = "exhaustive"

    def __init__(self, split_radius: int = 2, polish_top: int = 8, max_split_variants: int = 400,
                 sequence_parallel: bool = True, modern_knobs: bool = True, knob_top: int = 8,
                 knob_estimates: int = 200):
        self.split_radius, self.polish_top, self.max_split_variants = split_radius, polish_top, max_split_variants
        self.sequence_parallel = sequence_parallel  # the completion's rule, as the arachne planner applies it
        self.modern_knobs, self.knob_top, self.knob_estimates = modern_knobs, knob_top, knob_estimates

    def plan(self, cluster: Cluster, model: ModelSpec, job: Job, cost_model: CostModel,
             budget: SearchBudget) -> PlannerResult:
        deadline = budget.deadline()
        ctx = PlanningContext(cluster, model, job, cost_model, sequence_parallel=self.sequence_parallel)
        pricer = Pricer(ctx, max_priced=None)
        stats = SearchStats()
        with progress_bar(budget.progress, "exhaustive: templates") as advance:
            for st in all_states(ctx):
                if deadline.expired():
                    stats.timed_out = True
                    break
                pricer.price_state(st)
                stats.candidates += 1
                advance(1)
        ranked = sorted(((r[0], r[1]) for r in pricer.cache.values() if r is not None),
                        key=lambda x: x[1].iteration_time_s)
        results = list(ranked)
        for plan, _ in ranked[: self.polish_top]:
            for cand in split_neighbours(plan, self.split_radius, self.max_split_variants):
                if deadline.expired():
                    stats.timed_out = True
                    break
                est = cost_model.estimate(cand, validate=False)
                if est.fits:
                    results.append((cand, est))
        results.sort(key=lambda x: x[1].iteration_time_s)
        if self.modern_knobs and not deadline.expired():  # more plans and estimates than the planner's pass gets
            results += modern_variants(results, cost_model, allow_fp8=fp8_allowed(job), deadline=deadline,
                                       top=self.knob_top, max_estimates=self.knob_estimates, extra=0)
            results.sort(key=lambda x: x[1].iteration_time_s)
        top = results[: max(1, budget.top_k)]
        return PlannerResult([p for p, _ in top], [e.iteration_time_s for _, e in top], stats)
