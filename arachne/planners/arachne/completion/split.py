"""Layer split: contiguous stages that balance stage time under each stage's memory (bisection on the
bottleneck time with a greedy fill over per-layer prefix sums), optionally also balancing blocking sends."""

from __future__ import annotations

from arachne.cost.compute import act_bytes
from arachne.cost.schedule import simulate
from arachne.planners.arachne.context import PlanningContext, SlotProfile
from arachne.planners.arachne.work_clock import Work


def split_layers(profiles: list[SlotProfile], L: int, m: int, work: Work | None = None,
                 sends: list[float] | None = None,
                 skip_ahead: bool = True) -> tuple[list[tuple[int, int]], float] | None:
    """Contiguous split minimising the slowest stage, each stage within its memory; None if none fits.
    ``work`` tallies the stages of every attempt (the work clock's unit). ``sends``: per stage, the time
    its blocking point-to-point sends occupy it per micro-batch; the slowest stage time then includes
    them (a stage behind a slow link gets fewer layers), and among the splits that reach it, compute is
    balanced too. ``skip_ahead=False``: plain bisection, for comparison (``python -m benchmarks replay split-speed``)."""
    S = len(profiles)
    if S > L:
        return None
    inflight = [min(S - s, m) for s in range(S)]
    extra = sends if sends is not None and any(sends) else [0.0] * S
    inf = float("inf")
    # after a failed fill: the smallest limit T (C, when C is the limit searched) at which the greedy fill
    # would place one layer differently; below it, every fill fails the same way
    change = [inf, inf]

    def fill(T: float, C: float = inf) -> list[tuple[int, int]] | None:
        if work is not None:
            work.fill_stages += S
        out, a = [], 0
        for s, p in enumerate(profiles):
            first, last = s == 0, s == S - 1
            cap = min(T - extra[s], C)
            if last:
                if p.time(a, L, first, last) > cap or p.memory(a, L, first, last, inflight[s]) > p.capacity:
                    return failed(T, out, (a, L))
                out.append((a, L))
                return out
            lo = _largest_fit(p, a, a + 1, L - (S - 1 - s), first, inflight[s], cap)
            if lo is None:
                return failed(T, out, (a, a + 1))
            out.append((a, lo))
            a = lo
        return out

    def failed(T: float, placed: list[tuple[int, int]], stuck: tuple[int, int]) -> None:
        """Record in ``change`` where a fill that failed would first place a layer differently: each placed
        stage one layer longer, or the stage that did not fit as it is, once its cap reaches the time."""
        change[0] = change[1] = inf
        if not skip_ahead:
            return None
        grown = [(s, a, z + 1) for s, (a, z) in enumerate(placed) if z + 1 <= L - (S - 1 - s)]
        for s, a, z in grown + [(len(placed), *stuck)]:
            p, first, last = profiles[s], s == 0, z == L
            if p.memory(a, z, first, last, inflight[s]) <= p.capacity:
                t = p.time(a, z, first, last)
                change[0] = min(change[0], t + extra[s])
                if T - extra[s] >= t:
                    change[1] = min(change[1], t)
        return None

    def compute(split: list[tuple[int, int]]) -> float:
        return max(p.time(a, z, i == 0, i == S - 1) for i, (p, (a, z)) in enumerate(zip(profiles, split)))

    def slowest(split: list[tuple[int, int]]) -> float:
        return max(p.time(a, z, i == 0, i == S - 1) + x
                   for i, (p, (a, z), x) in enumerate(zip(profiles, split, extra)))

    hi_0 = max(p.time(0, L, True, True) + x for p, x in zip(profiles, extra))
    best = fill(hi_0)
    if best is None:
        return None
    if not skip_ahead:
        hi_t, best = _bisect(fill, hi_0, best)
        if extra is not sends:
            return best, hi_t
        return _bisect(lambda c: fill(hi_t, c), compute(best), best)[1], hi_t
    hi_t, best = _bisect(fill, slowest(best), best, slowest, lambda: change[0])
    slack = hi_t * (1 + 1e-4)  # the bottleneck's tolerance: the greedy fill there loads early stages fully
    if extra is not sends:
        best = fill(slack) or best
        return best, slowest(best)
    _, best = _bisect(lambda c: fill(slack, c), compute(best), best, compute, lambda: change[1])
    return best, slowest(best)


FEW_MICRO_BATCHES = 2.0
"""A split is trimmed by the 1F1B timeline (:func:`trim_last_stage`) when its pipeline runs fewer micro-batches
than this many times its stages: the schedule is then mostly warm-up and cool-down."""
TRIM_ROUNDS = 3  # layers the trim may take off the last stage, one per round
TRIM_GAIN = 0.01  # ... kept only where the timeline shortens by this share (each trimmed split costs an estimate)


def trim_last_stage(profiles: list[SlotProfile], split: list[tuple[int, int]], m: int, work: Work | None = None,
                    sends: list[float] | None = None) -> list[tuple[int, int]]:
    """The split with a layer moved off the last stage, when that stage is the slowest, onto an earlier one
    (every boundary from that stage on one layer later) while the 1F1B timeline of the stage times gets
    shorter, round by round (at least :data:`TRIM_GAIN` in all, else the split as it is), each stage within
    its memory. The rule split minimises the slowest stage, and at that bound its greedy fill loads the early
    stages fully and leaves the last at the bound; but with few micro-batches per stage the last stage paces
    the schedule (it runs each micro-batch's forward and backward back to back) while an early stage's excess
    hides in its warm-up. Judged by the cost model's own schedule (:func:`arachne.cost.schedule.simulate`) on
    the stages' forward and backward times and, with ``sends``, their blocking sends; ``work`` tallies the
    stage x micro-batch cells simulated."""
    S, L = len(profiles), split[-1][1]
    if S < 3 or m >= FEW_MICRO_BATCHES * S:
        return split
    x = sends if sends is not None else [0.0] * S
    times = [p.time(a, z, i == 0, i == S - 1) + x[i] for i, (p, (a, z)) in enumerate(zip(profiles, split))]
    if times[-1] < max(times[:-1]) * (1 - 1e-6):  # a last stage under the bound paces no more than the others
        return split
    s_fwd = tuple(0.0 if s == S - 1 else (x[s] if s == 0 else x[s] / 2) for s in range(S))
    s_bwd = tuple(0.0 if s == 0 else (x[s] if s == S - 1 else x[s] / 2) for s in range(S))
    inflight = [min(S - s, m) for s in range(S)]

    def span(sp: list[tuple[int, int]]) -> float:
        if work is not None:
            work.split_cells += S * m
        f, b = [], []
        for i, (p, (a, z)) in enumerate(zip(profiles, sp)):
            fi = p.fwd(a, z, i == 0, i == S - 1)
            f.append(fi)
            b.append(p.time(a, z, i == 0, i == S - 1) - fi)
        return simulate(tuple(f), tuple(b), s_fwd, s_bwd, m)

    def fits(sp: list[tuple[int, int]], frm: int) -> bool:
        return all(profiles[s].memory(a, z, s == 0, s == S - 1, inflight[s]) <= profiles[s].capacity
                   for s, (a, z) in enumerate(sp) if s >= frm)

    best, best_t = split, span(split)
    first_t = best_t
    for _ in range(TRIM_ROUNDS):
        a_last, _z = best[-1]
        if L - a_last < 2:
            break
        found = None
        for i in range(S - 2, -1, -1):
            cand = best[:i] + [(best[i][0], best[i][1] + 1)] + [(a + 1, z + 1) for a, z in best[i + 1:-1]] + \
                [(a_last + 1, L)]
            if not fits(cand, i):
                continue
            t = span(cand)
            if t < (found[0] if found else best_t) * (1 - 1e-6):
                found = (t, cand)
        if found is None:
            break
        best_t, best = found
    return best if best_t < (1 - TRIM_GAIN) * first_t else split


def _largest_fit(p: SlotProfile, a: int, lo: int, hi: int, first: bool, in_flight: int, cap: float) -> int | None:
    """The largest ``z`` in ``[lo, hi]`` whose not-last stage ``[a, z)`` fits: ``p.time <= cap`` and ``p.memory <=
    p.capacity`` (monotone in ``z``), by bisection; None if ``lo`` does not fit. :meth:`SlotProfile.time` and
    :meth:`SlotProfile.memory` are inlined term by term (the same floats; the layer split's innermost loop)."""
    tp, pp, ap = p.time_prefix, p.mem_param_prefix, p.mem_act_prefix
    ta, pa, aa = tp[a], pp[a], ap[a]
    emb = p.emb if first else 0.0
    fixed, capacity = p.mem_fixed, p.capacity
    first_mem = p.mem_first_param + in_flight * p.mem_first_act

    if tp[lo] - ta + emb + 0.0 > cap:  # lo itself must fit
        return None
    m = fixed + (pp[lo] - pa)
    m += in_flight * (ap[lo] - aa)
    if first:
        m += first_mem
    if m > capacity:
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if tp[mid] - ta + emb + 0.0 <= cap:
            m = fixed + (pp[mid] - pa)
            m += in_flight * (ap[mid] - aa)
            if first:
                m += first_mem
            if m <= capacity:
                lo = mid
                continue
        hi = mid - 1
    return lo


def _bisect(fill, hi: float, best: list, measure=None, change=None) -> tuple[float, list]:
    """The smallest limit (to 1e-4) at which ``fill`` still succeeds, from a limit ``hi`` that does. A limit
    that succeeds drops to what its split ``measure``s (a greedy fill succeeds there too); after a limit
    that fails, the next try is at least where the fill would ``change`` (below that it fails the same way),
    and no change below ``hi`` means ``hi`` is the least. A few fills instead of a dozen or more.
    Without ``measure`` and ``change``: plain bisection."""
    lo, floor = 0.0, 0.0
    for _ in range(40):
        if hi - lo <= 1e-4 * hi:
            break
        mid = max((lo + hi) / 2, floor)
        if mid >= hi:
            break
        r = fill(mid)
        if r is None:
            lo = mid
            if change is not None:
                floor = change()
                if floor >= hi:
                    break
        else:
            hi, best = (min(mid, measure(r)) if measure else mid), r
    return hi, best


def stage_sends(ctx: PlanningContext, group_placement, mbs: int) -> list[float]:
    """Per stage of a group, the time its blocking sends occupy it per micro-batch, as the cost model charges
    them: its activations to the next stage and its gradients back to the one before, both (a middle stage sends
    over two links); the slower of the group's first and last replica."""
    nbytes = mbs * ctx.job.sequence_length * ctx.model.hidden_size * act_bytes(ctx.job.precision)
    S = len(group_placement[0])
    out = [0.0] * S
    for rep in {0, len(group_placement) - 1}:
        devs = group_placement[rep]
        ctx.work.sends += S - 1
        per = [0.0] * S
        for i in range(S - 1):
            t = ctx.cost_model.network.p2p_time(list(devs[i]), list(devs[i + 1]), nbytes)
            per[i] += t
            per[i + 1] += t
        out = [max(a, b) for a, b in zip(out, per)]
    return out
