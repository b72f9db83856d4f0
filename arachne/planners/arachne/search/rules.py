"""Rule-based templates: the floor every search starts from (per device class and mixed across classes),
the type pools and the depth variants, screened cheaply and ordered for pricing."""

from __future__ import annotations

import math
from itertools import zip_longest
from typing import NamedTuple

import numpy as np

from arachne.cost.compute import act_bytes
from arachne.cost.memory import state_bytes_per_param
from arachne.planners.arachne.actions import (
    DP_CHOICES,
    STAGE_COUNTS,
    Action,
    State,
    class_actions,
    kin_left,
    mix_replica_options,
    replica_variants,
    type_fills,
)
from arachne.planners.arachne.completion.split import split_layers
from arachne.planners.arachne.context import PlanningContext
from arachne.planners.arachne.search.pricer import Pricer
from arachne.planners.arachne.search.refine import _pooled
from arachne.planners.arachne.seed_scope import seed_depths
from arachne.planners.arachne.template import (
    DeviceClass,
    Template,
    ep_options,
    pool_classes,
    slot_fits_nodes,
    tp_options,
)
from arachne.planners.protocol import Deadline
from arachne.spec.gpus import GPUType


def spare_memory(classes: list[DeviceClass]) -> list[float]:
    """For each ``i``, the bytes of GPU memory in ``classes[i:]``: :func:`may_fit`'s ``spare`` for a template
    that has decided the first ``i`` classes."""
    return [sum(c.gpu.memory_bytes * c.count for c in classes[i:]) for i in range(len(classes) + 1)]


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
    5 pipelines of 3, which shards the gradient all-reduce 3 ways over all 15
    (``test_a_gpu_type_split_across_node_sizes_is_pooled_into_identical_pipelines``). The planner prices
    them after refinement: priced first, a pool that beats the other templates becomes refinement's start
    and can lead it away from better mixed plans, and screened first they take the screening's time on
    large clusters (docs/decisions)."""
    classes, model = ctx.classes, ctx.model
    L, n = model.num_layers, len(classes)
    out: list[State] = []
    for c in classes:
        if len(c.kin) < 2 or c.index != c.kin[0][0]:
            continue
        kin = {j for j, _, _ in c.kin}
        for tp in sorted({tp_options(model, c.node_size)[0], tp_options(model, c.node_size)[-1]}):
            pool = pool_classes(c, tp, tp)
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
    them. The fewest stages that fit are rarely the best depth for every class at once
    (``test_the_planner_finds_the_joint_depths``). Dense models only: depth_actions keeps dp 1, so experts would
    not be sharded at all."""
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
        # across nodes with a sequence per group, at every tp (the first rule tries only the least and the most)
        for tp in tps:
            dp = 1 << (min(gbs, c.count // tp).bit_length() - 1)
            act = Action("own", tp, dp, 1, 1, c.count // (tp * dp))
            if act not in out and slot_fits_nodes(tp * dp, c.node_size):
                prof = ctx.slot_profile(ci, tp, dp, 1, dp, 1, dp, False)
                if split_layers([prof], L, 1, ctx.work) is not None:
                    out.append(act)
    if model.is_moe:
        # experts over the node's GPUs (tp 1); and, as Megatron does, experts over 8 data-parallel groups of
        # tp 1 (where the node is narrower), 2 or 4, across nodes
        node_dp = max(d for d in DP_CHOICES if d <= c.node_size and c.node_size % d == 0)
        pairs = [(1, node_dp)] if node_dp > 1 else []
        pairs += [(t, DP_CHOICES[-1]) for t in tps if t in (1, 2, 4) and (t, DP_CHOICES[-1]) not in pairs]
        for tp, dp in [(t, d) for t, d in pairs if slot_fits_nodes(t * d, c.node_size)]:
            for S in STAGE_COUNTS:
                if S > L or S * dp * tp > c.count:
                    break
                if (act := _experts_fit(ctx, ci, tp, dp, S, False)) is not None:
                    out.append(act)
                    break
        if not any(a.ep > 1 for a in out):
            # none fits at the action space's depths: two blocks, then one block per stage, experts over the
            # most data-parallel groups the class holds, recomputed (Megatron's grid runs DeepSeek-V3's 61
            # blocks on single-GPU H100 nodes at tp 1 x dp 4 x ep 4)
            tp = tps[0]
            for S in (d for d in seed_depths(L) if d > STAGE_COUNTS[-1]):
                dp = max((d for d in DP_CHOICES if S * d * tp <= c.count), default=0)
                if dp < 2:
                    break
                if (act := _experts_fit(ctx, ci, tp, dp, S, True)) is not None:
                    out.append(act)
                    break
    return out + [v for a in out for v in replica_variants(a, c) if v not in out]


def _experts_fit(ctx: PlanningContext, ci: int, tp: int, dp: int, S: int, recompute: bool) -> Action | None:
    """Class ``ci``'s pipelines of ``S`` stages of tp x dp, experts over the dp groups, as many as it holds,
    where their layers fit at one sequence per group (with ``recompute``, recomputing)."""
    c, L = ctx.classes[ci], ctx.model.num_layers
    ep = ep_options(ctx.model, dp)[-1]
    reps = c.count // (S * dp * tp)
    prof = ctx.slot_profile(ci, tp, dp, ep, dp, S, max(1, reps) * dp, recompute)
    if split_layers([prof] * S, L, max(1, ctx.job.global_batch_size // (dp * max(1, reps))), ctx.work) is None:
        return None
    return Action("own", tp, dp, ep, S, reps)


def mixed_floor_states(ctx: PlanningContext) -> list[State]:
    """Mixed pipelines by rule: ``R`` replicas over the fastest ``j`` classes, each class contributing
    stages in proportion to its GPUs, at one tp level (``uniform``) or with tp graded by each type's speed
    (``graded``: a slower type holds fewer, wider stages, :func:`speed_grade`); also at the replica counts a GPU type
    split across node sizes fills (:func:`type_fills`), and at each tp level over only the classes whose
    nodes hold it (``wide``; graded, each class its own: the one-GPU nodes of a type that asks for tp 8 left
    out), and without the classes on a much slower network
    (:func:`slow_network_classes`). Two orders are interleaved: a cheap
    throughput proxy over all of them, and all classes at one tp level with more replicas first
    (shorter pipelines; fewer replicas matter when memory is tight). With ``ctx.whole_block_mix`` (the second
    search's) each rule of the fastest-``j`` loop is also kept with its arguments in ``ctx.mixed_rule_args``, for
    the search's last pass (``search/whole_blocks.py``)."""
    classes, model = ctx.classes, ctx.model
    n = len(classes)
    levels = sorted({t for c in classes for t in tp_options(model, c.node_size)})
    spare = spare_memory(classes)
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
                            if ctx.whole_block_mix:
                                ctx.mixed_rule_args.append((st, (R, tp, j, graded, experts)))
    for tp in levels:  # only the classes whose nodes are wide enough, where that leaves some out
        for graded in (False, True):
            if 2 <= sum(tp_options(model, c.node_size)[-1] >= _want(ctx, c, tp, graded) for c in classes) < n:
                for R in replicas:
                    st = mixed_rule_state(ctx, R, tp, graded=graded, wide=True)
                    if st is not None and may_fit(ctx, st, 0):
                        every.setdefault(st.template(), st)
    slow = slow_network_classes(classes)
    if slow and n - len(slow) >= 2:  # without the leading classes whose network would hold every replica back
        fast = {st.template(): st for j in range(n, 1, -1) for R in replicas for tp in levels
                for graded in (False, True)
                if (st := mixed_rule_state(ctx, R, tp, j, graded=graded, leave_out=slow)) is not None
                and st.template() not in every and may_fit(ctx, st, 0)}
        for st in sorted(fast.values(), key=lambda st: -mix_guess(ctx, st, False)[0])[:SLOW_NETWORK_RULES]:
            every[st.template()] = st
    ranked = sorted(every.values(), key=lambda st: -mix_guess(ctx, st, False)[0])
    out: dict[Template, State] = {}
    for pair in zip_longest(ranked, plain):
        for st in pair:
            if st is not None:
                out.setdefault(st.template(), st)
    return list(out.values())


SLOW_NETWORK = 8.0  # a class whose inter-node network is this many times slower than the fastest's
SLOW_NETWORK_RULES = 4  # rules without those classes kept, by the proxy (each one ranked costs time)


def much_slower_networks(classes: list[DeviceClass]) -> frozenset[int]:
    """The classes on a network ``SLOW_NETWORK`` times slower than the best class's."""
    best = max((c.inter_node_bw for c in classes), default=0.0)
    return frozenset(c.index for c in classes if c.inter_node_bw * SLOW_NETWORK < best)


def slow_network_classes(classes: list[DeviceClass]) -> frozenset[int]:
    """The classes ahead of the first one on a fast network (:func:`much_slower_networks` are not): in a mixed
    pipeline their stage-to-stage sends and gradient sync hold every replica back, and every fastest-``j`` rule
    takes them (GH200 nodes of 4 on 3 Gb/s before GH200 nodes of 2 on 92 Gb/s). Only the leading ones: leaving out
    every such class wherever it stands (decision 0012) displaced the rules that win elsewhere."""
    slow = much_slower_networks(classes)
    fast = [c.index for c in classes if c.index not in slow]
    return frozenset(i for i in slow if i < fast[0]) if fast else frozenset()


def mix_guess(ctx: PlanningContext, st: State, whole: bool) -> tuple[float, float]:
    """A cheap throughput guess for ordering mixed rules, in sequences per second: ``R`` pipelines
    whose layers are split in proportion to each stage's speed (TP traffic included), a 1F1B bubble, the
    slowest stage-to-stage transfer and gradient ring over each class's network; halved when the
    stages' memory cannot hold every layer. With ``whole`` the split is in whole blocks (the slowest stage's share
    rounded up: 96 blocks over 61 equal stages run at two per stage), and the second value is the blocks a
    replica's stages hold at that pace (without: 0)."""
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
    tau, blocks = max(L / rate, max(1.0 / r for *_, r, _ in slots)), 0
    while whole and (blocks := sum(a.stages * int(tau * r * (1 + 1e-9)) for _, a, _, r, _ in slots)) < L:
        tau = min((int(tau * r * (1 + 1e-9)) + 1) / r for *_, r, _ in slots)
    tau += max(p for *_, p in slots)
    room, sync = 0.0, 0.0
    for c, a, prof, r, _ in slots:
        per_layer = (prof.mem_param_prefix[L] + min(S, m) * prof.mem_act_prefix[L]) / L
        room += a.stages * max(0.0, prof.capacity - prof.mem_fixed) / max(float(per_layer), 1.0)
        if R > 1 and c.node_size > 1:
            sync = max(sync, 2 * L * r / rate * grad_bytes / a.tp * c.node_size / c.inter_node_bw)
    step = (m + S - 1) * tau + sync
    return R * m * mbs / step * (1.0 if room >= L else 0.5), float(blocks)


def speed_grade(fastest: GPUType, gpu: GPUType, precision: str) -> int:
    """The tp factor that gives a stage of ``gpu`` about the pace of one of ``fastest`` on the same layers: the
    power of two nearest their peak rates' ratio (at least 1). Sailor's plan for DeepSeek-MoE-16B on H200 and
    A100-80 (fresh hold-out odd100-rerun/rob-028) ran H200 stages at tp 1 and A100 stages at tp 4 (3.2x slower)."""
    prec = "bf16" if precision == "fp8" else precision  # (not every type has fp8 rates: the bf16 ratio)
    ratio = fastest.peak_flops(prec) / gpu.peak_flops(prec)
    return 2 ** max(0, round(math.log2(ratio))) if ratio > 0 else 1


def mixed_rule_state(ctx: PlanningContext, R: int, tp: int, j: int | None = None,
                     graded: bool = False, experts: bool = False, wide: bool = False,
                     leave_out: frozenset[int] = frozenset()) -> State | None:
    """``R`` mixed replicas over the fastest ``j`` classes (all by default): each contributes ``mix``
    stages of the largest valid tp up to ``tp`` (``graded``: ``tp`` times the type's :func:`speed_grade`), as many
    as its GPUs allow per replica (pooled with its kin when too few for one), scaled down
    to the layer count. ``experts`` (MoE): each
    stage also spreads over its node (stage-level dp) with experts sharded across those GPUs (ep).
    ``wide``: only the classes whose nodes hold a stage of the tp asked of them (a small batch on deep, wide
    stages: 21 A10 nodes and 3 V100 nodes at tp 8, without the 4-GPU nodes between them). Classes in
    ``leave_out`` stay out."""
    classes = ctx.classes[: j or len(ctx.classes)]
    types: list[str] = []
    acts = []
    prefix = State(R)
    for c in classes:
        if c.index in leave_out or (wide and tp_options(ctx.model, c.node_size)[-1] < _want(ctx, c, tp, graded)):
            acts.append((1, 1, 1, 0, False))
            prefix = prefix.push(Action("skip"))
            continue
        if c.gpu.name not in types:
            types.append(c.gpu.name)
        want = _want(ctx, c, tp, graded)
        t = max((o for o in tp_options(ctx.model, c.node_size) if o <= want), default=1)
        have = kin_left(prefix, c)[c.index] if len(c.kin) > 1 else c.count
        dp = 1
        if experts:
            dp = max((d for d in DP_CHOICES if d * t <= c.node_size and c.node_size % (d * t) == 0
                      and have >= R * t * d), default=1)
        k, pool = have // (R * t * dp), False
        if k == 0:  # too small alone: pooled with its kin where they make up a replica's stage
            k = _pooled(ctx, prefix, c, t * dp, t) // (R * t * dp)
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


def _want(ctx: PlanningContext, c: DeviceClass, tp: int, graded: bool) -> int:
    """The tp a mixed rule asks of class ``c``'s stages: ``tp``, times the type's :func:`speed_grade` when graded."""
    return tp * (speed_grade(ctx.classes[0].gpu, c.gpu, ctx.job.precision) if graded else 1)


def _thin(acts: list[Action], n: int) -> list[Action]:
    if len(acts) <= n:
        return acts
    idx = np.linspace(0, len(acts) - 1, n).round().astype(int)
    return [acts[i] for i in sorted(set(idx))]
