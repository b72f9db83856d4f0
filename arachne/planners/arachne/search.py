"""Searching templates: the priced teacher (beam search over decisions), the policy's beam
search (no pricing), rule-based floor templates, and a priced local refinement."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import zip_longest
from typing import NamedTuple

import numpy as np

from arachne.cost import Estimate
from arachne.cost.compute import act_bytes
from arachne.cost.memory import state_bytes_per_param
from arachne.plan import Plan
from arachne.planners.arachne.actions import (
    DP_CHOICES,
    STAGE_COUNTS,
    Action,
    State,
    class_actions,
    kin_left,
    mix_replica_options,
    replica_variants,
    slot_options,
    type_fills,
)
from arachne.planners.arachne.features import FeatureBuilder
from arachne.planners.arachne.policy import Policy
from arachne.planners.arachne.template import (
    DeviceClass,
    Template,
    ep_options,
    pool_classes,
    slot_fits_nodes,
    tp_options,
)
from arachne.planners.base import Deadline
from arachne.planners.completion import PlanningContext, price_template, split_layers
from arachne.spec.model import ModelSpec


@dataclass
class Pricer:
    """Prices templates through completion, once each."""

    ctx: PlanningContext
    max_priced: int | None = 2  # candidates priced per template (None: every micro-batch size)
    cache: dict[Template, tuple[Plan, Estimate] | None] = field(default_factory=dict)
    states: dict[Template, State] = field(default_factory=dict)
    visited: dict[State, float] = field(default_factory=dict)  # every decision sequence priced
    screened: dict[Template, tuple[Plan, Estimate] | None] = field(default_factory=dict)

    def price_state(self, st: State) -> float:
        tpl = st.template()
        self.states.setdefault(tpl, st)
        v = self.visited[st] = self.throughput(tpl)
        return v

    def __call__(self, tpl: Template) -> tuple[Plan, Estimate] | None:
        if not tpl.groups:
            return None
        if tpl not in self.cache:
            self.cache[tpl] = (price_template(tpl, self.ctx, max_priced=self.max_priced)
                               if tpl.fits_counts(self.ctx.classes) else None)
        return self.cache[tpl]

    def throughput(self, tpl: Template) -> float:
        r = self(tpl)
        return r[1].tokens_per_s if r else 0.0

    def screen_state(self, st: State) -> float:
        """A cheap lower bound of :meth:`price_state` (see ``price_template(screen=True)``); the screened
        plan is a real priced plan and stays a candidate."""
        tpl = st.template()
        self.states.setdefault(tpl, st)
        if tpl in self.cache:
            r = self.cache[tpl]
        else:
            if tpl not in self.screened:
                self.screened[tpl] = (price_template(tpl, self.ctx, screen=True)
                                      if tpl.groups and tpl.fits_counts(self.ctx.classes) else None)
            r = self.screened[tpl]
        return r[1].tokens_per_s if r else 0.0

    def results(self) -> list[tuple[Plan, Estimate]]:
        """Every distinct priced plan (fully priced, or screened and not priced in full since)."""
        out, seen = [], set()
        for _, r in (*self.cache.items(), *((t, r) for t, r in self.screened.items() if t not in self.cache)):
            if r is None:
                continue
            key = (r[1].iteration_time_s, r[0].micro_batch_size, len(r[0].pipelines))  # equal plans price equally
            if key not in seen:
                seen.add(key)
                out.append(r)
        return out

    def best(self) -> tuple[Template, Plan, Estimate] | None:
        items = [(t, r) for t, r in (*self.screened.items(), *self.cache.items()) if r is not None]
        if not items:
            return None
        t, (p, e) = max(items, key=lambda x: x[1][1].tokens_per_s)
        return t, p, e


@dataclass
class Decision:
    """One priced step of the teacher: the state, its valid actions and each action's throughput."""

    state: State
    actions: list[Action]
    values: list[float]


def teacher_search(ctx: PlanningContext, pricer: Pricer, beam: int = 4, deadline: Deadline | None = None,
                   progress=None) -> list[Decision]:
    """Beam search over decisions where every partial template is completed and priced."""
    classes, model = ctx.classes, ctx.model
    decisions: list[Decision] = []
    beams = [State(r) for r in mix_replica_options(classes)]
    root_vals = []
    for st in beams:  # decision 0 is priced by the best single-step continuation below
        root_vals.append(0.0)
    for ci in range(len(classes)):
        cand: list[tuple[float, State]] = []
        for st in beams:
            acts = class_actions(st, model, classes[ci])
            vals = []
            for a in acts:
                if deadline is not None and deadline.expired():
                    break
                new = st.push(a)
                v = pricer.price_state(new)
                vals.append(v)
                cand.append((v, new))
                if progress:
                    progress(1)
            decisions.append(Decision(st, acts[: len(vals)], vals))
        cand.sort(key=lambda x: -x[0])
        seen, beams = set(), []
        for v, st in cand:
            key = st.template()
            if key in seen and st.actions[-1].kind == "skip":
                continue
            seen.add(key)
            beams.append(st)
            if len(beams) >= beam:
                break
        if not beams or (deadline is not None and deadline.expired()):
            break
    return decisions


def policy_search(ctx: PlanningContext, policy: Policy, k: int = 24, feats: FeatureBuilder | None = None,
                  deadline: Deadline | None = None) -> list[State]:
    """Beam search on the policy's log-probabilities: the top-k complete decision sequences
    (when the deadline passes, the beams are completed with the policy's single best action)."""
    feats = feats or FeatureBuilder(ctx)
    classes, model = ctx.classes, ctx.model
    roots = mix_replica_options(classes)
    beams: list[tuple[float, State]] = [(0.0, State(r)) for r in roots]
    # a template whose GPUs cannot hold one copy of the model state never fits: such beams are dropped
    # (when some beam can still fit), so a memory-tight problem does not spend its proposals on them
    later = [sum(c.gpu.memory_bytes * c.count for c in classes[i:]) for i in range(len(classes) + 1)]
    for ci in range(len(classes)):
        cand: list[tuple[float, State]] = []
        width = 1 if deadline is not None and deadline.expired() else k
        for lp, st in beams:
            acts = class_actions(st, model, classes[ci], pool=policy.pooled_actions)
            ctx.work.policy_calls += 1
            ctx.work.policy_rows += len(acts)
            logits = policy.logits(feats.batch(st, acts))
            logp = logits - np.logaddexp.reduce(logits)
            order = np.argsort(-logp)[: width]
            cand.extend((lp + float(logp[i]), st.push(acts[i])) for i in order)
        cand.sort(key=lambda x: -x[0])
        viable = [c for c in cand if may_fit(ctx, c[1], later[ci + 1])]
        beams = (viable or cand)[: k]
    return [st for _, st in beams]


def may_fit(ctx: PlanningContext, st: State, spare: float = 0.0) -> bool:
    """A necessary condition for a (partial) template to fit, with ``spare`` bytes of GPUs still to be
    decided: its GPUs hold one copy of the model state, and every pipeline holds the weights and
    gradients of all layers (ZeRO-1 shards only the optimizer state)."""
    w, g, o = state_bytes_per_param(ctx.job.precision, ctx.cost_model.cal.memory)
    params = ctx.model.num_params
    total, mix = 0.0, 0.0
    for ci, a in enumerate(st.actions):
        if a.kind == "skip":
            continue
        per_replica = a.stages * a.tp * a.dp * ctx.classes[ci].gpu.memory_bytes
        total += a.replicas * per_replica
        if a.kind == "own" and per_replica < params * (w + g):
            return False
        if a.kind == "mix":
            mix += per_replica
    if st.mix_replicas and any(a.kind == "mix" for a in st.actions):
        if mix + spare / st.mix_replicas < params * (w + g):
            return False
    return total + spare >= params * (w + g + o)


def floor_states(ctx: PlanningContext, pricer: Pricer, deadline: Deadline | None = None,
                 max_actions: int = 0, price: bool = True,
                 pools_out: list[State] | None = None) -> tuple[list[State], list[State]]:
    """Rule-based templates, as (core, mixed), and into ``pools_out`` (if given) the type pools
    (:func:`type_pool_states`). Per class the fewest stages that fit at tp 1 and at the
    largest in-node tp (priced alone; the better one is the class's homogeneous choice); the core is
    then all classes together (heterogeneous data parallelism), the fastest j classes together (a
    small batch is often trained faster without the slowest GPUs), the 2 and 3 classes that do best
    alone, and each class alone; mixed
    pipelines by rule follow. With ``price`` all are priced too (while the deadline lasts)."""
    classes, model = ctx.classes, ctx.model
    best_own: list[Action] = []
    own_v: list[float] = []
    for ci, c in enumerate(classes):
        prefix = State(0, tuple(Action("skip") for _ in range(ci)))
        cands = rule_own_actions(ctx, ci)
        if max_actions:
            extra = [a for a in class_actions(prefix, model, c) if a.kind == "own"]
            cands += _thin(extra, max_actions)
        top, top_v = Action("skip"), 0.0
        for a in cands:
            if deadline is not None and deadline.expired() and (top_v > 0 or ctx.found_fit):
                break
            v = (pricer.price_state if price else pricer.screen_state)(prefix.push(a))
            if v > top_v:
                top, top_v = a, v
        best_own.append(top)
        own_v.append(top_v)
    n = len(classes)
    skips = tuple(Action("skip") for _ in range(n))
    core = [State(0, tuple(best_own))]
    core += [State(0, tuple(best_own[:j]) + skips[j:]) for j in range(n - 1, 1, -1)]
    if ctx.by_value_prefixes:
        # the same with the classes ranked by what each does alone (a fast type on a slow network or in
        # small nodes ranks below the next type): e.g. the A100s and A800s without the L40S pairs
        ranked = sorted(range(n), key=lambda ci: -own_v[ci])
        for j in range(min(n - 1, 3), 1, -1):
            keep = set(ranked[:j])
            core.append(State(0, tuple(a if ci in keep else Action("skip") for ci, a in enumerate(best_own))))
    core += [State(0, skips[:ci] + (best_own[ci],) + skips[ci + 1:]) for ci in range(n)]
    if ctx.type_pools and pools_out is not None:
        pools_out.extend(type_pool_states(ctx, best_own))
    core = list(dict.fromkeys(st for st in core if not st.is_empty()))
    deeper = deeper_states(ctx, best_own)
    if not price:
        return core, mixed_floor_states(ctx) + deeper
    for st in core:
        if deadline is not None and deadline.expired():
            break
        pricer.price_state(st)
    mixed = mixed_floor_states(ctx) + deeper
    for st in mixed:
        if deadline is not None and deadline.expired():
            break
        pricer.price_state(st)
    return core, mixed


TYPE_POOL_DEPTHS = 2  # pipeline depths per (GPU type, tp) of a type pooled across its classes


def type_pool_states(ctx: PlanningContext, best_own: list[Action]) -> list[State]:
    """A GPU type split across node sizes (or node parts) as one pool: ``R`` identical pipelines of ``S``
    pooled stages, at the depths (2 to 4, or up to twice the fewest that fit) that leave the fewest of its
    GPUs idle, alone and beside every other type's homogeneous choice. Per class, 15 B200 in a node of 8
    and a node of 7 (parts 4, 2, 1) make at most 3 pipelines of 3 or data parallelism; as a pool they make
    5 pipelines of 3, which shards the gradient all-reduce 3 ways over all 15 (odd114/rob-010: +5.7%).
    The planner prices them after refinement: priced first, a pool that beats the other templates became
    refinement's start and led it away from better mixed plans (odd103/rob-013: -25%), and screened
    first they took the screening's time on large clusters."""
    classes, model = ctx.classes, ctx.model
    L, n = model.num_layers, len(classes)
    out: list[State] = []
    for c in classes:
        if len(c.kin) < 2 or c.index != c.kin[0][0]:
            continue
        kin = {j for j, _, _ in c.kin}
        for tp in sorted({tp_options(model, c.node_size)[0], tp_options(model, c.node_size)[-1]}):
            pool = [j for j in pool_classes(c, tp) if classes[j].node_size >= tp]
            total = c.count + sum(classes[j].count for j in pool)
            if not pool or total < 2 * tp:
                continue

            def fits(S: int) -> bool:
                reps = total // (S * tp)
                prof = ctx.slot_profile(c.index, tp, 1, 1, 1, S, max(1, reps), False)
                return split_layers([prof] * S, L, max(1, ctx.job.global_batch_size // max(1, reps)),
                                    ctx.work) is not None

            least = next((S for S in STAGE_COUNTS if S <= L and S * tp <= total and fits(S)), None)
            if least is None:
                continue
            depths = [S for S in STAGE_COUNTS if max(2, least) <= S <= min(L, max(4, 2 * least))
                      and total // (S * tp) >= 2 and (S == least or fits(S))]
            depths = sorted(depths, key=lambda S: (-(total // (S * tp)) * S, S))[:TYPE_POOL_DEPTHS]
            for S in depths:
                R = total // (S * tp)
                if R * S * tp <= c.count:
                    continue  # the class alone holds it: its own actions cover this
                mix = Action("mix", tp, 1, 1, S, R, pool=True)
                alone = tuple(mix if i == c.index else Action("skip") for i in range(n))
                out.append(State(R, alone))
                beside = tuple(mix if i == c.index else Action("skip") if i in kin else best_own[i]
                               for i in range(n))
                if beside != alone:
                    out.append(State(R, beside))
    return out


def deeper_states(ctx: PlanningContext, best_own: list[Action]) -> list[State]:
    """Each class alone in pipelines 2x and 4x deeper than its homogeneous choice (fewer replicas, less
    gradient traffic over its network), at the most replicas and at an even share of the batch."""
    n, L, gbs = len(ctx.classes), ctx.model.num_layers, ctx.job.global_batch_size
    skips = tuple(Action("skip") for _ in range(n))
    out = []
    for ci, (c, a) in enumerate(zip(ctx.classes, best_own)):
        if a.kind != "own":
            continue
        g = a.tp * a.dp
        for S in (2 * a.stages, 4 * a.stages):
            if S > L or c.count // (S * g) < 2:
                break
            deep = Action("own", a.tp, a.dp, a.ep, S, c.count // (S * g))
            for v in (deep, *replica_variants(deep, c, gbs)):
                out.append(State(0, skips[:ci] + (v,) + skips[ci + 1:]))
    return out


def depth_actions(ctx: PlanningContext, ci: int, per_class: int = 2, shortlist: int = 4, gbs: int = 0,
                  zero_extra: int = 0) -> list[Action]:
    """Homogeneous pipelines of class ``ci`` (tp 1 or the largest in-node tp) at the ``per_class`` depths a
    quick guess rates fastest: micro-batches at the slowest stage's time, the fill at the mean, plus the
    gradient all-reduce of a stage's share of the weights over the replicas. A small batch on many GPUs
    with a slow network trains fastest between the fewest stages that fit (every weight all-reduced) and
    the deepest (bubbles). Every depth is guessed with whole layers per stage; the ``shortlist`` best
    per tp are split properly (the embedding and head make 16 stages of 32 layers uneven). ``gbs``: the
    class's share of the batch (default all of it); ``zero_extra``: replicas elsewhere that shard the
    optimizer state with this class's."""
    c, model = ctx.classes[ci], ctx.model
    gbs = gbs or ctx.job.global_batch_size
    L, k = model.num_layers, c.node_size
    net = ctx.cost_model.network
    grad_b = 4.0 if ctx.job.precision == "fp32" else 2.0
    tps = tp_options(model, k)
    ep = ep_options(model, 1)[-1]
    scored = []
    for tp in sorted({tps[0], tps[-1]}):
        def split(S: int) -> float | None:
            reps = c.count // (S * tp)
            prof = ctx.slot_profile(ci, tp, 1, ep, 1, S, max(1, reps) + zero_extra, False)
            r = split_layers([prof] * S, L, max(1, gbs // max(1, reps)), ctx.work)
            return None if r is None else r[1]

        least = next((S for S in STAGE_COUNTS if S <= L and S * tp <= c.count and split(S) is not None), None)
        if least is None:
            continue
        prof = ctx.slot_profile(ci, tp, 1, ep, 1, 2, 1, False)
        total, per_layer = prof.time(0, L, True, True), prof.time(0, L, False, False) / L

        def guess(S: int, slowest: float) -> float:
            reps = min(c.count // (S * tp), gbs)
            per_node = max(1, k // (S * tp))
            nodes = {n: per_node for n in c.nodes[: -(-reps // per_node)]}
            sync = net.ring_all_reduce_time(reps, nodes, model.num_params / (S * tp) * grad_b, min(k, S * tp))
            return -(-gbs // reps) * slowest + (S - 1) * total / S + sync

        rough = sorted((guess(S, max(total / S, -(-L // S) * per_layer)), S)
                       for S in range(least, min(L, c.count // tp) + 1))
        for _, S in rough[:shortlist]:
            slowest = split(S)
            if slowest is not None:
                scored.append((guess(S, slowest), S, tp))
    return [Action("own", tp, 1, ep, S, c.count // (S * tp)) for _, S, tp in sorted(scored)[:per_class]]


def depth_states(ctx: PlanningContext, per_class: int = 2) -> list[State]:
    """Each class alone at its :func:`depth_actions`."""
    skips = tuple(Action("skip") for _ in ctx.classes)
    return [State(0, skips[:ci] + (a,) + skips[ci + 1:]) for ci in range(len(ctx.classes))
            for a in depth_actions(ctx, ci, per_class)]


def joint_depth_state(ctx: PlanningContext) -> State | None:
    """All classes together, each in homogeneous pipelines at the depth :func:`depth_actions` rates best
    for its share of the batch (in proportion to its speed). A class that fits only with the others'
    replicas sharding the optimizer state (T4s beside A40s and A10s for a 13B model) is guessed again with
    them. The fewest stages that fit are rarely the best depth for every class at once (seed2/rob-013:
    +13%). Dense models only: depth_actions keeps dp 1, so experts would not be sharded at all."""
    n, L = len(ctx.classes), ctx.model.num_layers
    if n < 2 or ctx.model.is_moe:
        return None
    speed = [c.count / max(ctx.slot_profile(ci, 1, 1, 1, 1, 2, 1, False).time(0, L, False, False), 1e-12)
             for ci, c in enumerate(ctx.classes)]
    share = [max(1, round(ctx.job.global_batch_size * v / sum(speed))) for v in speed]
    acts = [next(iter(depth_actions(ctx, ci, 1, gbs=share[ci])), None) for ci in range(n)]
    others = sum(a.replicas for a in acts if a is not None)
    acts = [a or next(iter(depth_actions(ctx, ci, 1, gbs=share[ci], zero_extra=others)), None)
            for ci, a in enumerate(acts)]
    if sum(a is not None for a in acts) < 2:
        return None
    return State(0, tuple(a or Action("skip") for a in acts))


class RulePool(NamedTuple):
    """The rule templates the shipped planner starts from: ``core``, priced as is; ``rest``, which joins the
    policy's proposals in the ranker's screening order; ``lead``, priced first when a longer target extends
    the search (or, with ``ArachnePlanner(lead_first=True)``, screened ahead of the rest); ``pools``, priced
    once refinement is done (candidates, never starts: see :func:`type_pool_states`)."""

    core: list[State]
    rest: list[State]
    lead: list[State]
    pools: tuple[State, ...] | list[State] = ()


def rule_pool(ctx: PlanningContext, pricer: Pricer, deadline: Deadline | None = None, max_actions: int = 0,
              depth: bool = True) -> RulePool:
    """The core (:func:`floor_states`), the rest (mixed rules, deeper pipelines and, with ``depth``,
    :func:`depth_states`) and, with ``depth``, the lead (:func:`joint_depth_state`). Planning and ranker
    training both build it here."""
    pools: list[State] = []
    core, mixed = floor_states(ctx, pricer, deadline, max_actions, price=False, pools_out=pools)
    lead: list[State] = []
    if depth:
        mixed = mixed + [st for st in depth_states(ctx) if st not in core]
        joint = joint_depth_state(ctx)
        if joint is not None and joint not in core:
            lead.append(joint)
    return RulePool(core, mixed, lead, pools)


def rule_own_actions(ctx: PlanningContext, ci: int) -> list[Action]:
    """Homogeneous pipelines of class ``ci`` with the fewest stages whose layers fit (micro-batch 1), each
    also with only one node's worth of replicas (see ``replica_variants``)."""
    c, model = ctx.classes[ci], ctx.model
    L = model.num_layers
    tps = tp_options(model, c.node_size)
    out = []
    for tp in sorted({tps[0], tps[-1]}):
        ep = ep_options(model, 1)[-1]
        for S in STAGE_COUNTS:
            if S > L or S * tp > c.count:
                break
            reps = c.count // (S * tp)
            prof = ctx.slot_profile(ci, tp, 1, ep, 1, S, max(1, reps), False)
            if split_layers([prof] * S, L, max(1, ctx.job.global_batch_size // max(1, reps)), ctx.work) is not None:
                out.append(Action("own", tp, 1, ep, S, reps))
                break
    if c.node_size > 1 and c.count >= 2 * c.node_size:
        # a small batch on many GPUs: node-wide stages (data parallel inside the node), as deep as the
        # class allows -- every GPU works on every micro-batch
        for tp in [t for t in tps if t <= 2]:
            dp = max(d for d in (1, 2, 4, 8) if d * tp <= c.node_size and c.node_size % (d * tp) == 0)
            S = max((k for k in STAGE_COUNTS if k <= min(L, c.count // (dp * tp))), default=0)
            if S > 1:
                wide = Action("own", tp, dp, ep_options(model, dp)[-1], S, c.count // (S * dp * tp))
                if wide not in out:
                    out.append(wide)
    gbs = ctx.job.global_batch_size
    if ctx.wide_small_batch and not model.is_moe and c.node_size > 1 and 2 * c.node_size <= c.count and gbs <= c.count:
        # a batch smaller than the class, as Megatron runs it: one stage, tp inside the node, data parallel
        # across nodes with a sequence per group (past the policy's dp choices)
        for tp in tps:
            dp = 1 << (min(gbs, c.count // tp).bit_length() - 1)
            if dp > DP_CHOICES[-1] and slot_fits_nodes(tp * dp, c.node_size):
                prof = ctx.slot_profile(ci, tp, dp, 1, dp, 1, dp, False)
                if split_layers([prof], L, 1, ctx.work) is not None:
                    out.append(Action("own", tp, dp, 1, 1, c.count // (tp * dp)))
    if model.is_moe:
        # experts over the node's GPUs (tp 1); and, as Megatron does, experts over 8 data-parallel groups of
        # tp 1 (where the node is narrower), 2 or 4, across nodes
        node_dp = max(d for d in DP_CHOICES if d <= c.node_size and c.node_size % d == 0)
        pairs = [(1, node_dp)] if node_dp > 1 else []
        pairs += [(t, DP_CHOICES[-1]) for t in tps if t in (1, 2, 4) and (t, DP_CHOICES[-1]) not in pairs]
        for tp, dp in [(t, d) for t, d in pairs if slot_fits_nodes(t * d, c.node_size)]:
            ep = ep_options(model, dp)[-1]
            for S in STAGE_COUNTS:
                if S > L or S * dp * tp > c.count:
                    break
                reps = c.count // (S * dp * tp)
                prof = ctx.slot_profile(ci, tp, dp, ep, dp, S, max(1, reps) * dp, False)
                if split_layers([prof] * S, L, max(1, ctx.job.global_batch_size // (dp * max(1, reps))),
                                ctx.work) is not None:
                    out.append(Action("own", tp, dp, ep, S, reps))
                    break
    return out + [v for a in out for v in replica_variants(a, c) if v not in out]


def mixed_floor_states(ctx: PlanningContext) -> list[State]:
    """Mixed pipelines by rule: ``R`` replicas over the fastest ``j`` classes, each class contributing
    stages in proportion to its GPUs, at one tp level (``uniform``) or with tp doubling per slower GPU
    type (``graded``: a slower type holds fewer, wider stages); also at the replica counts a GPU type
    split across node sizes fills (:func:`type_fills`), and at each tp level over only the classes whose
    nodes are that wide (``wide``), and without the classes on a much slower network
    (:func:`slow_network_classes`). Two orders are interleaved: a cheap
    throughput proxy over all of them, and all classes at one tp level with more replicas first
    (shorter pipelines; fewer replicas matter when memory is tight)."""
    classes, model = ctx.classes, ctx.model
    n = len(classes)
    levels = sorted({t for c in classes for t in tp_options(model, c.node_size)})
    spare = [sum(c.gpu.memory_bytes * c.count for c in classes[i:]) for i in range(n + 1)]
    replicas = sorted({r for r in mix_replica_options(classes) if r} | set(type_fills(classes)), reverse=True)
    plain = [st for R in replicas for tp in levels if (st := mixed_rule_state(ctx, R, tp)) is not None]
    every: dict[Template, State] = {}
    for j in range(n, 1, -1):
        for R in replicas:
            for tp in levels:
                for graded in (False, True):
                    for experts in ((False, True) if model.is_moe else (False,)):
                        st = mixed_rule_state(ctx, R, tp, j, graded, experts)
                        if st is not None and may_fit(ctx, st, spare[len(st.actions)]):
                            every.setdefault(st.template(), st)
    for tp in levels:  # only the classes whose nodes are wide enough, where that leaves some out
        if 2 <= sum(tp_options(model, c.node_size)[-1] >= tp for c in classes) < n:
            for R in replicas:
                st = mixed_rule_state(ctx, R, tp, wide=True)
                if st is not None and may_fit(ctx, st, 0):
                    every.setdefault(st.template(), st)
    slow = slow_network_classes(classes)
    if slow and n - len(slow) >= 2:  # without the leading classes whose network would hold every replica back
        fast = {st.template(): st for j in range(n, 1, -1) for R in replicas for tp in levels
                for graded in (False, True)
                if (st := mixed_rule_state(ctx, R, tp, j, graded=graded, leave_out=slow)) is not None
                and st.template() not in every and may_fit(ctx, st, 0)}
        for st in sorted(fast.values(), key=lambda st: -_mix_proxy(ctx, st))[:SLOW_NETWORK_RULES]:
            every[st.template()] = st
    ranked = sorted(every.values(), key=lambda st: -_mix_proxy(ctx, st))
    out: dict[Template, State] = {}
    for pair in zip_longest(ranked, plain):
        for st in pair:
            if st is not None:
                out.setdefault(st.template(), st)
    return list(out.values())


SLOW_NETWORK = 8.0  # a class whose inter-node network is this many times slower than the fastest's
SLOW_NETWORK_RULES = 4  # rules without those classes kept, by the proxy (each one ranked costs time)


def slow_network_classes(classes: list[DeviceClass]) -> frozenset[int]:
    """The classes ahead of the first one on a fast network (within ``SLOW_NETWORK`` times the best class's):
    in a mixed pipeline their stage-to-stage sends and gradient sync hold every replica back, and every
    fastest-``j`` rule takes them (GH200 nodes of 4 on 3 Gb/s before GH200 nodes of 2 on 92 Gb/s)."""
    best = max((c.inter_node_bw for c in classes), default=0.0)
    fast = [c.index for c in classes if c.inter_node_bw * SLOW_NETWORK >= best]
    return frozenset(c.index for c in classes if c.index < fast[0]) if fast else frozenset()


def _mix_proxy(ctx: PlanningContext, st: State) -> float:
    """A cheap throughput guess for ordering mixed rules, in sequences per second: ``R`` pipelines
    whose layers are split in proportion to each stage's speed (TP traffic included), a 1F1B bubble, the
    slowest stage-to-stage transfer and gradient ring over each class's network; halved when the
    stages' memory cannot hold every layer."""
    ctx.work.mix_proxies += 1
    R, S, L = st.mix_replicas, st.mixed_stages(), ctx.model.num_layers
    mbs = max(a.dp for a in st.actions if a.kind == "mix")  # every stage's dp groups get a sequence
    m = max(1, ctx.job.global_batch_size // (R * mbs))
    act = mbs * ctx.job.sequence_length * ctx.model.hidden_size * act_bytes(ctx.job.precision)
    grad_bytes = 2 * ctx.model.num_params / L  # per layer, bf16
    slots = []
    for ci, a in enumerate(st.actions):
        if a.kind == "mix":
            c = ctx.classes[ci]
            prof = ctx.slot_profile(ci, a.tp, a.dp, a.ep, mbs, S, R * a.dp, False)
            p2p = 2 * act / a.tp * c.node_size / c.inter_node_bw if c.node_size > 1 else 0.0
            slots.append((c, a, prof, L / max(float(prof.time_prefix[L]), 1e-12), p2p))
    rate = sum(a.stages * r for _, a, _, r, _ in slots)
    tau = max(L / rate, max(1.0 / r for *_, r, _ in slots)) + max(p for *_, p in slots)
    room, sync = 0.0, 0.0
    for c, a, prof, r, _ in slots:
        per_layer = (prof.mem_param_prefix[L] + min(S, m) * prof.mem_act_prefix[L]) / L
        room += a.stages * max(0.0, prof.capacity - prof.mem_fixed) / max(float(per_layer), 1.0)
        if R > 1 and c.node_size > 1:
            sync = max(sync, 2 * L * r / rate * grad_bytes / a.tp * c.node_size / c.inter_node_bw)
    step = (m + S - 1) * tau + sync
    return R * m * mbs / step * (1.0 if room >= L else 0.5)


def mixed_rule_state(ctx: PlanningContext, R: int, tp: int, j: int | None = None,
                     graded: bool = False, experts: bool = False, wide: bool = False,
                     leave_out: frozenset[int] = frozenset()) -> State | None:
    """``R`` mixed replicas over the fastest ``j`` classes (all by default): each contributes ``mix``
    stages of the largest valid tp up to ``tp`` (``graded``: ``tp`` times 2 per faster GPU type before
    it), as many as its GPUs allow per replica (pooled with its kin when too few for one), scaled down
    to the layer count. ``experts`` (MoE): each
    stage also spreads over its node (stage-level dp) with experts sharded across those GPUs (ep).
    ``wide``: only the classes whose nodes hold a stage of tp ``tp`` (a small batch on deep, wide
    stages: 21 A10 nodes and 3 V100 nodes at tp 8, without the 4-GPU nodes between them). Classes in
    ``leave_out`` stay out."""
    classes = ctx.classes[: j or len(ctx.classes)]
    types: list[str] = []
    acts = []
    prefix = State(R)
    for c in classes:
        if c.index in leave_out or (wide and tp_options(ctx.model, c.node_size)[-1] < tp):
            acts.append((1, 1, 1, 0, False))
            prefix = prefix.push(Action("skip"))
            continue
        if c.gpu.name not in types:
            types.append(c.gpu.name)
        want = tp * (2 ** types.index(c.gpu.name) if graded else 1)
        t = max((o for o in tp_options(ctx.model, c.node_size) if o <= want), default=1)
        have = kin_left(prefix, c)[c.index] if len(c.kin) > 1 else c.count
        dp = 1
        if experts:
            dp = max((d for d in DP_CHOICES if d * t <= c.node_size and c.node_size % (d * t) == 0
                      and have >= R * t * d), default=1)
        k, pool = have // (R * t * dp), False
        if k == 0:  # too small alone: pooled with its kin where they make up a replica's stage
            k = _pooled(ctx, prefix, c, t * dp) // (R * t * dp)
            pool = k > 0
        acts.append((t, dp, ep_options(ctx.model, dp)[-1], k, pool))
        prefix = prefix.push(Action("mix", t, dp, 1, k, R, pool) if k else Action("skip"))
    total = sum(a[3] for a in acts)
    if total == 0:
        return None
    scale = min(1.0, ctx.model.num_layers / total)
    st = State(R, tuple(Action("mix", t, dp, ep, int(k * scale), R, pool) if int(k * scale) > 0 else Action("skip")
                        for t, dp, ep, k, pool in acts))
    return None if st.is_empty() or sum(a.kind == "mix" for a in st.actions) < 2 else st


def _thin(acts: list[Action], n: int) -> list[Action]:
    if len(acts) <= n:
        return acts
    idx = np.linspace(0, len(acts) - 1, n).round().astype(int)
    return [acts[i] for i in sorted(set(idx))]


TAIL_SHARE = 0.2  # of refinement's time, for screening tail stages on the start (large pools cost the most)
TAIL_SLACK = 0.95  # a deep tail screened within this share of the best is priced (screens try fastest-first
# only, where a slow node does best at the head)


def refine(ctx: PlanningContext, pricer: Pricer, start: State, deadline: Deadline, rounds: int = 3,
           regroup: bool = False) -> State:
    """Priced local search, keeping improvements: each round, the mixed group's even-batch replica moves
    (:func:`replica_moves`) and each homogeneous group's best-balanced stage counts
    (:func:`balanced_stage_moves`), then each used class at tp >= 4 with half the tp and twice the dp, then
    one class's action at a time (:func:`class_moves`: its grid neighbours, tp/dp regroupings off the grid,
    the off-grid stage counts next to it, depth traded for dp); then the mixed group at the replica
    counts that a split GPU type fills; last, at a local optimum only, a slow node hung off a homogeneous
    pipeline (:func:`tail_stages`, also screened on the start). ``regroup`` (a longer target's extension):
    first, data parallelism's slowest class screened at a wider stage-level dp (:func:`batch_regroupings`)."""
    classes = ctx.classes
    pad = tuple(Action("skip") for _ in range(len(classes) - len(start.actions)))
    start = State(start.mix_replicas, start.actions + pad)
    best, best_v = start, pricer.throughput(start.template())
    share = deadline.child(TAIL_SHARE * deadline.remaining)
    for r in range(rounds):
        improved = False
        for cand in batch_regroupings(ctx, best) if regroup and r == 0 else ():  # screened: most do not pay
            if deadline.expired():
                return best
            if pricer.screen_state(cand) > best_v * (1 + 1e-9):
                v = pricer.price_state(cand)
                if v > best_v * (1 + 1e-9):
                    best, best_v, improved = cand, v, True
        for cand in replica_moves(ctx, best) + balanced_stage_moves(ctx, best):
            if deadline.expired():
                return best
            v = pricer.price_state(cand)
            if v > best_v * (1 + 1e-9):
                best, best_v, improved = cand, v, True
        for deep in (False, True) if r == 0 else ():  # cheap candidates, not walked from: see below
            for cand in tail_stages(ctx, start, deep):
                if share.expired():
                    break
                if pricer.screen_state(cand) > (TAIL_SLACK if deep else 1.0) * best_v:
                    pricer.price_state(cand)
        # first, each wide tp group at half the tp and twice the dp (one price per class, where a large
        # cluster's unused classes have many options each and can use up the time before them)
        used = [ci for ci, a in enumerate(best.actions) if a.kind != "skip"]
        # then one class at a time, the classes in use first (an unused slow class's many options can use up
        # the time before a used class's regrouping: odd105/rob-019)
        order = used + [ci for ci in range(len(classes)) if ci not in used]
        for ci, halve_tp in [(ci, True) for ci in used if best.actions[ci].tp >= 4] + [(ci, False) for ci in order]:
            if deadline.expired():
                return best
            cur = best.actions[ci]
            for a in class_moves(ctx, best, ci):
                if halve_tp and not (a.kind == cur.kind and a.stages == cur.stages and 2 * a.tp == cur.tp
                                     and a.dp == 2 * cur.dp and a.ep == cur.ep):
                    continue
                if deadline.expired():
                    return best
                cand = State(best.mix_replicas, best.actions[:ci] + (a,) + best.actions[ci + 1:])
                v = pricer.price_state(cand)
                if v > best_v * (1 + 1e-9):
                    best, best_v, improved = cand, v, True
        for cand in replica_moves(ctx, best, fill=True):
            if deadline.expired():
                return best
            v = pricer.price_state(cand)
            if v > best_v * (1 + 1e-9):
                best, best_v, improved = cand, v, True
        # at a local optimum only: taken early, a tail stage can block the moves that matter more
        for cand in [] if improved else tail_stages(ctx, best):
            if deadline.expired():
                return best
            v = pricer.price_state(cand)
            if v > best_v * (1 + 1e-9):
                best, best_v, improved = cand, v, True
        if not improved:
            break
    return best


def class_moves(ctx: PlanningContext, st: State, ci: int) -> list[Action]:
    """Refinement's moves for class ``ci`` of ``st``: its grid neighbours (fewer replicas of a homogeneous
    pipeline included), tp/dp regroupings off the grid, one stage more or fewer off the grid, and depth
    traded for stage-level dp (:func:`depth_regroupings`)."""
    c = ctx.classes[ci]
    prefix, cur = State(st.mix_replicas, st.actions[:ci]), st.actions[ci]
    options = class_actions(prefix, ctx.model, c)
    options += [v for a in options for v in replica_variants(a, c)]
    return (_neighbours(cur, options) + offgrid_regroupings(cur, options, ctx.model, c)
            + adjacent_stages(cur, options, prefix, c, ctx.model.num_layers)
            + depth_regroupings(cur, ctx.model, c))


def depth_regroupings(cur: Action, model: ModelSpec, c: DeviceClass) -> list[Action]:
    """``cur``'s GPUs per replica traded between pipeline depth and stage-level dp: half the stages at twice
    the dp (experts sharded over the larger dp, as far as it allows) or twice the stages at half the dp.
    Two steps on the grid, whose middle is often worse (8 stages of tp 2 -> one stage of tp 2 x dp 8 x ep 8)."""
    if cur.kind not in ("own", "mix"):
        return []
    valid = slot_options(model, c)
    out = []
    for S, dp in ((cur.stages // 2, cur.dp * 2), (cur.stages * 2, cur.dp // 2)):
        if S < 1 or dp < 1 or S * dp != cur.stages * cur.dp or S > model.num_layers:
            continue
        eps = [ep for tp, d, ep in valid if tp == cur.tp and d == dp]
        if eps:
            ep = max(eps) if dp > cur.dp else min(eps, key=lambda e: abs(e - cur.ep))
            out.append(replace(cur, dp=dp, stages=S, ep=ep))
    return out


def batch_regroupings(ctx: PlanningContext, st: State) -> list[State]:
    """Where two or more classes run one-stage replicas (data parallelism only), the slowest of them at twice
    and four times the stage-level dp on the same GPUs. A larger plan-level micro-batch then runs each of its
    GPUs at the same per-GPU micro-batch while the faster classes get larger ones (V100 pairs at 1 sequence
    each next to single A100s at 2: +9% on 96 A100 and 160 V100)."""
    own = [ci for ci, a in enumerate(st.actions) if a.kind == "own"]
    if len(own) < 2 or st.mix_replicas or any(st.actions[ci].stages > 1 for ci in own):
        return []  # with pipelines, a larger micro-batch also means fewer of them to fill the bubble
    ci, a = own[-1], st.actions[own[-1]]
    valid = slot_options(ctx.model, ctx.classes[ci])
    out = []
    for k in (2, 4):
        eps = [ep for tp, d, ep in valid if tp == a.tp and d == a.dp * k]
        if a.replicas >= k and eps:
            moved = replace(a, dp=a.dp * k, replicas=a.replicas // k, ep=max(eps) if ctx.model.is_moe else a.ep)
            out.append(State(st.mix_replicas, st.actions[:ci] + (moved,) + st.actions[ci + 1:]))
    return out


def tail_stages(ctx: PlanningContext, st: State, deep: bool = False) -> list[State]:
    """With no mixed group yet, each homogeneous group turned into the mixed group with one more stage: a
    whole node of an unused class, one per replica, its GPUs split between tp and dp (tp near the square
    root; refinement regroups it later). A slow node can take a layer or the head off a fast pipeline (8
    one-GPU H800 stages, then one V100 node at tp 2 x dp 4). ``deep``: instead, where the class has too few
    nodes for every replica, all the group's GPUs as one-GPU stages of one pipeline, plus one node of the
    class at its widest tp (a small batch on 16 GH200 and one V100 node at tp 8: no gradient sync)."""
    if st.mix_replicas:
        return []
    model = ctx.model
    out = []
    for o, a in enumerate(st.actions):
        if a.kind != "own" or a.stages >= model.num_layers:
            continue
        for ci, c in enumerate(ctx.classes):
            g = min(c.node_size, c.count)
            if ci == o or (ci < len(st.actions) and st.actions[ci].kind != "skip"):
                continue
            splits = [(tp, dp, ep) for tp, dp, ep in slot_options(model, c) if tp * dp == g]
            if not splits:
                continue
            acts = list(st.actions) + [Action("skip")] * (len(ctx.classes) - len(st.actions))
            if a.replicas * g <= c.count and not deep:
                tp, dp, ep = min(splits, key=lambda x: (abs(x[0] * x[0] - g), -x[0], -x[2]))
                acts[o], acts[ci] = replace(a, kind="mix"), Action("mix", tp, dp, ep, 1, a.replicas)
                out.append(State(a.replicas, tuple(acts)))
            elif deep and a.replicas * g > c.count >= g and a.replicas * a.stages * a.tp * a.dp <= model.num_layers:
                # too few nodes for a tail per replica: every GPU of the group one stage of one pipeline,
                # then the node at its widest tp (one pipeline of a small batch; no gradient sync)
                tp, dp, ep = max(splits)
                acts[o] = Action("mix", 1, 1, 1, a.replicas * a.stages * a.tp * a.dp, 1)
                acts[ci] = Action("mix", tp, dp, ep, 1, 1)
                out.append(State(1, tuple(acts)))
    return out


def replica_moves(ctx: PlanningContext, st: State, fill: bool = False) -> list[State]:
    """The mixed group at the nearest replica counts above and below its own that share the global batch
    evenly (10 replicas of a batch of 1000, where the grid offers 8 and 12), or (``fill``) at each count
    that one of its classes of a GPU type split across node sizes fills with its stages, pooled with
    its kin (14 replicas of 14 GPUs); each class's stages rescaled to keep its GPUs busy within what
    it has: uneven shares leave most replicas waiting on the
    ones with an extra sequence, and a class left short of a replica stays out."""
    R = st.mix_replicas
    if not R or not any(a.kind == "mix" for a in st.actions):
        return []
    gbs, L = ctx.job.global_batch_size, ctx.model.num_layers
    cap = max(c.count for c in ctx.classes)
    even = [r for r in range(1, min(cap, 2 * R) + 1) if gbs % r == 0 and r != R]
    if fill:
        targets = sorted({_pooled(ctx, State(R, st.actions[:ci]), ctx.classes[ci], a.tp * a.dp)
                          // (a.tp * a.dp * a.stages) for ci, a in enumerate(st.actions)
                          if a.kind == "mix" and len(ctx.classes[ci].kin) > 1} - {R})
    else:
        targets = [min((r for r in even if r > R), default=0), max((r for r in even if r < R), default=0)]
    out = []
    for R2 in dict.fromkeys(r for r in targets if r):
        acts: list[Action] = []
        for ci, a in enumerate(st.actions):
            c, g = ctx.classes[ci], a.tp * a.dp
            prefix = State(R2, tuple(acts))
            if a.kind == "mix":
                have = kin_left(prefix, c)[ci] if len(c.kin) > 1 else c.count
                avail = have if have >= R2 * g else _pooled(ctx, prefix, c, g)
                k = min(max(1, a.stages * R // R2), avail // (R2 * g))
                acts.append(replace(a, stages=k, replicas=R2, pool=R2 * k * g > have) if k > 0 else Action("skip"))
            elif a.kind == "own" and len(c.kin) > 1:  # kin pooled into the mix may have fewer GPUs left
                reps = kin_left(prefix, c)[ci] // (a.stages * g)
                acts.append(replace(a, replicas=reps) if reps else Action("skip"))
            else:
                acts.append(a)
        new = State(R2, tuple(acts))
        if sum(a.kind == "mix" for a in acts) and new.mixed_stages() <= L:
            out.append(new)
    return out


def _pooled(ctx: PlanningContext, prefix: State, c: DeviceClass, g: int) -> int:
    """GPUs a mixed slot of ``g`` GPUs of class ``c`` can have after ``prefix``: its own, then its kin's."""
    if len(c.kin) < 2:
        return c.count
    left = kin_left(prefix, c)
    return left[c.index] + sum(left[j] for j in pool_classes(c, g))


def balanced_stage_moves(ctx: PlanningContext, st: State, per_class: int = 2) -> list[State]:
    """Each homogeneous group at the ``per_class`` stage counts (within half to twice its own) whose
    layer split is best balanced, by a quick guess: replicas x micro-batches over (micro-batches +
    stages - 1) x the split's slowest stage. Blocks plus the embedding and head divide evenly only
    into some counts (7, 14, 21 for 40 blocks), and the stage-count grid skips most of them. Each
    (and the group as it is) also at the most replicas that share the global batch evenly."""
    L, gbs = ctx.model.num_layers, ctx.job.global_batch_size
    out = []
    for ci, a in enumerate(st.actions):
        if a.kind != "own":
            continue
        c, g = ctx.classes[ci], a.tp * a.dp
        scored = []
        for S in range(max(1, a.stages // 2), min(2 * a.stages, L, c.count // g) + 1):
            reps = c.count // (S * g)
            if S == a.stages or reps < 1 or reps * a.dp > gbs:
                continue
            m = max(1, gbs // (a.dp * reps))
            prof = ctx.slot_profile(ci, a.tp, a.dp, a.ep, a.dp, S, reps * a.dp, False)
            r = split_layers([prof] * S, L, m, ctx.work)
            if r is not None:
                scored.append((-reps * m / ((m + S - 1) * r[1]), S, reps))
        # each at the most replicas that share the batch evenly too (the current count included): with
        # 1024 sequences, 154 replicas leave most waiting on those with one more micro-batch
        moves = []
        for S, reps in [(S, reps) for _, S, reps in sorted(scored)[:per_class]] + [(a.stages, a.replicas)]:
            even = max((r for r in range(1, reps + 1) if gbs % r == 0), default=reps)
            moves += [(S, reps)] if S != a.stages else []
            moves += [(S, even)] if even != reps else []
        for S, reps in moves:
            out.append(State(st.mix_replicas, st.actions[:ci] + (replace(a, stages=S, replicas=reps),)
                             + st.actions[ci + 1:]))
    return out


def adjacent_stages(cur: Action, options: list[Action], prefix: State, c: DeviceClass, L: int) -> list[Action]:
    """``cur`` with one stage more or fewer where the stage-count grid skips that count (7 between 6 and
    8): a stage count that splits the layers (and the embedding and head) evenly can beat its grid
    neighbours by a few percent."""
    if cur.kind not in ("own", "mix"):
        return []
    g = cur.tp * cur.dp
    have = {(a.kind, a.tp, a.dp, a.ep, a.stages) for a in options}
    used = prefix.mixed_stages()
    out = []
    for S in (cur.stages - 1, cur.stages + 1):
        if S < 1 or (cur.kind, cur.tp, cur.dp, cur.ep, S) in have:
            continue
        if cur.kind == "own" and S * g <= c.count and S <= L:
            out.append(replace(cur, stages=S, replicas=c.count // (S * g)))
        elif cur.kind == "mix" and cur.replicas * S * g <= c.count and used + S <= L:
            out.append(replace(cur, stages=S))
    return out


def offgrid_regroupings(cur: Action, options: list[Action], model: ModelSpec, c: DeviceClass) -> list[Action]:
    """``cur``'s stages with their GPUs split another way between tp and dp where its stage count is off the
    grid (19, reached by a balanced move), so :func:`_neighbours` finds no such regrouping among the
    options: otherwise a tp 2 x dp 2 group that refinement moved off the grid could never become tp 4."""
    if cur.kind not in ("own", "mix") or any(a.kind == cur.kind and a.stages == cur.stages for a in options):
        return []
    g = cur.tp * cur.dp
    splits: dict[tuple[int, int], int] = {}  # each other split, at the ep nearest ``cur``'s (dp bounds ep)
    for tp, dp, ep in slot_options(model, c):
        if tp * dp == g and tp != cur.tp and abs(ep - cur.ep) < abs(splits.get((tp, dp), 1 << 30) - cur.ep):
            splits[tp, dp] = ep
    return [replace(cur, tp=tp, dp=dp, ep=ep) for (tp, dp), ep in splits.items()]


def _neighbours(cur: Action, options: list[Action]) -> list[Action]:
    """Actions one step away from ``cur``: same kind with one of tp/dp/ep/stages changed, or skip; then
    (last) the same stages with their GPUs split another way between tp and dp."""
    out, regrouped = [], []
    for a in options:
        if a == cur:
            continue
        if a.kind == "skip":
            out.append(a)
            continue
        if a.kind != cur.kind and cur.kind != "skip":
            continue
        diff = sum([a.tp != cur.tp, a.dp != cur.dp, a.ep != cur.ep, a.stages != cur.stages])
        if cur.kind == "skip" or diff <= 1:
            out.append(a)
        elif diff == 2 and a.tp != cur.tp and a.tp * a.dp == cur.tp * cur.dp:
            regrouped.append(a)
    return out + regrouped
