"""Polishing: a priced plan's layer split moved by a layer or two at stage boundaries, re-priced, kept when
faster."""

from __future__ import annotations

from collections.abc import Callable

from arachne.cost import CostModel, Estimate
from arachne.plan import Pipeline, Plan, Stage


def split_neighbours(plan: Plan, radius: int, limit: int, gpu_of=None):
    """Plans whose stage boundaries move by up to ``radius`` layers (the same move in every replica of a
    pipeline shape): one boundary at a time, or two neighbouring boundaries together (a stage shifts), at most
    ``limit`` of those; then one layer off the last stage, taken up by each earlier stage (every boundary from it
    on moves one layer later). A generator, linear in the number of stages.

    The last moves exist because the rule split minimises the slowest stage, and at that bound its greedy fill
    loads the early stages fully, leaving the last at the bound; in 1F1B the last stage runs each micro-batch's
    forward and backward back to back, so it paces the pipeline more than an early stage does, which the warm-up
    forwards decouple (fresh hold-out seed91/rob-013, LLaMA-2-13B over 12 stages: a layer moved off the last stage
    to the second raises the slowest stage from 189 to 191 ms and prices 1.06x faster, as Sailor's split)."""
    shapes: dict[tuple, list[int]] = {}
    for i, p in enumerate(plan.pipelines):
        key = tuple((gpu_of(s.devices[0]) if gpu_of else s.devices[0].split(":")[0], s.tp, s.dp_size, s.layers)
                    for s in p.stages)
        shapes.setdefault((len(p.stages), key), []).append(i)

    def moved(idxs: list[int], bounds: list[int], L: int, which: tuple[int, ...], d: int) -> Plan | None:
        nb = [b + d if k in which else b for k, b in enumerate(bounds)]
        edges = [0, *nb, L]
        if any(b >= c for b, c in zip(edges, edges[1:])):
            return None
        pipes = list(plan.pipelines)
        for i in idxs:
            p = plan.pipelines[i]
            pipes[i] = Pipeline.model_construct(  # valid parts: the counts are kept, the layers checked above
                micro_batches=p.micro_batches, micro_batch_size=p.micro_batch_size,
                stages=tuple(_resized(s, a, b) for s, a, b in zip(p.stages, edges, edges[1:])))
        return plan.model_copy(update={"pipelines": tuple(pipes)})

    made, seen = 0, []
    for idxs in shapes.values():
        base = plan.pipelines[idxs[0]]
        bounds = [s.layers[0] for s in base.stages[1:]]
        L = base.stages[-1].layers[1]
        seen.append((idxs, bounds, L))
        moves = [((i,), d) for i in range(len(bounds)) for d in range(-radius, radius + 1) if d]
        moves += [((i, i + 1), d) for i in range(len(bounds) - 1) for d in range(-radius, radius + 1) if d]
        for which, d in moves:
            cand = moved(idxs, bounds, L, which, d)
            if cand is not None:
                yield cand
                made += 1
                if made >= limit:
                    break
        if made >= limit:
            break
    for idxs, bounds, L in seen:  # one layer off the last stage (the last two boundaries: moves above)
        for i in range(len(bounds) - 3, -1, -1):
            cand = moved(idxs, bounds, L, tuple(range(i, len(bounds))), 1)
            if cand is not None:
                yield cand


def _resized(s: Stage, a: int, b: int) -> Stage:
    """Stage ``s`` holding blocks ``a`` to ``b``; its first-k recomputation (formats v2) kept where k is still
    fewer than its blocks, else every block (the same memory bound or less)."""
    k = s.recompute_layers
    return s.model_copy(update={"layers": (a, b), "recompute_layers": k if k is None or k < b - a else None})


def polish_splits(plan: Plan, est: Estimate, cost_model: CostModel, radius: int = 1, limit: int = 80,
                  deadline=None, ok: Callable[[Plan], bool] | None = None) -> tuple[Plan, Estimate]:
    """Greedy priced moves of stage boundaries (the rule split balances modelled stage time; the
    full estimate also sees transfers and the schedule); ``ok``: a move's plan must pass it (a runtime's
    rules)."""
    best = (plan, est)
    improved = True
    while improved:
        improved = False
        for cand in split_neighbours(best[0], radius, limit, lambda d: cost_model.cluster.devices[d].gpu.name):
            if deadline is not None and deadline.expired():
                return best
            if ok is not None and not ok(cand):
                continue
            e = cost_model.estimate(cand, validate=False)
            if e.fits and e.iteration_time_s < best[1].iteration_time_s * (1 - 1e-6):
                best, improved = (cand, e), True
    return best


def type_led(plan: Plan, gpu_of: Callable[[str], str]) -> list[Plan]:
    """``plan`` with each other GPU type's stages leading its pipelines: a pipeline's stages form runs of one type
    (blocks), and each candidate moves the k-th block of every pipeline that has one to the front, each stage with
    its devices, parallelism and layer count (the layer ranges follow the new order). The type that leads runs the
    embedding and its optimizer step, the last block the output layer: which type holds them moves the step's
    slowest stage (Megatron's grid over GH200 and H100 nodes on fresh hold-out seed135/rob-006 leads with the
    GH200, 1.03x the same stages led by the H100)."""
    def blocks(p: Pipeline) -> list[list[Stage]]:
        out: list[list[Stage]] = []
        for s in p.stages:
            if out and gpu_of(out[-1][-1].devices[0]) == gpu_of(s.devices[0]):
                out[-1].append(s)
            else:
                out.append([s])
        return out

    runs = [blocks(p) for p in plan.pipelines]
    cands = []
    for k in range(1, max(len(b) for b in runs)):
        pipes = []
        for p, b in zip(plan.pipelines, runs):
            if k >= len(b):
                pipes.append(p)
                continue
            order = b[k] + [s for j, blk in enumerate(b) if j != k for s in blk]
            edges, stages = 0, []
            for s in order:
                n = s.layers[1] - s.layers[0]
                stages.append(s.model_copy(update={"layers": (edges, edges + n)}))
                edges += n
            pipes.append(p.model_copy(update={"stages": tuple(stages)}))
        cands.append(plan.model_copy(update={"pipelines": tuple(pipes)}))
    return cands
