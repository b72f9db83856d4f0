"""Seeds for a batch too small for its cluster: the lock-step grid of depth, tp, cp and dp, cp built in.

Where a GPU type holds more GPUs than the global batch fills at one stage of node-wide tp per sequence (Llama 3.1
70B's 2,048 sequences on 100,000 H100: 16,384 GPUs at tp 8), a plan puts more of them to work only by splitting
each sequence over a cp group, or by a deeper pipeline with fewer replicas and more micro-batches each. The search
and the seed walk grow replicas, never these two together. This family enumerates, per device class past that
size, every lock-step shape (one pipeline whose stages are data parallel, as Megatron runs it) of depth ``S``
(:func:`~.seed_scope.seed_depths`), tp inside a node, cp (powers of two from 1, :data:`MAX_CP`, at least
:data:`CP_RANK_TOKENS` tokens a rank) and dp a divisor of the batch that fits the class (the largest and
:data:`HALVINGS` halvings of it: fewer replicas, more micro-batches, a smaller bubble), a micro-batch of one
sequence per replica (an MoE model's experts parallel over the most replicas the batch allows), and ranks them
in three steps:

1. a lower bound of each shape's 1F1B step from the slot profiles (the cost model's own layer costs at ``1 / cp``
   of a sequence, every stage an equal share, ``micro-batches + S - 1`` of them, no communication), which also
   drops the shapes whose first stage cannot hold its weights and in-flight activations, even recomputing;
2. fastest bound first, the cost model's price of the shape cut to :data:`PROXY_REPLICAS` replicas (the same
   stages, tp, cp and micro-batches on a few GPUs: the communication the bound leaves out, which decides between
   a shallow pipeline's gradient reduction and a deep one's bubble; an MoE model's cut keeps the replicas of its
   experts' parallel degrees up to :data:`MOE_CUT_REPLICAS` and is priced at each), its fastest form also
   interleaved where the runtime allows it (the bound's bubble is then the deepest interleaving's), until the
   next bound is no faster than the
   fastest cut price, :data:`MAX_CUTS` are priced or half the deadline is spent;
3. the :data:`MAX_PRICED` fastest cut prices completed as the seeds are (on the proxy job of :mod:`.long_context`,
   rewritten to cp) and priced whole, the two fastest forms also interleaved where the cut was fastest so. Only
   these whole plans compete, by the one cost model.

On the 100,000-GPU case the cut prices at 2 replicas (5 ms each) put the fastest of 160 shapes priced whole
fourth; the bound alone put it past the twentieth (decision 0052)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from arachne.cost import Estimate
from arachne.plan import PLAN_FORMAT_V2, Pipeline, Plan, Stage
from arachne.planners.arachne.completion.plan_edits import VIRTUAL_STAGES, interleaved, interleavings, with_pipelines
from arachne.planners.arachne.context import PlanningContext
from arachne.planners.arachne.long_context import cp_from_proxy, proxy_context
from arachne.planners.arachne.rules_view import template_ok
from arachne.planners.arachne.seed_forms import expert_parallel_forms, overlapped
from arachne.planners.arachne.seed_scope import seed_depths
from arachne.planners.arachne.template import Group, Slot, Template, ep_options, tp_fits_node, tp_options
from arachne.planners.protocol import Deadline
from arachne.spec.model import model_ref
from arachne.spec.runtimes import Legality

SCALE_OUT_SHARE = 0.2
"""The family's clock, and again the knobs' on its fastest plan (:func:`with_grid`), as this share of the planner's
target each: both beyond the seeds' share, spent only where :func:`starved` holds."""
MAX_CP = 16
"""The largest cp degree of the family (Megatron's grid baseline goes as far)."""
CP_RANK_TOKENS = 512
"""The fewest tokens of a sequence a cp rank holds in the family (8,192 tokens at cp 16)."""
HALVINGS = 2
"""Per depth, tp and cp, the replica counts after the largest that fits: this many halvings of it."""
PROXY_REPLICAS = 2
"""The replicas of a shape's cut (step 2 of the module docstring)."""
MOE_CUT_REPLICAS = 16
"""An MoE model's cut keeps up to this many replicas: the largest expert-parallel degree it is priced at."""
MAX_CUTS = 400
"""The most cuts priced."""
MAX_PRICED = 4
"""The most shapes completed and priced whole."""


@dataclass(frozen=True)
class Shape:
    """One lock-step shape on device class ``cls``: ``stages`` stages of ``dp`` groups of ``cp * tp`` GPUs,
    ``recompute`` where its first stage holds its activations only so, and the lower bound of its step."""

    cls: int
    stages: int
    tp: int
    cp: int
    dp: int
    recompute: bool
    bound_s: float


def starved(ctx: PlanningContext, legality: Legality | None) -> bool:
    """Whether some device class holds more GPUs than the batch fills at one stage of node-wide tp per sequence,
    where cp is allowed (``legality``) and the sequence splits at least in two."""
    if legality is not None and legality.constraints.max_cp == 1:
        return False
    if not cp_degrees(ctx.job.sequence_length, legality)[1:]:
        return False
    gbs = ctx.job.global_batch_size
    return any(c.count > gbs * c.node_size for c in ctx.classes)


def cp_degrees(seq: int, legality: Legality | None) -> list[int]:
    """1, then the powers of two up to :data:`MAX_CP` (and the constraints' ``max_cp``) that split ``seq`` into
    load-balanced halves of at least :data:`CP_RANK_TOKENS` tokens a rank."""
    most = MAX_CP if legality is None or legality.constraints.max_cp is None else \
        min(MAX_CP, legality.constraints.max_cp)
    out, c = [1], 2
    while c <= most and seq % (2 * c) == 0 and seq // c >= CP_RANK_TOKENS:
        out.append(c)
        c *= 2
    return out


def interleaving(legality: Legality | None) -> bool:
    """Whether ``legality`` allows interleaved pipelines."""
    return legality is None or legality.constraints.virtual_stages is not False


def shapes(ctx: PlanningContext, legality: Legality | None) -> list[Shape]:
    """Every shape of the family (module docstring) on the classes past the batch's size that holds its first
    stage's memory, fastest bound first."""
    chunks = interleaving(legality)
    L, gbs = ctx.model.num_layers, ctx.job.global_batch_size
    divisors = [d for d in range(1, gbs + 1) if gbs % d == 0]
    out: list[Shape] = []
    for cls in ctx.classes:
        if cls.count <= gbs * cls.node_size:
            continue
        for tp in (t for t in tp_options(ctx.model, cls.node_size) if tp_fits_node(t, cls.node_size)):
            for cp in cp_degrees(ctx.job.sequence_length, legality):
                for S in (s for s in seed_depths(L) if s <= L):
                    most = [d for d in divisors if S * tp * cp * d <= cls.count]
                    for dp in most[::-1][:HALVINGS + 1]:
                        shape = _bounded(ctx, cls.index, S, tp, cp, dp, chunks)
                        if shape is not None:
                            out.append(shape)
    return sorted(out, key=lambda s: s.bound_s)


def widest_ep(ctx: PlanningContext, dp: int) -> int:
    """The experts' parallel degree a shape of ``dp`` replicas is bounded and built at: the widest allowed (what
    fits, at the least compute per GPU; as the seeds' lock-step form builds an MoE model), 1 for a dense one."""
    return max(ep_options(ctx.model, dp))


def _bounded(ctx: PlanningContext, cls: int, S: int, tp: int, cp: int, dp: int, chunks: bool) -> Shape | None:
    """The shape with its lower bound, without recomputation where its first stage holds that (else with), or
    None where it holds neither; ``chunks``: the bound's bubble is the deepest interleaving's that fits it."""
    L, nmb = ctx.model.num_layers, ctx.job.global_batch_size // dp
    depth = -(-L // S)
    v = max((k for k in VIRTUAL_STAGES if chunks and S > 1 and nmb % S == 0 and L // S >= k), default=1)
    ep = widest_ep(ctx, dp)
    for recompute in (False, True):
        prof = ctx.slot_profile(cls, tp, cp, ep, 1, S, dp * cp, recompute)
        if prof.memory(0, depth, True, S == 1, min(S, nmb)) > prof.capacity:
            continue
        return Shape(cls, S, tp, cp, dp, recompute, (nmb + (S - 1) / v) * prof.time(0, L, True, True) / S)
    return None


def cut_plan(ctx: PlanningContext, shape: Shape, devices: list[str]) -> Plan:
    """``shape`` cut to ``min(dp, PROXY_REPLICAS)`` replicas (an MoE model's: to its largest expert-parallel degree
    up to :data:`MOE_CUT_REPLICAS`, if more) on the first of ``devices`` (its class's, node by node), its blocks
    split evenly, its batch those replicas' micro-batches, its gradient reduction overlapped."""
    job, L, S = ctx.job, ctx.model.num_layers, shape.stages
    d = min(shape.dp, max([PROXY_REPLICAS] + [e for e in ep_options(ctx.model, shape.dp) if e <= MOE_CUT_REPLICAS]))
    n = shape.tp * shape.cp * d
    nmb = job.global_batch_size // shape.dp
    stages = tuple(Stage(layers=(i * L // S, (i + 1) * L // S), devices=tuple(devices[i * n:(i + 1) * n]),
                         tp=shape.tp, cp=shape.cp, recompute=shape.recompute, sequence_parallel=shape.tp > 1)
                   for i in range(S))
    plan = Plan(format=PLAN_FORMAT_V2, model=model_ref(ctx.model), global_batch_size=d * nmb,
                sequence_length=job.sequence_length, micro_batch_size=d, precision=job.precision,
                zero_stage=1 if d * shape.cp > 1 else 0, optimizer=job.optimizer,
                pipelines=(Pipeline(micro_batches=nmb, stages=stages),))
    return overlapped(plan)


def scale_out_plans(ctx: PlanningContext, deadline: Deadline, ok: Callable[[Plan], bool],
                    legality: Legality | None) -> list:
    """The family's priced plans (module docstring): every fitting one, each completed as the seeds are
    (:func:`~.seeds.complete_seed`: its overlapped form where allowed, recomputation only where nothing fits
    without)."""
    from arachne.planners.arachne.seeds import complete_seed

    cm = ctx.cost_model
    seq, gbs = ctx.job.sequence_length, ctx.job.global_batch_size
    cuts = deadline.child(deadline.remaining / 2)
    devices: dict[int, list[str]] = {}
    ranked: list[tuple[float, int, Shape, int]] = []  # (cut time, order, shape, its interleaving)
    chunks = interleaving(legality)
    for i, shape in enumerate(shapes(ctx, legality)):
        if cuts.expired() or len(ranked) >= MAX_CUTS or ranked and shape.bound_s >= min(ranked)[0]:
            break
        if shape.cls not in devices:
            devices[shape.cls] = [x for node in ctx.classes[shape.cls].node_devices() for x in node]
        cut = cut_plan(ctx, shape, devices[shape.cls])
        # an MoE model's experts at each parallel degree, then the fastest of those interleaved
        forms = [(cm.estimate(f, validate=False).iteration_time_s, f) for f in [cut] + expert_parallel_forms(cut, ctx)]
        t, lead = min(forms, key=lambda r: r[0])
        more = [(cm.estimate(q, validate=False).iteration_time_s, q.pipelines[0].virtual_stages)
                for q in (interleavings(lead) if chunks else [])]
        best_t, v = min([(t, 1)] + more)
        ranked.append((best_t, i, shape, v))
    proxies: dict[int, PlanningContext | None] = {}
    out: list = []
    for _, _, shape, v in sorted(ranked)[:MAX_PRICED]:
        if deadline.expired():
            break
        c = shape.cp
        if c not in proxies:
            proxies[c] = proxy_context(ctx, c)
        pctx = proxies[c]
        if pctx is None:
            continue
        tpl = Template((Group((Slot(shape.cls, shape.tp, dp=shape.dp * c, ep=widest_ep(ctx, shape.dp)),) *
                              shape.stages, 1),))
        if legality is not None and not template_ok(tpl, legality):
            continue
        convert = None if c == 1 else (lambda p, c=c: cp_from_proxy(p, c, seq, gbs))
        got = complete_seed(tpl, pctx, shape.dp * c, ok, {}, deadline, convert)
        fastest = sorted(got, key=lambda r: r[1].iteration_time_s)[:2]  # (the two fastest forms)
        for plan, _ in fastest if v > 1 else []:  # and as its cut was fastest, interleaved
            pipes = [interleaved(p, v) or p for p in plan.pipelines]
            cand = with_pipelines(plan, pipes)
            if cand != plan and ok(cand) and not deadline.expired():
                est = cm.estimate(cand, validate=False)
                got += [(cand, est)] if est.fits else []
        out += got
    return out


def with_grid(out: list, grid: list, knobs: Callable[..., list], seconds: float, clock: Callable[[], float],
              cap: Deadline | None, score: Callable[[Estimate], float], lead: tuple | None) -> list:
    """``out`` and, where they win, the knobs on the fastest plan of the family (``grid``) on a clock of their own
    (``seconds`` on ``clock`` from now, never past ``cap``; ``score``: lower is better). Like the walk from the
    best one-type plan's type, in the walk's pool they would only displace the later knobs' starts (decision
    0052: on a fresh hold-out, 4,096 H200 for Qwen3-30B-A3B, they cost it 7%)."""
    if not grid:
        return out
    more = knobs(grid, Deadline(seconds, clock, cap), top=0, fastest=1)
    best = min((score(e) for _, e in out + ([lead] if lead is not None else [])), default=float("inf"))
    return out + [r for r in more if score(r[1]) < best]

