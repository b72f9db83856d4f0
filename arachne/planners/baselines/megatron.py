"""Megatron-LM's homogeneous 3D grid (docs/baselines.md §2), the reference every heterogeneous planner must beat.

``megatron`` is variant H-a (best single GPU type: a grid on each type's GPUs, the rest idle);
``megatron-oblivious`` is H-b (one grid over all GPUs ranked as if they were all the fastest type,
memory checked against the smallest GPU; the common model then exposes the stragglers).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from arachne.cost import CostModel
from arachne.plan import Pipeline, Stage
from arachne.planners.baselines.common import (
    DEFAULT_MBS,
    BaselinePlanner,
    Ctx,
    divisors,
    even_split,
    node_devices,
    node_tps,
    nodes_of_type,
    types_fastest_first,
    uniform_subcluster,
)
from arachne.planners.protocol import progress_bar
from arachne.spec.cluster import Cluster, Node
from arachne.spec.gpus import GPUType


def homogenised(cluster: Cluster, gpu: GPUType) -> Cluster:
    """The same nodes and links with every GPU replaced by ``gpu`` (H-b's view of the cluster)."""
    nodes = tuple(dataclasses.replace(n, gpu=gpu) for n in cluster.nodes)
    return Cluster(f"{cluster.name} (as {gpu.name})", nodes, cluster.catalog)


class MegatronPlanner(BaselinePlanner):
    """Nested loops over (tp, pp, b, ep, recompute, ZeRO-1); keep what fits; rank by the common model.

    ``uneven``: any pp <= L with a near-even split instead of pp | L. ``quirks``/``ep_postpass`` are
    accepted for a uniform constructor and ignored (no reference quirks; EP is native)."""

    name = "megatron"
    uniform_nodes = False   # H-a takes a uniform subset per type itself
    harness = False         # only fitting plans are kept, so the ranking is already the harness's
    native_ep = True

    def __init__(self, oblivious: bool = False, uneven: bool = False,
                 micro_batch_sizes: Sequence[int] = DEFAULT_MBS, recompute: bool = True, zero: bool = True,
                 quirks: bool = False, ep_postpass: bool = False):
        super().__init__(quirks=quirks, ep_postpass=False)  # EP is native
        self.oblivious = oblivious
        self.uneven = uneven
        self.mbs_options = tuple(micro_batch_sizes)
        self.recompute_options = (False, True) if recompute else (False,)
        self.zero = zero
        if oblivious:
            self.name = "megatron-oblivious"

    # ---- variants -------------------------------------------------------------------------------
    def search(self, ctx: Ctx) -> None:
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
    def _shapes(self, ctx: Ctx, num_gpus: int, node_size: int) -> list[tuple[int, int, int]]:
        """(tp, pp, dp): TP inside a node, pp | L (or any pp with ``uneven``), the largest dp that
        tiles the GPUs and divides the global batch."""
        L, G = ctx.model.num_layers, ctx.job.global_batch_size
        pps = range(1, L + 1) if self.uneven else divisors(L)
        out = []
        for tp in node_tps(ctx.model, node_size):
            for pp in pps:
                most = num_gpus // (tp * pp)
                dp = max((d for d in range(1, most + 1) if G % d == 0), default=0)
                if dp:
                    out.append((tp, pp, dp))
        return out

    def _grid(self, ctx: Ctx, nodes: list[Node], pricer: CostModel, mem_cap: float | None, label: str) -> None:
        devices = node_devices(nodes)
        shapes = self._shapes(ctx, len(devices), nodes[0].num_gpus)
        with progress_bar(ctx.budget.progress, f"megatron grid ({label})", total=len(shapes)) as advance:
            for tp, pp, dp in shapes:
                if ctx.expired():
                    return
                for plan in self._plans(ctx, devices, tp, pp, dp):
                    ctx.stats.candidates += 1
                    est = pricer.estimate(plan)
                    fits = est.fits if mem_cap is None else est.max_memory_bytes <= mem_cap
                    if fits:
                        ctx.add(plan, est.iteration_time_s)
                advance()

    def _plans(self, ctx: Ctx, devices: list[str], tp: int, pp: int, dp: int):
        """Every (b, ep, recompute, ZeRO) variant of one (tp, pp, dp) shape, ranks TP-DP-PP."""
        G, model = ctx.job.global_batch_size, ctx.model
        layers = even_split(model.num_layers, pp)
        eps = divisors(math.gcd(dp, model.num_experts)) if model.is_moe else [1]
        zeros = (0, 1) if self.zero and dp > 1 else (0,)
        for b in self.mbs_options:
            if G % (dp * b):
                continue
            for ep in eps:
                for rc in self.recompute_options:
                    stages = tuple(Stage(layers=layers[s], devices=tuple(devices[s * dp * tp:(s + 1) * dp * tp]),
                                         tp=tp, dp=dp, ep=ep, recompute=rc) for s in range(pp))
                    pipe = Pipeline(micro_batches=G // (dp * b), stages=stages)
                    for z in zeros:
                        yield ctx.plan(dp * b, [pipe], zero_stage=z)


