"""Seed candidates: the structures a framework's own grid prices, completed the way that framework runs them.

The search prices version-1 plans (no overlap of the gradient reduction) and gives the formats-v2 knobs only to
the fastest few of them (:mod:`.completion.modern`). A data-parallel-heavy plan loses that race: without
overlap its gradient all-reduce is all exposed, so deeper pipelines rank first, although with overlap and a few
large micro-batches per replica (a long last backward to hide the reduction behind) the shallow plan is the
fastest. Megatron's grid over all GPUs (``megatron-oblivious``: 16 GPUs of two types at tp 1, pp 1, dp 16, two
micro-batches of four sequences each, partial recomputation) beat the search by 6% on a 16-GPU cluster and by
25% on 512 GPUs that way.

So the planner always prices, within a small share of its target on the work clock, the uniform grid family:
the same (tp, pipeline depth) on every GPU type together (each type its own pipelines, a type split across node
sizes pooled) and on each type alone, starting from the incumbent plan's types and tp degrees, at the
shallowest depth that fits and the next depth that leaves the fewest GPUs idle (deeper again while that is
faster), with as many pipelines as divide the batch (Megatron's dp must) and as many as fit, at the largest
micro-batch sizes and the fastest by the completion's time model, the batch shared by the completion's rule and
evenly, also in Megatron's lock-step form (one pipeline whose stages are data parallel over all replicas; an MoE
model's built as one with its experts parallel, and at several expert-parallel degrees), each with the gradient
reduction overlapped. The best few then get the knobs (:func:`~.completion.modern.modernize`: per-stage
recomputation, ZeRO, ...). The work clock counts every estimate, layer split and placement."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from arachne.cost import Estimate
from arachne.plan import Plan
from arachne.planners.arachne.actions import STAGE_COUNTS  # noqa: F401 (re-exported)
from arachne.planners.arachne.completion.batch import mbs_candidates
from arachne.planners.arachne.completion.modern import LONG_SEQUENCE
from arachne.planners.arachne.completion.place import cap_replicas
from arachne.planners.arachne.completion.plan_edits import recomputes
from arachne.planners.arachne.completion.price import (
    ALT_WITHIN,
    P2P_SHARE,
    build_plan,
    split_and_share,
)
from arachne.planners.arachne.context import PlanningContext
from arachne.planners.arachne.long_context import cp_seed_plans, long_sequence
from arachne.planners.arachne.options import TimeShares
from arachne.planners.arachne.rules_view import planner_rules, template_ok
from arachne.planners.arachne.scale_out import SCALE_OUT_SHARE, scale_out_plans, starved, with_grid
from arachne.planners.arachne.search.rules import much_slower_networks
from arachne.planners.arachne.seed_forms import (  # noqa: F401 (layout_key re-exported)
    even_counts,
    expert_parallel_forms,
    layout_key,
    merged,
    overlapped,
    sharded,
)
from arachne.planners.arachne.seed_knobs import (  # noqa: F401 (re-exported)
    SEED_ESTIMATES,
    SEED_FASTEST,
    SEED_TOP,
    Priced,
    seed_knobs,
)
from arachne.planners.arachne.seed_scope import (  # noqa: F401 (re-exported: tests and callers read them here)
    EQUAL_SHARE_BAND,
    EQUAL_SHARE_CLASSES,
    EQUAL_SHARE_SUBSETS,
    EQUAL_SHARE_TYPES,
    alone,
    around_incumbent,
    batch_shares,
    class_pinned,
    class_subsets,
    deeper_divisor,
    equal_share_seeded,
    equal_share_subsets,
    equal_share_type,
    equal_share_types,
    fastest,
    gpu_types,
    gpus_used,
    holds_state,
    incumbent_shape,
    lockstep_dp,
    lockstep_fill_depth,
    mixed_template,
    next_depth,
    pools,
    recompute_share,
    seed_depths,
    share_time,
    spare_tps,
    tp_order,
    uniform_nodes,
    unrecomputed,
)
from arachne.planners.arachne.seed_sizes import SEED_SIZES, placed_once, quick_time, seed_sizes  # noqa: F401
from arachne.planners.arachne.seed_templates import (  # noqa: F401 (re-exported)
    MIXED_LOCKSTEP_DEGREES,
    mixed_lockstep_templates,
    spanning_lockstep_templates,
)
from arachne.planners.arachne.template import (
    Group,
    Slot,
    Template,
    ep_options,
    tp_fits_node,
    tp_options,
)
from arachne.planners.protocol import Deadline
from arachne.spec.runtimes import Legality

SEED_SHARE = TimeShares.seed_share
"""The seeds' work (completion, pricing and their knobs), as a share of the planner's target on its clock."""
LONG_SEED_SHARE = 0.3
"""The same for sequences of :data:`~.completion.modern.LONG_SEQUENCE` tokens or more, where half of it goes to
the context-parallel family (:mod:`.long_context`): the search has no cp."""
PRICED_SEED_SHARE = 0.3
"""The same under an objective that prices GPUs (``--objective cost``, a cost limit), on the whole cluster and on
each sub-cluster it is also planned on: the cheapest plans per token are the framework's own grid on one GPU type
at a depth and tp that divide its GPUs well, leaving the rest idle, which is what the family prices; the search
aims at using every GPU. At 0.08 the family reached only tp 1 on the grid's 192 H100 of hopper-ampere-512
(Mixtral-8x22B), where Megatron's tp 2 x 8 stages cost 1.6% less per token than arachne's cost plan."""
SEED_WALK = 0.7
"""Of the seeds' share, the uniform family's walk (the rest: the knobs on the best seeds)."""
ALONE_SHARE = 0.5
"""Where the incumbent runs on several GPU types, in the run's last pass: the walk from the best one-type plan's
type, and the knobs on its fastest seed, each on a clock of its own, as this share of the first walk's and of its
knobs' time (decision 0040: the first walk and its knobs keep all of theirs; halved, the replays lost the mixed
seed re-run odd104-rerun/rob-019 wins with, 1.207x -> 0.824x; in the base pass too, the extension's time went to
it, seed0-rerun/rob-022 1.379x -> 1.281x; its seeds among the first walk's knob starts displaced the one fresh
hold-out seed163/rob-003 wins from, 1.685x -> 1.020x)."""
SEED_DEPTHS = 2
"""Pipeline depths per (class subset, tp): the shallowest that completes, and (2) :func:`next_depth`; deeper again
(each :func:`next_depth` of the last) while the deeper depth prices faster."""
NODES_TPS = 2
"""The tp degrees the largest uniform sub-cluster is seeded at (:func:`uniform_nodes`, ``seed_plans``' nodes pass)."""
AROUND_SHARE = 0.5
"""Of the seed family's time left after the incumbent's own tp, at most, for the grid next to the incumbent
(:func:`~.seed_scope.around_incumbent`): it must not starve the walk (decision 0028)."""
IN_NODES_RATIO = 32.0
"""An MoE model's pipeline with every stage inside one node (:func:`~.seed_templates.mixed_lockstep_templates`,
``in_nodes``) is seeded first where the uniform nodes' own links are this many times faster than their NICs (a
catalog GPU on its default network: 7-12; on 10 Gb Ethernet: 190-290): there the experts' all-to-alls across nodes
cost more than the pipeline's bubble, and the walk, shallowest first, does not reach that depth in its time."""
FEWER_REPLICAS_SYNC = 0.25
"""The type-first seed is priced with half its replicas only while its exposed gradient sync is at least this share
of its compute time: halving doubles a replica's work, which only a large exposed sync can repay (a gate: the
fresh hold-out it was added for had 0.68, the two stored cases that an ungated halving cost work, 0.00)."""



def uniform_template(ctx: PlanningContext, subset: tuple[int, ...], tp: int, stages: int) -> Template | None:
    """Every GPU type of ``subset`` in pipelines of ``stages`` stages of ``tp`` GPUs, as many as it holds, a type
    over several classes pooled (:func:`pools`); None when no type holds one."""
    groups = []
    for first, n in pools(ctx, subset, tp):
        reps = n // (stages * tp)
        if reps:
            pooled = n > ctx.classes[first].count
            groups.append(Group((Slot(first, tp, pool=pooled),) * stages, reps))
    tpl = Template(tuple(groups))
    return tpl if groups and tpl.fits_counts(ctx.classes) else None


def lockstep_template(ctx: PlanningContext, subset: tuple[int, ...], tp: int, stages: int,
                      priced: dict | None = None) -> Template | None:
    """An MoE model's Megatron form built as one: per GPU type of ``subset``, one pipeline of ``stages`` stages of
    ``tp`` GPUs on one class of the type (:func:`lockstep_class`; ``priced`` its cache) whose stages are data parallel
    over as many replicas as divide the batch (and pack into nodes, :func:`lockstep_dp`), the experts parallel over
    the largest degree allowed: a depth that fits only
    with the experts sharded (DeepSeek-MoE-16B's 16 GB of weights on 32 GB parts at one stage) is built here, not at ep
    1 and then converted (:func:`expert_parallel_forms` prices the smaller degrees). None for a dense model or where no
    type holds one."""
    if not ctx.model.is_moe:
        return None
    groups = []
    for first, _ in pools(ctx, subset, tp):
        kin = [i for i in subset if ctx.classes[i].gpu.name == ctx.classes[first].gpu.name
               and tp_fits_node(tp, ctx.classes[i].node_size) and lockstep_dp(ctx, i, tp, stages) > 1]
        if kin:  # a type over node sizes: the class whose lock-step form prices fastest
            first = lockstep_class(ctx, kin, tp, stages, priced)
        dp = lockstep_dp(ctx, first, tp, stages)
        if dp > 1:
            ep = max(ep_options(ctx.model, dp))
            groups.append(Group((Slot(first, tp, dp=dp, ep=ep),) * stages, 1))
    tpl = Template(tuple(groups))
    return tpl if groups and tpl.fits_counts(ctx.classes) else None




def lockstep_class(ctx: PlanningContext, kin: list[int], tp: int, stages: int, priced: dict | None = None) -> int:
    """Of a GPU type's classes ``kin`` (its node sizes), the one whose lock-step form (:func:`lockstep_template`)
    prices fastest at its largest micro-batch, the first on a tie; ``priced``: a cache by (class, tp, stages).
    Priced, not guessed: what sets the pace is the NIC a GPU shares with its node's others, for the gradients and
    the experts' all-to-alls (fresh hold-outs: 32 H200 in nodes of 8 behind 100 Gb/s lost to 32 in nodes of 2
    behind 800 Gb/s, 0.888x; ep 64 over H100 in nodes of 2 beat it over nodes of 8 on the same NICs, 0.931x)."""
    if len(kin) == 1:
        return kin[0]
    cache = {} if priced is None else priced

    def speed(i: int) -> float:
        if (i, tp, stages) not in cache:
            d = lockstep_dp(ctx, i, tp, stages)
            t = Template((Group((Slot(i, tp, dp=d, ep=max(ep_options(ctx.model, d))),) * stages, 1),))
            sizes = mbs_candidates(t, ctx.job)
            cache[i, tp, stages] = max((e.tokens_per_s for _, e in complete_seed(
                t, ctx, max(sizes), lambda _p: True)), default=0.0) if sizes else 0.0
        return cache[i, tp, stages]

    return max(kin, key=lambda i: (speed(i), -kin.index(i)))


def complete_seed(tpl: Template, ctx: PlanningContext, mbs: int, ok: Callable[[Plan], bool],
                  cache: dict | None = None, deadline: Deadline | None = None,
                  convert: Callable[[Plan], Plan | None] | None = None) -> list[Priced]:
    """``tpl`` at micro-batch size ``mbs``, without recomputation or (if nothing fits without) with it, the batch
    shared by the completion's rule and evenly on each placement, and evenly in Megatron's lock-step form
    (:func:`merged`; an MoE model's also at the expert-parallel degrees of :func:`expert_parallel_forms`), each
    with the gradient reduction overlapped where the rules allow (:func:`overlapped`): every one that fits.
    ``cache``: placements by template (:func:`~.seed_sizes.placed_once`); no estimate once ``deadline`` expires.
    ``convert``: each plan is rewritten by it before it is priced (a proxy job's plan as the real job's,
    :mod:`.long_context`; None: not a candidate)."""
    cm = ctx.cost_model
    t = cap_replicas(tpl, ctx.job.global_batch_size // mbs)
    lays = placed_once(t, ctx, {} if cache is None else cache)
    if not lays:
        return []

    def forms(recompute: bool, splits: list, counts: list[int]) -> list[Plan | None]:
        even = even_counts(counts)
        plans: list[Plan | None] = []
        for lay in lays:  # pipeline order, and stage order (a stage's replicas share nodes: a cheap reduction)
            if even is not None:
                plans.append(build_plan(t, ctx, mbs, recompute, lay, splits, even))
            plans.append(build_plan(t, ctx, mbs, recompute, lay, splits, counts))
        # the lock-step form first (the framework's own structure; an MoE model's also with its experts
        # parallel over the replicas), then the even and rule shares
        lock = merged(plans[0]) if plans[0] is not None else None
        step = lock if lock is not None else plans[0]  # (a lock-step template's own plan is one pipeline)
        plans[0:0] = [lock] + [p for p in (expert_parallel_forms(step, ctx) if step is not None else []) if p != step]
        if convert is not None:
            plans = [convert(p) if p is not None else None for p in plans]
        return plans

    def priced(plans: list[Plan | None], only: int | None = None) -> list[tuple[int, Plan, Estimate]]:
        out = []
        for i, plan in enumerate(plans):
            if plan is None or (only is not None and i != only) or (deadline is not None and deadline.expired()):
                continue
            # overlapped where the framework allows it: never slower in the cost model (the reduction's
            # exposed part only shrinks, memory is the same), so the plain form is priced only in its place
            cand = next((c for c in (overlapped(plan), plan) if ok(c)), None)
            if cand is None:
                continue
            est = cm.estimate(cand, validate=False)
            if est.fits:
                out.append((i, cand, est))
        return out

    for recompute in (False, True):
        r = split_and_share(t, ctx, mbs, recompute, lays[0])
        if r is None:
            continue
        out = priced(forms(recompute, r[0], r[1]))
        best = max(out, key=lambda x: x[2].tokens_per_s, default=None)
        if best is not None and ctx.balance_sends and best[2].breakdown["p2p_s"] >= P2P_SHARE * \
                best[2].iteration_time_s and best[2].tokens_per_s >= ALT_WITHIN * ctx.best_tok_s:
            # blocking sends take a real share of the step of a seed near the best so far: its fastest form again
            # with the split that balances them too, as the search's completion prices it (completion/price.py)
            alt = split_and_share(t, ctx, mbs, recompute, lays[0], sends=True)
            if alt is not None and alt[0] != r[0]:
                out += priced(forms(recompute, alt[0], alt[1]), only=best[0])
        if out:
            return [(plan, est) for _, plan, est in out]
    return []


def seed_plans(ctx: PlanningContext, deadline: Deadline, legality: Legality | None = None,
               ok: Callable[[Plan], bool] = lambda _p: True, first: set[str] | None = None,
               tps: set[int] | None = None, multiple: int = 1,
               convert: Callable[[Plan], Plan | None] | None = None, mixed: bool = False,
               around: tuple[int, int] | None = None) -> list[Priced]:
    """The uniform grid family (module docstring), priced while ``deadline`` lasts: every fitting plan. Per class
    subset (:func:`class_subsets`, ``first`` the GPU types to start from) and tp (``tps`` first, then the rest
    ascending), the shallowest depth of :func:`seed_depths` that fits; then each one :func:`next_depth`, again while
    the deeper one prices faster. After the incumbent's own tp (its first subset and tp), ``around`` (the
    incumbent's (depth, tp) on one type): the grid next to it (:func:`around_incumbent`), each at its smallest
    micro-batch size, and the class subsets whose GPUs share the batch evenly (:func:`equal_share_subsets`).
    ``multiple`` and ``convert``: see :func:`batch_shares` and :func:`complete_seed`; ``mixed``: at each depth
    the type-oblivious pipeline (:func:`mixed_template`) too."""
    L = ctx.model.num_layers
    out: list[Priced] = []

    def at_depth(subset: tuple[int, ...], tp: int, S: int, until: Deadline | None = None,
                 smallest: bool = False) -> list[Priced] | None:
        # (the uniform template's merged form is priced too: over a type's node sizes its dp is the larger one)
        lock = lockstep_template(ctx, subset, tp, S, priced)
        tpls = [lock, uniform_template(ctx, subset, tp, S)]
        if lock is not None and len(lock.groups) > 1:  # each type's lock-step pipeline alone, at once (a slow
            tpls[1:1] = [Template((g,)) for g in lock.groups]  # type's replicas can cost more than they add)
        for span in spanning_lockstep_templates(ctx, subset, tp, S)[::-1]:  # (and each spanning pipeline alone)
            tpls[1:1] = [span] + [Template((g,)) for g in span.groups if len(span.groups) > 1 and g.slots[0].span]
        tpls += [mixed_template(ctx, subset, tp, S)] if mixed else []
        if all(t is None for t in tpls):
            return None
        return complete_all(tpls, smallest=smallest, until=until)

    def complete_all(tpls: list[Template | None], quick: bool = False, smallest: bool = False,
                     until: Deadline | None = None) -> list[Priced]:
        """Every template at its batch shares and micro-batch sizes (``quick``: the first share, even when one
        divides the batch, at the largest size only; ``smallest``: see :func:`seed_sizes`), while ``until`` (or
        the family's deadline) lasts."""
        stop = until or deadline
        found: list[Priced] = []
        for tpl in tpls:
            if tpl is None or (legality is not None and not template_ok(tpl, legality)):
                continue
            cache: dict = {}
            shares = batch_shares(tpl, ctx.job.global_batch_size, multiple)[:1 if quick else None]
            for t in shares + [v for t in shares if t is not tpl for v in class_pinned(ctx, t)]:
                sizes = sorted(mbs_candidates(t, ctx.job), reverse=True)[:1] if quick else \
                    seed_sizes(t, ctx, cache, smallest)
                for mbs in sizes:
                    if stop.expired():
                        break
                    found += complete_seed(t, ctx, mbs, ok, cache, stop, convert)
        return found

    def same_type(first: int) -> tuple[int, ...]:
        return tuple(gpu_types(ctx)[ctx.classes[first].gpu.name])

    def unsharded(subset: tuple[int, ...], tp: int, S: int) -> list[Priced]:
        """An MoE model that fits at depth ``S`` only with its experts sharded: each type also as one pipeline as
        deep as its GPUs allow, every expert whole (no gradient all-reduce, no token across a NIC: Megatron's grid
        runs Qwen3-235B's 94 blocks on 94 single-GPU H100 nodes so, for a batch of 96), once per type, and only
        where its ceiling (every stage busy, no bubble, no communication) beats the fastest seed so far: pricing
        it on every MoE case cost a grid case 12% of its plan (the time it took)."""
        best = max((e.tokens_per_s for _, e in out), default=0.0)

        def ceiling(first: int, depth: int) -> float:  # every stage busy, one block's share each: no bubble, no comm
            prof = ctx.slot_profile(first, tp, 1, 1, 1, 1, 1, False)
            return depth * ctx.job.sequence_length / prof.time(0, L, True, True)

        tpls = [Template((Group((Slot(first, tp, pool=n > ctx.classes[first].count),) * min(L, n // tp), 1),))
                for first, n in pools(ctx, subset, tp)
                if n // tp > S and holds_state(ctx, same_type(first), tp, min(L, n // tp), experts_sharded=False)
                and ceiling(first, min(L, n // tp)) > best]
        fresh = [t for t in tpls if t not in whole]  # a type's pipeline once, whichever subsets hold it
        whole.update(fresh)
        return complete_all(fresh)

    def fewer_replicas(subset: tuple[int, ...], priced_as_is: list[Priced]) -> list[Priced]:
        """The type-first seed (one stage, tp 1) with half the replicas, again while that prices faster: where
        the gradient all-reduce outweighs the compute a replica adds (a small batch on many GPUs), fewer replicas on
        fewer nodes win, as Megatron's grid over part of a type finds (fresh hold-out seed85/rob-015: OPT-350M, a
        batch of 64 x 512 tokens, 44 H100 PCIe: 16 replicas on two nodes of 8 beat 32 on five nodes)."""
        tpl = uniform_template(ctx, subset, 1, 1)
        if tpl is None or len(tpl.groups) != 1 or not priced_as_is:  # (none fits: fewer replicas fit no better)
            return []
        gbs, g = ctx.job.global_batch_size, tpl.groups[0]
        lead = max(priced_as_is, key=lambda r: r[1].tokens_per_s)[1]
        reps = max(d for d in range(1, g.replicas + 1) if gbs % d == 0) // 2
        found: list[Priced] = []
        while reps >= 1 and gbs % reps == 0 and not deadline.expired() and \
                lead.breakdown.get("dp_sync_exposed_s", 0.0) >= FEWER_REPLICAS_SYNC * lead.breakdown["compute_s"]:
            got = complete_all([Template((Group(g.slots, reps),))], quick=True)
            if not got or max(e.tokens_per_s for _, e in got) <= lead.tokens_per_s:
                break
            found, lead, reps = found + got, max(got, key=lambda r: r[1].tokens_per_s)[1], reps // 2
        return found

    def wider_tp(subset: tuple[int, ...], priced_as_is: list[Priced], tp: int = 2) -> list[Priced]:
        """The type-first seed (one stage) at ``tp``, twice that, ... inside its nodes: until one fits where the
        narrower does not, then again while that prices faster and only while its exposed gradient sync is
        :data:`FEWER_REPLICAS_SYNC` of its compute (each GPU then reduces 1/tp of the gradients; Megatron's grid on
        odd106-rerun/rob-006: GPT-3-6.7B, a batch of 64 x 512, one stage of tp 4 x dp 16 on 64 A100-40 of 360
        GPUs, where tp 1 does not fit)."""
        lead = max(priced_as_is, key=lambda r: r[1].tokens_per_s)[1] if priced_as_is else None
        found: list[Priced] = []
        while not deadline.expired() and (lead is None or lead.breakdown.get("dp_sync_exposed_s", 0.0) >=
                                          FEWER_REPLICAS_SYNC * lead.breakdown["compute_s"]):
            tpl = uniform_template(ctx, subset, tp, 1)
            if tpl is None or len(tpl.groups) != 1:
                break
            got = complete_all([tpl], quick=True)
            top = max(got, key=lambda r: r[1].tokens_per_s)[1] if got else None
            if lead is not None and (top is None or top.tokens_per_s <= lead.tokens_per_s):
                break
            found, lead, tp = found + got, top if top is not None else lead, tp * 2
        return found

    shallowest: list[tuple[tuple[int, ...], int, int, float, float]] = []  # (subset, tp, depth, before, now)
    priced: dict = {}  # lock-step forms priced to choose a type's class (lockstep_class)
    whole: set[Template] = set()  # the deep pipelines with every expert whole already priced (unsharded)
    # first, on several types, the ones that share the batch best, as Megatron's data parallelism would
    # (at tp 1, or at the wider tp that puts the GPUs a small batch leaves idle to work: seed_scope.spare_tps)
    for best, tp in equal_share_seeded(ctx) if multiple == 1 and len(gpu_types(ctx)) > 1 else ():
        out += complete_all([lockstep_template(ctx, best, tp, 1, priced)], quick=True)
        uniform = complete_all([uniform_template(ctx, best, tp, 1)], quick=True)
        out += uniform + (fewer_replicas(best, uniform) if tp == 1 else []) + wider_tp(best, uniform, 2 * tp)
    def around_pass() -> list[Priced]:
        """The grid next to a one-type incumbent (``around``), within :data:`AROUND_SHARE` of the time left (an MoE
        model's in its lock-step form, its experts parallel)."""
        if around is None or multiple > 1:
            return []
        home, share = class_subsets(ctx, first)[0], deadline.child(deadline.remaining * AROUND_SHARE)
        return [r for tp, S in around_incumbent(ctx, home, *around, ctx.same_gpus_first) for r in complete_all(
            [lockstep_template(ctx, home, tp, S, priced) or uniform_template(ctx, home, tp, S)], smallest=True,
            until=share)]

    def equal_pass() -> list[Priced]:
        """Class subsets whose GPUs share the batch evenly, as one data-parallel stage (decision 0030)."""
        found: list[Priced] = []
        for subset in equal_share_subsets(ctx, class_subsets(ctx, first)) if multiple == 1 else ():
            if deadline.expired():
                break
            if holds_state(ctx, subset, 1, 1):
                found += at_depth(subset, 1, 1) or []
        return found

    def nodes_pass() -> list[Priced]:
        """The largest uniform sub-cluster over several types (:func:`uniform_nodes`), at the first two tp degrees
        of :func:`tp_order` (the incumbent's first), each at its shallowest depth that fits, and for a dense model
        that needs a pipeline there, the lock-step pipeline over its GPU types at once
        (:func:`mixed_lockstep_templates`) without the classes on a much slower network
        (:func:`~.search.rules.much_slower_networks`), within :data:`AROUND_SHARE` of the time left (decisions
        0032, 0040). Where the walk below already holds those classes as a subset, only the dense lock-step
        pipeline (the walk has no such form; decision 0043)."""
        got = uniform_nodes(ctx) if multiple == 1 else None
        walked = got is not None and got[0] in class_subsets(ctx, first)
        if got is None or walked and ctx.model.is_moe:
            return []
        (sub, size), share = got, deadline.child(deadline.remaining * AROUND_SHARE)
        found: list[Priced] = []
        slow = much_slower_networks([ctx.classes[i] for i in sub])
        fast = tuple(i for i in sub if i not in slow)
        walks: list[tuple[int, int | None, float]] = []  # (tp, its shallowest depth that fits, its fastest seed)
        for tp in tp_order(ctx, sub, tp_options(ctx.model, size), tps)[:NODES_TPS]:
            depth = None  # the shallowest that fits
            for S in seed_depths(L) if not walked else ():
                if S > L or share.expired():
                    break
                if holds_state(ctx, sub, tp, S):
                    more = at_depth(sub, tp, S, share, smallest=True)
                    if more is None or more:
                        found, depth = found + (more or []), S if more else None
                        break
            walks.append((tp, depth, fastest(found)))
            if not ctx.model.is_moe and depth != 1:  # (an MoE model's comes from the walk over its subsets)
                found += complete_all(mixed_lockstep_templates(ctx, fast, tp, dense=True), smallest=True,
                                      until=share)
        for tp, depth, best in walks if ctx.model.is_moe else ():  # then an MoE model's type-oblivious stages
            S = deeper_divisor(L, depth) if depth else None  # deeper while faster, as Megatron's grid runs the
            while S is not None:  # depth that pays (seed150/rob-004: 4 stages over its L40S and A10 nodes)
                more = complete_all(spanning_lockstep_templates(ctx, sub, tp, S)[-1:], smallest=True, until=share)
                found += more
                if fastest(more) <= best or share.expired():
                    break
                best, S = fastest(more), deeper_divisor(L, S)
        return found

    def in_nodes_pass() -> list[Priced]:
        """An MoE model on uniform nodes of several types whose NICs are much slower than their own links
        (:data:`IN_NODES_RATIO`): the lock-step pipeline of node-wide stages over them, at the first two tp
        degrees of :func:`tp_order`, each at its smallest micro-batch size."""
        got = uniform_nodes(ctx) if ctx.model.is_moe and multiple == 1 else None
        if got is None:
            return []
        sub, size = got
        nodes = [ctx.cluster.node_by_name[ctx.classes[i].nodes[0]] for i in sub]
        if min(n.intra_node_bw / n.inter_node_bw for n in nodes) < IN_NODES_RATIO:
            return []
        return [r for tp in tp_order(ctx, sub, tp_options(ctx.model, size), tps)[:NODES_TPS]
                for r in complete_all(mixed_lockstep_templates(ctx, sub, tp, 1, in_nodes=True), smallest=True)]

    out += in_nodes_pass()
    pending = True  # the grid next to the incumbent: after the incumbent's own tp's shallowest depths
    for subset in class_subsets(ctx, first):  # breadth first: every (subset, tp) at its shallowest depth
        # a GPU type over several node sizes: its tp degrees are those of its largest nodes (pools() takes the
        # classes whose nodes hold tp), as Megatron's grid runs the type's largest uniform part; several types:
        # the degrees every type holds so
        largest: dict[str, int] = {}
        for i in subset:
            c = ctx.classes[i]
            largest[c.gpu.name] = max(largest.get(c.gpu.name, 0), c.node_size)
        node = min(largest.values())
        for tp in tp_order(ctx, subset, tp_options(ctx.model, node), tps, multiple):
            if not deadline.expired():  # its depth is the types' GPUs over tp d, not a depth of the loop below
                out += complete_all(mixed_lockstep_templates(ctx, subset, tp))
            for S in seed_depths(L):
                if S > L or deadline.expired():
                    break
                if not holds_state(ctx, subset, tp, S):
                    continue
                found = at_depth(subset, tp, S)
                if found is None:
                    break
                if found:
                    out += found
                    # a depth of one GPU type that fits only by recomputing, and could come near the best without
                    # it: one stage deeper at once, the walk below going on from there while that prices faster
                    # (decision 0027); with cp (long sequences) on any subset
                    one_type = len({ctx.classes[i].gpu.name for i in subset}) == 1
                    near = unrecomputed(found) >= ALT_WITHIN * max(ctx.best_tok_s, fastest(out))
                    deeper = next_depth(ctx, subset, tp, S) if (multiple > 1 or one_type and near) and all(
                        recomputes(p) for p, _ in found) else None
                    if deeper is not None and not deadline.expired():
                        more = at_depth(subset, tp, deeper) or []
                        out += more
                        if multiple == 1:
                            shallowest.append((subset, tp, deeper, fastest(found), fastest(more)) if more else
                                              (subset, tp, S, 0.0, fastest(found)))
                    else:
                        shallowest.append((subset, tp, S, 0.0, fastest(found)))
                    if all(sharded(p) for p, _ in found):
                        out += unsharded(subset, tp, S)
                    fill = lockstep_fill_depth(ctx, subset[0], tp, S) if len(subset) == 1 and multiple == 1 else None
                    if fill is not None and not deadline.expired():  # the lock-step depth that fills the class
                        out += complete_all([lockstep_template(ctx, subset, tp, fill, priced)])
                    break
            out, pending = out + (nodes_pass() + around_pass() + equal_pass() if pending else []), False
    out += nodes_pass() + around_pass() + equal_pass() if pending else []
    # then one depth deeper each, and again (breadth first) while the deeper one prices faster (the shallowest
    # counts as faster than nothing)
    walk = shallowest if SEED_DEPTHS > 1 else []
    while walk and not deadline.expired():
        step = []
        for subset, tp, S, before, now in walk:
            deeper = next_depth(ctx, subset, tp, S) if now > before else None
            if deeper is None or deadline.expired():
                continue
            found = at_depth(subset, tp, deeper) or []
            out += found
            step.append((subset, tp, deeper, now, fastest(found)))
        walk = step
    return out


def seed_share(job, priced: bool = False, plain: float = SEED_SHARE) -> float:
    """The seeds' share of the planner's target for ``job`` (``plain``, :data:`LONG_SEED_SHARE`; ``priced``: the
    planner ranks by an objective that prices GPUs, :data:`PRICED_SEED_SHARE`)."""
    if job.sequence_length >= LONG_SEQUENCE:
        return LONG_SEED_SHARE
    return PRICED_SEED_SHARE if priced else plain


def seed_pass(ctx: PlanningContext, legality: Legality | None, clock: Callable[[], float], target_s: float,
              cap: Deadline | None, score: Callable[[Estimate], float], found: Sequence[Priced] = (),
              seconds: float | None = None, priced: bool = False, last: bool = True,
              plain: float = SEED_SHARE) -> list[Priced]:
    """The planner's hook: :func:`seed_plans` for :func:`seed_share` of ``target_s`` on ``clock`` (never past
    ``cap``, the caller's wall-clock budget), then the knobs on the :data:`SEED_TOP` best by ``score`` (lower is
    better) less the recomputation they could drop, and on the fastest by ``score`` when it is not one of them;
    every plan returned fits and breaks no rule of ``legality``.
    ``found``: the plans the search priced (the best one's GPU types and tp degrees are seeded first; where it runs
    on several types, in the last pass, then the best one-type plan's type, :func:`alone`, :data:`ALONE_SHARE`);
    ``seconds``: on ``clock``, in place of the share (the planner gives what the search left of its target);
    ``priced``, ``plain``: see :func:`seed_share`; ``last``: the run's last pass (the knobs that reshape a plan
    run only there, as in :func:`~.completion.modern.modern_variants`)."""
    cluster = ctx.cost_model.cluster
    rules = legality if legality is not None and not legality.free else None
    built = planner_rules(rules) if rules is not None else None  # a seed keeps what the search's plans keep

    def bound(est: Estimate) -> float:  # what per-stage recomputation could reach at best
        return score(est) * (1 - recompute_share(est))

    def ok(plan: Plan) -> bool:
        return built is None or not built.errors(plan, cluster)

    def knobs(found: list[Priced], until: Deadline, top: int = SEED_TOP, fastest: int = SEED_FASTEST) -> list[Priced]:
        return seed_knobs(ctx, found, until, rules, score, bound, last, top, fastest)

    lead = min(found, key=lambda r: score(r[1]), default=None)  # the incumbent: its GPU types are seeded first
    types = {cluster.devices[d].gpu.name for d in lead[0].devices} if lead is not None else None
    tps = {st.tp for p in lead[0].pipelines for st in p.stages} if lead is not None else None
    around = incumbent_shape(lead[0], types, tps) if lead is not None else None
    # a mixed incumbent is the search's, not the grid's: the grid also walks from the best one-type plan's type
    one = alone(found, cluster, score) if last and types and len(types) > 1 and not long_sequence(ctx) else None
    base = max(seed_share(ctx.job, priced, plain) * target_s, seconds or 0.0)
    grid = scale_out_plans(ctx, Deadline(SCALE_OUT_SHARE * target_s, clock, cap), ok, rules) \
        if not long_sequence(ctx) and starved(ctx, rules) else []  # a batch too small for the cluster: .scale_out
    deadline = Deadline(base, clock, cap)
    if long_sequence(ctx):  # most of the family's time on plans with context parallelism built in
        seeds = seed_plans(ctx, deadline.child(deadline.remaining * 0.2), rules, ok, types, tps)
        seeds += cp_seed_plans(ctx, deadline.child(deadline.remaining * 0.5 / 0.8), rules, ok, types, tps)
    else:
        seeds = seed_plans(ctx, deadline.child(deadline.remaining * SEED_WALK), rules, ok, types, tps, around=around)
    if one is None:
        return with_grid(knobs(seeds, deadline), grid, knobs, SCALE_OUT_SHARE * target_s, clock, cap, score, lead)
    # the walk from the best one-type plan's type (its tp degrees in the order that fits, not its own; the grid next
    # to it) and the knobs on its fastest seed run on clocks of their own: the first walk's seeds keep their knobs
    # and the time the walk left them, as without it
    left, first = deadline.remaining, {cluster.devices[one.devices[0]].gpu.name}
    alone_seeds = seed_plans(ctx, Deadline(base * SEED_WALK * ALONE_SHARE, clock, cap), rules, ok, first, None,
                             around=incumbent_shape(one, first, {st.tp for p in one.pipelines for st in p.stages}))
    out = knobs(seeds, Deadline(left, clock, cap))
    more = knobs(alone_seeds, Deadline(base * (1 - SEED_WALK) * ALONE_SHARE, clock, cap), top=0, fastest=1)
    best = min(score(e) for _, e in out + [lead])  # kept only where they win: otherwise they would only displace the
    out += [r for r in more if score(r[1]) < best]  # later knobs' starts (seed163/rob-003: 1.685x -> 1.020x)
    return with_grid(out, grid, knobs, SCALE_OUT_SHARE * target_s, clock, cap, score, lead)

