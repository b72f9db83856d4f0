"""Rule completion shared by planners: a template becomes a full, priced plan.

Rules: place each slot on concrete devices (TP groups inside a node, a replica's stages next to
each other); split layers to balance stage time under each stage's memory (bisection on the
bottleneck time with a greedy fill, using the cost model's per-layer times and memory); share
micro-batches across pipelines in proportion to their speed (water-filling on the fill + steady
time of each pipeline); then price a small candidate set (micro-batch size, recomputation where
memory demands it, ZeRO-1 when layers are replicated) with ``CostModel.estimate``.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from arachne.cost import CostModel, Estimate, StageEstimate
from arachne.cost.compute import act_bytes
from arachne.cost.memory import block_activation_bytes
from arachne.plan import Pipeline, Plan, Stage
from arachne.planners.arachne.template import (
    DeviceClass,
    Group,
    Slot,
    Template,
    device_classes,
    pool_classes,
    tp_options,
)
from arachne.planners.work import Work
from arachne.spec.cluster import Cluster
from arachne.spec.job import Job
from arachne.spec.model import ModelSpec, model_ref

MBS_CHOICES = (1, 2, 4, 8, 16, 32)
SEND_SHARE = 0.05  # blocking sends below this share of an even stage's compute leave the layer split alone
P2P_SHARE = 0.05  # ... and so do sends below this share of the priced step (the most rebalancing could gain)
ALT_WITHIN = 0.8  # ... and templates priced below this share of the fastest plan so far
GROUP_WITHIN = 0.97  # a micro-batch size per group is tried on templates priced within this share of the best


@dataclass
class SlotProfile:
    """Per-layer time (fwd+bwd per micro-batch, TP traffic included) and a linear memory model. The prefix
    sums are kept as lists of floats: the layer split reads them hundreds of thousands of times per plan,
    and a list index is several times cheaper than a numpy scalar's (the values are the same doubles)."""

    time_prefix: list[float]
    emb: float
    head: float
    mem_fixed: float
    mem_param_prefix: list[float]
    mem_act_prefix: list[float]
    mem_first_param: float
    mem_first_act: float
    mem_last: float
    capacity: float

    def __post_init__(self) -> None:
        for name in ("time_prefix", "mem_param_prefix", "mem_act_prefix"):
            setattr(self, name, np.asarray(getattr(self, name), dtype=float).tolist())

    def time(self, a: int, z: int, first: bool, last: bool) -> float:
        t = self.time_prefix[z] - self.time_prefix[a]
        return t + (self.emb if first else 0.0) + (self.head if last else 0.0)

    def memory(self, a: int, z: int, first: bool, last: bool, in_flight: int) -> float:
        m = self.mem_fixed + (self.mem_param_prefix[z] - self.mem_param_prefix[a])
        m += in_flight * (self.mem_act_prefix[z] - self.mem_act_prefix[a])
        if first:
            m += self.mem_first_param + in_flight * self.mem_first_act
        if last:
            m += self.mem_last
        return m


@dataclass
class PlanningContext:
    """Everything completion needs about one planning problem, with caches."""

    cluster: Cluster
    model: ModelSpec
    job: Job
    cost_model: CostModel
    classes: list[DeviceClass] = field(default_factory=list)
    memory_headroom: float = 1.0  # the cost model already charges allocator reserve
    closest_unfit: tuple[float, str] | None = None  # (worst used/capacity, description) of the nearest miss
    found_fit: bool = False  # a priced plan fits: no more pricing only to explain a failure
    even_split_notes: int = 0  # plans priced only to explain a failure (a few are enough)
    work: Work = field(default_factory=Work)  # work requested so far (a work-bounded planner's clock)
    balance_sends: bool = True  # a second layer split that also balances blocking sends (slow links)
    node_parts: bool = True  # classes of odd-sized nodes by power-of-two parts (see template.node_parts)
    best_tok_s: float = 0.0  # the fastest fitting plan priced so far
    group_sizes: bool = True  # a group of pipelines may take its own micro-batch size (priced from the best)
    group_within: float = GROUP_WITHIN  # ... on templates priced within this share of the fastest plan so far
    by_value_prefixes: bool = True  # the floor's "fastest j classes" also by each class's value alone
    wide_small_batch: bool = True  # the floor's one-stage slots across nodes for a batch smaller than a class
    type_pools: bool = True  # pipelines over a GPU type pooled across its node sizes, priced after refinement
    _profiles: dict[tuple, SlotProfile] = field(default_factory=dict)
    _stages: dict[tuple, Stage] = field(default_factory=dict)
    _pipelines: dict[tuple, Pipeline] = field(default_factory=dict)

    def note_unfit(self, est: Estimate) -> None:
        """Remember the priced plan that came closest to fitting (for the no-plan message)."""
        worst = max(est.stages, key=lambda s: s.memory_bytes / s.capacity_bytes, default=None)
        if worst is None:
            return
        ratio = worst.memory_bytes / worst.capacity_bytes
        if self.closest_unfit is None or ratio < self.closest_unfit[0]:
            self.closest_unfit = (ratio, f"the closest layout found needs {worst.memory_bytes / 1e9:.1f} GB on a "
                                         f"{worst.gpu} ({worst.capacity_bytes / 1e9:.1f} GB; over by "
                                         f"{(worst.memory_bytes - worst.capacity_bytes) / 1e9:.1f} GB) for blocks "
                                         f"{worst.layers[0]}-{worst.layers[1]} at micro-batch 1 or more")

    def __post_init__(self) -> None:
        if not self.classes:
            self.classes = device_classes(self.cluster, self.job.precision, self.node_parts)

    def stage(self, layers: tuple[int, int], devices: tuple[str, ...], tp: int, dp: int, ep: int,
              recompute: bool) -> Stage:
        """A plan stage built from validated parts by completion: pydantic's validation is skipped, and equal
        stages (a template's candidates at other micro-batch sizes share them) are built once."""
        key = (layers, devices, tp, dp, ep, recompute)
        hit = self._stages.get(key)
        if hit is None:
            hit = self._stages[key] = Stage.model_construct(
                layers=layers, devices=devices, tp=tp, dp=dp if dp > 1 else None, ep=ep, recompute=recompute,
                allow_cross_node_tp=False)
        return hit

    def pipeline(self, micro_batches: int, stages: tuple[Stage, ...], micro_batch_size: int | None) -> Pipeline:
        """A plan pipeline of :meth:`stage` objects, built once per (count, stages, size): the stages live in
        this context, so their ids name them."""
        key = (micro_batches, tuple(map(id, stages)), micro_batch_size)
        hit = self._pipelines.get(key)
        if hit is None:
            hit = self._pipelines[key] = Pipeline.model_construct(micro_batches=micro_batches, stages=stages,
                                                                  micro_batch_size=micro_batch_size)
        return hit

    # ---- slot primitives ------------------------------------------------------------------------
    def slot_profile(self, cls: int, tp: int, dp: int, ep: int, mbs: int, num_stages: int,
                     zero_shards: int, recompute: bool) -> SlotProfile:
        key = (cls, tp, dp, ep, mbs, num_stages > 1, zero_shards, recompute)
        self.work.profile_calls += 1
        hit = self._profiles.get(key)
        if hit is not None:
            return hit
        self.work.profiles += 1
        m, job, cm = self.model, self.job, self.cost_model
        gpu = self.classes[cls].gpu
        b = mbs / dp
        seq, prec = job.sequence_length, job.precision
        lc = cm.layer_costs(m, gpu, prec, seq, b, tp, ep)
        L = m.num_layers
        per = np.diff(lc.fwd_cum) + np.diff(lc.bwd_cum)
        if recompute:
            per = per + np.diff(lc.fwd_cum)
        if tp > 1 and not lc.includes_tp_comm:
            tpc = cm.tp_block_time(gpu, tp, b * seq * m.hidden_size * act_bytes(prec)) * (3 if recompute else 2)
            per = per + tpc
        if ep > 1:
            nbytes = b * seq * m.experts_top_k * m.hidden_size * act_bytes(prec) / tp
            a2a = 4 * (2 * (ep - 1) / ep * nbytes / gpu.collective_bandwidth)
            per = per + np.array([a2a if m.moe_layers[i] else 0.0 for i in range(L)])
        tprefix = np.concatenate([[0.0], np.cumsum(per)])
        # memory: linear in layers; measure the pieces with the cost model's own function
        S = max(2, num_stages)
        kw = dict(model=m, num_stages=S, tp=tp, ep=ep, b=b, precision=prec, seq=seq, zero_shards=zero_shards,
                  replicated=zero_shards > 1, recompute=recompute)
        fixed0 = cm.stage_memory(layers=(0, 0), first=False, last=False, in_flight_mbs=0, **kw).total
        recompute_peak = 0.0
        if recompute:
            recompute_peak = max(block_activation_bytes(m, i, seq, b, tp, prec, cm.cal.memory) for i in range(L))
        kinds: dict[bool, tuple[float, float]] = {}
        p_inc, a_inc = np.zeros(L), np.zeros(L)
        for i in range(L):
            kind = m.moe_layers[i]
            if kind not in kinds:
                m0 = cm.stage_memory(layers=(i, i + 1), first=False, last=False, in_flight_mbs=0, **kw).total
                m1 = cm.stage_memory(layers=(i, i + 1), first=False, last=False, in_flight_mbs=1, **kw).total
                kinds[kind] = (m0 - fixed0 - recompute_peak, m1 - m0)
            p_inc[i], a_inc[i] = kinds[kind]
        f0 = cm.stage_memory(layers=(0, 0), first=True, last=False, in_flight_mbs=0, **kw).total
        f1 = cm.stage_memory(layers=(0, 0), first=True, last=False, in_flight_mbs=1, **kw).total
        last = cm.stage_memory(layers=(0, 0), first=False, last=True, in_flight_mbs=0,
                               **{**kw, "num_stages": num_stages}).total
        prof = SlotProfile(tprefix, lc.emb_fwd + lc.emb_bwd, lc.head_fwd + lc.head_bwd, fixed0 + recompute_peak,
                           np.concatenate([[0.0], np.cumsum(p_inc)]), np.concatenate([[0.0], np.cumsum(a_inc)]),
                           f0 - fixed0, f1 - f0, last - fixed0, gpu.memory_bytes * self.memory_headroom)
        self._profiles[key] = prof
        return prof


def split_layers(profiles: list[SlotProfile], L: int, m: int, work: Work | None = None,
                 sends: list[float] | None = None,
                 skip_ahead: bool = True) -> tuple[list[tuple[int, int]], float] | None:
    """Contiguous split minimising the slowest stage, each stage within its memory; None if none fits.
    ``work`` tallies the stages of every attempt (the work clock's unit). ``sends``: per stage, the time
    its blocking point-to-point sends occupy it per micro-batch; the slowest stage time then includes
    them (a stage behind a slow link gets fewer layers), and among the splits that reach it, compute is
    balanced too. ``skip_ahead=False``: plain bisection, for comparison (``benchmarks/split_speed.py``)."""
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
            lo, hi = a + 1, L - (S - 1 - s)
            if p.time(a, lo, first, False) > cap or p.memory(a, lo, first, False, inflight[s]) > p.capacity:
                return failed(T, out, (a, lo))
            while lo < hi:  # largest z with time and memory within limits
                mid = (lo + hi + 1) // 2
                if p.time(a, mid, first, False) <= cap and p.memory(a, mid, first, False, inflight[s]) <= p.capacity:
                    lo = mid
                else:
                    hi = mid - 1
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
    """Per stage of a group, the time its blocking sends (activations forward, gradients back) occupy it
    per micro-batch, as the cost model charges them; the slower of the group's first and last replica."""
    nbytes = mbs * ctx.job.sequence_length * ctx.model.hidden_size * act_bytes(ctx.job.precision)
    S = len(group_placement[0])
    out = [0.0] * S
    for rep in {0, len(group_placement) - 1}:
        devs = group_placement[rep]
        ctx.work.sends += S - 1
        for i in range(S - 1):
            t = ctx.cost_model.network.p2p_time(list(devs[i]), list(devs[i + 1]), nbytes)
            out[i] = max(out[i], t)
            out[i + 1] = max(out[i + 1], t)
    return out


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


def place(template: Template, ctx: PlanningContext, order: str = "pipeline") -> list[list[list[tuple[str, ...]]]] | None:
    """Devices for every (group, replica, slot): TP groups inside a node, packed in order.

    ``order="pipeline"`` packs each replica's stages next to each other (cheap point-to-point);
    ``"stage"`` packs the same stage of all replicas together (cheap gradient all-reduce, as
    Megatron's tp-dp-pp rank order does)."""
    free: dict[int, list[list[str]]] = {}
    for c in ctx.classes:
        free[c.index] = c.node_devices()
    cursor = {c.index: 0 for c in ctx.classes}

    def take(slot) -> tuple[str, ...] | None:
        devs = take_from(slot.cls, slot.gpus)
        for j in pool_classes(ctx.classes[slot.cls], slot.gpus) if slot.pool and devs is None else ():
            devs = take_from(j, slot.gpus)
            if devs is not None:
                break
        return devs

    def take_from(cls: int, need: int) -> tuple[str, ...] | None:
        c = ctx.classes[cls]
        nodes = free[cls]
        i = cursor[cls]
        if need >= c.node_size:
            if need % c.node_size:  # a slot spans whole nodes or none (see template.slot_fits_nodes)
                return None
            k = need // c.node_size
            while i < len(nodes) and len(nodes[i]) != c.node_size:
                i += 1
            j = i
            while j < len(nodes) and j - i < k and len(nodes[j]) == c.node_size:
                j += 1
            if j - i < k:
                return None
            devs = [d for n in nodes[i:j] for d in n]
            for n in nodes[i:j]:
                n.clear()
            cursor[cls] = j
        else:
            while i < len(nodes) and len(nodes[i]) < need:
                i += 1
            if i >= len(nodes):
                return None
            devs = nodes[i][:need]
            del nodes[i][:need]
            cursor[cls] = i
        return tuple(devs)

    out: list[list[list[tuple[str, ...]]]] = []
    for g in template.groups:
        reps: list[list[tuple[str, ...]]] = [[()] * g.num_stages for _ in range(g.replicas)]
        cells = ([(r, j) for r in range(g.replicas) for j in range(g.num_stages)] if order == "pipeline"
                 else [(r, j) for j in range(g.num_stages) for r in range(g.replicas)])
        for r, j in cells:
            devs = take(g.slots[j])
            if devs is None:
                return None
            reps[r][j] = devs
        keys = [(ctx.classes[s.cls].gpu.name, s.tp, s.dp, s.ep) for s in g.slots]
        out.append([node_contiguous(keys, devs) for devs in reps])
    return out


def node_contiguous(keys: list[tuple], devs: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """Reorder a pipeline's stage devices within each run of interchangeable stages (same GPU type and
    shape) so that stages on one node are adjacent and the run starts on the node the stage before
    it ends on: parts of one node (:func:`node_parts`) are separate classes, and placing them class
    by class would cross between nodes at every part."""
    node = [d[0].rsplit(":", 1)[0] for d in devs]
    out = list(devs)

    def hops(seq: list[str]) -> int:
        return sum(a != b for a, b in zip(seq, seq[1:]))

    i = 0
    while i < len(devs):
        j = i + 1
        while j < len(devs) and keys[j] == keys[i]:
            j += 1
        run = node[i:j]
        if len(set(run)) > 1:
            order = list(dict.fromkeys(run))
            if i and node[i - 1] in order:
                order.remove(node[i - 1])
                order.insert(0, node[i - 1])
            rank = {n: k for k, n in enumerate(order)}
            perm = sorted(range(j - i), key=lambda k: rank[run[k]])
            edge = node[max(0, i - 1):i], node[j:j + 1]
            if hops([*edge[0], *(run[k] for k in perm), *edge[1]]) < hops([*edge[0], *run, *edge[1]]):
                out[i:j] = [devs[i + k] for k in perm]
                node[i:j] = [run[k] for k in perm]
        i = j
    return out


def placements(template: Template, ctx: PlanningContext) -> list[list[list[list[tuple[str, ...]]]]]:
    """The placements worth pricing: pipeline order, and stage order where replicas of a stage
    smaller than a node could share nodes."""
    out = [p for p in (place(template, ctx),) if p is not None]
    if any(g.replicas > 1 and any(s.gpus < ctx.classes[s.cls].node_size for s in g.slots) for g in template.groups):
        alt = place(template, ctx, "stage")
        if alt is not None and alt not in out:
            out.append(alt)
    return out


def complete(template: Template, ctx: PlanningContext, mbs: int, recompute: bool = False,
             placement=None) -> Plan | None:
    """The template as a full plan at micro-batch size ``mbs`` (None if it cannot be completed)."""
    r = complete_with_time(template, ctx, mbs, recompute, placement)
    return r[0] if r else None


def complete_with_time(template: Template, ctx: PlanningContext, mbs: int, recompute: bool = False,
                       placement=None) -> tuple[Plan, float] | None:
    """:func:`complete`, plus the completion's own time model of the pipelines (fill + steady state),
    used only to decide which candidates are worth pricing."""
    placement = placement or place(template, ctx)
    if placement is None:
        return None
    r = split_and_share(template, ctx, mbs, recompute, placement)
    if r is None:
        return None
    plan = build_plan(template, ctx, mbs, recompute, placement, *r[:2])
    return (plan, r[2]) if plan is not None else None


def group_sizes(template: Template, mbs: int | tuple[int, ...]) -> tuple[int, ...]:
    """Each group's micro-batch size: one for all (an int) or one per group."""
    return (mbs,) * len(template.groups) if isinstance(mbs, int) else tuple(mbs)


def split_and_share(template: Template, ctx: PlanningContext, mbs: int | tuple[int, ...], recompute: bool,
                    placement, sends: bool = False) -> tuple[list, list[int], float] | None:
    """The rule part of completion: per group the layer split, per pipeline its micro-batches, and the
    completion's own time model (None if it cannot complete). ``mbs``: the micro-batch size, or one per
    group. ``placement`` explains a memory failure and, with ``sends``, gives each stage's blocking send
    time for the split to balance (None when no group's sends matter: the plain split is the answer)."""
    job, L = ctx.job, ctx.model.num_layers
    gbs = job.global_batch_size
    sizes = group_sizes(template, mbs)
    uniform = len(set(sizes)) == 1
    if gbs % min(sizes):
        return None
    M = gbs // sizes[0]
    if any(b % s.dp for g, b in zip(template.groups, sizes) for s in g.slots):
        return None
    n_pipes = sum(g.replicas for g in template.groups)
    if (n_pipes > M) if uniform else sum(g.replicas * b for g, b in zip(template.groups, sizes)) > gbs:
        return None
    zero = max(1, n_pipes)
    profiles = [[ctx.slot_profile(s.cls, s.tp, s.dp, s.ep, b, g.num_stages, zero * s.dp, recompute) for s in g.slots]
                for g, b in zip(template.groups, sizes)]
    group_sends: list[list[float] | None] = [None] * len(template.groups)
    if sends:
        for gi, (g, profs) in enumerate(zip(template.groups, profiles)):
            if g.num_stages > 1:
                x = stage_sends(ctx, placement[gi], sizes[gi])
                # sends negligible next to an even stage's compute leave the plain split standing
                if max(x) >= SEND_SHARE * min(p.time(0, L, False, False) for p in profs) / g.num_stages:
                    group_sends[gi] = x
        if not any(group_sends):
            return None
    splits, periods, fills, pipe_sizes = [], [], [], []
    for gi, (g, profs) in enumerate(zip(template.groups, profiles)):
        S = g.num_stages
        r = split_layers(profs, L, max(1, gbs // (n_pipes * sizes[gi])), ctx.work, group_sends[gi])
        if r is None:
            if uniform and not ctx.found_fit and ctx.even_split_notes < 8 and (
                    ctx.closest_unfit is None or ctx.closest_unfit[0] > 1):
                ctx.even_split_notes += 1
                _note_even_split(template, ctx, sizes[0], recompute, placement)
            return None
        split, _ = r
        times = [p.time(a, z, i == 0, i == S - 1) for i, (p, (a, z)) in enumerate(zip(profs, split))]
        splits.append(split)
        periods.extend([max(times)] * g.replicas)
        fills.extend([sum(times)] * g.replicas)
        pipe_sizes.extend([sizes[gi]] * g.replicas)
    counts = share_micro_batches(periods, fills, M) if uniform else share_samples(periods, fills, pipe_sizes, gbs)
    if counts is None:
        return None
    quick = max(((m - 1) * p + f for m, p, f in zip(counts, periods, fills) if m > 0), default=float("inf"))
    return splits, counts, quick


def build_plan(template: Template, ctx: PlanningContext, mbs: int | tuple[int, ...], recompute: bool, placement,
               splits: list, counts: list[int]) -> Plan | None:
    """The plan of a completed template on one placement (pipelines of a group whose micro-batch size is not
    the first group's carry their own)."""
    job = ctx.job
    sizes = group_sizes(template, mbs)
    pipelines = []
    k = 0
    for gi, g in enumerate(template.groups):
        own = sizes[gi] if sizes[gi] != sizes[0] else None
        for r in range(g.replicas):
            m = counts[k]
            k += 1
            if m <= 0:
                continue
            stages = tuple(ctx.stage(ab, devs, s.tp, s.dp, s.ep, recompute)
                           for ab, devs, s in zip(splits[gi], placement[gi][r], g.slots))
            pipelines.append(ctx.pipeline(m, stages, own))
    if not pipelines:
        return None
    replicated = len(pipelines) > 1 or any(s.dp > 1 for g in template.groups for s in g.slots)
    return Plan(model=model_ref(ctx.model), global_batch_size=job.global_batch_size,
                sequence_length=job.sequence_length, micro_batch_size=sizes[0], precision=job.precision,
                zero_stage=1 if replicated else 0, optimizer=job.optimizer, pipelines=tuple(pipelines))


def cap_replicas(template: Template, max_pipelines: int) -> Template:
    """At most ``max_pipelines`` pipelines in total (each needs a micro-batch): later groups give way."""
    if sum(g.replicas for g in template.groups) <= max_pipelines:
        return template
    groups, left = [], max_pipelines
    for g in template.groups:
        r = min(g.replicas, left)
        if r > 0:
            groups.append(Group(g.slots, r))
        left -= r
    return Template(tuple(groups))


def _note_even_split(template: Template, ctx: PlanningContext, mbs: int, recompute: bool, placement) -> None:
    """Price the template with even layer splits, only to report how far memory is from fitting."""
    L = ctx.model.num_layers
    if any(g.num_stages > L for g in template.groups):
        return
    M = ctx.job.global_batch_size // mbs
    n = sum(g.replicas for g in template.groups)
    if n > M:
        return
    pipes = []
    for gi, g in enumerate(template.groups):
        S = g.num_stages
        edges = [round(i * L / S) for i in range(S + 1)]
        for r in range(g.replicas):
            stages = tuple(Stage(layers=(a, b), devices=devs, tp=s.tp, dp=s.dp if s.dp > 1 else None, ep=s.ep,
                                 recompute=recompute)
                           for a, b, devs, s in zip(edges, edges[1:], placement[gi][r], g.slots))
            pipes.append(Pipeline(micro_batches=M // n + (1 if len(pipes) < M % n else 0), stages=stages))
    plan = Plan(model=model_ref(ctx.model), global_batch_size=ctx.job.global_batch_size,
                sequence_length=ctx.job.sequence_length, micro_batch_size=mbs, precision=ctx.job.precision,
                zero_stage=1 if n > 1 else 0, pipelines=tuple(pipes))
    ctx.note_unfit(ctx.cost_model.estimate(plan, validate=False))


def mbs_candidates(template: Template, job: Job, allow_fewer_pipelines: bool = False) -> list[int]:
    """Micro-batch sizes dividing the batch and every stage's dp, up to 32 sequences per GPU of the widest
    stage (a stage of dp 8 splits a micro-batch of 128 into 16 each); with ``allow_fewer_pipelines`` also
    those that feed fewer micro-batches than the template has pipelines (the rest are dropped)."""
    n_pipes = sum(g.replicas for g in template.groups)
    dps = {s.dp for g in template.groups for s in g.slots}
    choices = MBS_CHOICES + tuple(MBS_CHOICES[-1] * d for d in (2, 4, 8) if d <= max(dps))
    gbs = job.global_batch_size
    # one or two micro-batches per pipeline where that is off the powers of two (24 sequences each for 16
    # data-parallel replicas of a batch of 384): the fewest, largest micro-batches
    shares = tuple(gbs // (n_pipes * k) for k in (1, 2) if gbs % (n_pipes * k) == 0)
    choices += tuple(sorted({b for b in shares if b <= max(choices)} - set(choices)))
    out = [b for b in choices if gbs % b == 0 and all(b % d == 0 for d in dps)
           and (allow_fewer_pipelines or gbs // b >= n_pipes)]
    return out


def price_template(template: Template, ctx: PlanningContext, mbs_options: list[int] | None = None,
                   max_priced: int | None = 2, screen: bool = False,
                   heads: bool = True) -> tuple[Plan, Estimate] | None:
    """Complete the template at every candidate micro-batch size, price the ``max_priced`` most promising
    (by the completion's own time model; all when None) with the cost model, on each placement and
    class order, with recomputation only where memory demands it; the fastest plan that fits, or None.

    ``screen``: a cheap first look (a few times cheaper): the most promising micro-batch size only, the
    reversed class order only if the first does not fit. With ``heads``, a plan whose pace is set by a
    one-layer last stage (the head) is priced again with a wider last stage (:func:`wide_head`)."""
    if screen:
        ctx.work.screens += 1
    else:
        ctx.work.prices += 1
    template = cap_replicas(template, ctx.job.global_batch_size)
    best: tuple[Plan, Estimate] | None = None
    for variant in stage_orders(template, ctx.classes):
        if screen and best is not None:
            break
        r = _price_variant(variant, ctx, mbs_options, 1 if screen else max_priced, alt_splits=not screen)
        if r is not None and (best is None or r[1].iteration_time_s < best[1].iteration_time_s):
            best = r
    if best is not None and heads and not screen and head_bound(best[1]):
        wide = wide_head(template, ctx)
        r = price_template(wide, ctx, mbs_options, max_priced, heads=False) if wide is not None else None
        if r is not None and r[1].iteration_time_s < best[1].iteration_time_s:
            best = r
    if best is not None:
        ctx.best_tok_s = max(ctx.best_tok_s, best[1].tokens_per_s)
    return best


HEAD_BOUND = 1.25  # a one-layer last stage this much slower than its pipeline's other stages is worth widening


def head_bound(est: Estimate) -> bool:
    """Whether some pipeline's last stage holds one layer and is ``HEAD_BOUND`` times slower than any other
    stage of it: the head (a large vocabulary's projection) sets the pace, and no split can move it."""
    last: dict[int, StageEstimate] = {}
    others: dict[int, float] = {}
    for st in est.stages:
        if st.pipeline in last:
            others[st.pipeline] = max(others.get(st.pipeline, 0.0), last[st.pipeline].compute_s)
        last[st.pipeline] = st
    return any(st.layers[1] - st.layers[0] == 1 and st.stage >= 2 and st.compute_s >= HEAD_BOUND * others[pi]
               for pi, st in last.items())


def wide_head(template: Template, ctx: PlanningContext) -> Template | None:
    """The template with each group's last two stages, where they are alike, merged into one stage of twice
    the tensor parallelism: the same GPUs, one stage fewer, the head's stage twice as fast (Sailor's plan
    for DeepSeek-MoE-16B on an H100 and an H800 node: 14 one-GPU stages, then the last layer and the head
    at tp 2). None if no group has such a tail."""
    groups, changed = [], False
    for g in template.groups:
        a, b = (g.slots[-2], g.slots[-1]) if len(g.slots) >= 3 else (None, None)
        if a is not None and a == b and 2 * b.tp in tp_options(ctx.model, ctx.classes[b.cls].node_size):
            groups.append(Group(g.slots[:-2] + (Slot(b.cls, 2 * b.tp, b.dp, b.ep, b.pool),), g.replicas))
            changed = True
        else:
            groups.append(g)
    return Template(tuple(groups)) if changed else None


def stage_orders(template: Template, classes: list[DeviceClass] | None = None) -> list[Template]:
    """The template, and with its mixed pipelines' classes in reverse order: fastest first puts the
    output layer (large vocabularies need memory for the logits) on the slowest, often smallest, GPUs.
    Where a pipeline runs over the parts of the same nodes (:func:`node_parts`), also node by node."""
    out = [template]
    if any(len({s.cls for s in g.slots}) > 1 for g in template.groups):
        out.append(Template(tuple(Group(_reverse_classes(g.slots), g.replicas) for g in template.groups)))
        if classes is not None:
            groups = tuple(Group(_node_major(g.slots, classes) if g.replicas == 1 else g.slots, g.replicas)
                           for g in template.groups)
            if any(a.slots != b.slots for a, b in zip(groups, template.groups)):
                out.append(Template(groups))
    return out


def _node_major(slots: tuple[Slot, ...], classes: list[DeviceClass]) -> tuple[Slot, ...]:
    """Runs of slots over sibling parts of the same nodes, reordered to visit one node's parts, then the
    next node's in reverse (``A A B C | C B A A``): one crossing between nodes instead of one per part."""
    out: list[Slot] = []
    i = 0
    while i < len(slots):
        nodes = classes[slots[i].cls].nodes
        j = i + 1
        while j < len(slots) and classes[slots[j].cls].nodes == nodes and not slots[j].pool:
            j += 1
        run = slots[i:j]
        per_class: dict[int, list[Slot]] = {}
        for sl in run:
            per_class.setdefault(sl.cls, []).append(sl)
        N = len(nodes)
        if len(per_class) > 1 and N > 1 and not run[0].pool and all(len(v) % N == 0 for v in per_class.values()):
            for k in range(N):
                part = [sl for v in per_class.values() for sl in v[k * len(v) // N:(k + 1) * len(v) // N]]
                out += part[::-1] if k % 2 else part
        else:
            out += run
        i = j
    return tuple(out)


def _reverse_classes(slots: tuple[Slot, ...]) -> tuple[Slot, ...]:
    runs: list[list[Slot]] = []
    for s in slots:
        if runs and runs[-1][0].cls == s.cls:
            runs[-1].append(s)
        else:
            runs.append([s])
    return tuple(s for run in reversed(runs) for s in run)


def _price_variant(template: Template, ctx: PlanningContext, mbs_options: list[int] | None,
                   max_priced: int | None, alt_splits: bool = True) -> tuple[Plan, Estimate] | None:
    gbs = ctx.job.global_batch_size
    options = mbs_options or mbs_candidates(template, ctx.job, allow_fewer_pipelines=True)
    # a micro-batch size with fewer micro-batches than pipelines keeps as many pipelines as it feeds
    layouts_of: dict[Template, list] = {}
    capped: dict[int, tuple[Template, list]] = {}
    for mbs in options:
        t = cap_replicas(template, gbs // mbs)
        if t not in layouts_of:
            ctx.work.placed_slots += sum(len(g.slots) * g.replicas for g in t.groups)
            layouts_of[t] = placements(t, ctx)
        capped[mbs] = (t, layouts_of[t])
    best: tuple[Plan, Estimate] | None = None
    for recompute in (False, True):
        cands = []
        for mbs in options:
            t, layouts = capped[mbs]
            if not layouts:
                continue
            r = split_and_share(t, ctx, mbs, recompute, layouts[0])
            if r is not None:
                cands.append((r[2], mbs, r))
        cands.sort(key=lambda c: c[0])
        priced = 0
        for _, mbs, (splits, counts, _) in cands:
            if max_priced is not None and priced >= max_priced and best is not None:
                break
            priced += 1
            t, layouts = capped[mbs]
            variants = [p for p in (build_plan(t, ctx, mbs, recompute, lay, splits, counts) for lay in layouts)
                        if p is not None]
            sends_matter = False
            for cand in variants:
                est = ctx.cost_model.estimate(cand, validate=False)
                sends_matter = sends_matter or est.breakdown["p2p_s"] >= P2P_SHARE * est.iteration_time_s
                if not est.fits:
                    ctx.note_unfit(est)
                elif best is None or est.iteration_time_s < best[1].iteration_time_s:
                    best = (cand, est)
                    ctx.found_fit = True
            promising = best is None or best[1].tokens_per_s >= ALT_WITHIN * ctx.best_tok_s
            if alt_splits and ctx.balance_sends and sends_matter and promising:
                # blocking sends take a real share of the step: the split that balances them too is priced
                alt = split_and_share(t, ctx, mbs, recompute, layouts[0], sends=True)
                if alt is not None and alt[0] != splits:
                    for cand in (build_plan(t, ctx, mbs, recompute, lay, alt[0], alt[1]) for lay in layouts):
                        est = ctx.cost_model.estimate(cand, validate=False) if cand is not None else None
                        if est is not None and est.fits and est.iteration_time_s < best_time(best):
                            best = (cand, est)
                            ctx.found_fit = True
        if best is not None:
            if alt_splits and ctx.group_sizes and len(template.groups) > 1 and \
                    best[1].tokens_per_s >= ctx.group_within * ctx.best_tok_s:
                best = _price_group_sizes(ctx, capped, best, recompute)
            break  # recomputation only when nothing fits without it
    return best


GROUP_SIZE_GAIN = 0.005  # a per-group micro-batch size is priced when the completion's time model gains this


def _price_group_sizes(ctx: PlanningContext, capped: dict[int, tuple[Template, list]],
                       best: tuple[Plan, Estimate], recompute: bool) -> tuple[Plan, Estimate]:
    """From the best plan at one micro-batch size ``b``, each group in turn at another size (b/4 ... 4b; the
    fast GPUs of one group take larger micro-batches than memory lets the others): the change the
    completion's time model likes best is priced, and kept where the cost model agrees."""
    b = best[0].micro_batch_size
    if b not in capped or any(p.micro_batch_size for p in best[0].pipelines):
        return best
    t, layouts = capped[b]
    base = split_and_share(t, ctx, b, recompute, layouts[0]) if len(t.groups) > 1 and layouts else None
    if base is None:
        return best
    gbs = ctx.job.global_batch_size
    trials = []
    for gi, g in enumerate(t.groups):
        for a in mbs_candidates(Template((g,)), ctx.job, allow_fewer_pipelines=True):
            if a == b or not b <= 4 * a <= 16 * b or gbs % a:
                continue
            sizes = tuple(a if j == gi else b for j in range(len(t.groups)))
            r = split_and_share(t, ctx, sizes, recompute, layouts[0])
            if r is not None and r[2] < base[2] * (1 - GROUP_SIZE_GAIN):
                trials.append((r[2], sizes, r))
    if not trials:
        return best
    _, sizes, (splits, counts, _) = min(trials, key=lambda x: x[0])
    for lay in layouts:
        cand = build_plan(t, ctx, sizes, recompute, lay, splits, counts)
        est = ctx.cost_model.estimate(cand, validate=False) if cand is not None else None
        if est is not None and est.fits and est.iteration_time_s < best[1].iteration_time_s:
            best = (cand, est)
    return best


def best_time(best: tuple[Plan, Estimate] | None) -> float:
    return best[1].iteration_time_s if best is not None else float("inf")


def split_neighbours(plan: Plan, radius: int, limit: int, gpu_of=None):
    """Plans whose stage boundaries move by up to ``radius`` layers (the same move in every replica of a
    pipeline shape): one boundary at a time, or two neighbouring boundaries together (a stage shifts).
    A generator, linear in the number of stages."""
    shapes: dict[tuple, list[int]] = {}
    for i, p in enumerate(plan.pipelines):
        key = tuple((gpu_of(s.devices[0]) if gpu_of else s.devices[0].split(":")[0], s.tp, s.dp_size, s.layers)
                    for s in p.stages)
        shapes.setdefault((len(p.stages), key), []).append(i)
    made = 0
    for idxs in shapes.values():
        base = plan.pipelines[idxs[0]]
        bounds = [s.layers[0] for s in base.stages[1:]]
        L = base.stages[-1].layers[1]
        moves = [((i,), d) for i in range(len(bounds)) for d in range(-radius, radius + 1) if d]
        moves += [((i, i + 1), d) for i in range(len(bounds) - 1) for d in range(-radius, radius + 1) if d]
        for which, d in moves:
            nb = [b + d if k in which else b for k, b in enumerate(bounds)]
            edges = [0, *nb, L]
            if any(b >= c for b, c in zip(edges, edges[1:])):
                continue
            pipes = list(plan.pipelines)
            for i in idxs:
                p = plan.pipelines[i]
                pipes[i] = Pipeline.model_construct(  # valid parts: the counts are kept, the layers checked above
                    micro_batches=p.micro_batches, micro_batch_size=p.micro_batch_size,
                    stages=tuple(s.model_copy(update={"layers": (a, b)}) for s, a, b in zip(p.stages, edges, edges[1:])))
            yield plan.model_copy(update={"pipelines": tuple(pipes)})
            made += 1
            if made >= limit:
                return


def polish_splits(plan: Plan, est: Estimate, cost_model: CostModel, radius: int = 1, limit: int = 80,
                  deadline=None) -> tuple[Plan, Estimate]:
    """Greedy priced moves of stage boundaries (the rule split balances modelled stage time; the
    full estimate also sees transfers and the schedule)."""
    best = (plan, est)
    improved = True
    while improved:
        improved = False
        for cand in split_neighbours(best[0], radius, limit, lambda d: cost_model.cluster.devices[d].gpu.name):
            if deadline is not None and deadline.expired():
                return best
            e = cost_model.estimate(cand, validate=False)
            if e.fits and e.iteration_time_s < best[1].iteration_time_s * (1 - 1e-6):
                best, improved = (cand, e), True
    return best
