"""AMP (Li et al., NeurIPS'22; docs/baselines.md §3): uniform (tp, dp) grid, DP layer partition, native cost.

Per-layer time is a count-weighted mean over GPU types (AMP cannot tell which stage gets the slow
GPUs), compute is linear in the micro-batch, and the search has no memory model: plans are ranked
by ``pipeline + DP`` and the harness walk drops the ones that do not fit (AMP's real trials).
"""

from __future__ import annotations

import numpy as np

from arachne.plan import Pipeline, Stage
from arachne.planners.baselines.common import (
    BaselinePlanner,
    Ctx,
    divisors,
    even_split,
    ext_cuts_to_blocks,
    minmax_partition,
    node_devices,
    node_tps,
    rep_group,
)
from arachne.planners.protocol import progress_bar


class AMPPlanner(BaselinePlanner):
    """``partition``: "dp" (AMP's pipe_ast, default) or "uniform" (Sailor's port, DeepSpeed uniform).
    ``weighted``: count-weighted mean of per-type layer times (AMP) or the unweighted mean (Sailor's port).
    ``quirks``: the DP all-reduce uses only the last ring pair's link (reference code, §12)."""

    name = "amp"

    def __init__(self, partition: str = "dp", weighted: bool = True, max_micro_batch: int | None = None,
                 quirks: bool = False, ep_postpass: bool = False):
        super().__init__(quirks=quirks, ep_postpass=ep_postpass)
        if partition not in ("dp", "uniform"):
            raise ValueError(f"partition must be 'dp' or 'uniform', not {partition!r}")
        self.partition = partition
        self.weighted = weighted
        self.max_micro_batch = max_micro_batch
        if ep_postpass:
            self.name = "amp+ep"

    # ---- per-layer profiles ----------------------------------------------------------------------
    def _layer_profile(self, ctx: Ctx, tp: int) -> np.ndarray:
        """Per extended layer (embedding, blocks, head): 3 x forward seconds for one sequence,
        averaged over GPU types (weighted by GPU count unless ``weighted`` is off)."""
        L = ctx.model.num_layers
        counts = {}
        for n in ctx.cluster.nodes:
            counts[n.gpu.name] = counts.get(n.gpu.name, 0) + n.num_gpus
        total = sum(counts.values())
        prof = np.zeros(L + 2)
        for gpu, count in counts.items():
            w = count / total if self.weighted else 1 / len(counts)
            prof += w * 3 * self._type_forward(ctx, gpu, tp)
        return prof

    def _type_forward(self, ctx: Ctx, gpu: str, tp: int) -> np.ndarray:
        """Forward seconds per extended layer for b=1 on one TP group of ``gpu``."""
        L = ctx.model.num_layers
        group = rep_group(ctx.cost.cluster, gpu, tp)
        fwd = np.array([ctx.stage_time(group, (i, i + 1), False, False, 1, tp)[0] for i in range(L)])
        emb = ctx.stage_time(group, (0, 1), True, False, 1, tp)[0] - fwd[0]
        head = ctx.stage_time(group, (L - 1, L), False, True, 1, tp)[0] - fwd[-1]
        return np.concatenate([[emb], fwd, [head]])

    # ---- search -----------------------------------------------------------------------------------
    def _candidates(self, ctx: Ctx, node_size: int, num_nodes: int) -> list[tuple[int, int, int, int]]:
        """(h, w, pp, b): h | M, w | M*N/h with w | G, pp = M*N/(h*w) <= L, b | G/w."""
        G, L = ctx.job.global_batch_size, ctx.model.num_layers
        out = []
        for h in node_tps(ctx.model, node_size):
            for w in divisors(node_size * num_nodes // h):
                pp = node_size * num_nodes // (h * w)
                if w > G or G % w or pp > L:
                    continue
                for b in divisors(G // w):
                    if self.max_micro_batch is None or b <= self.max_micro_batch:
                        out.append((h, w, pp, b))
        return out

    def search(self, ctx: Ctx) -> None:
        nodes = list(ctx.cluster.nodes)
        devices = node_devices(nodes)
        cands = self._candidates(ctx, nodes[0].num_gpus, len(nodes))
        profiles: dict[int, np.ndarray] = {}
        with progress_bar(ctx.budget.progress, "amp", total=len(cands)) as advance:
            for h, w, pp, b in cands:
                if ctx.expired():
                    return
                ctx.stats.candidates += 1
                if h not in profiles:
                    profiles[h] = self._layer_profile(ctx, h)
                self._evaluate(ctx, devices, profiles[h], h, w, pp, b)
                advance()

    def _evaluate(self, ctx: Ctx, devices: list[str], prof: np.ndarray, h: int, w: int, pp: int, b: int) -> None:
        G, L = ctx.job.global_batch_size, ctx.model.num_layers
        B = G // (w * b)
        cost_e = b * prof
        layers = self._partition(cost_e, pp, B, L)
        if layers is None:
            return
        per = w * h
        stage_devs = [devices[s * per:(s + 1) * per] for s in range(pp)]
        stage_times = [cost_e[a + (0 if a == 0 else 1): z + 1 + (1 if z == L else 0)].sum() for a, z in layers]
        comm = sum(self._boundary_cost(ctx, stage_devs[j], stage_devs[j + 1], h, w, b) for j in range(pp - 1))
        pipeline = (B - 1) * max(stage_times) + comm + cost_e.sum()
        dp = max(self._dp_cost(ctx, stage_devs[j], layers[j], j, pp, h, w) for j in range(pp))
        stages = tuple(Stage(layers=layers[j], devices=tuple(stage_devs[j]), tp=h, dp=w) for j in range(pp))
        ctx.add(ctx.plan(w * b, [Pipeline(micro_batches=B, stages=stages)]), pipeline + dp)

    def _partition(self, cost_e: np.ndarray, pp: int, B: int, L: int) -> list[tuple[int, int]] | None:
        """AMP's DP partition (B > 1) or the uniform split.

        Every block boundary carries the same activation bytes, so pipe_ast's boundary terms add
        the same sum for any cut: minimising ``(B-1) * max stage + comm`` is the exact min-max
        partition of the extended layer list (which also makes the store-without-comm quirk moot)."""
        if self.partition == "uniform" or B == 1:
            return even_split(L, pp)
        cuts = minmax_partition(cost_e, pp)
        return None if cuts is None else ext_cuts_to_blocks(cuts, L)

    def _boundary_cost(self, ctx: Ctx, src: list[str], dst: list[str], h: int, w: int, b: int) -> float:
        """Activations of ``b`` sequences across one boundary, averaged over the w replicas."""
        nbytes = ctx.boundary_bytes(b)
        net = ctx.cost.network
        return sum(net.p2p_time(src[k * h:(k + 1) * h], dst[k * h:(k + 1) * h], nbytes) for k in range(w)) / w

    def _dp_cost(self, ctx: Ctx, devs: list[str], layers: tuple[int, int], j: int, pp: int, h: int, w: int) -> float:
        """Max over tp ranks of the ring all-reduce of the stage's gradient shard over w replicas."""
        if w == 1:
            return 0.0
        nbytes = ctx.grad_bytes(layers, j == 0, j == pp - 1, pp, h)
        net = ctx.cost.network
        worst = 0.0
        for r in range(h):
            ring = [devs[k * h + r] for k in range(w)]
            if self.quirks:  # bandwidth of the last ring pair only, scaled to the ring's volume
                t = (w - 1) / w * 2 * net.all_reduce_time(ring[-2:], nbytes)
            else:
                t = net.all_reduce_time(ring, nbytes, concurrent=h)
            worst = max(worst, t)
        return worst

