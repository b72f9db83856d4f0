"""Context-parallel seeds: the uniform grid family of :mod:`.seeds` for long sequences, with ``cp`` built in.

The search builds version-1 plans, and the knobs (:mod:`.completion.modern`) add context parallelism only to
plans that already fit without it. At 64k-128k tokens a 70B model fits 32 GPUs only with its sequences split
(no plan without cp does), and at 32k an 8B model is fastest with no recomputation and ``cp`` 8, which its
activations never allow at ``cp`` 1: the search has nothing to start from.

A stage at context parallelism ``c`` holds, per GPU, the activations and does the per-token work of the same
stage at ``seq / c`` tokens (each rank keeps ``1/c`` of every sequence), so the family is completed on a
*proxy* job (``seq / c`` tokens, ``c`` times the sequences: the same tokens per iteration) with the
completion's own rules (layer split, batch shares, recomputation only where nothing fits without; sequence
parallelism on every stage of tp > 1, as long-sequence recipes run it: its activation memory decides what
fits). On a cluster of several GPU types the type-oblivious pipeline over all of them is in the family too (a
70B model at 64k tokens on 16 H100 and 16 A100 fits only as pipelines over both). Each proxy plan is
rewritten to the real job (:func:`cp_from_proxy`): ``c`` identical pipelines merged into one whose stages run
``cp = c`` (a stage's replicas share nodes, so a cp group does too), or a stage's data parallelism split into
``dp / c`` groups of ``c * tp``. Only the rewritten plan is priced, by the one cost model (attention's
quadratic term, the ring exchange of keys and values): the proxy only chooses the structure."""

from __future__ import annotations

from collections.abc import Callable

from arachne.plan import PLAN_FORMAT_V2, Pipeline, Plan
from arachne.planners.arachne.completion.modern import LONG_SEQUENCE
from arachne.planners.arachne.context import PlanningContext
from arachne.planners.protocol import Deadline
from arachne.spec.runtimes import Legality

CP_SEED_DEGREES = (2, 4, 8)
"""Context-parallel degrees of the seeds (Megatron's grid goes to 8 on one node of 8)."""


def long_sequence(ctx: PlanningContext) -> bool:
    """Whether the job's sequences are long enough for context parallelism to be worth pricing."""
    return ctx.job.sequence_length >= LONG_SEQUENCE


def proxy_context(ctx: PlanningContext, c: int) -> PlanningContext | None:
    """``ctx`` for the proxy job of ``seq / c`` tokens and ``c`` times the sequences (same device classes, cost
    model and work tally); None when ``c`` does not split the sequence into load-balanced halves."""
    job = ctx.job
    if job.sequence_length % (2 * c):
        return None
    proxy = job.model_copy(update={"sequence_length": job.sequence_length // c,
                                   "global_batch_size": job.global_batch_size * c})
    return PlanningContext(ctx.cluster, ctx.model, proxy, ctx.cost_model, classes=ctx.classes, work=ctx.work,
                           node_parts=ctx.node_parts, balance_sends=ctx.balance_sends, trim_last=ctx.trim_last,
                           sequence_parallel=True)


def _shape(p: Pipeline) -> tuple:
    return (p.micro_batches, p.micro_batch_size, p.virtual_stages,
            tuple((st.layers, st.tp, st.dp_size, st.cp, st.ep, st.etp, st.recompute, st.recompute_layers,
                   st.sequence_parallel, len(st.devices)) for st in p.stages))


def _merge(part: list[Pipeline], c: int) -> Pipeline:
    """``c`` pipelines of one shape as one at ``cp = c``: per stage, replica ``j``'s cp group is the ``j``-th
    tp group of each (the stage's devices ordered dp, then cp, then tp); the micro-batches stay those of one
    (each sequence now ``c`` times as long, split ``c`` ways)."""
    stages = []
    for si, st in enumerate(part[0].stages):
        t = st.tp
        devices = tuple(d for j in range(st.dp_size) for q in part for d in q.stages[si].devices[j * t:(j + 1) * t])
        stages.append(st.model_copy(update={"devices": devices, "cp": c}))
    return part[0].model_copy(update={"stages": tuple(stages)})


def cp_from_proxy(plan: Plan, c: int, sequence_length: int, global_batch_size: int) -> Plan | None:
    """A plan of the proxy job (:func:`proxy_context`) as a plan of the real one at ``cp = c``, on the same
    devices with the same tokens per GPU: pipelines of one shape merged ``c`` at a time (:func:`_merge`), a
    pipeline left over with every stage's dp split into ``dp / c`` groups of ``c * tp`` and its micro-batch
    ``c`` times fewer sequences. None when some pipeline can be neither (or already uses cp)."""
    groups: dict[tuple, list[Pipeline]] = {}
    for p in plan.pipelines:
        if p.virtual_stages != 1 or any(st.cp != 1 for st in p.stages):
            return None
        groups.setdefault(_shape(p), []).append(p)
    pipes: list[Pipeline] = []
    for group in groups.values():
        whole = len(group) - len(group) % c
        pipes += [_merge(group[i:i + c], c) for i in range(0, whole, c)]
        for p in group[whole:]:
            mbs = plan.mbs(p)
            if mbs % c or any(st.dp_size % c for st in p.stages):
                return None
            stages = tuple(st.model_copy(update={"cp": c, "dp": st.dp_size // c if st.dp_size > c else None})
                           for st in p.stages)
            pipes.append(p.model_copy(update={"stages": stages, "micro_batch_size": mbs // c}))
    out = plan.model_copy(update={"pipelines": tuple(pipes), "sequence_length": sequence_length,
                                  "global_batch_size": global_batch_size, "format": PLAN_FORMAT_V2})
    return out if sum(p.micro_batches * out.mbs(p) for p in pipes) == global_batch_size else None


def cp_seed_plans(ctx: PlanningContext, deadline: Deadline, legality: Legality | None,
                  ok: Callable[[Plan], bool], first: set[str] | None, tps: set[int] | None) -> list:
    """The uniform grid family at each degree of :data:`CP_SEED_DEGREES`, the largest first (an equal share of
    what ``deadline`` has left each: a degree whose family fits nowhere ends early and leaves its time to the
    next), completed on the proxy job and priced as the real job's cp plans: every fitting one."""
    from arachne.planners.arachne.seeds import seed_plans

    out: list = []
    degrees = sorted((c for c in CP_SEED_DEGREES if ctx.job.sequence_length % (2 * c) == 0), reverse=True)
    seq, gbs = ctx.job.sequence_length, ctx.job.global_batch_size
    for i, c in enumerate(degrees):
        if deadline.expired():
            break
        pctx = proxy_context(ctx, c)
        if pctx is None:
            continue
        sub = deadline.child(deadline.remaining / (len(degrees) - i))
        out += seed_plans(pctx, sub, legality, ok, first, tps, multiple=c, mixed=True,
                          convert=lambda p, c=c: cp_from_proxy(p, c, seq, gbs))
    return out
