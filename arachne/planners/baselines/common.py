"""Helpers shared by the baseline planners only (docs/baselines.md §1, §9-§11).

Extended layer lists (embedding + blocks + head) and their mapping back to block ranges,
device orders, the largest uniform sub-cluster, plan building, the common-model wrappers the
baselines build their native formulas from, the EP post-pass, and the harness walk (§9: drop the
ranked plans that do not fit under the common model).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Iterable, Sequence

from arachne.cost import CostModel
from arachne.cost.compute import act_bytes
from arachne.cost.memory import stage_params
from arachne.errors import InputError
from arachne.plan import Pipeline, Plan, Stage
from arachne.planners.protocol import Deadline, PlannerResult, SearchBudget, SearchStats
from arachne.spec.cluster import Cluster, Node
from arachne.spec.gpus import GPUType
from arachne.spec.job import Job
from arachne.spec.model import ModelSpec, model_ref
from arachne.spec.runtimes import Legality

DEFAULT_MBS = (1, 2, 4, 8, 16)


# ---- small arithmetic ---------------------------------------------------------------------------
def divisors(n: int) -> list[int]:
    """Positive divisors of ``n`` in ascending order."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def powers_of_two(limit: int) -> list[int]:
    """1, 2, 4, ... up to ``limit``."""
    out, p = [], 1
    while p <= limit:
        out.append(p)
        p *= 2
    return out


def node_tps(model: ModelSpec, node_size: int) -> list[int]:
    """Powers of two dividing the node size that the model's shapes allow (TP stays in a node)."""
    return [t for t in powers_of_two(node_size) if node_size % t == 0 and model.tp_allowed(t)]


def even_split(num_blocks: int, parts: int, extra_last: bool = False) -> list[tuple[int, int]]:
    """Contiguous ranges of near-equal size; the remainder goes to the first (or last) parts."""
    base, extra = divmod(num_blocks, parts)
    sizes = [base + (1 if (i >= parts - extra if extra_last else i < extra) else 0) for i in range(parts)]
    out, a = [], 0
    for s in sizes:
        out.append((a, a + s))
        a += s
    return out


# ---- extended layer list (§1) ----------------------------------------------------------------------
def ext_cuts_to_blocks(cuts: Sequence[int], num_blocks: int) -> list[tuple[int, int]] | None:
    """Stage boundaries on the extended list ``[emb, blocks..., head]`` -> block ranges.

    ``cuts`` is ``[0, c1, ..., num_blocks + 2]``. Returns ``None`` when a stage would hold only the
    embedding, only the head, or nothing (forbidden, §1)."""
    bounds = [0] + [c - 1 for c in cuts[1:-1]] + [num_blocks]
    if any(b <= a for a, b in zip(bounds, bounds[1:])):
        return None
    return list(zip(bounds, bounds[1:]))


def minmax_partition(costs: Sequence[float], parts: int, min_first: int = 2, min_last: int = 2) -> list[int] | None:
    """Cuts ``[0, ..., n]`` of ``costs`` into ``parts`` contiguous ranges minimising the largest sum.

    The first and last range hold at least ``min_first``/``min_last`` items (embedding or head plus
    one block on the extended list). Exact O(n^2 * parts) dynamic programme, vectorised."""
    import numpy as np

    n = len(costs)
    if parts == 1:
        return [0, n] if n >= max(min_first, min_last) else None
    if n < min_first + min_last + parts - 2:
        return None
    pre = np.concatenate([[0.0], np.cumsum(costs)])
    seg = pre[None, :] - pre[:, None]            # seg[c, i] = sum(costs[c:i])
    idx = np.arange(n + 1)
    seg = np.where(idx[None, :] > idx[:, None], seg, np.inf)
    best = np.where(idx >= min_first, pre, np.inf)  # one range [0, i)
    choice = []
    for j in range(1, parts):
        m = np.maximum(best[:, None], seg)          # end previous at c, this range [c, i)
        if j == parts - 1:
            m[n - min_last + 1:, :] = np.inf
        arg = np.argmin(m, axis=0)
        best = m[arg, idx]
        choice.append(arg)
    if not np.isfinite(best[n]):
        return None
    cuts = [n]
    for arg in reversed(choice):
        cuts.append(int(arg[cuts[-1]]))
    cuts.append(0)
    return cuts[::-1]


# ---- cluster views --------------------------------------------------------------------------------
def uniform_subcluster(cluster: Cluster) -> tuple[Cluster, str | None]:
    """§11.6: the largest sub-cluster whose nodes all have the same GPU count (and a note when cut)."""
    sizes: dict[int, int] = {}
    for n in cluster.nodes:
        sizes[n.num_gpus] = sizes.get(n.num_gpus, 0) + n.num_gpus
    if len(sizes) == 1:
        return cluster, None
    size = max(sizes, key=lambda s: (sizes[s], s))
    keep = [n.name for n in cluster.nodes if n.num_gpus == size]
    idle = cluster.num_gpus - sizes[size]
    note = (f"mixed node sizes: planned on the largest uniform sub-cluster ({len(keep)} nodes of {size} GPUs); "
            f"{idle} GPUs on other nodes left idle")
    return cluster.subset(keep), note


def gpu_speed_key(gpu: GPUType, precision: str) -> tuple[float, float]:
    """Sort key, fastest first when negated: peak FLOP/s, then memory."""
    return gpu.peak_flops(precision), gpu.memory_bytes


def types_fastest_first(cluster: Cluster, precision: str) -> list[str]:
    return sorted(cluster.gpu_types, key=lambda t: gpu_speed_key(cluster.gpu_types[t], precision), reverse=True)


def nodes_of_type(cluster: Cluster, gpu: str) -> list[Node]:
    return [n for n in cluster.nodes if n.gpu.name == gpu]


def node_devices(nodes: Iterable[Node]) -> list[str]:
    """Devices of ``nodes`` in rank order (node by node, local index fastest)."""
    return [f"{n.name}:{i}" for n in nodes for i in range(n.num_gpus)]


def rep_group(cluster: Cluster, gpu: str, tp: int) -> tuple[str, ...]:
    """A representative TP group of ``tp`` devices of type ``gpu`` on one node (for per-type costs)."""
    for n in cluster.nodes:
        if n.gpu.name == gpu and n.num_gpus >= tp:
            return tuple(f"{n.name}:{i}" for i in range(tp))
    nodes = nodes_of_type(cluster, gpu)
    return tuple(node_devices(nodes)[:tp])


def groups_cross_nodes(devices: Sequence[str], tp: int) -> bool:
    """Whether any TP group of consecutive ``tp`` devices spans two nodes."""
    for i in range(0, len(devices), tp):
        if len({d.split(":")[0] for d in devices[i:i + tp]}) > 1:
            return True
    return False


# ---- the search context --------------------------------------------------------------------------
@dataclass
class Ctx:
    """What a baseline search sees: inputs, the common cost model, budget and stats."""

    cluster: Cluster               # the (sub-)cluster the baseline plans on
    model: ModelSpec
    job: Job
    cost: CostModel                # priced on the full cluster
    budget: SearchBudget
    deadline: Deadline
    stats: SearchStats
    ranked: dict[int, tuple[float, Plan]] = field(default_factory=dict)
    legal: Callable[[Plan], bool] | None = None
    """Whether a plan can satisfy the run's rules (runtime preset and constraints; None: no rules): a
    baseline told them keeps only such plans, as a user of its framework targeting that runtime would."""
    _time_cache: dict[tuple, tuple[float, float]] = field(default_factory=dict)
    _opt_cache: dict[tuple, float] = field(default_factory=dict)

    def expired(self) -> bool:
        """True (and record the time-out) once the budget is spent."""
        if self.deadline.expired():
            self.stats.timed_out = True
            return True
        return False

    def add(self, plan: Plan, score: float) -> bool:
        """Record a candidate with its native score (lower is better); duplicates keep the best; a plan that
        breaks the rules (:attr:`legal`) is not recorded (False)."""
        if self.legal is not None and not self.legal(plan):
            self.stats.notes["illegal"] = self.stats.notes.get("illegal", 0) + 1
            return False
        key = hash(plan)
        old = self.ranked.get(key)
        if old is None or score < old[0]:
            self.ranked[key] = (score, plan)
        return True

    @property
    def seq(self) -> int:
        return self.job.sequence_length

    @property
    def precision(self) -> str:
        return self.job.precision

    # ---- plan building ---------------------------------------------------------------------
    def plan(self, mbs: int, pipelines: Sequence[Pipeline], zero_stage: int = 0, schedule: str = "1f1b") -> Plan:
        return Plan(model=model_ref(self.model), global_batch_size=self.job.global_batch_size,
                    sequence_length=self.seq, micro_batch_size=mbs, precision=self.precision,
                    optimizer=self.job.optimizer, zero_stage=zero_stage, schedule=schedule,
                    pipelines=tuple(pipelines))

    # ---- common-model primitives the native formulas are built from --------------------------
    def stage_time(self, devices: Sequence[str], layers: tuple[int, int], first: bool, last: bool, mbs: float,
                   tp: int, dp: int = 1, ep: int = 1) -> tuple[float, float]:
        """(fwd, bwd) seconds per micro-batch of a stage, as ``CostModel.estimate`` prices it
        (compute of the slowest group plus TP and EP traffic)."""
        key = (tuple(devices), layers, first, last, mbs, tp, dp, ep)
        hit = self._time_cache.get(key)
        if hit is None:
            st = Stage(layers=layers, devices=tuple(devices), tp=tp, dp=dp, ep=ep)
            # CostModel._stage reads only sequence_length and precision from its plan argument
            r = self.cost._stage(self.model, st, first, last, mbs, self.job)
            hit = self._time_cache[key] = (r[0], r[1])
        return hit

    def type_time(self, gpu: str, layers: tuple[int, int], first: bool, last: bool, b: float, tp: int) -> float:
        """fwd+bwd seconds of ``layers`` for ``b`` sequences on one TP group of type ``gpu``."""
        f, bw = self.stage_time(rep_group(self.cost.cluster, gpu, tp), layers, first, last, b, tp)
        return f + bw

    def whole_model_time(self, gpu: str, b: float, tp: int) -> float:
        return self.type_time(gpu, (0, self.model.num_layers), True, True, b, tp)

    def optimizer_time(self, gpu: str, layers: tuple[int, int], first: bool, last: bool, num_stages: int,
                       tp: int) -> float:
        """Adam step of a stage: the common model's whole-model step on ``gpu`` scaled by the stage's
        parameter share (Metis' "optimizer time / tp x layer fraction")."""
        key = (gpu, tp)
        whole = self._opt_cache.get(key)
        if whole is None:
            L = self.model.num_layers
            plan = self.plan(1, [Pipeline(micro_batches=self.job.global_batch_size, stages=(
                Stage(layers=(0, L), devices=rep_group(self.cost.cluster, gpu, tp), tp=tp),))])
            whole = self._opt_cache[key] = self.cost._optimizer_time(self.model, plan, {})
        full = stage_params(self.model, 0, self.model.num_layers, True, True, 1, tp, 1)
        part = stage_params(self.model, layers[0], layers[1], first, last, num_stages, tp, 1)
        return whole * part / full

    def boundary_bytes(self, b: float) -> float:
        """Activation bytes crossing a stage boundary for ``b`` sequences."""
        return b * self.seq * self.model.hidden_size * act_bytes(self.precision)

    def grad_bytes(self, layers: tuple[int, int], first: bool, last: bool, num_stages: int, tp: int) -> float:
        """Gradient bytes one device of a stage all-reduces."""
        g = 4.0 if self.precision == "fp32" else 2.0
        return stage_params(self.model, layers[0], layers[1], first, last, num_stages, tp, 1) * g

    def stage_memory(self, layers: tuple[int, int], first: bool, last: bool, num_stages: int, tp: int, b: float,
                     in_flight: int, ep: int = 1, recompute: bool = False) -> float:
        """Bytes on one device of a stage (common memory model, no ZeRO)."""
        return self.cost.stage_memory(self.model, layers, first, last, num_stages, tp, ep, b, in_flight,
                                      self.precision, self.seq, recompute=recompute).total


# ---- post-passes and the harness -----------------------------------------------------------------
def merge_aligned_pipelines(plan: Plan) -> Plan:
    """Pipelines with identical structure (layers, tp, dp per stage; micro-batches) -> one pipeline
    with stage-level dp, so that EP over the replicas becomes expressible (formats §4)."""
    groups: dict[tuple, list[Pipeline]] = {}
    for p in plan.pipelines:
        sig = (tuple((s.layers, s.tp, s.dp_size, s.recompute) for s in p.stages), p.micro_batches, plan.mbs(p))
        groups.setdefault(sig, []).append(p)
    if all(len(g) == 1 for g in groups.values()):
        return plan
    merged = []
    for (_, m, mbs), pipes in groups.items():
        stages = []
        for si, st in enumerate(pipes[0].stages):
            devs = tuple(d for p in pipes for d in p.stages[si].devices)
            stages.append(st.model_copy(update={"devices": devs, "dp": st.dp_size * len(pipes)}))
        merged.append(Pipeline(micro_batches=m, stages=tuple(stages), micro_batch_size=mbs * len(pipes)))
    first = merged[0].micro_batch_size or plan.micro_batch_size
    merged = [p.model_copy(update={"micro_batch_size": None}) if p.micro_batch_size == first else p for p in merged]
    return plan.model_copy(update={"pipelines": tuple(merged), "micro_batch_size": first})


def expert_parallel_postpass(plan: Plan, model: ModelSpec) -> Plan:
    """§11.6 EP post-pass: each stage gets the largest ep dividing its dp and num_experts.

    Memory falls monotonically with ep (expert weights are sharded), so the largest divisor is
    also the one most likely to fit; the common model prices the all-to-all it adds."""
    if not model.is_moe:
        return plan
    plan = merge_aligned_pipelines(plan)
    pipes = []
    for p in plan.pipelines:
        stages = tuple(s.model_copy(update={"ep": max(divisors(math.gcd(s.dp_size, model.num_experts)))})
                       for s in p.stages)
        pipes.append(p.model_copy(update={"stages": stages}))
    return plan.model_copy(update={"pipelines": tuple(pipes)})


def ep_variants(plan: Plan, model: ModelSpec) -> list[Plan]:
    """The plan as the algorithm wrote it and its EP post-pass variant (when that differs)."""
    ep = expert_parallel_postpass(plan, model)
    return [plan, ep] if hash(ep) != hash(plan) else [plan]


def fp8_variant(plan: Plan, cluster: Cluster) -> Plan | None:
    """The plan with FP8 GEMMs (``precision: fp8``, Transformer Engine's recipe on bf16) when every GPU it
    uses has an FP8 rate, else None: what a user of any framework switches on for an fp8 job."""
    if plan.precision != "bf16" or not all(cluster.device(d).gpu.fp8_tflops is not None for d in plan.devices):
        return None
    return plan.model_copy(update={"precision": "fp8"})


def harness_walk(ranked: Iterable[tuple[float, Plan]], cost: CostModel, k: int, deadline: Deadline, grace_s: float,
                 variants: Callable[[Plan], list[Plan]] | None = None,
                 legal: Callable[[Plan], bool] | None = None) -> tuple[list[Plan], list[float], int, int]:
    """§9 harness rule: walk the native ranking, drop plans that do not fit under the common model,
    keep the first ``k`` that fit. With ``variants`` (the EP post-pass) each ranked plan stands for
    its fastest fitting variant; with ``legal`` (:attr:`Ctx.legal`), its fastest fitting variant that can
    satisfy the rules. Returns (plans, scores, dropped, invalid)."""
    plans, scores = [], []
    dropped = invalid = 0
    stop_at = deadline.clock() + deadline.remaining + grace_s  # (on the budget's own clock)
    for score, plan in ranked:
        if len(plans) >= k or (plans and deadline.clock() > stop_at):
            break
        best: tuple[float, Plan] | None = None
        for cand in (variants(plan) if variants else [plan]):
            if legal is not None and not legal(cand):
                continue
            try:
                est = cost.estimate(cand)
            except InputError:
                invalid += 1
                continue
            if est.fits and (best is None or est.iteration_time_s < best[0]):
                best = (est.iteration_time_s, cand)
        if best is None:
            dropped += 1
        else:
            plans.append(best[1])
            scores.append(score)
    return plans, scores, dropped, invalid


def _with_fp8(plan: Plan, base: Callable[[Plan], list[Plan]] | None, cluster: Cluster) -> list[Plan]:
    out = base(plan) if base else [plan]
    return out + [v for p in out if (v := fp8_variant(p, cluster)) is not None]


class BaselinePlanner:
    """Shared driver: sub-cluster choice, timing, ranking, EP post-pass, harness walk."""

    name = "baseline"
    uniform_nodes = True        # §11.6: the algorithm assumes one node size
    harness = True              # walk the native ranking for plans that fit (§9)
    native_ep = False           # the algorithm itself chooses ep (Megatron)
    native_fp8 = False          # the algorithm itself chooses fp8 (the Megatron grid's --fp8-format)

    def __init__(self, quirks: bool = False, ep_postpass: bool = False):
        self.quirks = quirks
        self.ep_postpass = ep_postpass

    legality: Legality | None = None

    def restrict(self, legality: Legality | None, objective: object = None) -> None:
        """Search for plans the run's rules (``--runtime``, ``--constraints``) allow: the harness calls this before
        :meth:`plan`. A baseline keeps and ranks only plans that can satisfy them (:attr:`Ctx.legal`), so its
        best legal plan is not crowded out of its top-k by plans the runtime cannot run. It plans for
        throughput whatever the objective (the harness ranks its plans by the objective)."""
        self.legality = legality if legality is not None and not legality.free else None

    def _legal(self, cluster: Cluster) -> Callable[[Plan], bool] | None:
        """:attr:`Ctx.legal` for a run on ``cluster`` (the full cluster), or None without rules: the plan, or
        one of the variants the harness also tries (ZeRO stage, Megatron-expressible split), breaks none."""
        rules = self.legality
        if rules is None:
            return None
        from arachne.planners.harness import legal_variants  # (the harness imports the planners)

        return lambda plan: any(not rules.errors(v, cluster) for v in legal_variants(plan, rules))

    def search(self, ctx: Ctx) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def plan(self, cluster: Cluster, model: ModelSpec, job: Job, cost_model: CostModel,
             budget: SearchBudget) -> PlannerResult:
        t0 = time.perf_counter()
        stats = SearchStats()
        deadline = budget.deadline()
        sub, note = uniform_subcluster(cluster) if self.uniform_nodes else (cluster, None)
        if note:
            stats.notes["subcluster"] = note
        ctx = Ctx(sub, model, job, cost_model, budget, deadline, stats, legal=self._legal(cost_model.cluster))
        self.search(ctx)
        ranked = sorted(ctx.ranked.values(), key=lambda sp: sp[0])
        stats.notes["ranked"] = len(ranked)
        variants = None
        if model.is_moe and not self.native_ep:
            stats.notes["ep"] = ("post-pass: largest ep | gcd(stage dp, experts), kept where the common model "
                                 "prices it faster than ep = 1" if self.ep_postpass else
                                 "ep = 1 (the algorithm cannot express expert parallelism)")
            if self.ep_postpass:
                variants = partial(ep_variants, model=model)
        if job.fp8 and not self.native_fp8:  # each plan also as its fp8 variant (kept where it fits and is faster)
            stats.notes["fp8"] = "post-pass: fp8 where every GPU of the plan has an FP8 rate, kept where faster"
            variants = partial(_with_fp8, base=variants, cluster=sub)
        k = max(1, budget.top_k)
        if self.harness:
            plans, scores, dropped, invalid = harness_walk(ranked, cost_model, k, deadline,
                                                           max(1.0, 0.25 * budget.time_budget_s), variants,
                                                           ctx.legal)
            stats.notes["dropped_unfit"] = dropped
            if plans:  # §11.2 "faithful" mode: the first fitting plan in the native ranking
                stats.notes["faithful_pick_iteration_s"] = cost_model.estimate(plans[0]).iteration_time_s
            if invalid:
                stats.notes["invalid_plans"] = invalid
        else:
            plans, scores = [p for _, p in ranked[:k]], [s for s, _ in ranked[:k]]
        stats.wall_time_s = time.perf_counter() - t0
        return PlannerResult(plans, scores, stats)

