"""Megatron-LM's homogeneous 3D grid (docs/baselines.md §2), the reference every heterogeneous planner must beat.

``megatron`` is variant H-a (best single GPU type: a grid on each type's GPUs, the rest idle);
``megatron-oblivious`` is H-b (one grid over all GPUs ranked as if they were all the fastest type,
memory checked against the smallest GPU; the common model then exposes the stragglers).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Sequence

from arachne.cost import CostModel
from arachne.plan import Plan
from arachne.planners.baselines.common import (
    DEFAULT_MBS,
    BaselinePlanner,
    Ctx,
    divisors,
    node_devices,
    nodes_of_type,
    types_fastest_first,
    uniform_subcluster,
)
from arachne.planners.baselines.megatron_knobs import (
    MegatronKnobs,
    PlanBuilder,
    Point,
    Priced,
    Rung,
    cp_menu,
    expert_menu,
    ladder,
    micro_batch_menu,
    moe_overlap_variant,
    tp_menu,
    virtual_menu,
)
from arachne.planners.protocol import progress_bar
from arachne.spec.cluster import Cluster, Node
from arachne.spec.gpus import GPUType
from arachne.spec.runtimes import Legality

INTERLEAVE_SLACK = 0.1
"""v > 1 is tried while the v = 1 time less its bubble is under (1 + this) x the best time so far:
interleaving was measured to beat that floor by up to 3.7% on six grid cases (its other terms change a
little too)."""


def homogenised(cluster: Cluster, gpu: GPUType) -> Cluster:
    """The same nodes and links with every GPU replaced by ``gpu`` (H-b's view of the cluster)."""
    nodes = tuple(dataclasses.replace(n, gpu=gpu) for n in cluster.nodes)
    return Cluster(f"{cluster.name} (as {gpu.name})", nodes, cluster.catalog)


class MegatronPlanner(BaselinePlanner):
    """The grid over (tp, cp, pp) shapes, (ep, etp), b, v and the least recomputation that fits, in three
    passes (§2.2), then overlapped expert all-to-alls on the plans they could make the best; keep what fits;
    rank by the common model. The knobs are Megatron-LM's launch options
    (§2.1, :class:`MegatronKnobs`).

    ``uneven``: any pp <= L with a near-even split instead of pp | L. ``v1``: the version-1 grid (tp, pp, b,
    ep | dp, recompute none/full, ZeRO-1 on/off). ``quirks``/``ep_postpass`` are accepted for a uniform
    constructor and ignored (no reference quirks; EP is native)."""

    name = "megatron"
    uniform_nodes = False   # H-a takes a uniform subset per type itself
    harness = False         # only fitting plans are kept, so the ranking is already the harness's
    native_ep = True
    native_fp8 = True       # the --fp8-format knob (MegatronKnobs.fp8)

    def __init__(self, oblivious: bool = False, uneven: bool = False,
                 micro_batch_sizes: Sequence[int] = DEFAULT_MBS, recompute: bool = True, zero: bool = True,
                 sequence_parallel: bool = True, overlap: bool = True, max_virtual_stages: int = 4,
                 context_parallel: bool = True, cp_min_sequence: int = 8192, max_cp: int = 16,
                 expert_tp: bool = True, moe_overlap: bool = True, v1: bool = False, quirks: bool = False,
                 ep_postpass: bool = False):
        super().__init__(quirks=quirks, ep_postpass=False)  # EP is native
        self.oblivious = oblivious
        self.uneven = uneven
        self.knobs = MegatronKnobs(
            micro_batch_sizes=tuple(micro_batch_sizes), recompute=recompute, distributed_optimizer=zero,
            sequence_parallel=sequence_parallel, overlap=overlap, max_virtual_stages=max_virtual_stages,
            context_parallel=context_parallel, cp_min_sequence=cp_min_sequence, max_cp=max_cp,
            expert_tp=expert_tp, moe_overlap=moe_overlap, v1=v1)
        self._top = TopK(16)
        if oblivious:
            self.name = "megatron-oblivious"

    def restrict(self, legality: Legality | None, objective: object = None) -> None:
        """Also narrow the launch options to what the rules allow, as a Megatron-LM user targeting that runtime
        would: no ``--num-layers-per-virtual-pipeline-stage`` where interleaving is not allowed, cp up to the
        constraints' ``max_cp``, no ``--fp8-format`` where fp8 is not, ``--expert-tensor-parallel-size`` only
        where the runtime runs experts at their own tp, ``--overlap-moe-expert-parallel-comm`` only where it
        overlaps them, the distributed optimizer only where ZeRO-1 is allowed. Other rules filter the plans."""
        super().restrict(legality, objective)
        if self.legality is None:
            return
        c, r, k = self.legality.constraints, self.legality.runtime, self.knobs
        self.knobs = dataclasses.replace(
            k, max_virtual_stages=1 if c.virtual_stages is False else k.max_virtual_stages,
            max_cp=min(k.max_cp, c.max_cp or k.max_cp), context_parallel=k.context_parallel and c.max_cp != 1,
            fp8=k.fp8 and c.fp8 is not False, expert_tp=k.expert_tp and not r.expert_tp_is_tp,
            moe_overlap=k.moe_overlap and r.moe_comm_overlap,
            distributed_optimizer=k.distributed_optimizer and (c.zero_stages is None or 1 in c.zero_stages))

    # ---- variants -------------------------------------------------------------------------------
    def search(self, ctx: Ctx) -> None:
        self._top = TopK(max(1, ctx.budget.top_k))  # one ranking for every GPU type (H-a)
        if self.knobs.v1:
            ctx.stats.notes["knobs"] = "version-1 grid"
        if self.oblivious:
            self._search_oblivious(ctx)
            return
        ctx.stats.notes["variant"] = "H-a: best single GPU type"
        for gpu in types_fastest_first(ctx.cluster, ctx.precision):
            if ctx.expired():
                return
            names = [n.name for n in nodes_of_type(ctx.cluster, gpu)]
            sub, note = uniform_subcluster(ctx.cluster.subset(names))
            if note:
                ctx.stats.notes[f"subcluster[{gpu}]"] = note
            self._grid(ctx, list(sub.nodes), ctx.cost, None, gpu)

    def _search_oblivious(self, ctx: Ctx) -> None:
        sub, note = uniform_subcluster(ctx.cluster)
        if note:
            ctx.stats.notes["subcluster"] = note
        order = types_fastest_first(sub, ctx.precision)
        nodes = sorted(sub.nodes, key=lambda n: order.index(n.gpu.name))
        fast = sub.gpu_types[order[0]]
        virtual = CostModel(homogenised(sub, fast), profiles=ctx.cost.profiles, calibration=ctx.cost.cal)
        cap = min(n.gpu.memory_bytes for n in nodes)
        ctx.stats.notes["variant"] = f"H-b: type-oblivious, ranked as all {fast.name}, memory of the smallest GPU"
        self._grid(ctx, nodes, virtual, cap, "all")

    # ---- the grid --------------------------------------------------------------------------------
    def _shapes(self, ctx: Ctx, num_gpus: int, node_size: int) -> list[tuple[int, int, int, int]]:
        """(tp, cp, pp, dp): TP inside a node, cp for long sequences, pp | L (or any pp with ``uneven``),
        the largest dp that tiles the GPUs and divides the global batch."""
        L, G = ctx.model.num_layers, ctx.job.global_batch_size
        pps = range(1, L + 1) if self.uneven else divisors(L)
        out = []
        for tp in tp_menu(ctx.model, node_size, self.knobs):
            for cp in cp_menu(ctx.seq, self.knobs):
                for pp in pps:
                    most = num_gpus // (tp * cp * pp)
                    dp = max((d for d in range(1, most + 1) if G % d == 0), default=0)
                    if dp:
                        out.append((tp, cp, pp, dp))
        return out

    def _grid(self, ctx: Ctx, nodes: list[Node], pricer: CostModel, mem_cap: float | None, label: str) -> None:
        """§2.2 in three passes, so that the bounds are tight when the dear points come: (1) every point
        at v = 1 without recomputation; (2) the least recomputation that fits, for the points of pass 1
        that do not fit, fastest first; (3) interleaving, for the points whose v = 1 time less its
        bubble could still rank, most promising first."""
        devices = node_devices(nodes)
        shapes = self._shapes(ctx, len(devices), nodes[0].num_gpus)
        builder = PlanBuilder(ctx, devices, self.knobs)
        top = self._top

        def fits(plan: Plan) -> Priced:
            ctx.stats.candidates += 1
            est = pricer.estimate(plan)
            ok = est.fits if mem_cap is None else est.max_memory_bytes <= mem_cap
            t = est.iteration_time_s
            return Priced(ok, t, t - est.breakdown.get("pipeline_bubble_s", 0.0), est.breakdown.get("ep_comm_s", 0.0))

        found: list[tuple[Plan, Priced]] = []

        def keep(rung: Rung) -> None:
            for plan, got in rung.found:
                if not ctx.add(plan, got.time_s):  # the bounds count only plans the rules allow
                    continue
                top.push(got.time_s)
                found.append((plan, got))

        G, L = ctx.job.global_batch_size, ctx.model.num_layers
        seen: list[Seen] = []
        with progress_bar(ctx.budget.progress, f"megatron grid ({label})", total=len(shapes)) as advance:
            for tp, cp, pp, dp in shapes:
                for ep, etp in expert_menu(ctx.model, tp, cp, dp, self.knobs):
                    if ctx.expired():
                        return
                    for b in micro_batch_menu(G, dp, self.knobs):
                        pt = Point(tp, cp, pp, dp, 1, b, ep, etp)
                        rung = ladder(builder, pt, fits, -math.inf)
                        keep(rung)
                        seen.append(Seen(pt, rung.plain, rung.plain.floor_s))
                advance()
        if self.knobs.v1:
            return
        dead: dict[tuple, int] = {}  # (point less b, v) -> smallest b at which nothing fits

        def alive(pt: Point) -> bool:
            return pt.b < dead.get((dataclasses.replace(pt, b=0), pt.v), math.inf)

        def climb(pt: Point, plain: Priced | None) -> Rung:
            rung = ladder(builder, pt, fits, top.bound, plain)
            keep(rung)
            if not rung.may_fit:
                key = (dataclasses.replace(pt, b=0), pt.v)
                dead[key] = min(dead.get(key, pt.b), pt.b)
            return rung

        for x in sorted((x for x in seen if not x.plain.fits), key=lambda x: x.plain.time_s):
            if x.plain.time_s >= top.bound or ctx.expired():
                break  # recomputation only adds time: nothing later can rank
            if alive(x.pt):
                rung = climb(x.pt, x.plain)
                # interleaving needs more activation memory, so at least this much recomputation
                x.floor_s = min((got.floor_s for _, got in rung.found), default=x.floor_s)
        for x in sorted((x for x in seen if x.pt.pp > 1 and alive(x.pt)), key=lambda x: x.floor_s):
            if x.floor_s >= top.best * (1 + INTERLEAVE_SLACK) or ctx.expired():
                break  # interleaving wins back about the bubble at most (§2.2)
            if (G // (x.pt.dp * x.pt.b)) % x.pt.pp:
                continue
            for v in virtual_menu(L, x.pt.pp, self.knobs)[1:]:
                ptv = dataclasses.replace(x.pt, v=v)
                if alive(ptv):
                    climb(ptv, None)
        # (4) overlapped expert all-to-alls on the fitting plans that hiding all of them could make the best
        for plan, got in sorted(found, key=lambda x: x[1].time_s - x[1].ep_s):
            if got.time_s - got.ep_s >= top.best or ctx.expired():
                break
            cand = moe_overlap_variant(plan, ctx.model, self.knobs)
            if cand is not None and (ctx.legal is None or ctx.legal(cand)) and (res := fits(cand)).fits:
                ctx.add(cand, res.time_s)
                top.push(res.time_s)


@dataclasses.dataclass
class Seen:
    """A point of the first pass (v = 1, no recomputation) and what later passes learn about it."""

    pt: Point
    plain: Priced
    floor_s: float
    """The fastest fitting v = 1 variant's time less its bubble (of the plain point until one is known)."""


class TopK:
    """The k fastest fitting times seen; :attr:`bound` is the k-th (infinite until k are known)."""

    def __init__(self, k: int):
        self.k = k
        self._heap: list[float] = []  # negated: a max-heap of the k smallest

    @property
    def best(self) -> float:
        """The fastest time seen (infinite before any)."""
        return -max(self._heap) if self._heap else math.inf

    @property
    def bound(self) -> float:
        return -self._heap[0] if len(self._heap) >= self.k else math.inf

    def push(self, t: float) -> None:
        if len(self._heap) < self.k:
            heapq.heappush(self._heap, -t)
        elif t < -self._heap[0]:
            heapq.heapreplace(self._heap, -t)
