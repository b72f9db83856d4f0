"""What the seed family (:mod:`.seeds`) covers: the GPU types and class subsets it starts from, the type the batch
shares best over, the depths it tries, and whether a depth can hold the model's state."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import combinations

from arachne.cost import Estimate
from arachne.cost.memory import state_bytes_per_param
from arachne.plan import Plan
from arachne.planners.arachne.actions import STAGE_COUNTS
from arachne.planners.arachne.completion.place import cap_replicas
from arachne.planners.arachne.context import PlanningContext
from arachne.planners.arachne.template import (
    Group,
    Slot,
    Template,
    ep_options,
    slot_fits_nodes,
    tp_fits_node,
    tp_options,
)

EQUAL_SHARE_SUBSETS = 2
"""Class subsets whose GPUs divide the batch evenly, seeded as one data-parallel stage (:func:`equal_share_subsets`)."""
EQUAL_SHARE_TYPES = 2
"""GPU types seeded first, in one stage (at tp 1 or the tp :func:`spare_tps` gives), by :func:`equal_share_types`'
quick guess: the guess ranks a type whose gradient sync crosses nodes too slow (fresh hold-out seed88/rob-023,
LLaMA-3-8B at a batch of 32: 16 A800 in two nodes guessed 0.94 s, priced 0.29 s; 8 A100 in one node guessed 0.66 s,
priced 0.50 s), so the best two are priced, the second only within :data:`EQUAL_SHARE_BAND` of the first."""
EQUAL_SHARE_BAND = 1.5
"""How much slower than the first the guess may put the second type seeded first: its seed costs the family's
other seeds time (at 1.62x and 1.69x, odd112/rob-018 and the grid's hopper-ampere-512/DeepSeek-MoE-16B lost 7% and
4% of their plans to it; rob-023's A800 were at 1.43x). Tuned on those three cases."""
EQUAL_SHARE_CLASSES = 10
"""The fastest classes those subsets are drawn from (2^10 subsets at most)."""


def gpu_types(ctx: PlanningContext) -> dict[str, list[int]]:
    """The device classes of each GPU type (a type over several node sizes has several), in class order."""
    types: dict[str, list[int]] = {}
    for c in ctx.classes:
        types.setdefault(c.gpu.name, []).append(c.index)
    return types


def class_subsets(ctx: PlanningContext, first: set[str] | None = None) -> list[tuple[int, ...]]:
    """Device classes planned together: the GPU types in ``first`` (the incumbent plan's types, when not all of
    them), then all classes, then each GPU type's classes alone (fastest type first)."""
    every = tuple(c.index for c in ctx.classes)
    types = gpu_types(ctx)
    out = [every] + [tuple(v) for v in types.values() if len(types) > 1]
    lead = tuple(c.index for c in ctx.classes if first and c.gpu.name in first)
    return list(dict.fromkeys([lead] + out)) if lead else out


def uniform_nodes(ctx: PlanningContext) -> tuple[tuple[int, ...], int] | None:
    """The classes on the node size that holds the most GPUs (ties: the larger size), and that size, when they are
    of several GPU types: the largest uniform sub-cluster, over which ``megatron-oblivious`` runs its grid as if
    its GPUs were of one type (docs/baselines.md, H-b); None when one type has them all."""
    nodes: dict[int, set[str]] = {}
    for c in ctx.classes:
        for name in c.nodes:
            nodes.setdefault(ctx.cluster.node_by_name[name].num_gpus, set()).add(name)
    size = max(nodes, key=lambda k: (k * len(nodes[k]), k))
    sub = tuple(c.index for c in ctx.classes if all(ctx.cluster.node_by_name[n].num_gpus == size for n in c.nodes))
    return (sub, size) if len({ctx.classes[i].gpu.name for i in sub}) > 1 else None


def equal_share_subsets(ctx: PlanningContext, known: list[tuple[int, ...]],
                        count: int = EQUAL_SHARE_SUBSETS) -> list[tuple[int, ...]]:
    """Class subsets whose GPUs divide the batch, so that one data-parallel stage over them gives every GPU the
    same number of sequences (as ``megatron-oblivious`` runs it over the GPUs it picks), not in ``known``: the
    ``count`` with the most GPUs times their slowest GPU's peak rate (lock-step, the slowest sets the pace).
    The prefixes by type of :func:`class_subsets` rarely divide the batch: 12 L40S and a 4-GPU H20 node do (32
    sequences, 2 per GPU), 12 L40S and both H20 nodes do not. Only over the :data:`EQUAL_SHARE_CLASSES` fastest
    classes (the subsets are enumerated)."""
    gbs, precision = ctx.job.global_batch_size, ctx.job.precision
    fast = sorted(ctx.classes, key=lambda c: -c.gpu.peak_flops(precision))[:EQUAL_SHARE_CLASSES]
    seen, ranked = set(map(frozenset, known)), []
    for r in range(1, len(fast) + 1):
        for sub in combinations(fast, r):
            n = sum(c.count for c in sub)
            if n > 1 and gbs % n == 0 and frozenset(c.index for c in sub) not in seen:
                ranked.append((-n * min(c.gpu.peak_flops(precision) for c in sub), n,
                               tuple(sorted(c.index for c in sub))))
    return [sub for _, _, sub in sorted(ranked)[:count]]


def share_time(ctx: PlanningContext, classes: Sequence[int], n: int, tp: int, stages: int, ep: int) -> float:
    """The depth rule's quick guess of an iteration with the batch shared evenly over ``n`` replicas of a ``stages``
    x ``tp`` pipeline on ``classes`` (their nodes filled in order): the first class's profile for a replica's
    sequences, one stage's share of the layers, plus a stage's gradient all-reduce over the nodes its replicas
    take, each node's replicas counted as rings sharing its NIC (sync.py counts tp rings: a coarser guess, kept
    as the type-first seed was measured with it; the lock-step class is priced, :func:`lockstep_class`)."""
    gbs, L = ctx.job.global_batch_size, ctx.model.num_layers
    grad_b = 4.0 if ctx.job.precision == "fp32" else 2.0
    nodes: dict[str, int] = {}
    for i in classes:
        per = max(1, ctx.classes[i].node_size // tp)
        for node in ctx.classes[i].nodes:
            if sum(nodes.values()) < n:
                nodes[node] = min(per, n - sum(nodes.values()))
    prof = ctx.slot_profile(classes[0], tp, 1, ep, 1, 1, n, False)
    return gbs // n * prof.time(0, L, True, True) / stages + ctx.cost_model.network.ring_all_reduce_time(
        n, nodes, ctx.model.num_params * grad_b / (stages * tp), max(nodes.values()))


def spare_tps(ctx: PlanningContext, classes: Sequence[int]) -> list[tuple[int, int, tuple[int, ...]]]:
    """(tp, replicas, classes) at which a GPU type (``classes``) shares the batch evenly: tp 1 with the most replicas
    whose number divides the batch, and each wider tp inside its nodes that keeps that many replicas (the batch caps
    them; the GPUs it leaves idle at tp 1 go to tp: Megatron's grid runs Qwen3-30B-A3B at a batch of 32 on 128
    A800 at tp 4 x dp 32, not on 32 of them at tp 1), each on the type's classes whose nodes hold it."""
    gbs = ctx.job.global_batch_size
    out: list[tuple[int, int, tuple[int, ...]]] = []
    for tp in tp_options(ctx.model, max(ctx.classes[i].node_size for i in classes)):
        fit = tuple(i for i in classes if tp_fits_node(tp, ctx.classes[i].node_size))
        n = max((d for d in range(1, sum(ctx.classes[i].count for i in fit) // tp + 1) if gbs % d == 0), default=0)
        if n and (not out or n == out[0][1]):
            out.append((tp, n, fit))
    return out


def equal_share_types(ctx: PlanningContext, guesses: bool = False) -> list:
    """The classes of each GPU type that holds the model in one stage, fastest first by how fast it trains with the
    batch shared evenly over its GPUs so: the most of them whose number divides the batch, at tp 1 or at a wider tp
    that puts the GPUs the batch leaves idle to work (:func:`spare_tps`), each its share of sequences (the depth
    rule's quick guess: its first class's profile, one sequence at a time) and the gradients all-reduced over
    their nodes (``guesses``: as (classes, guessed seconds, tp) triples, the tp guessed fastest). The family
    reaches a type alone only after the incumbent's types and all classes together, at every tp and depth; on a
    large cluster of many types its time can run out first, while Megatron's grid over that type (data parallel
    over 32 of 40 H100 for a batch of 128, a fresh hold-out) is the plan to beat."""
    ep = ep_options(ctx.model, 1)[-1]
    ranked = []
    for v in gpu_types(ctx).values():
        held = [(share_time(ctx, fit, n, tp, 1, ep), tp) for tp, n, fit in spare_tps(ctx, v)
                if holds_state(ctx, tuple(v), tp, 1)]
        if held:
            t, tp = min(held)
            ranked.append((tuple(v), t, tp))
    ranked.sort(key=lambda x: x[1])
    return ranked if guesses else [v for v, _, _ in ranked]


def equal_share_seeded(ctx: PlanningContext) -> list[tuple[tuple[int, ...], int]]:
    """(classes, tp) of the types :func:`equal_share_types` seeds first, at the tp it guessed fastest: the best, and
    up to :data:`EQUAL_SHARE_TYPES` in all whose guess is within :data:`EQUAL_SHARE_BAND` of the best's."""
    ranked = equal_share_types(ctx, guesses=True)  # (each guess once: the work clock counts its profile calls)
    return [(v, tp) for v, t, tp in ranked[:EQUAL_SHARE_TYPES] if t <= EQUAL_SHARE_BAND * ranked[0][1]]


def equal_share_type(ctx: PlanningContext) -> tuple[int, ...] | None:
    """The first of :func:`equal_share_types` (None: no type holds the model in one stage)."""
    return next(iter(equal_share_types(ctx)), None)


def pools(ctx: PlanningContext, subset: tuple[int, ...], tp: int) -> list[tuple[int, int]]:
    """(first class, GPUs) per GPU type of ``subset``: the type's classes whose nodes hold ``tp`` GPUs, as one pool
    (a type split across node sizes, 142 H200 in nodes of 5 and 8, makes one set of identical pipelines)."""
    out: dict[str, tuple[int, int]] = {}
    for i in subset:
        c = ctx.classes[i]
        if tp_fits_node(tp, c.node_size):
            first, n = out.get(c.gpu.name, (i, 0))
            out[c.gpu.name] = (first, n + c.count)
    return list(out.values())


def class_pinned(ctx: PlanningContext, tpl: Template) -> list[Template]:
    """A template of one group of one-stage pipelines drawing from a GPU type's pooled classes (:func:`pools`),
    fewer pipelines than the pool holds (the batch capped them: :func:`~.seeds.batch_shares`), also on each later
    class of the type with more NIC bandwidth per GPU, alone, as many as it holds up to that number and the batch
    divides. The pool takes its first class first, whose nodes may be the worse ones for the gradient sync: re-run
    odd110/rob-004 (GPT-Neo-2.7B, a batch of 16) put 16 tp-2 replicas on A100 nodes of 8 at 6.25 GB/s per node,
    where Megatron's grid runs them on A100 nodes of 2 with their own NICs (1.31x faster); re-run seed33/rob-019
    (GPT-3-1.3B, a batch of 64): the pool's 32 replicas took 16 A100 in nodes of 8 first, Megatron's grid ran 16
    on the 20 in nodes of 2 (1.14x). The seed family prices them after the template's other forms."""
    if len(tpl.groups) != 1 or len(tpl.groups[0].slots) != 1:  # one stage: the replicas' sync is what matters
        return []
    (s,), replicas = tpl.groups[0].slots, tpl.groups[0].replicas
    if not s.pool or s.span:
        return []
    first, gbs = ctx.classes[s.cls], ctx.job.global_batch_size
    out = []
    for j, _, size in first.kin:
        if j <= first.index or ctx.classes[j].inter_node_bw / size <= first.inter_node_bw / first.node_size or \
                not slot_fits_nodes(s.gpus, size):
            continue
        reps = next((d for d in range(min(replicas, ctx.classes[j].count // s.gpus), 0, -1) if gbs % d == 0), 0)
        if reps:
            out.append(Template((Group((Slot(j, s.tp, s.dp, s.ep),), reps),)))
    return out


def lockstep_dp(ctx: PlanningContext, cls: int, tp: int, stages: int) -> int:
    """The data-parallel degree of a lock-step pipeline of ``stages`` x ``tp`` GPUs on device class ``cls``: the
    most replicas that divide the batch and pack into the class's nodes (1: none). One class: placement takes
    a slot's GPUs from one class, so a lock-step stage cannot span a type's node sizes."""
    c, gbs = ctx.classes[cls], ctx.job.global_batch_size
    return next((d for d in range(c.count // (stages * tp), 1, -1)
                 if gbs % d == 0 and slot_fits_nodes(tp * d, c.node_size)), 1)


def gpus_used(ctx: PlanningContext, subset: tuple[int, ...], tp: int, stages: int) -> int:
    """GPUs of ``subset`` that :func:`uniform_template` puts to work at (``tp``, ``stages``)."""
    return sum(n // (stages * tp) * stages * tp for _, n in pools(ctx, subset, tp))


def holds_state(ctx: PlanningContext, subset: tuple[int, ...], tp: int, stages: int,
                experts_sharded: bool = True) -> bool:
    """A necessary condition for the family's templates to fit: some type's pipeline holds the weights and
    gradients of every layer (ZeRO-1 shards only the optimizer state; an MoE model's routed experts are sharded
    as :func:`lockstep_template` shards them, unless not ``experts_sharded``) within its GPUs' memory; shallower
    depths of a large model are skipped without completing them."""
    w, g, _ = state_bytes_per_param(ctx.job.precision, ctx.cost_model.cal.memory)
    model = ctx.model
    routed = sum(model.block_expert_params(i) for i in range(model.num_layers)) if experts_sharded else 0

    def need(first: int, n: int) -> float:  # an MoE model's routed experts over the largest ep allowed lock-step
        ep = max(ep_options(model, lockstep_dp(ctx, first, tp, stages))) if routed else 1
        return (model.num_params - routed + routed / ep) * (w + g)

    return any(stages * tp * ctx.classes[first].gpu.memory_bytes >= need(first, n)
               for first, n in pools(ctx, subset, tp) if n >= stages * tp)


def seed_depths(num_layers: int) -> tuple[int, ...]:
    """The depths the family tries, shallowest first: :data:`STAGE_COUNTS`, then two layers and one layer per stage
    (a model that fits no depth up to 32 on a type: Qwen3-235B's 94 blocks on 103 single-GPU H100 nodes train as
    Megatron's grid runs them, one block per stage)."""
    deep = (-(-num_layers // 2), num_layers)
    return tuple(sorted(set(STAGE_COUNTS) | {d for d in deep if d > STAGE_COUNTS[-1]}))


def next_depth(ctx: PlanningContext, subset: tuple[int, ...], tp: int, first: int) -> int | None:
    """The depth after the shallowest that fits (``first``), up to twice as deep, that leaves the fewest GPUs idle
    (ties: the shallower): 142 GPUs of one type make 10 pipelines of 14 stages, not 11 of 12."""
    deeper = range(first + 1, min(ctx.model.num_layers, 2 * first) + 1)
    best = max(deeper, key=lambda S: (gpus_used(ctx, subset, tp, S), -S), default=None)
    return best if best is not None and gpus_used(ctx, subset, tp, best) > 0 else None


def deeper_divisor(num_layers: int, depth: int) -> int | None:
    """The shallowest depth of :func:`seed_depths` deeper than ``depth``, at most twice as deep, that divides the
    blocks evenly (as Megatron's pipelines split them), or None: 28 blocks go 1, 2, 4 and stop; DeepSeek-V3's 61 have
    no second step (a 61-stage form over 488 GPUs took the seeds' last time on seed95/rob-019, 1.000x -> 0.718x)."""
    return next((d for d in seed_depths(num_layers) if depth < d <= 2 * depth and num_layers % d == 0), None)


FILL_IDLE = 0.25  # a lock-step form leaving this share of its class idle is also priced at the depth that fills it


def lockstep_fill_depth(ctx: PlanningContext, cls: int, tp: int, first: int) -> int | None:
    """A lock-step pipeline's depth after ``first`` (up to four times as deep) whose data parallelism puts the most
    of class ``cls`` to work (ties: the shallower), where at ``first`` more than :data:`FILL_IDLE` of it idles: its
    dp must divide the batch, so 104 GH200 run one stage of dp 64, or three of dp 32 (Megatron's grid on seed89/
    rob-003), which the walk one depth at a time does not reach in its time. None where nothing fills more."""
    def used(S: int) -> int:
        d = lockstep_dp(ctx, cls, tp, S)
        return d * S * tp if d > 1 else 0

    n = ctx.classes[cls].count
    if used(first) >= (1 - FILL_IDLE) * n:
        return None
    best = max(range(first + 1, min(ctx.model.num_layers, 4 * first) + 1), key=lambda S: (used(S), -S), default=None)
    return best if best is not None and used(best) > used(first) else None


def alone(found: Sequence[tuple[Plan, Estimate]], cluster, score: Callable[[Estimate], float]) -> Plan | None:
    """The best plan of ``found`` by ``score`` (lower is better) that runs on one GPU type; None without one: where
    the incumbent is mixed, the seeds' second walk starts from its type (decision 0040)."""
    one = [r for r in found if len({cluster.devices[d].gpu.name for d in r[0].devices}) == 1]
    return min(one, key=lambda r: score(r[1]))[0] if one else None


def incumbent_shape(plan: Plan, types: set[str], tps: set[int]) -> tuple[int, int] | None:
    """(depth, tp) of the incumbent ``plan`` where it runs on one GPU type (``types``) at one tp (``tps``): its
    deepest pipeline's stage count; None otherwise."""
    if len(types) != 1 or len(tps) != 1:
        return None
    return max(len(p.stages) for p in plan.pipelines), min(tps)


def around_incumbent(ctx: PlanningContext, subset: tuple[int, ...], depth: int, tp: int,
                     same_gpus_first: bool = False) -> list[tuple[int, int]]:
    """(tp, depth) pairs of the framework's grid next to the incumbent's pipelines of ``depth`` stages of ``tp`` GPUs
    on the GPU type ``subset``: twice the tp at its depth; half the tp at twice its depth (the same replicas on the
    same GPUs: fresh hold-out seed199/rob-013, LLaMA-2-70B on 81 GH200 nodes of 4, where Megatron's grid runs 80
    stages of tp 2 x dp 2 and arachne's incumbent was 2 pipelines of 40 stages of tp 4); half the tp at its depth;
    half its depth at its tp (twice the replicas); twice the tp at half its depth (the same GPUs again). Each but
    the same-GPU ones also at its :func:`next_depth` (the one that fills the type) unless that is the
    incumbent's; a pair once.
    Refinement walks from the incumbent one action at a time and on a large cluster can run out of time before a
    second step; these are two steps away (tp up and the replicas down; an MoE model's lock-step form with its
    experts narrower), and the shallow-first walk reaches them last (decision 0028). None at the walk's first two
    depths. ``same_gpus_first`` (the second search's order, decision 0047): twice the tp at half the depth first,
    and at its next depth (seed195/rob-011: from 2 pipelines of 32 stages of tp 4 on 320 H200, 2 of 20 of tp 8),
    then half the tp at twice the depth, then the others."""
    if depth <= seed_depths(ctx.model.num_layers)[1]:
        return []  # the walk starts there
    node = min(ctx.classes[i].node_size for i in subset)
    out: list[tuple[int, int]] = []
    steps = ((2 * tp, depth, True), (tp // 2, 2 * depth, False), (tp // 2, depth, True), (tp, depth // 2, True),
             (2 * tp, depth // 2, False))
    if same_gpus_first:
        steps = ((2 * tp, depth // 2, True),) + steps[1:2] + steps[0:1] + steps[2:4]
    for t, S, also in steps:
        if t in tp_options(ctx.model, node) and 0 < S <= ctx.model.num_layers and holds_state(ctx, subset, t, S):
            deeper = next_depth(ctx, subset, t, S) if also else None
            out += [(t, S)] + ([(t, deeper)] if deeper is not None and (t, deeper) != (tp, depth) else [])
    return list(dict.fromkeys(out))


def tp_order(ctx: PlanningContext, subset: tuple[int, ...], options: Sequence[int], first: set[int] | None,
             multiple: int = 1) -> list[int]:
    """The tp degrees the family walks, the incumbent's (``first``) first: ascending (the fewest collectives
    first) from the smallest whose one stage holds the model's weights and gradients, then the smaller ones
    descending (their shallowest depths are pipelines, whose seeds cost the most and are rarely the fastest: fresh
    hold-out seed89/rob-010, LLaMA-3-70B on 152 H100, spent the family's time on tp 1 and 2 and never reached
    Megatron's one stage of tp 8 x dp 16); with cp (``multiple``) descending: at long sequences the widest groups
    are the likeliest to fit, and each depth that does not costs a completion."""
    flat = [t for t in options if holds_state(ctx, subset, t, 1)]
    lo = min(flat) if flat else max(options)

    def key(t: int) -> tuple:
        return (t not in (first or ()), -t) if multiple > 1 else (t not in (first or ()), t < lo, abs(t - lo))
    return sorted(options, key=key)


def batch_shares(tpl: Template, gbs: int, multiple: int = 1) -> list[Template]:
    """``tpl`` with as many pipelines as divide the batch evenly (first: Megatron's data parallelism must divide
    it: 192 of 204 replicas for a batch of 384), then as it is; ``multiple``: pipeline counts a multiple of it
    only (the context-parallel seeds merge that many)."""
    n = sum(g.replicas for g in tpl.groups)
    counts = [r for r in range(multiple, n + 1, multiple) if gbs % r == 0]
    if not counts:
        return []
    even = max(counts)
    if multiple > 1:
        return [cap_replicas(tpl, r) for r in dict.fromkeys([even, n - n % multiple])]
    return [cap_replicas(tpl, even), tpl] if even < n else [tpl]


def mixed_template(ctx: PlanningContext, subset: tuple[int, ...], tp: int, stages: int) -> Template | None:
    """The type-oblivious grid's structure: as many replicas as possible of one pipeline of ``stages`` stages of
    ``tp`` GPUs over every GPU type of ``subset``, each type serving consecutive stages in proportion to its GPUs
    (the first types first); None with fewer than two types in it (:func:`uniform_template` is that)."""
    pl = pools(ctx, subset, tp)
    if len(pl) < 2:
        return None
    for reps in range(sum(n for _, n in pl) // (stages * tp), 0, -1):
        ks = [n // (reps * tp) for _, n in pl]
        if sum(ks) < stages:
            continue
        left, take = stages, []
        for k in ks:
            take.append(min(k, left))
            left -= take[-1]
        used = [(first, k) for (first, _), k in zip(pl, take) if k]
        if len(used) < 2:
            return None
        slots = tuple(Slot(first, tp, pool=sum(n for f, n in pl if f == first) > ctx.classes[first].count)
                      for first, k in used for _ in range(k))
        tpl = Template((Group(slots, reps),))
        return tpl if tpl.fits_counts(ctx.classes) else None
    return None


def fastest(found: Sequence[tuple[Plan, Estimate]]) -> float:
    """The best throughput among priced plans (0 when none)."""
    return max((e.tokens_per_s for _, e in found), default=0.0)


def recompute_share(est: Estimate) -> float:
    """The share of a priced plan's step spent recomputing activations."""
    return est.breakdown.get("recompute_s", 0.0) / est.iteration_time_s


def unrecomputed(found: Sequence[tuple[Plan, Estimate]]) -> float:
    """The best throughput among priced plans with their recomputation's time taken off (what a depth that fits
    without it could reach at best; 0 when none)."""
    return max((e.tokens_per_s / max(1e-9, 1 - recompute_share(e)) for _, e in found), default=0.0)
