"""Batch sharing: the global batch's micro-batches (or samples) shared across pipelines in proportion to
their speed (water-filling on each pipeline's fill and steady time), and the micro-batch sizes to try."""

from __future__ import annotations

import heapq
from math import lcm

from arachne.planners.arachne.template import (
    Template,
)
from arachne.spec.job import Job

MBS_CHOICES = (1, 2, 4, 8, 16, 32)


def share_micro_batches(periods: list[float], fills: list[float], total: int) -> list[int]:
    """Micro-batches per pipeline minimising the slowest ``(m - 1) * period + fill``; 0 drops a pipeline."""
    n = len(periods)
    if n == 0:
        return []

    kinds: dict[tuple[float, float], int] = {}  # replicas of one shape share (period, fill)
    for pf in zip(periods, fills):
        kinds[pf] = kinds.get(pf, 0) + 1

    def total_at(T: float) -> int:
        return sum(k * (int((T - f) / p) + 1) for (p, f), k in kinds.items() if T >= f)

    lo, hi = 0.0, max(f + (total - 1) * p for p, f in zip(periods, fills))
    for _ in range(60):
        mid = (lo + hi) / 2
        if total_at(mid) >= total:
            hi = mid
        else:
            lo = mid
    c = [max(0, int((hi - f) / p) + 1) if hi >= f else 0 for p, f in zip(periods, fills)]
    extra = sum(c) - total
    if extra > 0:  # trim from the pipelines that finish last (ties: the first such pipeline)
        heap = [(-((c[i] - 1) * periods[i] + fills[i]), i) for i in range(n) if c[i] > 0]
        heapq.heapify(heap)
        for _ in range(extra):
            _, i = heapq.heappop(heap)
            c[i] -= 1
            if c[i] > 0:
                heapq.heappush(heap, (-((c[i] - 1) * periods[i] + fills[i]), i))
    elif extra < 0:  # top up the pipelines that would finish first
        heap = [(c[i] * periods[i] + fills[i], i) for i in range(n)]
        heapq.heapify(heap)
        for _ in range(-extra):
            _, i = heapq.heappop(heap)
            c[i] += 1
            heapq.heappush(heap, (c[i] * periods[i] + fills[i], i))
    return c


def share_samples(periods: list[float], fills: list[float], sizes: list[int], total: int) -> list[int] | None:
    """:func:`share_micro_batches` for pipelines with their own micro-batch sizes: micro-batches per pipeline
    whose samples make up ``total`` exactly, with the earliest slowest ``(m - 1) * period + fill``. The sizes
    must divide one another (1, 2, 4, ...): then the largest sizes taken first, as many as fit by a finish
    time, make up the batch whenever any choice can, so bisection on that time finds the best. None when
    the sizes cannot make up ``total``."""
    n = len(periods)
    kinds = sorted({b for b in sizes}, reverse=True)
    if n == 0 or any(a % b for a, b in zip(kinds, kinds[1:])) or total % kinds[-1]:
        return None
    by_size = {b: [i for i in range(n) if sizes[i] == b] for b in kinds}
    shapes: dict[int, dict[tuple[float, float], int]] = {b: {} for b in kinds}  # replicas share (period, fill)
    for p, f, b in zip(periods, fills, sizes):
        shapes[b][(p, f)] = shapes[b].get((p, f), 0) + 1

    def plan_at(T: float) -> list[int] | None:
        """Micro-batches per size class finishing by ``T`` (largest sizes first), or None if short."""
        left, out = total, []
        for b in kinds:
            cap = sum(k * (int((T - f) / p) + 1) for (p, f), k in shapes[b].items() if T >= f)
            take = min(cap, left // b)
            out.append(take)
            left -= take * b
        return out if left == 0 else None

    hi = max(f + (total // b) * p for p, f, b in zip(periods, fills, sizes))
    best = plan_at(hi)
    if best is None:
        return None
    lo = 0.0
    for _ in range(60):
        mid = (lo + hi) / 2
        r = plan_at(mid)
        if r is None:
            lo = mid
        else:
            hi, best = mid, r
    c = [0] * n
    for b, m in zip(kinds, best):
        idx = by_size[b]
        for i, k in zip(idx, share_micro_batches([periods[i] for i in idx], [fills[i] for i in idx], m)):
            c[i] = k
    return c


def group_sizes(template: Template, mbs: int | tuple[int, ...]) -> tuple[int, ...]:
    """Each group's micro-batch size: one for all (an int) or one per group."""
    return (mbs,) * len(template.groups) if isinstance(mbs, int) else tuple(mbs)


def mbs_candidates(template: Template, job: Job, allow_fewer_pipelines: bool = False) -> list[int]:
    """Micro-batch sizes dividing the batch and every stage's dp, up to 32 sequences per GPU of the widest
    stage (a stage of dp 8 splits a micro-batch of 128 into 16 each); with ``allow_fewer_pipelines`` also
    those that feed fewer micro-batches than the template has pipelines (the rest are dropped)."""
    n_pipes = sum(g.replicas for g in template.groups)
    dps = {s.dp for g in template.groups for s in g.slots}
    top = max(dps)  # up to 32 sequences per GPU of the widest stage: 32 x its dp (the power of two at or above it)
    choices = MBS_CHOICES + tuple(MBS_CHOICES[-1] * 2 ** i for i in range(1, top.bit_length() + 1)
                                  if 2 ** (i - 1) < top)
    # a lock-step stage's dp off the powers of two (200 replicas for a batch of 1000) divides none of them: its
    # own multiples, 1-32 sequences per replica
    wide = lcm(*dps)
    if wide & (wide - 1):
        choices += tuple(wide * k for k in MBS_CHOICES)
    gbs = job.global_batch_size
    # one or two micro-batches per pipeline where that is off the powers of two (24 sequences each for 16
    # data-parallel replicas of a batch of 384): the fewest, largest micro-batches
    shares = tuple(gbs // (n_pipes * k) for k in (1, 2) if gbs % (n_pipes * k) == 0)
    choices += tuple(sorted({b for b in shares if b <= max(choices)} - set(choices)))
    out = [b for b in choices if gbs % b == 0 and all(b % d == 0 for d in dps)
           and (allow_fewer_pipelines or gbs // b >= n_pipes)]
    return out
