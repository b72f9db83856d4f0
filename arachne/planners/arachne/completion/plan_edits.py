"""Plan edits for the knobs (``completion/modern.py``): each returns a new plan (or None where the edit does not
apply) and prices nothing; the knobs decide which to keep."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from arachne.plan import PLAN_FORMAT, PLAN_FORMAT_V2, Pipeline, Plan, Stage
from arachne.plan_rules import uses_v2
from arachne.spec.model import ModelSpec

VIRTUAL_STAGES = (2, 3, 4)
"""Interleaving depths tried."""


def with_pipelines(plan: Plan, pipes: Iterable[Pipeline], **update) -> Plan:
    p = plan.model_copy(update={"pipelines": tuple(pipes), **update})
    return p.model_copy(update={"format": PLAN_FORMAT_V2 if uses_v2(p) else PLAN_FORMAT})


def map_stages(plan: Plan, fn: Callable[[int, int, Pipeline, Stage], Stage], **update) -> Plan:
    """``plan`` with every stage replaced by ``fn(pipeline index, stage index, pipeline, stage)``."""
    pipes = []
    for pi, p in enumerate(plan.pipelines):
        stages = tuple(fn(pi, si, p, st) for si, st in enumerate(p.stages))
        pipes.append(p if all(a is b for a, b in zip(stages, p.stages)) else p.model_copy(update={"stages": stages}))
    return with_pipelines(plan, pipes, **update)


def with_recompute(st: Stage, kind: str, k: int | None = None) -> Stage:
    """``st`` at recomputation ``kind`` (none / selective / full), ``k``: only the first k blocks (full)."""
    rec: bool | str = {"none": False, "selective": "selective", "full": True}[kind]
    layers = k if kind == "full" and k is not None and k < st.num_layers else None
    if st.recompute == rec and st.recompute_layers == layers:
        return st
    return st.model_copy(update={"recompute": rec, "recompute_layers": layers})


def interleaved(pipe: Pipeline, v: int) -> Pipeline | None:
    """``pipe`` as interleaved 1F1B with ``v`` chunks per stage (each stage keeps its block count, except that a
    stage of fewer than ``v`` blocks takes what it lacks from the stage with the most; chunk j of stage s is
    range ``j * S + s``), or None where it cannot be (one stage, too few blocks, micro-batches not a multiple
    of the stages, already interleaved)."""
    S = len(pipe.stages)
    if S < 2 or pipe.virtual_stages != 1 or pipe.micro_batches % S:
        return None
    counts = [st.num_layers for st in pipe.stages]
    while min(counts) < v:  # a stage short of v blocks takes them from the stage with the most
        short, most = counts.index(min(counts)), counts.index(max(counts))
        need = v - counts[short]
        if counts[most] - need < v:
            return None
        counts[short] += need
        counts[most] -= need
    sizes = [[n // v + (1 if j < n % v else 0) for j in range(v)] for n in counts]
    ranges: list[list[tuple[int, int]]] = [[] for _ in range(S)]
    at = 0
    for j in range(v):
        for s in range(S):
            ranges[s].append((at, at + sizes[s][j]))
            at += sizes[s][j]
    stages = tuple(st.model_copy(update={"layers": tuple(r)}) for st, r in zip(pipe.stages, ranges))
    return pipe.model_copy(update={"stages": stages, "virtual_stages": v})


def interleavings(plan: Plan) -> list[Plan]:
    """``plan`` with its pipelines interleaved at each of :data:`VIRTUAL_STAGES` that changes some pipeline (a
    pipeline :func:`interleaved` cannot split stays as it is); none for a schedule other than 1F1B."""
    out: list[Plan] = []
    if plan.schedule != "1f1b":
        return out
    for v in VIRTUAL_STAGES:
        pipes = [interleaved(p, v) or p for p in plan.pipelines]
        if all(a is b for a, b in zip(pipes, plan.pipelines)):
            break
        out.append(with_pipelines(plan, pipes))
    return out


def with_micro_batch_size(plan: Plan, f: int) -> Plan | None:
    """``plan`` with every micro-batch ``f`` times larger and ``f`` times fewer of them per pipeline (a pipeline
    with its own size scaled too), or None where some pipeline's micro-batches are not a multiple of ``f`` (or,
    interleaved, would no longer be a multiple of its stages)."""
    if any(p.micro_batches % f or (p.virtual_stages > 1 and p.micro_batches // f % len(p.stages))
           for p in plan.pipelines):
        return None
    pipes = [p.model_copy(update={"micro_batches": p.micro_batches // f, "micro_batch_size":
                                  None if p.micro_batch_size is None else p.micro_batch_size * f})
             for p in plan.pipelines]
    return with_pipelines(plan, pipes, micro_batch_size=plan.micro_batch_size * f)


def even_split(plan: Plan, cluster) -> Plan | None:
    """``plan`` with the blocks of each run of like stages (consecutive, the same GPU type, tp, dp, cp and ep)
    spread evenly over them, a remainder going to the stages that held the most; None where nothing moves (an
    interleaved pipeline, or every run even already). Memory pushes blocks off the stages with the most
    micro-batches in flight when nothing is recomputed; with a few blocks recomputed, the even split can be
    faster."""
    devs = cluster.devices
    pipes, moved = [], False
    for pipe in plan.pipelines:
        if pipe.virtual_stages != 1:
            pipes.append(pipe)
            continue
        kinds = [(devs[st.devices[0]].gpu.name, st.tp, st.dp_size, st.cp, st.ep) for st in pipe.stages]
        counts = [st.num_layers for st in pipe.stages]
        i = 0
        while i < len(counts):
            j = i + 1
            while j < len(counts) and kinds[j] == kinds[i]:
                j += 1
            n, k = sum(counts[i:j]), j - i
            extra = set(sorted(range(i, j), key=lambda x: (-counts[x], -x))[:n % k])
            for x in range(i, j):
                counts[x] = n // k + (x in extra)
            i = j
        if counts == [st.num_layers for st in pipe.stages]:
            pipes.append(pipe)
            continue
        moved, at, stages = True, pipe.stages[0].start, []
        for st, c in zip(pipe.stages, counts):
            stages.append(st.model_copy(update={"layers": (at, at + c)}))
            at += c
        pipes.append(pipe.model_copy(update={"stages": tuple(stages)}))
    return with_pipelines(plan, pipes) if moved else None


def with_cp(plan: Plan, c: int) -> Plan | None:
    """Context parallelism ``c`` in place of data parallelism: pipelines of the same shape merged ``c`` at a
    time (their stages' devices concatenated, so each stage keeps its dp and runs ``c`` times the
    micro-batches at ``1/c`` of each sequence per GPU: a smaller bubble share and less activation memory);
    in a pipeline left over, each stage of dp divisible by ``c`` becomes dp/c groups of ``c * tp`` (the same
    devices, tp fastest then cp). None when nothing changes."""
    if plan.sequence_length % (2 * c):
        return None
    pipes: list[Pipeline] = []
    shapes: dict[tuple, list[Pipeline]] = {}
    for p in plan.pipelines:
        if any(st.cp != 1 for st in p.stages) or p.virtual_stages != 1:
            pipes.append(p)
            continue
        key = (p.micro_batches, p.micro_batch_size, tuple((st.layers, st.tp, st.dp_size, st.ep, st.etp, st.recompute,
                                                           st.recompute_layers, st.sequence_parallel,
                                                           len(st.devices)) for st in p.stages))
        shapes.setdefault(key, []).append(p)
    changed = False
    for group in shapes.values():
        whole = len(group) - len(group) % c
        for i in range(0, whole, c):
            part = group[i:i + c]
            stages = tuple(st.model_copy(update={"devices": tuple(d for q in part for d in q.stages[si].devices),
                                                 "cp": c, "dp": st.dp_size if st.dp_size > 1 else None})
                           for si, st in enumerate(part[0].stages))
            pipes.append(part[0].model_copy(update={"stages": stages,
                                                    "micro_batches": sum(q.micro_batches for q in part)}))
            changed = True
        for p in group[whole:]:
            stages = tuple(st if st.dp_size % c else st.model_copy(
                update={"cp": c, "dp": st.dp_size // c if st.dp_size > c else None}) for st in p.stages)
            changed = changed or any(a is not b for a, b in zip(stages, p.stages))
            pipes.append(p.model_copy(update={"stages": stages}))
    return with_pipelines(plan, pipes) if changed else None


def cp_for_tp(plan: Plan, k: int) -> Plan | None:
    """Context parallelism ``k`` in place of a ``k``-th of tensor parallelism: each stage of ``tp`` divisible by
    ``k`` (no cp yet, no experts) runs ``tp / k`` and ``cp = k`` on the same devices (each tp group of the
    stage becomes ``k`` groups of ``tp / k``, tp fastest then cp). No per-layer tensor-parallel collectives and
    ``k`` times the parameters per GPU; activations split ``k`` ways as before. None when nothing changes."""
    if plan.sequence_length % (2 * k):
        return None
    changed = False

    def swap(_a: int, _b: int, _p: Pipeline, st: Stage) -> Stage:
        nonlocal changed
        if st.tp % k or st.cp != 1 or st.ep != 1 or st.etp is not None:
            return st
        changed = True
        t = st.tp // k
        return st.model_copy(update={"tp": t, "cp": k, "sequence_parallel": st.sequence_parallel and t > 1})

    out = map_stages(plan, swap)
    return out if changed else None


def expert_layouts(st: Stage, model: ModelSpec) -> list[tuple[int, int | None]]:
    """``(ep, etp)`` layouts of a MoE stage's experts worth pricing: etp 1 and tp, each with the largest ep
    the stage allows (``ep * etp`` dividing ``dp * cp * tp``, ``num_experts % ep == 0``) and the next one below
    it (all-to-alls over fewer GPUs, twice the expert memory: fresh hold-out seed97/rob-029), and etp 1 at the
    current ep. ``etp`` None where the layout is version 1's (etp = tp, cp 1)."""
    n = st.dp_size * st.cp * st.tp
    out: list[tuple[int, int | None]] = []
    for etp in sorted({1, st.tp}):
        if model.tp_error(st.tp, etp=etp) is not None:
            continue
        eps = [e for e in range(1, n // etp + 1) if (n // etp) % e == 0 and model.ep_error(e) is None]
        below = sorted(eps)[-2:-1]
        for ep in sorted({max(eps, default=1), *below, st.ep if (n // etp) % st.ep == 0 else 1}):
            spelled = None if etp == st.tp and st.cp == 1 and st.dp_size % ep == 0 else etp
            if (ep, spelled) != (st.ep, st.etp):
                out.append((ep, spelled))
    return out


def recomputes(plan: Plan) -> bool:
    """Whether some stage recomputes activations."""
    return any(st.recompute for p in plan.pipelines for st in p.stages)


def replicated(plan: Plan) -> bool:
    """Whether some layers are held by more than one replica (gradients are reduced)."""
    return len(plan.pipelines) > 1 or any(st.dp_size * st.cp > 1 for p in plan.pipelines for st in p.stages)
