"""The arachne planner: the policy proposes templates, rules complete them, the cost model prices them."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, replace
from itertools import zip_longest
from typing import Any

from threadpoolctl import threadpool_limits

from arachne.cost import CostModel
from arachne.plan_rules import uses_v2
from arachne.planners.arachne.actions import State
from arachne.planners.arachne.completion.modern import MODERN_SHARE, modern_pass
from arachne.planners.arachne.completion.polish import polish_splits, type_led
from arachne.planners.arachne.context import PlanningContext
from arachne.planners.arachne.learned.features import FeatureBuilder
from arachne.planners.arachne.learned.policy import Policy, shipped_policy
from arachne.planners.arachne.learned.ranker import (
    RankerEnsemble,
    rank_states,
    ranked_pool,
    shipped_ranker,
)
from arachne.planners.arachne.long_context import long_sequence
from arachne.planners.arachne.options import (
    BASE_TARGET_S,
    AblationSwitches,
    ArachneOptions,
    TimeShares,
    default_target,
)
from arachne.planners.arachne.portfolio import SECOND_LOOK, SECOND_LOOK_MAX_GPUS, Forked
from arachne.planners.arachne.rules_view import RulePricer, cost_views, framework_floor, planner_rules
from arachne.planners.arachne.search.beams import policy_search, teacher_search
from arachne.planners.arachne.search.pricer import Pricer
from arachne.planners.arachne.search.refine import SPANNING_GAIN, refine, spanning_dropped
from arachne.planners.arachne.search.rules import rule_pool
from arachne.planners.arachne.search.whole_blocks import WHOLE_BLOCK_SHARE, whole_block_pass
from arachne.planners.arachne.template import has_odd_nodes
from arachne.planners.arachne.work_clock import WorkClock
from arachne.planners.objective import Objective
from arachne.planners.protocol import (
    Deadline,
    PlannerResult,
    SearchBudget,
    SearchStats,
    progress_bar,
)
from arachne.spec.cluster import Cluster
from arachne.spec.job import Job
from arachne.spec.model import ModelSpec
from arachne.spec.runtimes import Legality

CPU_GUARD = 4.0  # the run stops at this many times its target (plus 1 s) in CPU seconds, whatever the work clock says
FINAL_POLISH_SHARE = 0.03  # of the target, at most, for the winner's stage boundaries after the knobs
TYPE_LED_SLACK = 0.05  # another GPU type leading the winner's pipelines is polished where it prices within this


def _contiguous(plan) -> bool:
    """Every stage of ``plan`` holds one contiguous layer range (what polishing moves; no interleaving)."""
    return all(isinstance(s.layers[0], int) for p in plan.pipelines for s in p.stages)


def _plain_split(plan) -> bool:
    """A plan of the search (version 1, with sequence parallelism where tp > 1) whose stages each hold one
    contiguous layer range (what polishing moves)."""
    return not uses_v2(plan, sequence_parallel=False) and _contiguous(plan)


def _post_share(job: Job, priced: bool = False, plain: float = TimeShares.seed_share) -> float:
    """The target's share kept for the passes after the search (the seeds and the modern knobs), so that the
    whole run keeps to the target; ``priced``: under an objective that prices GPUs, ``plain``: the seeds' share
    otherwise (``seeds.seed_share``)."""
    from arachne.planners.arachne.seeds import seed_share

    return seed_share(job, priced, plain) + MODERN_SHARE


class ArachnePlanner:
    """Top-k templates from the learned policy plus rule-based floor templates, ordered for screening
    by the learned ranker, completed and priced, then a short priced local refinement of the best one.

    ``mode``: "policy" (default; falls back to "teacher" when no checkpoint is shipped), "teacher"
    (priced beam search: the offline teacher), "floor" (rule-based templates only), "random"
    (``k`` random valid templates; the learning ablation)."""

    name = "arachne"

    def __init__(self, options: ArachneOptions | None = None, *, policy: Policy | None = None,
                 ranker: Policy | RankerEnsemble | None = None, **flat: Any):
        """``options`` (default: :class:`ArachneOptions`), changed by any flat keyword (a field's name);
        ``policy``/``ranker``: models to use instead of the shipped checkpoints."""
        self.options = (options or ArachneOptions()).with_flat(**flat)
        self.policy, self.ranker = policy, ranker

    @property
    def _polishes(self) -> bool:
        """Stage boundaries are polished at the end (never in the ablation's random mode)."""
        return self.options.ablation.use_polish and self.options.ablation.mode != "random"

    legality: Legality | None = None
    objective: Objective | None = None

    def restrict(self, legality: Legality | None, objective: Objective | None) -> None:
        """Search only templates that can satisfy ``legality`` (a cheap check before pricing, the full rules
        on each priced plan) and rank by ``objective``; with the cost objective, also plan on sub-clusters
        (each GPU type alone, and all but the type with the most USD per peak FLOP/s), and so with a
        ``--max-cost-per-hour`` limit: a cheaper plan may leave GPUs idle. Under a framework's rules (one
        pipeline structure for all replicas) that framework's own grid is priced too, as a floor
        (``rules_view.framework_floor``). Called by the harness before :meth:`plan`."""
        self.legality = legality if legality is not None and not legality.free else None
        self.objective = objective if objective is not None and not objective.default else None

    def plan(self, cluster: Cluster, model: ModelSpec, job: Job, cost_model: CostModel,
             budget: SearchBudget) -> PlannerResult:
        second = self._second_look(cluster, model, job, cost_model, budget)
        floor = self._floor(cluster, model, job, cost_model, budget, fork=second is None)
        try:
            # the policy's and the ranker's products are a few hundred rows: BLAS threads cost more than they
            # save there, and far more on a busy machine (the same products, the same results, on one thread)
            with threadpool_limits(limits=1, user_api="blas"):
                result = self._plan_views(cluster, model, job, cost_model, budget, floor)
            return result if second is None else with_second(result, *second.result())
        except BaseException:  # an error or an interrupt here: the children are stopped, not waited for
            for child in (second, floor):
                if child is not None:
                    child.cancel()
            raise

    floor_wanted = True
    """Whether :meth:`plan` prices the framework's own grid as a floor; off in the second search, whose floor
    would be the first's."""

    def _floor(self, cluster: Cluster, model: ModelSpec, job: Job, cost_model: CostModel, budget: SearchBudget,
               fork: bool) -> Forked | None:
        """Under a framework's rules (one pipeline structure for all replicas), that framework's own grid
        (``rules_view.framework_floor``), started in a forked process where the other core is free (``fork``:
        no second search), else run when its result is asked for; None where there is no floor to price."""
        if not self.floor_wanted or self.legality is None or not self.legality.runtime.one_structure:
            return None
        quiet = replace(budget, progress=False) if fork else budget
        return Forked(lambda: framework_floor(cluster, model, job, cost_model, quiet, self._score), fork=fork)

    def _second_look(self, cluster: Cluster, model: ModelSpec, job: Job, cost_model: CostModel,
                     budget: SearchBudget) -> Forked | None:
        """The second search (:mod:`.portfolio`), started in a forked process, on its own cost model (the same
        prices, cold caches, as a fresh process would have); None where the options turn it off."""
        o = self.options
        if not o.target.second_look or o.ablation != AblationSwitches() or \
                len(cluster.devices) > SECOND_LOOK_MAX_GPUS:
            return None
        other = ArachnePlanner(o.with_flat(**SECOND_LOOK, second_look=False), policy=self.policy, ranker=self.ranker)
        other.legality, other.objective, other.floor_wanted = self.legality, self.objective, False
        cm = CostModel(cluster, cost_model.profiles, cost_model.cal)
        quiet = replace(budget, progress=False)
        return Forked(lambda: other.plan(cluster, model, job, cm, quiet))

    def _plan_views(self, cluster: Cluster, model: ModelSpec, job: Job, cost_model: CostModel,
                    budget: SearchBudget, floor_job: Forked | None = None) -> PlannerResult:
        views = cost_views(cluster, job.precision) if self.objective is not None and \
            self.objective.needs_prices else []
        result = self._plan_cluster(cluster, model, job, cost_model, budget)
        floor = []
        if floor_job is not None:
            floor, _, _ = floor_job.result()
            if floor is None:  # the child died or could not send its plans: the floor in this process
                floor = framework_floor(cluster, model, job, cost_model, budget, self._score)
        if not views and not floor:
            return result
        ranked = list(zip(result.scores, result.plans)) + floor
        result.stats.notes["framework_floor"] = len(floor)
        for sub in views:
            r = self._plan_cluster(sub, model, job, CostModel(sub, cost_model.profiles, cost_model.cal), budget)
            ranked += list(zip(r.scores, r.plans))
            result.stats.candidates += r.stats.candidates
            result.stats.notes["work_s"] = round(result.stats.notes.get("work_s", 0.0) + r.stats.notes.get(
                "work_s", 0.0), 3)
        result.stats.notes["cost_views"] = len(views)
        ranked.sort(key=lambda x: x[0])  # every view's top-k: the harness applies the limits to all of them
        return PlannerResult([p for _, p in ranked], [t for t, _ in ranked], result.stats)

    def _plan_cluster(self, cluster: Cluster, model: ModelSpec, job: Job, cost_model: CostModel,
                      budget: SearchBudget) -> PlannerResult:
        o = self.options
        # the caller's budget in CPU seconds of this thread: a loaded machine stretches the wall time, not the
        # search, so the same input gets the same plan under any load
        deadline = replace(budget, cpu=True).deadline()
        span = o.target.target_s if o.target.target_s is not None else default_target(len(cluster.devices))
        base = min(span, BASE_TARGET_S)  # the base pass, which a longer target runs first and then extends
        # the latency target runs on the work clock; CPU time only guards the whole run (every pass of it)
        # against a machine many times slower than the one the work rates were fitted on, or work they miss
        guard = Deadline(min(deadline.seconds, CPU_GUARD * span + 1.0), deadline.clock)
        if not has_odd_nodes(cluster) or not 0 < o.shares.parts_share < 1:
            return self._plan(cluster, model, job, cost_model, budget, deadline, guard, o.shares.parts_share > 0,
                              span, base)
        if len(cluster.devices) > o.search.parts_max_gpus:  # a large cluster's search needs all of the target
            return self._plan(cluster, model, job, cost_model, budget, deadline, guard, False, span, base)
        # nodes of 3, 6 or 7 GPUs: first a quick pass (its floor, screens and first prices; no refinement) over
        # their power-of-two parts as classes (tp 2 and 4 fit a node of 7), then the search over whole nodes (a
        # stage of dp 6, fewer classes for mixed pipelines) with the rest of the target; the faster plan wins.
        # Both are split as the base pass splits them; a longer target's extra time goes to the whole-node
        # search, so its base pass is the base pass's own (a longer target never returns a slower plan)
        quick = base * o.shares.parts_share
        parts = self._plan(cluster, model, job, cost_model, budget, deadline, guard, True, quick, quick,
                           fallback=False)
        rest = base * max(o.shares.whole_min_share, 1 - parts.stats.notes.get("work_s", 0.0) / base)
        whole = self._plan(cluster, model, job, cost_model, budget, deadline, guard, False, rest + span - base,
                           rest, fallback=not parts.plans)
        if not parts.plans and not whole.plans:  # nothing fits whole nodes: every part template, while time lasts
            parts = self._plan(cluster, model, job, cost_model, budget, deadline, guard, True, span, base)
        stats = parts.stats
        stats.candidates += whole.stats.candidates
        stats.timed_out = stats.timed_out or whole.stats.timed_out
        stats.notes["work_s"] = round(stats.notes.get("work_s", 0.0) + whole.stats.notes.get("work_s", 0.0), 3)
        if whole.stats.notes.get("guard_expired"):
            stats.notes["guard_expired"] = True
        stats.notes["node_views"] = {name: r.scores[0] if r.scores else None
                                     for name, r in (("parts", parts), ("whole", whole))}
        ranked = sorted(zip(parts.scores + whole.scores, parts.plans + whole.plans), key=lambda x: x[0])
        ranked = ranked[: max(1, budget.top_k)]
        return PlannerResult([p for _, p in ranked], [t for t, _ in ranked], stats)

    def _plan(self, cluster: Cluster, model: ModelSpec, job: Job, cost_model: CostModel, budget: SearchBudget,
              deadline: Deadline, guard: Deadline, parts: bool, span: float, base_span: float,
              fallback: bool = True) -> PlannerResult:
        """One search over the cluster's classes (``parts``: odd nodes by parts) for ``span`` seconds of the
        target, of which ``base_span`` is its base pass (a longer span runs that pass as it is, then extends
        it); ``fallback``: where nothing fits, the priced teacher and then every template while the budget lasts."""
        o = self.options
        whole = min(span, deadline.remaining)
        # the seeds' and the knobs' passes run after the search, within the same target: the search gets the rest
        full_target = whole * (1 - _post_share(job, self._priced, o.shares.seed_share)) if o.ablation.modern_knobs \
            else whole
        # a target beyond the base pass's runs that pass first and spends the rest improving on it, so
        # more time does not change (and lose) what the base pass would have found
        base = base_span * (full_target / whole if whole > 0 else 1.0)
        extend = o.ablation.mode == "policy" and o.ablation.use_floor and not o.ablation.rank_k and full_target > base
        target = base if extend else full_target
        polish_at = target * (1 - o.shares.polish_share) if self._polishes else target
        rules = asdict(o.completion)
        rules["sequence_parallel"] = rules["sequence_parallel"] and o.ablation.modern_knobs  # (off: version-1 plans)
        ctx = PlanningContext(cluster, model, job, cost_model, node_parts=parts,
                              same_gpus_first=o.search.same_gpus_first,
                              whole_block_mix=o.search.whole_block_mix, **rules)
        pricer = RulePricer(ctx, rules=planner_rules(self.legality)) if self.legality is not None else Pricer(ctx)
        stats = SearchStats()
        early: list = []  # the passes after the search, run before the fallback (long sequences)

        def post(span: float, polished: list, last: bool = True) -> list:
            """The passes after the search, for their shares of ``span`` on the run's clock: the seeds (the
            uniform grid family, seeds.py), then the formats-v2 knobs on the best plans (completion/modern.py)."""
            from arachne.planners.arachne.seeds import seed_pass

            # the seeds also get what the search left of the target (a search that stops early: nothing fits
            # without context parallelism, or a small cluster's space is spent)
            left = span * (1 - MODERN_SHARE) - run.elapsed
            out = seed_pass(ctx, self.legality, run.clock, span, deadline, self._score, pricer.results() + polished,
                            seconds=left, priced=self._priced, last=last, plain=o.shares.seed_share)
            mark("seeds")
            return out + modern_pass(pricer.results() + polished + out, cost_model, job, self.legality, run.clock,
                                     span, deadline, self._score, work=ctx.work, last=last)

        work = WorkClock(ctx.work, cost_model)
        run = Deadline(full_target, work if o.target.clock == "work" else time.perf_counter, guard)
        phases: dict[str, float] = {}
        stats.notes["phases"] = phases

        def mark(name: str) -> None:
            """The run's clock at the end of a phase (``notes["phases"]``: where the target went)."""
            phases[name] = round(run.elapsed, 4)
        policy = self.policy or (shipped_policy() if o.ablation.mode == "policy" else None)
        mode = o.ablation.mode if (o.ablation.mode != "policy" or policy is not None) else "teacher"
        stats.notes["mode"] = mode
        with progress_bar(budget.progress, "arachne: pricing templates") as advance:
            # phase 1, within its share of the target: the floor's homogeneous and all-classes templates,
            # then the policy's proposals interleaved with the mixed-pipeline rules
            phase1 = run.child(target * o.shares.phase1_share - run.elapsed)
            proposed: list[State] = []
            feats = FeatureBuilder(ctx)
            if mode == "policy":  # beams narrow to one action each once their share of the target is spent
                proposed = policy_search(ctx, policy, o.search.k, feats, run.child(target * o.shares.policy_share))
                mark("policy")
            elif mode == "random":
                proposed = random_states(ctx, o.search.k, budget.seed)
            core: list[State] = []
            mixed: list[State] = []
            lead: list[State] = []
            pools: list[State] = []
            if mode in ("floor", "teacher") or (mode == "policy" and o.ablation.use_floor):
                depth = o.search.depth_rule and mode == "policy" and not o.ablation.rank_k
                core, mixed, lead, pools = rule_pool(ctx, pricer, deadline, o.search.floor_actions, depth)
                if mode == "floor" and o.ablation.floor_k:  # the ablation's equal-size rule arm: the first k rules
                    core, mixed = core[: o.ablation.floor_k], mixed[: max(0, o.ablation.floor_k - len(core))]
                mark("rules")
            if mode == "teacher":
                teacher_search(ctx, pricer, o.search.teacher_beam, deadline, advance)
            timed = mode == "policy" and o.ablation.use_floor  # the shipped configuration keeps to its latency target
            # past the budget, pricing goes on only until one plan fits (a plan beats a timeout), and
            # never past twice the budget
            hard = Deadline(max(0.0, 2 * deadline.seconds - deadline.elapsed), deadline.clock)

            def stop(soft: Deadline | None = None) -> bool:
                if hard.expired():
                    return True
                return ctx.found_fit and (deadline.expired() or (timed and soft is not None and soft.expired()))

            for st in core:
                if stop():
                    break
                pricer.price_state(st)
                advance(1)
            mark("core")
            # the rest is screened first (cheap), in the learned ranker's order (without one: proposals and
            # rules interleaved), then the most promising are priced in full
            ranker = (self.ranker or shipped_ranker()) if o.ablation.use_ranker and mode == "policy" else None
            if ranker is not None:
                rest = rank_states(ctx, ranker, *ranked_pool(proposed, mixed), feats)
                stats.notes["ranked"] = len(rest)
                if o.ablation.rank_k:
                    core, rest = [], rest[: o.ablation.rank_k]
                elif o.search.proxy_first and mixed:
                    # the mixed rule the throughput proxy rates best goes first: on large clusters only the
                    # ranker's first few get screened
                    # (test_the_mixed_rule_the_proxy_rates_best_is_screened_first)
                    top = mixed[: o.search.proxy_first]
                    rest = top + [st for st in rest if st not in top]
                mark("rank")
            else:
                rest = [st for pair in zip_longest(proposed, mixed) for st in pair if st is not None]
            screen_until = run.child(target * o.shares.screen_share - run.elapsed)
            screened = []
            for i, st in enumerate((lead if o.search.lead_first else []) + rest):
                if stop(screen_until if i >= o.search.min_screened else None):
                    break
                screened.append((pricer.screen_state(st), st))
                advance(1)
            screened.sort(key=lambda x: -x[0])
            mark("screen")
            for i, (v, st) in enumerate(screened):
                if v <= 0 or stop(phase1 if i >= 2 else None):
                    break
                pricer.price_state(st)
            stats.notes["screened"] = len(screened)
            mark("phase1")
            stats.timed_out = deadline.expired()
            best = pricer.best()
            if best is None and o.ablation.modern_knobs and long_sequence(ctx):
                # long sequences: the seeds with context parallelism before the wide fallback below, which
                # would spend the whole budget on layouts that cannot fit without it
                early = post(whole, [])
            if best is None and not early and mode != "random" and fallback and not deadline.expired():
                # memory is tight: the priced teacher, then the whole template space, while the budget lasts
                teacher_search(ctx, pricer, o.search.teacher_beam, deadline)
                best = pricer.best()
                if best is None:
                    from arachne.planners.arachne.oracle import all_states

                    for st in all_states(ctx):
                        if deadline.expired() or pricer.price_state(st) > 0:
                            break
                    best = pricer.best()
            elif best is not None and mode == "policy" and o.ablation.use_floor and not o.ablation.rank_k:
                # the priced teacher as a safety net, for a share of what the latency target leaves
                spare = polish_at - run.elapsed
                if spare > 0.05:
                    teacher_search(ctx, pricer, o.search.teacher_beam, run.child(spare * o.shares.teacher_share))
                    best = pricer.best()
                    mark("teacher")
            if best is not None and o.ablation.use_refine and mode != "random":
                start = pricer.states.get(best[0])
                if start is not None:
                    end = refine(ctx, pricer, start, run.child(polish_at - run.elapsed))
                    # time left once refinement converges: refine from the next best distinct templates
                    for st in _next_starts(pricer, {start.template(), end.template()}, o.search.more_starts):
                        if polish_at - run.elapsed <= 0.02:
                            break
                        refine(ctx, pricer, st, run.child(polish_at - run.elapsed))
                    mark("refine")
            for st in pools:  # a GPU type pooled across its node sizes: candidates after refinement
                if stop(run.child(target - run.elapsed)):
                    break
                pricer.price_state(st)
            # and the incumbent's mixed group without its classes whose stages span nodes: screened even where
            # the search used up its share (large clusters leave refinement no time), priced where it gains
            lead_state = pricer.states.get(pricer.best()[0]) if pricer.best() is not None else None
            for st in spanning_dropped(ctx, lead_state) if lead_state is not None and not hard.expired() else []:
                if pricer.screen_state(st) > SPANNING_GAIN * pricer.best()[2].tokens_per_s:
                    pricer.price_state(st)
            polished = self._polish(pricer, [], cost_model, target, run)
            mark("polish")
            if extend and pricer.best() is not None and o.ablation.modern_knobs:
                # what the base pass returns (its passes after the search, as it runs them) stays in the
                # pool, so a longer target never returns a slower plan (the knobs' lift and reshaping wait for
                # the last pass: their estimates here would shift the extension)
                polished += post(base_span, polished, last=False)
            if extend and pricer.best() is not None:
                stats.notes["extended_s"] = round(full_target - run.elapsed, 3)
                end = full_target * (1 - o.shares.polish_share) if self._polishes else full_target
                seen = {id(st) for _, st in screened}
                self._extend(ctx, pricer, screened, run.child(end - run.elapsed), lead,
                             [st for st in rest if id(st) not in seen])
                polished = self._polish(pricer, polished, cost_model, full_target, run)
        if o.ablation.modern_knobs:
            polished += early or post(whole, polished)
            mark("knobs")
        if self._polishes:  # the winner's stage boundaries once more, as it now runs (decision 0029)
            clock = work if o.target.clock == "work" else time.perf_counter
            polished += self._polish_final(pricer.results() + polished, cost_model,
                                           Deadline(FINAL_POLISH_SHARE * whole, clock, guard))
            mark("final")
        if ctx.whole_block_mix and pricer.best() is not None:  # the second search's last pass (decision 0048)
            clock = work if o.target.clock == "work" else time.perf_counter
            polished += self._whole_blocks(ctx, pricer, polished, whole, clock, guard, stats)
            mark("whole_blocks")
        score = self._score
        ranked = sorted(pricer.results() + polished,  # distinct plans, best first (fastest by default)
                        key=lambda r: score(r[1]))[: max(1, budget.top_k)]
        stats.candidates = len(pricer.cache) + len(pricer.screened)
        if ctx.closest_unfit is not None:
            stats.notes["closest_unfit"] = ctx.closest_unfit[1]
        stats.timed_out = stats.timed_out or deadline.expired()
        stats.notes["clock"] = o.target.clock
        stats.notes["work_s"] = round(work(), 3)
        if guard.expired():  # the plan then depends on the machine's speed: say so
            stats.notes["guard_expired"] = True
        stats.notes["work"] = asdict(work.tally())
        return PlannerResult([r[0] for r in ranked], [score(r[1]) for r in ranked], stats)

    def _whole_blocks(self, ctx: PlanningContext, pricer: Pricer, polished: list, whole: float,
                      clock: Callable[[], float], guard: Deadline, stats: SearchStats) -> list:
        """The mixed rules at the replicas their whole blocks per stage allow (``search/whole_blocks.py``), screened
        for ``WHOLE_BLOCK_SHARE`` of the target after everything else; one that beats every plan so far is priced
        in full and given the knobs (their own share). Returns the knobs' plans (the rest join the pricer's);
        ``notes["whole_blocks"]``: the forms screened, and those faster than every plan before."""
        best = min(self._score(e) for _, e in pricer.results() + polished)
        deadline = Deadline(WHOLE_BLOCK_SHARE * whole, clock, guard)
        faster = []
        for st in (done := whole_block_pass(ctx, pricer, deadline)):
            r = pricer.screened.get(st.template())
            if r is not None and self._score(r[1]) < best and not guard.expired():
                pricer.price_state(st)
                faster += [r for r in (pricer.cache.get(st.template()), r) if r is not None]
        stats.notes["whole_blocks"] = {"screened": len(done), "faster": len(faster)}
        if not faster or not self.options.ablation.modern_knobs:
            return []
        return modern_pass(faster, ctx.cost_model, ctx.job, self.legality, clock, whole, guard, self._score,
                           work=ctx.work)

    @property
    def _priced(self) -> bool:
        """Planning under an objective that prices GPUs (the cost objective or a cost limit): the seeds get
        ``seeds.PRICED_SEED_SHARE`` of the target."""
        return self.objective is not None and self.objective.needs_prices

    def _score(self, est) -> float:
        """Lower is better: iteration time, or the objective's score (USD per token with ``cost``)."""
        return self.objective.score(est) if self.objective is not None else est.iteration_time_s

    def _polish(self, pricer: Pricer, polished: list, cost_model: CostModel, until: float,
                run: Deadline) -> list:
        """Stage boundaries of the three fastest plans so far, moved while ``until`` lasts; the polished
        plans found are added to ``polished``."""
        if not self._polishes:
            return polished
        top = sorted((r for r in pricer.results() + polished if _plain_split(r[0])),  # v1 splits only
                     key=lambda r: -r[1].tokens_per_s)[:3]
        sub = run.child(max(0.05, until - run.elapsed))
        for plan, est in top:
            better = polish_splits(plan, est, cost_model, deadline=sub)
            if better[0] is not plan:
                polished = polished + [better]
        return polished

    def _polish_final(self, results: list, cost_model: CostModel, until: Deadline) -> list:
        """The best plan by the planner's score with its stage boundaries moved while ``until`` lasts (the layer
        splits balance compute; with the gradient reduction overlapped, the stage whose backward ends last
        also sets the exposed reduction, which a smaller first stage shrinks), keeping the runtime's rules:
        the polished plan, if faster."""
        best = min(results, key=lambda r: self._score(r[1]), default=None)
        if best is None or not _contiguous(best[0]) or all(len(p.stages) < 2 for p in best[0].pipelines):
            return []
        rules, cluster = self.legality, cost_model.cluster
        ok = None if rules is None else lambda p: not rules.errors(p, cluster)
        better = polish_splits(*best, cost_model, deadline=until, ok=ok)
        # then each other GPU type leading the pipelines (its stages as they are; what runs the embedding and the
        # output layer moves the slowest stage), polished on a clock of its own as long as the first polish's where
        # it prices within TYPE_LED_SLACK of the plan (a lead that pays once the boundaries follow it)
        for cand in type_led(best[0], lambda d: cluster.devices[d].gpu.name):
            if until.cap is not None and until.cap.expired():
                break
            if ok is not None and not ok(cand):
                continue
            e = cost_model.estimate(cand, validate=False)
            if e.fits and e.iteration_time_s < best[1].iteration_time_s * (1 + TYPE_LED_SLACK):
                led = polish_splits(cand, e, cost_model, deadline=Deadline(until.seconds, until.clock, until.cap),
                                    ok=ok)
                if led[1].iteration_time_s < better[1].iteration_time_s * (1 - 1e-6):
                    better = led
        return [better] if better[0] is not best[0] else []

    def _extend(self, ctx: PlanningContext, pricer: Pricer, screened: list, until: Deadline,
                lead: list[State], unscreened: list[State] = ()) -> None:
        """Time beyond the base pass: the lead templates (when the base pass left them out) and the
        rest of the screened templates priced in full (best screened first); then the ranked pool past what
        the base pass screened, screened in the ranker's order and the best of it priced (on a large cluster
        the base pass screens only the first few of hundreds:
        ``test_a_longer_target_screens_the_ranked_pool_past_the_default_pass``); a wider priced teacher; then
        refinement from each of the three best templates."""
        o = self.options
        share = until.child(until.remaining * 0.4)
        for st in [] if o.search.lead_first else lead:
            pricer.price_state(st)
        for v, st in screened:
            if v <= 0 or share.expired():
                break
            pricer.price_state(st)
        more = until.child(until.remaining * 0.25)
        found = []
        for st in unscreened:
            if more.expired():
                break
            found.append((pricer.screen_state(st), st))
        best = pricer.best()
        bar = best[2].tokens_per_s if best is not None else 0.0
        for v, st in sorted(found, key=lambda x: -x[0])[:4]:
            if v > 0.97 * bar and not until.expired():
                pricer.price_state(st)
        teacher_search(ctx, pricer, o.search.teacher_beam + 1, until.child(until.remaining * 0.4))
        tops = sorted(((v, st) for st, v in pricer.visited.items() if v > 0), key=lambda x: -x[0])
        starts: list[State] = []
        for _, st in tops:
            if st.template() not in {s.template() for s in starts}:
                starts.append(st)
            if len(starts) == 3:
                break
        for i, st in enumerate(starts):
            if until.expired():
                break
            refine(ctx, pricer, st, until.child(until.remaining / (len(starts) - i)), regroup=True)


def with_second(result: PlannerResult, second: PlannerResult | None, cpu_s: float, error: str | None) -> PlannerResult:
    """``result`` with the second search's plans merged in by score (the first's first among equals), and
    ``notes["second_look"]``: its best score, whether it won, its work and CPU seconds, or its error."""
    note: dict[str, Any] = {"cpu_s": round(cpu_s, 3)}
    result.stats.notes["second_look"] = note
    if second is None:
        note["error"] = error
        return result
    first = result.scores[0] if result.scores else float("inf")
    note.update(best=second.scores[0] if second.scores else None, work_s=second.stats.notes.get("work_s"),
                won=bool(second.scores) and second.scores[0] < first)
    ranked = sorted(list(zip(result.scores, result.plans)) + list(zip(second.scores, second.plans)),
                    key=lambda x: x[0])
    result.stats.candidates += second.stats.candidates
    result.stats.timed_out = result.stats.timed_out or second.stats.timed_out
    return PlannerResult([p for _, p in ranked], [t for t, _ in ranked], result.stats)


def _next_starts(pricer: Pricer, skip: set, k: int) -> list[State]:
    """The ``k`` fastest priced decision sequences after those in ``skip``, one per template."""
    out, seen = [], set(skip)
    for st, _ in sorted(((st, v) for st, v in pricer.visited.items() if v > 0), key=lambda x: -x[1]):
        tpl = st.template()
        if tpl not in seen:
            seen.add(tpl)
            out.append(st)
            if len(out) == k:
                break
    return out


def random_states(ctx: PlanningContext, k: int, seed: int) -> list[State]:
    """``k`` uniformly random decision sequences (valid by construction): the ablation baseline."""
    import random

    from arachne.planners.arachne.actions import class_actions, mix_replica_options

    rng = random.Random(seed)
    out = []
    for _ in range(k * 4):
        st = State(rng.choice(mix_replica_options(ctx.classes)))
        for c in ctx.classes:
            st = st.push(rng.choice(class_actions(st, ctx.model, c)))
        if not st.is_empty():
            out.append(st)
        if len(out) >= k:
            break
    return out
