"""Sailor (Strati et al., SOSP'25; docs/baselines.md §6): uniform stages, one D, heterogeneous replicas.

Outer loops over stage count P, micro-batch b and data-parallel degree D (only the D values where
the micro-batch count changes, descending, with early stop); TP per (GPU type, stage) fixed by the
memory-floor / speed-up-ceiling heuristics; a memoised stage-wise DP chooses how many of the D
replicas of each stage every GPU type supplies. GPUs may stay idle. Ranking: Sailor's iteration
time, its terms from the common cost model. Geo/zones and the $ objective are not modelled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Sequence

from arachne.plan import Pipeline, Plan, Stage
from arachne.planners.baselines.common import (
    DEFAULT_MBS,
    BaselinePlanner,
    Ctx,
    ext_cuts_to_blocks,
    gpu_speed_key,
    nodes_of_type,
    powers_of_two,
)
from arachne.planners.protocol import progress_bar

SPEEDUP_THRESHOLD = 1.5


def uniform_ext_split(num_blocks: int, parts: int) -> list[tuple[int, int]] | None:
    """Sailor's split of the extended list: floor((L+2)/P) each, the extra layers to the last stages."""
    n = num_blocks + 2
    base, extra = divmod(n, parts)
    if base == 0:
        return None
    cuts = [0]
    for i in range(parts):
        cuts.append(cuts[-1] + base + (1 if i >= parts - extra else 0))
    return ext_cuts_to_blocks(cuts, num_blocks)


def dp_candidates(gbs: int, b: int, most: int) -> list[int]:
    """S-H5: the D values (<= most) at which ceil(G / (b D)) changes, descending."""
    out, prev = [], None
    for D in range(1, most + 1):
        m = -(-gbs // (b * D))
        if m != prev:
            out.append(D)
            prev = m
    return out[::-1]


def compositions(total: int, caps: Sequence[int]) -> Iterator[tuple[int, ...]]:
    """Ways to write ``total`` as c_1 + ... + c_T with 0 <= c_t <= caps[t], first type filled first."""
    if len(caps) == 1:
        if total <= caps[0]:
            yield (total,)
        return
    rest = sum(caps[1:])
    for c in range(min(total, caps[0]), max(0, total - rest) - 1, -1):
        for tail in compositions(total - c, caps[1:]):
            yield (c,) + tail


@dataclass(frozen=True)
class Suffix:
    """The best plan for stages i..P-1 under Sailor's DP, with what merging needs."""

    time: float
    straggler: float
    sum_comp: float
    sum_p2p: float
    max_ar: float
    max_upd: float
    comp_first: float
    first_types: tuple[str, ...]
    comps: tuple[tuple[int, ...], ...]   # composition per stage (replicas per type)


class SailorPlanner(BaselinePlanner):
    """``quirks``: the update term is dropped when merging stages, and in a heterogeneous pool the
    first GPU type (alphabetical) takes the memory-floor TP only (reference code, §12)."""

    name = "sailor"
    uniform_nodes = False   # per-type VM sizes

    def __init__(self, micro_batch_sizes: Sequence[int] = DEFAULT_MBS, speedup_threshold: float = SPEEDUP_THRESHOLD,
                 quirks: bool = False, ep_postpass: bool = False):
        super().__init__(quirks=quirks, ep_postpass=ep_postpass)
        self.mbs_options = tuple(micro_batch_sizes)
        self.speedup = speedup_threshold
        if ep_postpass:
            self.name = "sailor+ep"

    # ---- outer loops (§6.3) --------------------------------------------------------------------------
    def search(self, ctx: Ctx) -> None:
        L, G = ctx.model.num_layers, ctx.job.global_batch_size
        self.types = sorted(ctx.cluster.gpu_types)                  # Sailor iterates types alphabetically
        self._cache: dict[tuple, tuple[float, float, float] | float] = {}
        self.avail = tuple(sum(n.num_gpus for n in nodes_of_type(ctx.cluster, t)) for t in self.types)
        with progress_bar(ctx.budget.progress, "sailor", total=L) as advance:
            for P in range(1, L + 1):
                layers = uniform_ext_split(L, P)
                if layers is None:
                    advance()
                    continue
                for b in self.mbs_options:
                    if G % b:
                        continue
                    if not self._per_b(ctx, P, b, layers):
                        return
                advance()

    def _per_b(self, ctx: Ctx, P: int, b: int, layers: list[tuple[int, int]]) -> bool:
        """All D for one (P, b); False once the budget is spent."""
        tps = {t: self._tp_table(ctx, t, P, b, layers) for t in self.types}
        usable = [i for i, t in enumerate(self.types) if tps[t] is not None]
        if not usable:
            return True
        G = ctx.job.global_batch_size
        most = min(sum(self.avail[k] // tps[self.types[k]][i] for k in usable) for i in range(P))
        best = math.inf
        for D in dp_candidates(G, b, min(most, G // b)):
            if ctx.expired():
                return False
            ctx.stats.candidates += 1
            solver = _StageDP(self, ctx, P, b, D, layers, tps, usable)
            res = solver.solve(0, self.avail)
            if res is None:
                continue
            plan = self._materialise(ctx, P, b, D, layers, tps, res)
            if plan is not None:
                ctx.add(plan, res.time)
            if res.time >= best:                                     # S-H6: D stopped helping
                break
            best = res.time
        return True

    # ---- TP heuristics (S-H1..S-H3) --------------------------------------------------------------------
    def _tp_table(self, ctx: Ctx, gpu: str, P: int, b: int, layers: list[tuple[int, int]]) -> list[int] | None:
        """One TP per stage for ``gpu``: max(memory floor, speed-up ceiling); None if a stage cannot fit."""
        node = min(n.num_gpus for n in nodes_of_type(ctx.cluster, gpu))
        cands = [t for t in powers_of_two(node) if node % t == 0 and ctx.model.tp_allowed(t)]
        cap = ctx.cluster.gpu_types[gpu].memory_bytes
        floor_only = self.quirks and len(self.types) > 1 and gpu == self.types[0]
        out = []
        for i, lay in enumerate(layers):
            first, last = i == 0, i == P - 1
            floor = next((t for t in cands
                          if ctx.stage_memory(lay, first, last, P, t, b, P - i) <= cap), None)
            if floor is None:
                return None
            ceil = cands[0]
            for prev, t in zip(cands, cands[1:]):
                if ctx.type_time(gpu, lay, first, last, b, prev) / ctx.type_time(gpu, lay, first, last, b, t) < self.speedup:
                    break
                ceil = t
            out.append(floor if floor_only else max(floor, ceil))
        return out

    # ---- stage terms on the common primitives ------------------------------------------------------------
    def stage_terms(self, ctx: Ctx, i: int, P: int, b: int, D: int, layers: list[tuple[int, int]],
                    tps: dict[str, list[int]], used: tuple[str, ...]) -> tuple[float, float, float]:
        """(comp, AR, upd) of stage i with replicas of the GPU types ``used``: the slowest replica's
        fwd+bwd, the gradient all-reduce over D replicas on the bottleneck link, the largest update."""
        key = ("terms", i, P, b, D, used)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        lay, first, last = layers[i], i == 0, i == P - 1
        comp = max(ctx.type_time(t, lay, first, last, b, tps[t][i]) for t in used)
        upd = max(ctx.optimizer_time(t, lay, first, last, P, tps[t][i]) for t in used)
        ar = 0.0
        if D > 1:
            min_tp = min(tps[t][i] for t in used)
            ring = self._ring(ctx, used, D, {t: tps[t][i] for t in used})
            ar = ctx.cost.network.all_reduce_time(ring, ctx.grad_bytes(lay, first, last, P, min_tp),
                                                  concurrent=max(tps[t][i] for t in used))
        self._cache[key] = (comp, ar, upd)
        return comp, ar, upd

    @staticmethod
    def _ring(ctx: Ctx, used: tuple[str, ...], D: int, tp: dict[str, int]) -> list[str]:
        """D replica leaders spread round-robin over the nodes of the types used (bottleneck link)."""
        slots = []
        for t in used:
            for n in nodes_of_type(ctx.cluster, t):
                slots.append([f"{n.name}:{j}" for j in range(0, n.num_gpus - tp[t] + 1, tp[t])])
        ring, r = [], 0
        while len(ring) < D and any(slots):
            s = slots[r % len(slots)]
            if s:
                ring.append(s.pop(0))
            r += 1
        return ring

    def p2p(self, ctx: Ctx, i: int, b: int, tps: dict[str, list[int]], src: tuple[str, ...],
            dst: tuple[str, ...]) -> float:
        """Activation send from stage i to i+1: the slowest pair of types (gradient taken as equal)."""
        key = ("p2p", i, b, src, dst)
        hit = self._cache.get(key)
        if hit is None:
            nbytes = ctx.boundary_bytes(b)
            hit = max(ctx.cost.network.p2p_time(*self._pair(ctx, t, tps[t][i], u, tps[u][i + 1]), nbytes)
                      for t in src for u in dst)
            self._cache[key] = hit
        return hit

    @staticmethod
    def _pair(ctx: Ctx, t: str, tp_t: int, u: str, tp_u: int) -> tuple[list[str], list[str]]:
        """A TP group of type t and one of type u on a different node when there is one."""
        a = nodes_of_type(ctx.cluster, t)[0]
        others = [n for n in nodes_of_type(ctx.cluster, u) if n.name != a.name] or nodes_of_type(ctx.cluster, u)
        z = others[0]
        return [f"{a.name}:{j}" for j in range(tp_t)], [f"{z.name}:{j % z.num_gpus}" for j in range(tp_u)]

    # ---- plan -------------------------------------------------------------------------------------------
    def _materialise(self, ctx: Ctx, P: int, b: int, D: int, layers: list[tuple[int, int]],
                     tps: dict[str, list[int]], res: Suffix) -> Plan | None:
        """Allocate devices (largest TP groups first, node by node) and write D aligned pipelines."""
        free = {t: [[f"{n.name}:{j}" for j in range(n.num_gpus)] for n in nodes_of_type(ctx.cluster, t)]
                for t in self.types}
        order = sorted(self.types, key=lambda t: gpu_speed_key(ctx.cluster.gpu_types[t], ctx.precision), reverse=True)
        wanted = [(tps[t][i], i, t) for i, comp in enumerate(res.comps) for t, c in zip(self.types, comp)
                  for _ in range(c)]
        groups: dict[tuple[int, str], list[tuple[str, ...]]] = {}
        for tp, i, t in sorted(wanted, key=lambda x: -x[0]):
            fitting = [f for f in free[t] if len(f) >= tp]
            if not fitting:                                  # fragmented nodes: the counts did not tile
                return None
            node = min(fitting, key=len)                     # best fit keeps nodes whole
            groups.setdefault((i, t), []).append(tuple(node[:tp]))
            del node[:tp]
        total = ctx.job.global_batch_size // b
        pipes = []
        for k in range(D):
            stages = []
            for i in range(P):
                reps = [(t, g) for t in order for g in groups.get((i, t), [])]
                t, g = reps[k]
                stages.append(Stage(layers=layers[i], devices=g, tp=tps[t][i]))
            pipes.append(Pipeline(micro_batches=total // D + (1 if k < total % D else 0), stages=tuple(stages)))
        return ctx.plan(b, pipes)


class _StageDP:
    """Sailor's memoised stage-wise DP for one (P, b, D) (§6.4)."""

    def __init__(self, planner: SailorPlanner, ctx: Ctx, P: int, b: int, D: int, layers: list[tuple[int, int]],
                 tps: dict[str, list[int]], usable: list[int]):
        self.p, self.ctx, self.P, self.b, self.D = planner, ctx, P, b, D
        self.layers, self.tps, self.usable = layers, tps, usable
        self.m = -(-ctx.job.global_batch_size // (b * D))
        self.memo: dict[tuple, Suffix | None] = {}

    def solve(self, i: int, remaining: tuple[int, ...]) -> Suffix | None:
        key = (i, remaining)
        if key not in self.memo:
            self.memo[key] = self._solve(i, remaining)
        return self.memo[key]

    def _solve(self, i: int, remaining: tuple[int, ...]) -> Suffix | None:
        types = self.p.types
        caps = [remaining[k] // self.tps[types[k]][i] if k in self.usable else 0 for k in range(len(types))]
        best: Suffix | None = None
        prev_stage = None
        for comp in compositions(self.D, caps):
            if self.ctx.deadline.expired():
                break
            used = tuple(t for t, c in zip(types, comp) if c)
            c, ar, upd = self.p.stage_terms(self.ctx, i, self.P, self.b, self.D, self.layers, self.tps, used)
            alone = self.m * c + ar + upd
            if alone == prev_stage:                                   # S-H8: equivalent branch
                continue
            prev_stage = alone
            cand = self._with_rest(i, remaining, comp, used, c, ar, upd, alone)
            if cand is not None and (best is None or cand.time < best.time):
                best = cand
        return best

    def _with_rest(self, i: int, remaining: tuple[int, ...], comp: tuple[int, ...], used: tuple[str, ...],
                   c: float, ar: float, upd: float, alone: float) -> Suffix | None:
        if i == self.P - 1:
            return Suffix(alone, c, c, 0.0, ar, upd, c, used, (comp,))
        types = self.p.types
        left = tuple(r - n * self.tps[t][i] if n else r for r, n, t in zip(remaining, comp, types))
        rest = self.solve(i + 1, left)
        if rest is None:
            return None
        t_act = self.p.p2p(self.ctx, i, self.b, self.tps, used, rest.first_types)
        straggler = max(c + t_act, rest.comp_first + t_act, rest.straggler)
        max_ar, max_upd = max(ar, rest.max_ar), max(upd, rest.max_upd)
        time = (self.m - 1) * straggler + c + rest.sum_comp + t_act + rest.sum_p2p + max_ar
        if not self.p.quirks:
            time += max_upd
        return Suffix(time, straggler, c + rest.sum_comp, t_act + rest.sum_p2p, max_ar, max_upd, c, used,
                      (comp,) + rest.comps)

