"""The arachne planner: the policy proposes templates, rules complete them, the cost model prices them."""

from __future__ import annotations

import time
from dataclasses import asdict
from itertools import zip_longest

from arachne.cost import CostModel
from arachne.planners.arachne.actions import State
from arachne.planners.arachne.completion.polish import polish_splits
from arachne.planners.arachne.context import GROUP_WITHIN, PlanningContext
from arachne.planners.arachne.learned.features import FeatureBuilder
from arachne.planners.arachne.learned.policy import Policy, shipped_policy
from arachne.planners.arachne.learned.ranker import (
    RankerEnsemble,
    rank_states,
    ranked_pool,
    shipped_ranker,
)
from arachne.planners.arachne.search.beams import policy_search, teacher_search
from arachne.planners.arachne.search.pricer import Pricer
from arachne.planners.arachne.search.refine import refine
from arachne.planners.arachne.search.rules import rule_pool
from arachne.planners.arachne.template import has_odd_nodes
from arachne.planners.arachne.work_clock import WorkClock
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

BASE_TARGET_S = 0.8  # the default latency target, s (of work: see arachne.planners.arachne.work_clock)
WALL_GUARD = 4.0  # the run stops at this many times its target on the wall clock, whatever the work clock says


class ArachnePlanner:
    """Top-k templates from the learned policy plus rule-based floor templates, ordered for screening
    by the learned ranker, completed and priced, then a short priced local refinement of the best one.

    ``mode``: "policy" (default; falls back to "teacher" when no checkpoint is shipped), "teacher"
    (priced beam search: the offline teacher), "floor" (rule-based templates only), "random"
    (``k`` random valid templates; the learning ablation)."""

    name = "arachne"

    def __init__(self, k: int = 24, mode: str = "policy", floor_actions: int = 0, teacher_beam: int = 2,
                 policy: Policy | None = None, use_refine: bool = True, use_floor: bool = True,
                 use_polish: bool = True, target_s: float = BASE_TARGET_S, polish_share: float = 0.15,
                 teacher_share: float = 0.5, phase1_share: float = 0.6, screen_share: float = 0.5,
                 policy_share: float = 0.2, min_screened: int = 8, floor_k: int = 0,
                 ranker: Policy | RankerEnsemble | None = None, use_ranker: bool = True, rank_k: int = 0,
                 clock: str = "work", balance_sends: bool = True, more_starts: int = 2, depth_rule: bool = True,
                 parts_share: float = 0.001, parts_max_gpus: int = 512, whole_min_share: float = 0.5,
                 lead_first: bool = False, group_sizes: bool = True, group_within: float = GROUP_WITHIN,
                 by_value_prefixes: bool = True, wide_small_batch: bool = True,
                 type_pools: bool = True, proxy_first: int = 1):
        self.k, self.mode = k, mode
        self.floor_actions, self.teacher_beam = floor_actions, teacher_beam
        self.policy = policy
        self.use_refine = use_refine
        self.use_floor = use_floor
        self.use_polish = use_polish and mode != "random"  # the ablation's random mode is left unpolished
        self.target_s = target_s  # the whole run aims to end by then (or by the budget, if sooner)
        self.polish_share = polish_share  # of the target, kept for moving stage boundaries at the end
        self.teacher_share = teacher_share  # of the spare time, for the priced teacher (the rest: refine)
        self.phase1_share = phase1_share  # of the target, for pricing the proposals (large clusters)
        self.screen_share = screen_share  # of the target, for screening them (a cheap first look)
        self.policy_share = policy_share  # of the target, for the policy's beam search
        self.min_screened = min_screened  # proposals screened even when the target is spent
        self.floor_k = floor_k  # "floor" mode: only the first k rule templates (0: all)
        self.ranker, self.use_ranker = ranker, use_ranker  # the learned screening order (default: shipped)
        self.rank_k = rank_k  # the ablation's learned arm: only the ranker's first k templates, nothing else
        if clock not in ("work", "wall"):
            raise ValueError(f"clock must be 'work' or 'wall', not {clock!r}")
        self.clock = clock  # "work": the target counts work done (same plan under any load); "wall": seconds
        self.balance_sends = balance_sends  # layer splits balance blocking sends too (see completion.split_layers)
        self.more_starts = more_starts  # further refinement starts when time is left (path dependence)
        self.depth_rule = depth_rule  # each class alone at the depths a quick guess rates best (depth_states)
        self.parts_share = parts_share  # of the target, odd-sized nodes by parts (0: whole nodes only, 1: parts)
        self.parts_max_gpus = parts_max_gpus  # ... on clusters of at most this many GPUs (above: whole nodes)
        self.whole_min_share = whole_min_share  # of the target, for whole nodes after the pass by parts, at least
        # the rule pool's lead (all classes at their joint depths) screened first in the default pass; off, it
        # is priced first in a longer target's extension (in the default pass it cost more than it found)
        self.lead_first = lead_first
        self.group_sizes = group_sizes  # a group of pipelines may take its own micro-batch size
        self.group_within = group_within  # ... on templates priced within this share of the best so far
        self.by_value_prefixes = by_value_prefixes  # the floor's fastest j classes also ranked by value alone
        self.wide_small_batch = wide_small_batch  # one-stage slots across nodes for a batch smaller than a class
        self.type_pools = type_pools  # pipelines over a GPU type pooled across its node sizes
        self.proxy_first = proxy_first  # mixed rules the throughput proxy rates best, screened first

    def plan(self, cluster: Cluster, model: ModelSpec, job: Job, cost_model: CostModel,
             budget: SearchBudget) -> PlannerResult:
        deadline = budget.deadline()  # the caller's budget, on the wall clock
        if not has_odd_nodes(cluster) or not 0 < self.parts_share < 1:
            return self._plan(cluster, model, job, cost_model, budget, deadline, self.parts_share > 0, 1.0)
        if len(cluster.devices) > self.parts_max_gpus:  # a large cluster's search needs all of the target
            return self._plan(cluster, model, job, cost_model, budget, deadline, False, 1.0)
        # nodes of 3, 6 or 7 GPUs: first a quick pass (its floor, screens and first prices; no refinement) over
        # their power-of-two parts as classes (tp 2 and 4 fit a node of 7), then the search over whole nodes (a
        # stage of dp 6, fewer classes for mixed pipelines) with the rest of the target; the faster plan wins
        parts = self._plan(cluster, model, job, cost_model, budget, deadline, True, self.parts_share, fallback=False)
        rest = max(self.whole_min_share, 1 - parts.stats.notes.get("work_s", 0.0) / self.target_s)
        whole = self._plan(cluster, model, job, cost_model, budget, deadline, False, rest, fallback=not parts.plans)
        if not parts.plans and not whole.plans:  # nothing fits whole nodes: every part template, while time lasts
            parts = self._plan(cluster, model, job, cost_model, budget, deadline, True, 1.0)
        stats = parts.stats
        stats.candidates += whole.stats.candidates
        stats.timed_out = stats.timed_out or whole.stats.timed_out
        stats.notes["work_s"] = round(stats.notes.get("work_s", 0.0) + whole.stats.notes.get("work_s", 0.0), 3)
        stats.notes["node_views"] = {name: r.scores[0] if r.scores else None
                                     for name, r in (("parts", parts), ("whole", whole))}
        ranked = sorted(zip(parts.scores + whole.scores, parts.plans + whole.plans), key=lambda x: x[0])
        ranked = ranked[: max(1, budget.top_k)]
        return PlannerResult([p for _, p in ranked], [t for t, _ in ranked], stats)

    def _plan(self, cluster: Cluster, model: ModelSpec, job: Job, cost_model: CostModel, budget: SearchBudget,
              deadline: Deadline, parts: bool, share: float, fallback: bool = True) -> PlannerResult:
        """One search over the cluster's classes (``parts``: odd nodes by parts) with ``share`` of the target;
        ``fallback``: where nothing fits, the priced teacher and then every template while the budget lasts."""
        full_target = min(self.target_s * share, deadline.remaining)
        # a target beyond the default runs the default pass first and spends the rest improving on it, so
        # more time does not change (and lose) what the default would have found
        base = BASE_TARGET_S * share
        extend = self.mode == "policy" and self.use_floor and not self.rank_k and full_target > base
        target = base if extend else full_target
        polish_at = target * (1 - self.polish_share) if self.use_polish else target
        ctx = PlanningContext(cluster, model, job, cost_model, balance_sends=self.balance_sends, node_parts=parts,
                              group_sizes=self.group_sizes, group_within=self.group_within,
                              by_value_prefixes=self.by_value_prefixes, wide_small_batch=self.wide_small_batch,
                              type_pools=self.type_pools)
        pricer = Pricer(ctx)
        stats = SearchStats()
        # the latency target runs on the work clock; the wall clock only guards against a machine many
        # times slower than the one the work rates were fitted on
        guard = Deadline(min(deadline.remaining, WALL_GUARD * full_target + 1.0))
        work = WorkClock(ctx.work, cost_model)
        run = Deadline(full_target, work if self.clock == "work" else time.perf_counter, guard)
        policy = self.policy or (shipped_policy() if self.mode == "policy" else None)
        mode = self.mode if (self.mode != "policy" or policy is not None) else "teacher"
        stats.notes["mode"] = mode
        with progress_bar(budget.progress, "arachne: pricing templates") as advance:
            # phase 1, within its share of the target: the floor's homogeneous and all-classes templates,
            # then the policy's proposals interleaved with the mixed-pipeline rules
            phase1 = run.child(target * self.phase1_share - run.elapsed)
            proposed: list[State] = []
            feats = FeatureBuilder(ctx)
            if mode == "policy":  # beams narrow to one action each once their share of the target is spent
                proposed = policy_search(ctx, policy, self.k, feats, run.child(target * self.policy_share))
            elif mode == "random":
                proposed = random_states(ctx, self.k, budget.seed)
            core: list[State] = []
            mixed: list[State] = []
            lead: list[State] = []
            pools: list[State] = []
            if mode in ("floor", "teacher") or (mode == "policy" and self.use_floor):
                depth = self.depth_rule and mode == "policy" and not self.rank_k
                core, mixed, lead, pools = rule_pool(ctx, pricer, deadline, self.floor_actions, depth)
                if mode == "floor" and self.floor_k:  # the ablation's equal-size rule arm: the first k rules
                    core, mixed = core[: self.floor_k], mixed[: max(0, self.floor_k - len(core))]
            if mode == "teacher":
                teacher_search(ctx, pricer, self.teacher_beam, deadline, advance)
            timed = mode == "policy" and self.use_floor  # the shipped configuration keeps to its latency target
            # past the budget, pricing goes on only until one plan fits (a plan beats a timeout), and
            # never past twice the budget
            hard = Deadline(max(0.0, 2 * deadline.seconds - deadline.elapsed))

            def stop(soft: Deadline | None = None) -> bool:
                if hard.expired():
                    return True
                return ctx.found_fit and (deadline.expired() or (timed and soft is not None and soft.expired()))

            for st in core:
                if stop():
                    break
                pricer.price_state(st)
                advance(1)
            # the rest is screened first (cheap), in the learned ranker's order (without one: proposals and
            # rules interleaved), then the most promising are priced in full
            ranker = (self.ranker or shipped_ranker()) if self.use_ranker and mode == "policy" else None
            if ranker is not None:
                rest = rank_states(ctx, ranker, *ranked_pool(proposed, mixed), feats)
                stats.notes["ranked"] = len(rest)
                if self.rank_k:
                    core, rest = [], rest[: self.rank_k]
                elif self.proxy_first and mixed:
                    # the mixed rule the throughput proxy rates best goes first: on large clusters only the
                    # ranker's first few get screened (seed35/rob-021: 8 of 348, the proxy's first at 0.995x
                    # Sailor where the plan was at 0.983x)
                    top = mixed[: self.proxy_first]
                    rest = top + [st for st in rest if st not in top]
            else:
                rest = [st for pair in zip_longest(proposed, mixed) for st in pair if st is not None]
            screen_until = run.child(target * self.screen_share - run.elapsed)
            screened = []
            for i, st in enumerate((lead if self.lead_first else []) + rest):
                if stop(screen_until if i >= self.min_screened else None):
                    break
                screened.append((pricer.screen_state(st), st))
                advance(1)
            screened.sort(key=lambda x: -x[0])
            for i, (v, st) in enumerate(screened):
                if v <= 0 or stop(phase1 if i >= 2 else None):
                    break
                pricer.price_state(st)
            stats.notes["screened"] = len(screened)
            stats.timed_out = deadline.expired()
            best = pricer.best()
            if best is None and mode != "random" and fallback and not deadline.expired():
                # memory is tight: the priced teacher, then the whole template space, while the budget lasts
                teacher_search(ctx, pricer, self.teacher_beam, deadline)
                best = pricer.best()
                if best is None:
                    from arachne.planners.arachne.oracle import all_states

                    for st in all_states(ctx):
                        if deadline.expired() or pricer.price_state(st) > 0:
                            break
                    best = pricer.best()
            elif best is not None and mode == "policy" and self.use_floor and not self.rank_k:
                # the priced teacher as a safety net, for a share of what the latency target leaves
                spare = polish_at - run.elapsed
                if spare > 0.05:
                    teacher_search(ctx, pricer, self.teacher_beam, run.child(spare * self.teacher_share))
                    best = pricer.best()
            if best is not None and self.use_refine and mode != "random":
                start = pricer.states.get(best[0])
                if start is not None:
                    end = refine(ctx, pricer, start, run.child(polish_at - run.elapsed))
                    # time left once refinement converges: refine from the next best distinct templates
                    for st in _next_starts(pricer, {start.template(), end.template()}, self.more_starts):
                        if polish_at - run.elapsed <= 0.02:
                            break
                        refine(ctx, pricer, st, run.child(polish_at - run.elapsed))
            for st in pools:  # a GPU type pooled across its node sizes: candidates after refinement
                if stop(run.child(target - run.elapsed)):
                    break
                pricer.price_state(st)
            polished = self._polish(pricer, [], cost_model, target, run)
            if extend and pricer.best() is not None:
                stats.notes["extended_s"] = round(full_target - run.elapsed, 3)
                end = full_target * (1 - self.polish_share) if self.use_polish else full_target
                seen = {id(st) for _, st in screened}
                self._extend(ctx, pricer, screened, run.child(end - run.elapsed), lead,
                             [st for st in rest if id(st) not in seen])
                polished = self._polish(pricer, polished, cost_model, full_target, run)
        ranked = sorted(pricer.results() + polished,  # distinct plans, fastest first
                        key=lambda r: -r[1].tokens_per_s)[: max(1, budget.top_k)]
        stats.candidates = len(pricer.cache) + len(pricer.screened)
        if ctx.closest_unfit is not None:
            stats.notes["closest_unfit"] = ctx.closest_unfit[1]
        stats.timed_out = stats.timed_out or deadline.expired()
        stats.notes["clock"] = self.clock
        stats.notes["work_s"] = round(work(), 3)
        stats.notes["work"] = asdict(work.tally())
        return PlannerResult([r[0] for r in ranked], [r[1].iteration_time_s for r in ranked], stats)

    def _polish(self, pricer: Pricer, polished: list, cost_model: CostModel, until: float,
                run: Deadline) -> list:
        """Stage boundaries of the three fastest plans so far, moved while ``until`` lasts; the polished
        plans found are added to ``polished``."""
        if not self.use_polish:
            return polished
        top = sorted(pricer.results() + polished, key=lambda r: -r[1].tokens_per_s)[:3]
        sub = run.child(max(0.05, until - run.elapsed))
        for plan, est in top:
            better = polish_splits(plan, est, cost_model, deadline=sub)
            if better[0] is not plan:
                polished = polished + [better]
        return polished

    def _extend(self, ctx: PlanningContext, pricer: Pricer, screened: list, until: Deadline,
                lead: list[State], unscreened: list[State] = ()) -> None:
        """Time beyond the default target: the lead templates (when the default pass left them out) and the
        rest of the screened templates priced in full (best screened first); then the ranked pool past what
        the default pass screened, screened in the ranker's order and the best of it priced (on 1010 GPUs the
        default pass screens 8 of 348, and the best mixed rule sat 18th: seed35/rob-021, +18%); a wider
        priced teacher; then refinement from each of the three best templates."""
        share = until.child(until.remaining * 0.4)
        for st in [] if self.lead_first else lead:
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
        teacher_search(ctx, pricer, self.teacher_beam + 1, until.child(until.remaining * 0.4))
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
