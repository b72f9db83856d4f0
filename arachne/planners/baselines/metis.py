"""Metis (Um et al., USENIX ATC'24; docs/baselines.md §4): one pipeline of power-of-two device groups.

Search: every GPU-type order (types contiguous on the rank line) x stage count x device-group
sequence (size floor ``variance``, bounded permutations ``max_permute_len``) x micro-batch count;
inside, DP first and TP only under memory pressure, with the compute/memory layer load balancer.
Ranking: Metis' iteration-time formula, each term from the common cost model's primitives.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import permutations
from typing import Callable, Iterator, Sequence

from arachne.cost.network import Link
from arachne.plan import Pipeline, Stage
from arachne.planners.baselines.common import (
    BaselinePlanner,
    Ctx,
    divisors,
    ext_cuts_to_blocks,
    groups_cross_nodes,
    node_devices,
    nodes_of_type,
    powers_of_two,
)
from arachne.planners.protocol import progress_bar

HALLUCINATION = 7       # sub-layers per layer in the compute balancer
MEMORY_COEF = 5.0       # reference code's multiplier on profiled per-layer memory (quirk)


# ---- inter-stage enumeration (§4.2) ----------------------------------------------------------------
def stage_size_multisets(num_gpus: int, num_stages: int, shapes: Sequence[int]) -> Iterator[list[int]]:
    """Non-decreasing sequences of ``num_stages`` shapes summing to ``num_gpus``."""
    def grow(prefix: list[int], total: int, lo: int) -> Iterator[list[int]]:
        left = num_stages - len(prefix)
        if left == 0:
            if total == num_gpus:
                yield list(prefix)
            return
        need = num_gpus - total
        if shapes[-1] * left < need or shapes[lo] * left > need:
            return
        for i in range(lo, len(shapes)):
            if shapes[i] > need:
                break
            prefix.append(shapes[i])
            yield from grow(prefix, total + shapes[i], i)
            prefix.pop()

    yield from grow([], 0, 0)


def permutation_units(sizes: Sequence[int], max_len: int) -> list[tuple[int, ...]]:
    """Key idea 2: merge adjacent pairs of the smallest units until at most ``max_len`` remain
    (or a sweep makes no progress)."""
    units = [(s,) for s in sizes]
    while len(units) > max_len:
        target = sum(units[0])
        lead = next((i for i, u in enumerate(units) if u != units[0]), len(units) - 1) + 1
        sweeps = max(len(units) - max_len, lead // 2)
        merged: list[tuple[int, ...]] = []
        for i in range(0, len(units), 2):
            if i // 2 >= sweeps:
                merged.extend(units[i:])
                break
            pair = units[i:i + 2]
            if len(pair) == 2 and sum(pair[0]) == target == sum(pair[1]):
                merged.append(pair[0] + pair[1])
            else:
                merged.extend(pair)
        if len(merged) == len(units):
            break
        units = merged
    return units


def distinct_permutations(items: Sequence[tuple[int, ...]]) -> Iterator[list[tuple[int, ...]]]:
    """Each distinct ordering of a multiset once."""
    counts: dict[tuple[int, ...], int] = {}
    for it in items:
        counts[it] = counts.get(it, 0) + 1
    keys = sorted(counts)
    out: list[tuple[int, ...]] = []

    def rec() -> Iterator[list[tuple[int, ...]]]:
        if len(out) == len(items):
            yield list(out)
            return
        for k in keys:
            if counts[k]:
                counts[k] -= 1
                out.append(k)
                yield from rec()
                out.pop()
                counts[k] += 1

    yield from rec()


def device_group_sequences(num_gpus: int, num_stages: int, variance: float, max_len: int) -> Iterator[list[int]]:
    """Stage sizes (powers of two, summing to ``num_gpus``) Metis tries for ``num_stages`` stages."""
    floor = variance * max(num_gpus // num_stages, num_stages // num_gpus)
    shapes = [s for s in powers_of_two(num_gpus) if s >= floor]
    if not shapes:
        return
    for ms in stage_size_multisets(num_gpus, num_stages, shapes):
        for perm in distinct_permutations(permutation_units(ms, max_len)):
            yield [g for unit in perm for g in unit]


# ---- layer load balancer (§4.4) ---------------------------------------------------------------------
def compute_balance(shares: Sequence[float], weights: Sequence[float], sub: int = HALLUCINATION) -> list[int]:
    """Layers per stage, balancing normalised ``weights`` against stage ``shares`` at sub-layer
    granularity, then mapping back to whole layers and adjusting boundaries locally."""
    S, n = len(shares), len(weights)
    U = n * sub
    unit = [weights[u // sub] / sub for u in range(U)]
    rem = list(shares)
    owned: list[list[int]] = [[] for _ in range(S)]
    free: set[int] = set()
    k = 0
    for s in range(S - 1):                       # forward pass; the last layer stays for the last stage
        for u in range(k, U - sub):
            k = u + 1
            if rem[s] > unit[u]:
                rem[s] -= unit[u]
                owned[s].append(u)
            else:
                free.add(u)
                break
    free.update(range(k, U))
    last = S - 1
    for u in sorted(free, reverse=True):         # backward pass: the last stage from the end
        if len(owned[last]) < sub or (u + 1 == min(owned[last]) and rem[last] > unit[u]):
            rem[last] -= unit[u]
            owned[last].append(u)
            free.discard(u)
    for u in sorted(free):                       # leftovers: between the nearest assigned neighbours
        lo = max((s for s in range(S) if owned[s] and max(owned[s]) < u), default=0)
        hi = min((s for s in range(S) if owned[s] and min(owned[s]) > u), default=S - 1)
        s = max(range(lo, hi + 1), key=lambda i: (rem[i], -i))
        rem[s] -= unit[u]
        owned[s].append(u)
    layers = _whole_layers(owned, n, sub)
    rem = [shares[s] - sum(weights[i] for i in layers[s]) for s in range(S)]
    return [len(x) for x in _adjust(layers, rem, weights)]


def _whole_layers(owned: list[list[int]], n: int, sub: int) -> list[list[int]]:
    """A layer goes to the stage holding most of its sub-layers (more than half in the reference)."""
    votes = [[0] * len(owned) for _ in range(n)]
    for s, units in enumerate(owned):
        for u in units:
            votes[u // sub][s] += 1
    layers: list[list[int]] = [[] for _ in owned]
    for layer, v in enumerate(votes):
        layers[max(range(len(owned)), key=lambda s: (v[s], -s))].append(layer)
    return layers


def _adjust(layers: list[list[int]], rem: list[float], weights: Sequence[float], rounds: int = 4) -> list[list[int]]:
    """Move boundary layers into the most under-loaded stage while the worst remainder does not grow."""
    best_layers, best_rem = [list(x) for x in layers], list(rem)
    cur_layers, cur_rem = [list(x) for x in layers], list(rem)
    for r in range(1, rounds + 1):
        s = max(range(len(cur_rem)), key=lambda i: (cur_rem[i], -i))
        nbs = [i for i in (s - 1, s + 1) if 0 <= i < len(cur_rem)]
        nb = min(nbs, key=lambda i: cur_rem[i], default=None)
        if nb is not None and len(best_layers[nb]) > 1 and cur_layers[nb]:
            layer = cur_layers[nb].pop(-1 if s > nb else 0)
            cur_layers[s] = sorted(cur_layers[s] + [layer])
            cur_rem[s] -= weights[layer]
            cur_rem[nb] += weights[layer]
        if max(cur_rem) > max(best_rem) or r > 3:
            break
        best_layers, best_rem = [list(x) for x in cur_layers], list(cur_rem)
    return best_layers


def rebalance_shares(shares: Sequence[float], caps: Sequence[float], demands: Sequence[float]) -> list[float] | None:
    """Cut the shares of stages out of memory to 0.9 x what fits and spread the deficit over the
    stages with spare memory, in proportion to their shares; ``None`` when it cannot be absorbed."""
    adj, offer, deficit = [], [], 0.0
    for c, cap, dem in zip(shares, caps, demands):
        if cap > dem:
            adj.append(c)
            offer.append(c * cap / dem - c)
        else:
            cut = c * cap / dem * 0.9
            adj.append(cut)
            offer.append(0.0)
            deficit += c - cut
    if sum(offer) < deficit:
        return None
    for _ in range(100):
        if deficit <= 0.01:
            break
        total = sum(c for c, o in zip(shares, offer) if o > 0.001)
        if total <= 0:
            return None
        for i, (c, o) in enumerate(zip(shares, offer)):
            if o <= 0.001:
                continue
            give = min(o, deficit * c / total)
            adj[i] += give
            offer[i] -= give
            deficit -= give
    return adj


@dataclass
class Balanced:
    layers: list[tuple[int, int]] | None   # block ranges, None on failure
    attempts: int
    spare: list[float] | None


def balance_layers(shares: list[float], weights: Sequence[float], caps: Sequence[float], num_blocks: int,
                   demand: Callable[[list[tuple[int, int]]], list[float]], attempts: int = 3) -> Balanced:
    """§4.4: balance compute, check pooled memory, shift shares away from stages out of memory."""
    for attempt in range(1, attempts + 1):
        counts = compute_balance(shares, weights)
        cuts = [0]
        for c in counts:
            cuts.append(cuts[-1] + c)
        layers = ext_cuts_to_blocks(cuts, num_blocks)
        if layers is None:                       # a stage with only the embedding/head, or nothing
            return Balanced(None, -1, None)
        dem = demand(layers)
        spare = [c - d for c, d in zip(caps, dem)]
        if min(spare) >= 0:
            return Balanced(layers, attempt, spare)
        new = rebalance_shares(shares, caps, dem)
        if new is None:
            return Balanced(None, -1, None)
        shares = new
    return Balanced(None, -1, None)


# ---- the planner ---------------------------------------------------------------------------------------
class MetisPlanner(BaselinePlanner):
    """``variance``/``max_permute_len``: Metis' key ideas 1 and 2 (upstream 0.5 and README 4; Sailor 0.5/10).
    ``quirks``: reference-code behaviour (§12): inter-node bandwidth read as intra-node, orderings
    after the first skip S=1 and cost a mislabelled 2-stage plan over its first stage, memory
    demand = 5 x per-layer memory of one replica."""

    name = "metis"

    def __init__(self, variance: float = 0.5, max_permute_len: int = 4, max_micro_batch: int = 16,
                 max_tp: int | None = None, quirks: bool = False, ep_postpass: bool = False):
        super().__init__(quirks=quirks, ep_postpass=ep_postpass)
        self.variance = variance
        self.max_permute_len = max_permute_len
        self.max_micro_batch = max_micro_batch
        self.max_tp = max_tp
        if ep_postpass:
            self.name = "metis+ep"

    def search(self, ctx: Ctx) -> None:
        cluster, L, G = ctx.cluster, ctx.model.num_layers, ctx.job.global_batch_size
        N = cluster.num_gpus
        types = list(cluster.gpu_types)
        orders = list(permutations(types))
        counts = list(range(1, min(N, L) + 1))
        weights = self._layer_weights(ctx, types[0])
        batches = sorted(divisors(G), reverse=True)
        with progress_bar(ctx.budget.progress, "metis", total=len(orders) * len(counts)) as advance:
            for oi, order in enumerate(orders):
                devices = [d for t in order for d in node_devices(nodes_of_type(cluster, t))]
                plan_counts = counts if not (self.quirks and oi > 0) else [min(2, len(counts))] + counts[1:]
                for ci, S in enumerate(plan_counts):
                    truncated = self.quirks and oi > 0 and ci == 0
                    ctx.stats.notes["reached"] = f"type order {oi + 1}/{len(orders)}, {S} of {counts[-1]} stages"
                    for groups in device_group_sequences(N, S, self.variance, self.max_permute_len):
                        for m in batches:
                            if ctx.expired():
                                return
                            ctx.stats.candidates += 1
                            self._intra(ctx, devices, groups, m, weights, truncated)
                    advance()

    def _layer_weights(self, ctx: Ctx, gpu: str) -> list[float]:
        """Normalised per-extended-layer compute (first GPU type, tp=1, b=1), assumed type-independent."""
        L = ctx.model.num_layers
        blocks = [ctx.type_time(gpu, (i, i + 1), False, False, 1, 1) for i in range(L)]
        emb = ctx.type_time(gpu, (0, 1), True, False, 1, 1) - blocks[0]
        head = ctx.type_time(gpu, (L - 1, L), False, True, 1, 1) - blocks[-1]
        w = [emb] + blocks + [head]
        total = sum(w)
        return [x / total for x in w]

    # ---- intra-stage strategies (§4.3) ----------------------------------------------------------------
    def _valid(self, ctx: Ctx, strategies: list[tuple[int, int]], mb: int, node_size: int) -> bool:
        max_tp = self.max_tp or node_size
        for d, tp in strategies:
            b = mb // d
            if b < 1 or b > self.max_micro_batch or mb % d or tp > max_tp or not ctx.model.tp_allowed(tp):
                return False
        return True

    @staticmethod
    def _next_strategy(strategies: list[tuple[int, int]], spare: list[float] | None) -> list[tuple[int, int]] | None:
        """Halve DP / double TP in the stage with the least spare memory (before any: the largest DP)."""
        key = spare if spare else [1 / d for d, _ in strategies]
        for i in sorted(range(len(strategies)), key=lambda s: key[s]):
            d, tp = strategies[i]
            if d != 1:
                out = list(strategies)
                out[i] = (d // 2, tp * 2)
                return out
        return None

    def _intra(self, ctx: Ctx, devices: list[str], groups: list[int], m: int, weights: list[float],
               truncated: bool) -> None:
        mb = ctx.job.global_batch_size // m
        node_size = ctx.cluster.nodes[0].num_gpus
        offsets = [sum(groups[:i]) for i in range(len(groups))]
        stage_devs = [devices[o:o + g] for o, g in zip(offsets, groups)]
        strategies: list[tuple[int, int]] | None = [(g, 1) for g in groups]
        spare: list[float] | None = None
        first = True
        while True:
            if not first:
                strategies = self._next_strategy(strategies, spare)
                if strategies is None:
                    return
            first = False
            if not self._valid(ctx, strategies, mb, node_size):
                continue
            res = self._balance(ctx, stage_devs, strategies, mb, weights)
            if res.layers is None:
                spare = None
                continue
            self._emit(ctx, stage_devs, strategies, res.layers, m, mb, truncated)
            if res.attempts == 1:
                return
            spare = res.spare

    def _balance(self, ctx: Ctx, stage_devs: list[list[str]], strategies: list[tuple[int, int]], mb: int,
                 weights: list[float]) -> Balanced:
        devs = ctx.cluster.devices
        power = []
        for sd, (d, tp) in zip(stage_devs, strategies):
            replica_types = {devs[sd[k * tp]].gpu.name for k in range(d)}
            power.append(1 / max(ctx.whole_model_time(t, mb // d, tp) for t in replica_types))
        shares = [p / sum(power) for p in power]
        caps = [sum(devs[x].gpu.memory_bytes for x in sd) for sd in stage_devs]
        S = len(stage_devs)

        def demand(layers: list[tuple[int, int]]) -> list[float]:
            out = []
            for i, ((d, tp), lay) in enumerate(zip(strategies, layers)):
                b = mb // d
                if self.quirks:
                    per_layer = sum(self._layer_memory(ctx, j, tp, b) for j in range(*lay))
                    out.append(MEMORY_COEF * per_layer + 1e-3)
                else:
                    in_flight = S - i
                    out.append(d * tp * ctx.stage_memory(lay, i == 0, i == S - 1, S, tp, b, in_flight))
            return out

        return balance_layers(shares, weights, caps, ctx.model.num_layers, demand)

    @staticmethod
    def _layer_memory(ctx: Ctx, index: int, tp: int, b: int) -> float:
        """One block's state and activations for one micro-batch (a profiled per-layer figure)."""
        mem = ctx.cost.stage_memory(ctx.model, (index, index + 1), False, False, 2, tp, 1, b, 1,
                                    ctx.precision, ctx.seq)
        return mem.weights + mem.gradients + mem.optimizer + mem.activations

    # ---- native cost (§4.6) and the plan ----------------------------------------------------------------
    def _emit(self, ctx: Ctx, stage_devs: list[list[str]], strategies: list[tuple[int, int]],
              layers: list[tuple[int, int]], m: int, mb: int, truncated: bool) -> None:
        S = len(stage_devs)
        stages = tuple(Stage(layers=lay, devices=tuple(sd), tp=tp, dp=d,
                             allow_cross_node_tp=groups_cross_nodes(sd, tp))
                       for sd, (d, tp), lay in zip(stage_devs, strategies, layers))
        plan = ctx.plan(mb, [Pipeline(micro_batches=m, stages=stages)])
        counted = 1 if truncated else S
        E, U, DP, PP = [], [], [], []
        devs = ctx.cluster.devices
        for i in range(counted):
            st = stages[i]
            f, bw = ctx.stage_time(st.devices, st.layers, i == 0, i == S - 1, mb, st.tp, st.dp_size)
            E.append(f + bw)
            types = {devs[x].gpu.name for x in st.devices}
            U.append(max(ctx.optimizer_time(t, st.layers, i == 0, i == S - 1, S, st.tp) for t in types))
            DP.append(self._dp_time(ctx, st, i, S))
            if i < S - 1:
                PP.append(self._pp_time(ctx, st.devices, stages[i + 1].devices, ctx.boundary_bytes(mb)))
        T = (m - 1) * max(E) + sum(E) + max(U) + max(DP) + sum(PP)
        ctx.add(plan, T)

    @staticmethod
    def _dp_time(ctx: Ctx, st: Stage, i: int, S: int) -> float:
        d, tp = st.dp_size, st.tp
        if d == 1:
            return 0.0
        nbytes = ctx.grad_bytes(st.layers, i == 0, i == S - 1, S, tp)
        return max(ctx.cost.network.all_reduce_time([st.devices[k * tp + r] for k in range(d)], nbytes,
                                                    concurrent=tp) for r in range(tp))

    def _pp_time(self, ctx: Ctx, src: Sequence[str], dst: Sequence[str], nbytes: float) -> float:
        net = ctx.cost.network
        if self.quirks:  # get_inter_bandwidth returns the intra-node value
            link: Link = net.intra_link(net.node_of(src[0]))
            return link.time(nbytes / max(1, min(len(src), len(dst))))
        return net.p2p_time(list(src), list(dst), nbytes)



__all__ = ["MetisPlanner", "balance_layers", "compute_balance", "device_group_sequences"]
