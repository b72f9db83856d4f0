"""Priced local refinement of the best template: moves per device class (stage depth, tp, replicas,
batch regrouping, tail stages, balanced stages), each priced, the best kept, for a few rounds."""

from __future__ import annotations

from dataclasses import replace

from arachne.planners.arachne.actions import (
    Action,
    State,
    class_actions,
    kin_left,
    replica_variants,
    slot_options,
)
from arachne.planners.arachne.completion.split import split_layers
from arachne.planners.arachne.context import PlanningContext
from arachne.planners.arachne.search.pricer import Pricer
from arachne.planners.arachne.template import (
    DeviceClass,
    pool_classes,
)
from arachne.planners.protocol import Deadline
from arachne.spec.model import ModelSpec

TAIL_SHARE = 0.2  # of refinement's time, for screening tail stages on the start (large pools cost the most)
TAIL_SLACK = 0.95  # a deep tail screened within this share of the best is priced (screens try fastest-first


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
        # the time before a used class's regrouping:
        # test_refinement_regroups_a_wide_tp_group_before_trying_unused_classes)
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
    each next to single A100s at 2)."""
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
        targets = sorted({_pooled(ctx, State(R, st.actions[:ci]), ctx.classes[ci], a.tp * a.dp, a.tp)
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
                avail = have if have >= R2 * g else _pooled(ctx, prefix, c, g, a.tp)
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


SPANNING_GAIN = 1.02
""":func:`spanning_dropped`'s move is priced only where its screen (a lower bound of its price) beats the incumbent by
this much: the price of a large mixed pipeline is a share of what the seeds and the knobs get (seed98/rob-023:
0.06 s of work for 0.7%, and the knobs then lifted the plan 6.8% less)."""


def spanning_dropped(ctx: PlanningContext, st: State) -> list[State]:
    """``st``'s mixed group without every class whose stage replicas span nodes (``R`` x tp x dp GPUs past its node
    size, or pooled with its kin), where two or more classes stay: such a stage's gradient all-reduce crosses the
    NIC while the others' stay inside a node, and it holds every replica back. All at once: without one of them
    the other still sets the pace (fresh hold-out seed158/rob-025, LLaMA-2-7B on 383 GPUs: 8 replicas of 24
    stages over H200 and H100 nodes of 8, GH200 nodes of 4 and A100 stages of tp 4 exposed 29 ms of gradient
    sync; the 16 H200 and H100 stages alone, 4 ms). The planner prices it once after refinement, screened first
    (:data:`SPANNING_GAIN`); as a refinement move it changed which local optimum refinement reached, 6.9% lower on
    seed96/rob-003."""
    R = st.mix_replicas
    mix = [ci for ci, a in enumerate(st.actions) if a.kind == "mix"]
    if R < 2 or len(mix) < 3:
        return []
    span = [ci for ci in mix if R * st.actions[ci].tp * st.actions[ci].dp > ctx.classes[ci].node_size
            or st.actions[ci].pool]
    if not span or len(mix) - len(span) < 2:
        return []
    return [State(R, tuple(Action("skip") if ci in span else a for ci, a in enumerate(st.actions)))]


def _pooled(ctx: PlanningContext, prefix: State, c: DeviceClass, g: int, tp: int) -> int:
    """GPUs a mixed slot of ``g`` GPUs in tp groups of ``tp`` of class ``c`` can have after ``prefix``: its own,
    then its kin's."""
    if len(c.kin) < 2:
        return c.count
    left = kin_left(prefix, c)
    return left[c.index] + sum(left[j] for j in pool_classes(c, g, tp))


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
