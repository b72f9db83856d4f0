"""FlashFlex / HexiScale (Yan et al., arXiv 2409.01143; docs/baselines.md §5): graph-partitioned pipelines.

Phase 1 splits the GPU graph into pipelines of equal compute, cutting the *fast* links (so DP
traffic between pipelines rides them); phase 2 splits each pipeline into 1-3 parts cutting the
*slow* links; parts are chained by a bounded path search, split per machine into TP stages from a
fixed menu, and layers are handed out in proportion to stage memory. Random (seeded).

METIS itself (pymetis) is not a dependency: :func:`kway_partition` is a small balanced k-way
partitioner (greedy balanced start + move/swap refinement) with the same objective.
"""

from __future__ import annotations

import random
from itertools import accumulate
from typing import Sequence

import numpy as np

from arachne.plan import Pipeline, Stage
from arachne.planners.baselines.common import BaselinePlanner, Ctx
from arachne.planners.protocol import progress_bar

# machine-share size -> TP splits FlashFlex tries (docs/baselines.md §5.2 step 5)
MENU: dict[int, list[list[int]]] = {
    1: [[1]], 2: [[2], [1, 1]], 3: [[2, 1], [1, 1, 1]], 4: [[4], [2, 2], [2, 1, 1]],
    5: [[4, 1], [2, 2, 1]], 6: [[4, 2], [2, 2, 2]], 7: [[4, 2, 1], [2, 2, 2, 1]], 8: [[8], [4, 4], [4, 2, 2]],
}

MAX_GRAPH_DEVICES = 8192
"""The most GPUs FlashFlex plans for: its dense device graph and the partitioner's copies take about
24 bytes per pair of GPUs (1.6 GB at 8,192); a larger cluster gets no plan and a note saying so."""


# ---- graph partitioning -------------------------------------------------------------------------------
def kway_partition(W: np.ndarray, vw: np.ndarray, k: int, rng: np.random.Generator, imbalance: float = 0.05,
                   sweeps: int = 6) -> list[list[int]]:
    """Split vertices into ``k`` parts of about equal vertex weight, minimising the weight of cut edges."""
    n = len(vw)
    if k <= 1:
        return [list(range(n))]
    if k >= n:
        return [[v] for v in range(n)]
    parts = np.empty(n, dtype=int)
    load = np.zeros(k)
    for v in sorted(rng.permutation(n), key=lambda v: -vw[v]):   # balanced start (largest first)
        p = int(np.argmin(load))
        parts[v] = p
        load[p] += vw[v]
    conn = W @ np.eye(k)[parts]                                   # conn[v, p]: edge weight from v into p
    cap = (1 + imbalance) * vw.sum() / k
    for _ in range(sweeps):
        moved = False
        for v in rng.permutation(n):
            moved |= _improve(v, W, vw, parts, load, conn, cap)
        if not moved:
            break
    out = [sorted(np.flatnonzero(parts == p).tolist()) for p in range(k)]
    return [p for p in out if p]


def _improve(v: int, W: np.ndarray, vw: np.ndarray, parts: np.ndarray, load: np.ndarray, conn: np.ndarray,
             cap: float) -> bool:
    """Best single move or swap of ``v`` that lowers the cut and keeps every part under ``cap``."""
    a = parts[v]
    if np.count_nonzero(parts == a) == 1:
        return False
    move_gain = conn[v] - conn[v, a]
    move_gain[a] = -np.inf
    move_gain[load + vw[v] > cap] = -np.inf
    b = int(np.argmax(move_gain))
    best, swap_with = move_gain[b], -1
    other = parts != a
    sw = conn[v, parts] - conn[v, a] + conn[np.arange(len(parts)), a] - conn[np.arange(len(parts)), parts] - 2 * W[v]
    ok = other & (load[a] - vw[v] + vw <= cap) & (load[parts] - vw + vw[v] <= cap)
    sw = np.where(ok, sw, -np.inf)
    u = int(np.argmax(sw))
    if sw[u] > best:
        best, swap_with = sw[u], u
    if not best > 1e-12 * max(1.0, abs(conn[v]).max()):
        return False
    if swap_with < 0:
        _move(v, b, W, vw, parts, load, conn)
    else:
        bu = parts[swap_with]
        _move(v, bu, W, vw, parts, load, conn)
        _move(swap_with, a, W, vw, parts, load, conn)
    return True


def _move(v: int, to: int, W: np.ndarray, vw: np.ndarray, parts: np.ndarray, load: np.ndarray,
          conn: np.ndarray) -> None:
    frm = parts[v]
    parts[v] = to
    load[frm] -= vw[v]
    load[to] += vw[v]
    conn[:, frm] -= W[:, v]
    conn[:, to] += W[:, v]


def chain_parts(weight: np.ndarray, kway: int, faithful: bool) -> list[int]:
    """Order parts into a chain from a bounded path search (top-``kway`` neighbours per step).

    Intended: the chain with the best bottleneck link, then the best total bandwidth. ``faithful``:
    the reference code's choice (per start the lexicographically largest path, across starts the
    path with the smallest total bandwidth)."""
    K = len(weight)
    if K == 1:
        return [0]

    def paths(path: list[int]) -> list[list[int]]:
        if len(path) == K:
            return [path]
        nxt = sorted((j for j in range(K) if j not in path), key=lambda j: -weight[path[-1], j])[:kway]
        return [p for j in nxt for p in paths(path + [j])]

    def links(p: list[int]) -> list[float]:
        return [weight[a, b] for a, b in zip(p, p[1:])]

    if faithful:
        per_start = [max(paths([s])) for s in range(K)]
        return min(per_start, key=lambda p: sum(links(p)))
    return max((p for s in range(K) for p in paths([s])), key=lambda p: (min(links(p)), sum(links(p))))


def gpipe_steps(compute: Sequence[float], m: int) -> float:
    """GPipe fill/drain accounting: each of the m+S-1 steps takes the slowest active stage. With at least as
    many micro-batches as stages, the fill's steps take the running maximum of the first stages, the
    m-S+1 full steps the slowest stage and the drain's the running maximum of the last stages (time
    independent of ``m``)."""
    S = len(compute)
    if S and m >= S:
        head = list(accumulate(compute[:S - 1], max))
        tail = list(accumulate(reversed(compute[1:]), max))
        return sum(head) + (m - S + 1) * max(compute) + sum(tail)
    total = 0.0
    for t in range(m + S - 1):
        lo, hi = max(0, t - m + 1), min(S - 1, t)
        total += max(compute[lo:hi + 1])
    return total


class FlashFlexPlanner(BaselinePlanner):
    """``mode``: "sweep" (Sailor's port: each pipeline count 1..N/5 once) or "walk" (upstream random
    walk over [N/L+1, N/5] for ``niter`` steps). ``quirks``: one inter-machine bandwidth for all links
    (the minimum) and the reference stage-order selection (``faithful_order``)."""

    name = "flashflex"
    uniform_nodes = False   # works per machine; machine shares above 8 GPUs are split into pieces of 8

    def __init__(self, mode: str = "sweep", niter: int = 50, micro_batch_size: int = 1, kway: int = 3,
                 faithful_order: bool | None = None, quirks: bool = False, ep_postpass: bool = False):
        super().__init__(quirks=quirks, ep_postpass=ep_postpass)
        if mode not in ("sweep", "walk"):
            raise ValueError(f"mode must be 'sweep' or 'walk', not {mode!r}")
        self.mode = mode
        self.niter = niter
        self.mbs = micro_batch_size
        self.kway = kway
        self.faithful_order = quirks if faithful_order is None else faithful_order
        if ep_postpass:
            self.name = "flashflex+ep"

    # ---- graph inputs ----------------------------------------------------------------------------------
    def _graph(self, ctx: Ctx, devices: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Bandwidth matrix (bytes/s) and vertex weights (blocks per second at tp=1, b=1)."""
        devs, net = ctx.cluster.devices, ctx.cost.network
        nodes = list(ctx.cluster.nodes)
        index = {n.name: i for i, n in enumerate(nodes)}
        if self.quirks:
            node_bw = np.full((len(nodes), len(nodes)), min(n.inter_node_bw for n in nodes))
        else:  # one flow between two nodes: the slower end's NIC or per-flow rate (as CostModel's inter_link)
            one = np.array([net.inter_link(n, n).bandwidth for n in nodes])
            node_bw = np.minimum.outer(one, one)
        np.fill_diagonal(node_bw, [n.intra_node_bw for n in nodes])
        of = np.array([index[devs[d].node.name] for d in devices])
        W = node_bw[np.ix_(of, of)]
        np.fill_diagonal(W, 0.0)
        speed = {g: 1 / ctx.type_time(g, (0, 1), False, False, 1, 1) for g in ctx.cluster.gpu_types}
        vw = np.array([speed[devs[d].gpu.name] for d in devices])
        return W, vw / vw.max()

    def _pipeline_counts(self, ctx: Ctx, rng: random.Random) -> list[int]:
        N, L = ctx.cluster.num_gpus, ctx.model.num_layers
        top = max(1, N // 5)
        if self.mode == "sweep":
            return list(range(1, top + 1))
        lo = min(top, N // L + 1)
        k = rng.randint(lo, top)
        out = []
        for _ in range(self.niter):
            out.append(k)
            k = min(top, max(lo, k + rng.choice((-1, 1))))
        return out

    def search(self, ctx: Ctx) -> None:
        devices = list(ctx.cluster.devices)
        if len(devices) > MAX_GRAPH_DEVICES:
            ctx.stats.notes["gave_up"] = (f"its device graph ({len(devices):,} x {len(devices):,} links) is past "
                                          f"what this implementation partitions ({MAX_GRAPH_DEVICES:,} GPUs)")
            return
        W, vw = self._graph(ctx, devices)
        inv = np.where(W > 0, 1e10 / np.where(W > 0, W, 1), 0.0)
        rng = random.Random(ctx.budget.seed)
        nrng = np.random.default_rng(ctx.budget.seed)
        ks = self._pipeline_counts(ctx, rng)
        with progress_bar(ctx.budget.progress, "flashflex", total=len(ks)) as advance:
            for k in ks:
                if ctx.expired():
                    return
                ctx.stats.candidates += 1
                pipes = kway_partition(inv, vw, k, nrng)
                built = [self._pipeline(ctx, [devices[i] for i in p], W[np.ix_(p, p)], vw[p], rng, nrng, len(pipes))
                         for p in pipes]
                if all(b is not None for b in built):
                    self._emit(ctx, built)
                advance()

    # ---- one pipeline --------------------------------------------------------------------------------------
    def _pipeline(self, ctx: Ctx, devs: list[str], W: np.ndarray, vw: np.ndarray, rng: random.Random,
                  nrng: np.random.Generator, k: int) -> list[Stage] | None:
        """Stage parts, their chain order, per-machine TP stages and the memory-proportional split."""
        K = 1 + sum(rng.random() < 0.2 for _ in range(2))
        parts = kway_partition(W, vw, min(K, len(devs)), nrng)
        pw = np.array([[W[np.ix_(a, b)].sum() for b in parts] for a in parts])
        m = -(-ctx.job.global_batch_size // (k * self.mbs))
        groups: list[tuple[str, ...]] = []
        for pi in chain_parts(pw, self.kway, self.faithful_order):
            groups += self._machine_stages(ctx, [devs[i] for i in parts[pi]], m, len(devs))
        L = ctx.model.num_layers
        if len(groups) > L:
            return None
        counts = self._memory_split(ctx, groups)
        stages, a = [], 0
        for g, c in zip(groups, counts):
            stages.append(Stage(layers=(a, a + c), devices=g, tp=len(g)))
            a += c
        if not self._fits(ctx, stages, m):
            return None
        return stages

    def _machine_stages(self, ctx: Ctx, devs: list[str], m: int, pipe_gpus: int) -> list[tuple[str, ...]]:
        """Per machine share of a part, the menu split whose simulated sub-pipeline is fastest."""
        by_node: dict[str, list[str]] = {}
        for d in devs:
            by_node.setdefault(d.split(":")[0], []).append(d)
        out: list[tuple[str, ...]] = []
        for share in by_node.values():
            for i in range(0, len(share), 8):
                piece = share[i:i + 8]
                out += self._best_menu(ctx, piece, m, pipe_gpus)
        return out

    def _best_menu(self, ctx: Ctx, devs: list[str], m: int, pipe_gpus: int) -> list[tuple[str, ...]]:
        L = ctx.model.num_layers
        best, best_t = None, float("inf")
        for option in MENU[len(devs)]:
            if not all(ctx.model.tp_allowed(t) for t in option):
                continue
            groups, a = [], 0
            for t in option:
                groups.append(tuple(devs[a:a + t]))
                a += t
            fake = max(len(option), round(L * len(devs) / pipe_gpus))
            cuts = self._weighted_split(fake, option)
            t = gpipe_steps([sum(ctx.stage_time(g, c, False, False, self.mbs, len(g))) for g, c in zip(groups, cuts)], m)
            if t < best_t:
                best, best_t = groups, t
        return best if best is not None else [(d,) for d in devs]

    @staticmethod
    def _weighted_split(num: int, weights: Sequence[int]) -> list[tuple[int, int]]:
        """``num`` blocks in proportion to ``weights`` (at least one each)."""
        total = sum(weights)
        sizes = [max(1, round(num * w / total)) for w in weights]
        sizes[-1] = max(1, num - sum(sizes[:-1]))
        out, a = [], 0
        for s in sizes:
            out.append((a, a + s))
            a += s
        return out

    def _memory_split(self, ctx: Ctx, groups: list[tuple[str, ...]]) -> list[int]:
        """Layers round-robin while a stage stays under its memory fraction; leftovers to the
        largest-memory stages; every stage keeps at least one block (v1 cannot express an empty stage)."""
        L = ctx.model.num_layers
        devs = ctx.cluster.devices
        mem = [sum(devs[d].gpu.memory_bytes for d in g) for g in groups]
        frac = [x / sum(mem) for x in mem]
        counts = [0] * len(groups)
        left = L
        progress = True
        while left and progress:
            progress = False
            for s in range(len(groups)):
                if left and (counts[s] + 1) / L <= frac[s] + 1e-12:
                    counts[s] += 1
                    left -= 1
                    progress = True
        for s in sorted(range(len(groups)), key=lambda s: -mem[s]) * (left // len(groups) + 1):
            if not left:
                break
            counts[s] += 1
            left -= 1
        for s in range(len(counts)):
            if counts[s] == 0:
                donor = max(range(len(counts)), key=lambda i: counts[i])
                counts[donor] -= 1
                counts[s] = 1
        return counts

    def _fits(self, ctx: Ctx, stages: list[Stage], m: int) -> bool:
        """FlashFlex's OOM check, on the common memory model (1F1B in-flight micro-batches)."""
        S = len(stages)
        devs = ctx.cluster.devices
        for i, st in enumerate(stages):
            need = ctx.stage_memory(st.layers, i == 0, i == S - 1, S, st.tp, self.mbs, min(S - i, m))
            if need > min(devs[d].gpu.memory_bytes for d in st.devices):
                return False
        return True

    # ---- native cost (§5.3) and the plan ----------------------------------------------------------------
    def _emit(self, ctx: Ctx, pipelines: list[list[Stage]]) -> None:
        G = ctx.job.global_batch_size
        k = len(pipelines)
        total = G // self.mbs
        if G % self.mbs or total < k:
            return
        shares = [total // k + (1 if i < total % k else 0) for i in range(k)]
        times = [self._pipeline_time(ctx, stages, m) for stages, m in zip(pipelines, shares)]
        T = max(times) + self._dp_time(ctx, pipelines)
        plan = ctx.plan(self.mbs, [Pipeline(micro_batches=m, stages=tuple(st)) for st, m in zip(pipelines, shares)])
        ctx.add(plan, T)

    def _pipeline_time(self, ctx: Ctx, stages: list[Stage], m: int) -> float:
        S = len(stages)
        nbytes = ctx.boundary_bytes(self.mbs)
        fwd, bwd = [], []
        for i, st in enumerate(stages):
            f, b = ctx.stage_time(st.devices, st.layers, i == 0, i == S - 1, self.mbs, st.tp)
            p2p = ctx.cost.network.p2p_time(list(st.devices), list(stages[i + 1].devices), nbytes) if i < S - 1 else 0.0
            fwd.append(f + p2p)
            bwd.append(b + p2p)
        return gpipe_steps(fwd, m) + gpipe_steps(bwd[::-1], m)

    @staticmethod
    def _dp_time(ctx: Ctx, pipelines: list[list[Stage]]) -> float:
        """Gradient all-reduce per layer segment among the pipelines' holders (finest TP shard)."""
        if len(pipelines) < 2:
            return 0.0
        L = ctx.model.num_layers
        bounds = sorted({0, L} | {st.layers[0] for p in pipelines for st in p})
        total = 0.0
        for lo, hi in zip(bounds, bounds[1:]):
            holders = [next(st for st in p if st.layers[0] <= lo < st.layers[1]) for p in pipelines]
            min_tp, max_tp = min(h.tp for h in holders), max(h.tp for h in holders)
            nbytes = ctx.grad_bytes((lo, hi), lo == 0, hi == L, 2, min_tp)
            total += ctx.cost.network.all_reduce_time([h.devices[0] for h in holders], nbytes, concurrent=max_tp)
        return total



__all__ = ["FlashFlexPlanner", "chain_parts", "gpipe_steps", "kway_partition"]
