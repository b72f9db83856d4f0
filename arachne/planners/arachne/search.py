"""Searching templates: the priced teacher (beam search over decisions), the policy's beam
search (no pricing), rule-based floor templates, and a priced local refinement."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from arachne.cost import Estimate
from arachne.cost.memory import state_bytes_per_param
from arachne.plan import Plan
from arachne.planners.arachne.actions import Action, State, class_actions, mix_replica_options
from arachne.planners.arachne.features import FeatureBuilder
from arachne.planners.arachne.policy import Policy
from arachne.planners.arachne.template import Template, tp_options
from arachne.planners.base import Deadline
from arachne.planners.completion import PlanningContext, price_template


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
            acts = class_actions(st, model, classes[ci])
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
                 max_actions: int = 0, price: bool = True) -> tuple[list[State], list[State]]:
    """Rule-based templates, as (core, mixed). Per class the fewest stages that fit at tp 1 and at the
    largest in-node tp (priced alone; the better one is the class's homogeneous choice); the core is
    then all classes together (heterogeneous data parallelism), the fastest j classes together (a
    small batch is often trained faster without the slowest GPUs) and each class alone; mixed
    pipelines by rule follow. With ``price`` all are priced too (while the deadline lasts)."""
    classes, model = ctx.classes, ctx.model
    best_own: list[Action] = []
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
            v = pricer.price_state(prefix.push(a))
            if v > top_v:
                top, top_v = a, v
        best_own.append(top)
    n = len(classes)
    skips = tuple(Action("skip") for _ in range(n))
    core = [State(0, tuple(best_own))]
    core += [State(0, tuple(best_own[:j]) + skips[j:]) for j in range(n - 1, 1, -1)]
    core += [State(0, skips[:ci] + (best_own[ci],) + skips[ci + 1:]) for ci in range(n)]
    core = list(dict.fromkeys(st for st in core if not st.is_empty()))
    mixed = mixed_floor_states(ctx)
    if price:
        for st in core + mixed:
            if deadline is not None and deadline.expired():
                break
            pricer.price_state(st)
    return core, mixed


def rule_own_actions(ctx: PlanningContext, ci: int) -> list[Action]:
    """Homogeneous pipelines of class ``ci`` with the fewest stages whose layers fit (micro-batch 1)."""
    from arachne.planners.arachne.actions import STAGE_COUNTS
    from arachne.planners.arachne.template import ep_options, tp_options
    from arachne.planners.completion import split_layers

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
            if split_layers([prof] * S, L, max(1, ctx.job.global_batch_size // max(1, reps))) is not None:
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
    if model.is_moe and c.node_size > 1:  # experts over the node's GPUs
        tp = 1
        dp = max(d for d in (1, 2, 4, 8) if d <= c.node_size and c.node_size % d == 0)
        ep = ep_options(model, dp)[-1]
        for S in STAGE_COUNTS:
            if S > L or S * dp > c.count:
                break
            reps = c.count // (S * dp)
            prof = ctx.slot_profile(ci, tp, dp, ep, dp, S, max(1, reps) * dp, False)
            if split_layers([prof] * S, L, max(1, ctx.job.global_batch_size // (dp * max(1, reps)))) is not None:
                out.append(Action("own", tp, dp, ep, S, reps))
                break
    return out


def mixed_floor_states(ctx: PlanningContext) -> list[State]:
    """Mixed pipelines by rule: ``R`` replicas, each class contributing stages in proportion to its
    GPUs, at one tp level for all classes (capped by each class's node). More replicas first: their
    pipelines are shorter (less bubble) and cheaper to price; fewer replicas matter when memory is tight."""
    classes, model = ctx.classes, ctx.model
    out = []
    levels = sorted({t for c in classes for t in tp_options(model, c.node_size)})
    for R in sorted(mix_replica_options(classes), reverse=True):
        if R == 0:
            continue
        for tp in levels:
            st = mixed_rule_state(ctx, R, tp)
            if st is not None and st not in out:
                out.append(st)
    return out


def mixed_rule_state(ctx: PlanningContext, R: int, tp: int) -> State | None:
    """``R`` mixed replicas where every class contributes ``mix`` stages of the largest valid tp up to
    ``tp``, as many as its GPUs allow per replica, scaled down to the layer count."""
    acts = []
    for c in ctx.classes:
        t = max((o for o in tp_options(ctx.model, c.node_size) if o <= tp), default=1)
        acts.append((t, c.count // (R * t)))
    total = sum(k for _, k in acts)
    if total == 0:
        return None
    scale = min(1.0, ctx.model.num_layers / total)
    st = State(R, tuple(Action("mix", t, 1, 1, int(k * scale), R) if int(k * scale) > 0 else Action("skip")
                        for t, k in acts))
    return None if st.is_empty() else st


def _thin(acts: list[Action], n: int) -> list[Action]:
    if len(acts) <= n:
        return acts
    idx = np.linspace(0, len(acts) - 1, n).round().astype(int)
    return [acts[i] for i in sorted(set(idx))]


def refine(ctx: PlanningContext, pricer: Pricer, start: State, deadline: Deadline, rounds: int = 3) -> State:
    """Priced local search: change one class's action at a time, keep improvements."""
    classes, model = ctx.classes, ctx.model
    pad = tuple(Action("skip") for _ in range(len(classes) - len(start.actions)))
    start = State(start.mix_replicas, start.actions + pad)
    best, best_v = start, pricer.throughput(start.template())
    for _ in range(rounds):
        improved = False
        for ci in range(len(classes)):
            if deadline.expired():
                return best
            prefix = State(best.mix_replicas, best.actions[:ci])
            cur = best.actions[ci]
            for a in _neighbours(cur, class_actions(prefix, model, classes[ci])):
                if deadline.expired():
                    return best
                cand = State(best.mix_replicas, best.actions[:ci] + (a,) + best.actions[ci + 1:])
                v = pricer.price_state(cand)
                if v > best_v * (1 + 1e-9):
                    best, best_v, improved = cand, v, True
        if not improved:
            break
    return best


def _neighbours(cur: Action, options: list[Action]) -> list[Action]:
    """Actions one step away from ``cur``: same kind with one of tp/dp/ep/stages changed, or skip."""
    out = []
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
    return out
