"""The one cost model: ``CostModel(cluster).estimate(plan) -> Estimate`` for every planner.

Per stage and data-parallel group it prices compute (profiles or analytic), TP collectives and
MoE all-to-all on the group's links; simulates each pipeline's schedule with point-to-point
delays between stages; adds the gradient all-reduce among every group holding the same layers
(across pipelines of different structure) and the optimizer step; and sums memory per device.
Primitives are cached by value, so re-pricing similar plans is cheap.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from arachne.cost.calibration import DEFAULT_CALIBRATION, Calibration
from arachne.cost.compute import ComputeModel, LayerCosts, act_bytes
from arachne.cost.memory import (
    MemoryBreakdown,
    block_activation_bytes,
    block_transient_bytes,
    head_transient_bytes,
    stage_expert_params,
    stage_params,
    state_bytes_per_param,
)
from arachne.cost.network import Network
from arachne.cost.schedule import in_flight, pipeline_time
from arachne.errors import InputError
from arachne.plan import Plan, Stage, validate_plan
from arachne.plan_rules import FEATURES, unpriced_features, uses_v2
from arachne.profiles.format import ProfileDB, default_profile_db
from arachne.spec.cluster import Cluster
from arachne.spec.gpus import GPUType
from arachne.spec.model import ModelSpec

BREAKDOWN_KEYS = ("compute_s", "pipeline_bubble_s", "p2p_s", "tp_comm_s", "dp_sync_s", "ep_comm_s", "optimizer_s")
PRICED_V2_FEATURES: frozenset[str] = frozenset()  # plan_rules.v2_fields_used features this cost model prices


@dataclass
class StageEstimate:
    """What one stage costs: per-micro-batch times and the memory of its worst device."""

    pipeline: int
    stage: int
    gpu: str
    layers: tuple[int, int]
    tp: int
    dp: int
    ep: int
    fwd_s: float
    bwd_s: float
    compute_s: float
    tp_comm_s: float
    ep_comm_s: float
    send_fwd_s: float
    send_bwd_s: float
    memory_bytes: float
    capacity_bytes: float
    source: str

    def to_doc(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline, "stage": self.stage, "gpu": self.gpu, "layers": list(self.layers),
            "tp": self.tp, "dp": self.dp, "ep": self.ep, "time_per_microbatch_s": self.fwd_s + self.bwd_s,
            "memory_bytes": int(self.memory_bytes), "capacity_bytes": int(self.capacity_bytes),
            "compute_source": self.source,
        }


@dataclass
class Estimate:
    """The priced plan (formats v1 section 5) plus per-stage details.

    MFU, the per-device peaks and the per-stage rows are built on first use from ``parts`` (per
    pipeline: its index, the pipeline, its stage rows and memory): a search prices thousands of plans
    and reads them for a few."""

    iteration_time_s: float
    samples_per_s: float
    tokens_per_s: float
    max_memory_bytes: float
    fits: bool
    breakdown: dict[str, float]
    parts: list[tuple] = field(default_factory=list, repr=False, compare=False)
    model_flops_per_s: float = field(default=0.0, repr=False, compare=False)  # MFU's numerator
    device_flops: dict[str, float] = field(default_factory=dict, repr=False, compare=False)  # peak FLOP/s by device
    device_prices: dict[str, float | None] = field(default_factory=dict, repr=False, compare=False)  # USD/GPU-hour
    _built: tuple | None = field(default=None, init=False, repr=False, compare=False)

    def _build(self) -> tuple:
        if self._built is None:
            peak: dict[str, float] = {}
            detail: dict[str, MemoryBreakdown] = {}
            stages: list[StageEstimate] = []
            for pi, p, out_rows, mems in self.parts:
                for si, st in enumerate(p.stages):
                    row = out_rows[si]
                    peak.update(dict.fromkeys(st.devices, row[12]))
                    detail.update(dict.fromkeys(st.devices, mems[si][0]))
                    stages.append(StageEstimate(pi, si, *row))
            self._built = (peak, detail, stages)
        return self._built

    @property
    def peak_memory_bytes(self) -> dict[str, float]:
        return self._build()[0]

    @property
    def memory_detail(self) -> dict[str, MemoryBreakdown]:
        return self._build()[1]

    @property
    def stages(self) -> list[StageEstimate]:
        return self._build()[2]

    @property
    def mfu(self) -> float:
        """Model FLOP/s over the summed peak of the devices the plan uses."""
        return self.model_flops_per_s / sum(self.device_flops[d] for d in self.peak_memory_bytes)

    @property
    def cost_per_hour(self) -> float | None:
        """USD per hour of the devices the plan uses, when every one of them has a price (formats v2 9)."""
        prices = [self.device_prices.get(d) for d in self.peak_memory_bytes]
        return None if not prices or None in prices else float(sum(prices))  # type: ignore[arg-type]

    @property
    def worst_memory_ratio(self) -> float:
        """Largest used/capacity over stages (> 1 means it does not fit)."""
        return max((s.memory_bytes / s.capacity_bytes for s in self.stages), default=0.0)

    def to_doc(self, details: bool = True) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "iteration_time_s": self.iteration_time_s,
            "samples_per_s": self.samples_per_s,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "peak_memory_bytes": {k: int(v) for k, v in self.peak_memory_bytes.items()},
            "max_memory_bytes": int(self.max_memory_bytes),
            "fits": self.fits,
            "breakdown": dict(self.breakdown),
        }
        if (cost := self.cost_per_hour) is not None:
            doc["cost_per_hour"] = cost
            doc["cost_per_million_tokens"] = cost / 3600 / self.tokens_per_s * 1e6
        if details:
            doc["stages"] = [s.to_doc() for s in self.stages]
        return doc


IDENTITY_CACHE_SIZE = 100_000  # entries of the caches keyed by stage identity (each holds its stages alive)


def _slowest(gpus: list[GPUType], precision: str) -> GPUType:
    return min(gpus, key=lambda g: (g.peak_flops(precision), g.hbm_bandwidth))


class CostModel:
    """Prices plans on one cluster. Construct once per cluster; ``estimate`` is cheap when warm."""

    def __init__(self, cluster: Cluster, profiles: ProfileDB | None | str = "default",
                 calibration: Calibration = DEFAULT_CALIBRATION):
        self.cluster = cluster
        self.profiles = default_profile_db() if profiles == "default" else profiles
        self.cal = calibration
        self.compute = ComputeModel(self.profiles, calibration.compute)
        self.network = Network(cluster, calibration.network)
        self._model_cache: dict[str, ModelSpec] = {}
        self._stage_cache: dict[tuple, tuple] = {}
        self.estimates = 0  # plans priced so far (planners report it)
        self.estimated_stages = 0  # their stages and GPUs: the work priced, for work-bounded planners
        self.estimated_devices = 0
        self.estimated_cells = 0  # stage x micro-batch cells of the distinct pipelines' schedules
        self._sig_cache: dict[tuple, tuple] = {}
        self._mem_cache: dict[tuple, MemoryBreakdown] = {}
        self._pipe_cache: dict[tuple, tuple] = {}
        self._leader_nodes: dict[tuple, tuple] = {}
        self._pipe_sigs: dict[tuple, tuple] = {}
        self._pipe_ids: dict[tuple, tuple] = {}  # pipelines' stage objects (by identity) -> their signature
        self._sync_cache: dict[tuple, tuple] = {}
        self._starts: dict[int, tuple] = {}
        self._dev_flops: dict[str, dict[str, float]] = {}
        self._node_class = {n.name: (n.gpu.name, n.inter_node_bw, n.intra_node_bw, n.per_flow_bw)
                            for n in cluster.nodes}
        self._dev_node = {d: dev.node.name for d, dev in cluster.devices.items()}
        self._prices = {d: dev.node.price_per_gpu_hour for d, dev in cluster.devices.items()}

    # ---- helpers --------------------------------------------------------------------------------
    def resolve_model(self, plan: Plan) -> ModelSpec:
        key = plan.model if isinstance(plan.model, str) else repr(sorted(plan.model.items()))
        m = self._model_cache.get(key)
        if m is None:
            m = self._model_cache[key] = plan.resolve_model()
        return m

    def layer_costs(self, model: ModelSpec, gpu: GPUType, precision: str, seq: int, b: float, tp: int,
                    ep: int = 1) -> LayerCosts:
        """Per-layer times on one GPU type (what planners use as leaf costs)."""
        h = model.hidden_size

        def tp_comm(t: int) -> float:
            return self.tp_block_time(gpu, t, b * seq * h * act_bytes(precision))

        return self.compute.layer_costs(model, gpu, precision, seq, b, tp, ep, tp_comm)

    def tp_block_time(self, gpu: GPUType, tp: int, nbytes: float) -> float:
        """Forward TP traffic of one block (two all-reduces) inside a node of ``gpu``."""
        if tp <= 1:
            return 0.0
        bw = gpu.collective_bandwidth
        lat = self.cal.network.intra_node_latency_s
        return 2 * (2 * (tp - 1) / tp * nbytes / bw + 2 * (tp - 1) * lat)

    # ---- per stage ------------------------------------------------------------------------------
    def _layout_signature(self, st: Stage) -> tuple:
        """What a stage's time depends on besides its shape: which of its devices share a node (nodes
        renamed by first use) and those nodes' classes (GPU type and links), not the device names."""
        key = (st.devices, st.tp)
        sig = self._sig_cache.get(key)
        if sig is None:
            local: dict[str, int] = {}
            ids = tuple(local.setdefault(self._dev_node[d], len(local)) for d in st.devices)
            sig = self._sig_cache[key] = (ids, tuple(self._node_class[n] for n in local))
        return sig

    def _stage(self, model: ModelSpec, st: Stage, first: bool, last: bool, mbs: int, plan: Plan) -> tuple:
        """(fwd, bwd, compute, tp_comm, ep_comm, gpu name, source) per micro-batch for a stage."""
        key = (model.key, st.layers, self._layout_signature(st), st.tp, st.dp_size, st.ep, st.recompute, first, last,
               mbs, plan.precision, plan.sequence_length)
        hit = self._stage_cache.get(key)
        if hit is not None:
            return hit
        seq, prec = plan.sequence_length, plan.precision
        dp, tp, ep = st.dp_size, st.tp, st.ep
        b = mbs / dp
        a, z = st.layers
        h = model.hidden_size
        devs = self.cluster.devices
        groups = st.groups()
        n_moe = sum(model.moe_layers[a:z])
        worst = None
        for g in groups:
            gpu = _slowest([devs[d].gpu for d in g], prec)
            lc = self.layer_costs(model, gpu, prec, seq, b, tp, ep)
            f, bw = lc.blocks(a, z)
            if first:
                f += lc.emb_fwd
                bw += lc.emb_bwd
            if last:
                f += lc.head_fwd
                bw += lc.head_bwd
            if st.recompute:
                bw += lc.blocks(a, z)[0]
            tp_f = 0.0
            if tp > 1 and not lc.includes_tp_comm:
                nbytes = b * seq * h * act_bytes(prec)
                per = 2 * self.network.all_reduce_time(g, nbytes)
                tp_f = per * (z - a) + (per / 2 if first else 0.0) + (per / 2 if last else 0.0)
            ep_f = 0.0
            if ep > 1 and n_moe:
                idx = groups.index(g)
                base = idx - idx % ep
                ring = [groups[base + k][0] for k in range(ep)]
                nbytes = b * seq * model.experts_top_k * h * act_bytes(prec) / tp
                ep_f = 2 * n_moe * self.network.all_to_all_time(ring, nbytes, concurrent=tp)
            tp_b = tp_f * (2 if st.recompute else 1)
            ep_b = ep_f * (2 if st.recompute else 1)
            fwd, bwd = f + tp_f + ep_f, bw + tp_b + ep_b
            cand = (fwd, bwd, f + bw, tp_f + tp_b, ep_f + ep_b, gpu.name, lc.source)
            if worst is None or fwd + bwd > worst[0] + worst[1]:
                worst = cand
        self._stage_cache[key] = worst
        return worst

    # ---- memory ---------------------------------------------------------------------------------
    def stage_memory(self, model: ModelSpec, layers: tuple[int, int], first: bool, last: bool, num_stages: int,
                     tp: int, ep: int, b: float, in_flight_mbs: int, precision: str, seq: int,
                     zero_shards: int = 1, replicated: bool = False, recompute: bool = False) -> MemoryBreakdown:
        """Bytes on one device of a stage holding ``layers`` with ``b`` sequences per micro-batch and
        ``in_flight_mbs`` micro-batches of activations alive (ZeRO-1 when ``zero_shards > 1``)."""
        key = (model.key, layers, first, last, num_stages, tp, ep, b, in_flight_mbs, precision, seq, zero_shards,
               replicated, recompute)
        hit = self._mem_cache.get(key)
        if hit is None:
            hit = self._mem_cache[key] = self._stage_memory(model, layers, first, last, num_stages, tp, ep, b,
                                                            in_flight_mbs, precision, seq, zero_shards, recompute)
        return hit

    def _stage_memory(self, model: ModelSpec, layers: tuple[int, int], first: bool, last: bool, num_stages: int,
                      tp: int, ep: int, b: float, in_flight_mbs: int, precision: str, seq: int, zero_shards: int,
                      recompute: bool) -> MemoryBreakdown:
        cal = self.cal.memory
        a, z = layers
        params = _stage_params_cached(model, a, z, first, last, num_stages, tp, ep)
        w, g, o = state_bytes_per_param(precision, cal)
        if precision == "fp32":
            g += cal.fp32_grad_buffer
        # ZeRO-1 shards optimizer state over the replicas of each parameter: every replica holds the
        # dense part, only 1/ep of them hold a given expert
        expert = stage_expert_params(model, a, z, tp, ep) if ep > 1 else 0.0
        opt_params = (params - expert) / max(1, zero_shards) + expert / max(1, zero_shards // ep)
        ab = act_bytes(precision)
        if recompute:
            per_mb = (z - a) * seq * b * model.hidden_size * ab
            transient = max((block_activation_bytes(model, i, seq, b, tp, precision, cal) for i in range(a, z)),
                            default=0.0)
        else:
            per_mb = _block_acts_cached(model, a, z, seq, b, tp, precision, cal)
            transient = 0.0
        if first:
            per_mb += seq * b * model.hidden_size * ab
        acts = per_mb * in_flight_mbs
        transient += block_transient_bytes(model, seq, b, tp, precision, cal)
        if last:
            transient += head_transient_bytes(model, seq, b, tp, cal)
        dynamic = acts + transient
        fixed = cal.fp32_overhead_bytes if precision == "fp32" else cal.mixed_overhead_bytes
        overhead = fixed + cal.allocator_reserve * dynamic
        return MemoryBreakdown(params * w, params * g, opt_params * o, acts, transient, overhead)

    def _memory(self, model: ModelSpec, plan: Plan, st: Stage, s: int, S: int, m: int, mbs: int,
                zero_shards: int, replicated: bool) -> MemoryBreakdown:
        return self.stage_memory(model, st.layers, s == 0, s == S - 1, S, st.tp, st.ep, mbs / st.dp_size,
                                 in_flight(s, S, m, plan.schedule), plan.precision, plan.sequence_length,
                                 zero_shards if plan.zero_stage == 1 else 1, replicated, st.recompute)

    # ---- data-parallel synchronisation ---------------------------------------------------------
    def _sync(self, model: ModelSpec, plan: Plan) -> tuple[float, list[tuple[int, ...]]]:
        """The gradient all-reduce time (the slowest stage's), and per pipeline the number of replicas of each
        stage's layers.
        Cached by the identity of the plan's stage objects (a search re-prices the same stages with other
        micro-batch counts and sizes); the entry holds them alive, so equal ids are the same stages."""
        key = (model.key, plan.precision, tuple(tuple(map(id, p.stages)) for p in plan.pipelines))
        hit = self._sync_cache.get(key)
        if hit is None:
            if len(self._sync_cache) >= IDENTITY_CACHE_SIZE:
                self._sync_cache.clear()
            hit = self._sync_cache[key] = ([p.stages for p in plan.pipelines], self._new_sync(model, plan))
        return hit[1]

    def _new_sync(self, model: ModelSpec, plan: Plan) -> tuple[float, list[tuple[int, ...]]]:
        prec = plan.precision
        grad_b = 4.0 if prec == "fp32" else 2.0
        L = model.num_layers
        # segment boundaries: every stage boundary of every pipeline
        starts = [self._stage_starts(p) for p in plan.pipelines]
        bounds = sorted({0, L}.union(*starts))
        # pipelines with the same stage boundaries hold the same layers stage by stage: aggregate them
        shapes: dict[tuple[int, ...], list[int]] = {}
        for pi, st_starts in enumerate(starts):
            shapes.setdefault(st_starts, []).append(pi)
        agg = []  # per shape, per stage: (dp sum, min tp, max tp, min ep, max ep, leader nodes)
        for st_starts, pis in shapes.items():
            rows = []
            for si in range(len(st_starts)):
                sts = [plan.pipelines[pi].stages[si] for pi in pis]
                nodes: dict[str, int] = defaultdict(int)
                for st in sts:
                    for n, k in self._group_leader_nodes(st):
                        nodes[n] += k
                tps, eps = [st.tp for st in sts], [st.ep for st in sts]
                rows.append((sum(st.dp_size for st in sts), min(tps), max(tps), min(eps), max(eps), nodes))
            agg.append((st_starts, rows, [0] * len(st_starts), [0.0] * len(st_starts)))
        for lo, hi in zip(bounds, bounds[1:]):
            held = [(k, bisect.bisect_right(a[0], lo) - 1) for k, a in enumerate(agg)]
            parts = [agg[k][1][si] for k, si in held]
            D = sum(r[0] for r in parts)
            for k, si in held:
                mins = agg[k][2]
                mins[si] = D if mins[si] == 0 else min(mins[si], D)
            if D <= 1:
                continue
            min_tp = min(r[1] for r in parts)
            max_tp = max(r[2] for r in parts)
            dense = sum(model.block_params(i) - model.block_expert_params(i) for i in range(lo, hi))
            expert = sum(model.block_expert_params(i) for i in range(lo, hi))
            if lo == 0:
                dense += model.embedding_params(min_tp)
            if hi == L:
                dense += model.head_params(min_tp)
            if len(parts) == 1:
                nodes = parts[0][5]
            else:
                nodes = defaultdict(int)
                for r in parts:
                    for n, k in r[5].items():
                        nodes[n] += k
            t = self.network.ring_all_reduce_time(D, nodes, dense / min_tp * grad_b, concurrent=max_tp)
            if expert:
                ep = max(r[4] for r in parts)
                ep_bytes = expert / (min_tp * min(r[3] for r in parts)) * grad_b
                if ep > 1:  # the expert rings: every ep-th group leader, in pipeline order
                    groups = []
                    for pi, p in enumerate(plan.pipelines):
                        groups += p.stages[bisect.bisect_right(starts[pi], lo) - 1].groups()
                    t += self.network.all_reduce_time([grp[0] for grp in groups][::ep], ep_bytes, concurrent=max_tp)
                else:
                    t += self.network.ring_all_reduce_time(D, nodes, ep_bytes, concurrent=max_tp)
            for k, si in held:
                agg[k][3][si] += t
        replicas: list[tuple[int, ...]] = [()] * len(plan.pipelines)
        t_sync = 0.0
        for (_, _, mins, times), pis in zip(agg, shapes.values()):
            reps = tuple(mins)
            for pi in pis:
                replicas[pi] = reps
            t_sync = max(t_sync, max(times))
        return t_sync, replicas

    def _stage_starts(self, p) -> tuple[int, ...]:
        """A pipeline's first layer per stage, cached by identity (the entry holds the pipeline alive)."""
        hit = self._starts.get(id(p))
        if hit is None:
            if len(self._starts) >= IDENTITY_CACHE_SIZE:
                self._starts.clear()
            hit = self._starts[id(p)] = (p, tuple(st.layers[0] for st in p.stages))
        return hit[1]

    def _group_leader_nodes(self, st: Stage) -> tuple[tuple[str, int], ...]:
        """(node, count) of the first device of each of the stage's TP groups (they join the DP rings)."""
        key = (st.devices, st.tp)
        hit = self._leader_nodes.get(key)
        if hit is None:
            c: dict[str, int] = defaultdict(int)
            for grp in st.groups():
                c[self._dev_node[grp[0]]] += 1
            hit = self._leader_nodes[key] = tuple(c.items())
        return hit

    def _pipeline_signature(self, p) -> tuple:
        """A pipeline's shape with its nodes renamed by first use: equal signatures price equally
        (time, transfers and memory depend on node classes and which stages share a node, not names)."""
        ids = tuple(map(id, p.stages))
        hit = self._pipe_ids.get(ids)
        if hit is not None:  # the entry holds those stages alive, so equal ids are the same (frozen) stages
            return hit[1]
        key = tuple((st.layers, st.devices, st.tp, st.dp, st.ep, st.recompute) for st in p.stages)
        sig = self._pipe_sigs.get(key)
        if sig is None:
            sig = self._pipe_sigs[key] = self._new_pipeline_signature(p)
        if len(self._pipe_ids) >= IDENTITY_CACHE_SIZE:
            self._pipe_ids.clear()
        self._pipe_ids[ids] = (p.stages, sig)
        return sig

    def _new_pipeline_signature(self, p) -> tuple:
        local: dict[str, int] = {}
        dev_node = self._dev_node
        parts = []
        for st in p.stages:
            ids = tuple(local.setdefault(dev_node[d], len(local)) for d in st.devices)
            parts.append((st.layers, st.tp, st.dp_size, st.ep, st.recompute, ids))
        return tuple(parts), tuple(self._node_class[n] for n in local)

    # ---- the estimate ---------------------------------------------------------------------------
    def estimate(self, plan: Plan, validate: bool = True, source: str = "") -> Estimate:
        """Price ``plan``. With ``validate`` (default) an invalid plan raises ``InputError`` (naming ``source``),
        as does, always, a version-2 feature this cost model does not price yet."""
        self.estimates += 1
        model = self.resolve_model(plan)
        if validate:
            validate_plan(plan, self.cluster, model, source)
        if uses_v2(plan) and (bad := unpriced_features(plan, PRICED_V2_FEATURES)):
            raise InputError(source, bad[0][0], f"not priced yet by this version's cost model ({FEATURES[bad[0][1]]})")
        devs = self.cluster.devices
        prec = plan.precision
        t_sync, replicas = self._sync(model, plan)
        parts: list[tuple] = []
        max_mem = 0.0
        fits = True
        worst_pp = -1.0
        crit = None
        t_opt = 0.0
        shapes: set[tuple] = set()
        for pi, p in enumerate(plan.pipelines):
            S = len(p.stages)
            mbs = plan.mbs(p)
            reps = replicas[pi]
            key = (self._pipeline_signature(p), model.key, mbs, p.micro_batches, reps, plan.schedule, prec,
                   plan.sequence_length, plan.zero_stage)
            if key not in shapes:
                shapes.add(key)
                self.estimated_cells += S * min(p.micro_batches, 4 * S + 64)
            hit = self._pipe_cache.get(key)
            if hit is None:
                hit = self._pipe_cache[key] = self._price_pipeline(model, plan, p, mbs, reps)
            rows, send_f, send_b, T, mems, opt, out_rows, n_devs, pipe_fits, pipe_max = hit
            t_opt = max(t_opt, opt)
            fits = fits and pipe_fits
            max_mem = max(max_mem, pipe_max)
            self.estimated_stages += S
            self.estimated_devices += n_devs
            parts.append((pi, p, out_rows, mems))
            if T > worst_pp:
                worst_pp, crit = T, (pi, rows, send_f, send_b, p.micro_batches)
        iteration = worst_pp + t_sync + t_opt
        # breakdown of the critical pipeline, by its bottleneck stage
        pi, rows, send_f, send_b, m = crit
        b_idx = max(range(len(rows)), key=lambda i: rows[i][0] + rows[i][1] + send_f[i] + send_b[i])
        r = rows[b_idx]
        compute_s = m * r[2]
        tp_s = m * r[3]
        ep_s = m * r[4]
        p2p_s = m * (send_f[b_idx] + send_b[b_idx])
        bubble = max(0.0, worst_pp - compute_s - tp_s - ep_s - p2p_s)
        scale = 1.0
        if compute_s + tp_s + ep_s + p2p_s > worst_pp:
            scale = worst_pp / (compute_s + tp_s + ep_s + p2p_s)
        breakdown = {
            "compute_s": compute_s * scale, "pipeline_bubble_s": bubble, "p2p_s": p2p_s * scale,
            "tp_comm_s": tp_s * scale, "dp_sync_s": t_sync, "ep_comm_s": ep_s * scale, "optimizer_s": t_opt,
        }
        gbs = plan.global_batch_size
        tokens = gbs * plan.sequence_length
        flops = self._dev_flops.get(prec)
        if flops is None:
            flops = self._dev_flops[prec] = {d: dev.gpu.peak_flops(prec) for d, dev in devs.items()}
        return Estimate(
            iteration_time_s=iteration, samples_per_s=gbs / iteration, tokens_per_s=tokens / iteration,
            max_memory_bytes=max_mem, fits=fits, breakdown=breakdown, parts=parts,
            model_flops_per_s=model.model_flops_per_sequence(plan.sequence_length) * gbs / iteration,
            device_flops=flops, device_prices=self._prices,
        )

    def _price_pipeline(self, model: ModelSpec, plan: Plan, p, mbs: int, reps: tuple[int, ...]) -> tuple:
        """Per stage times and (memory, capacity), the transfers and the schedule's time of one pipeline."""
        devs = self.cluster.devices
        S = len(p.stages)
        rows = [self._stage(model, st, si == 0, si == S - 1, mbs, plan) for si, st in enumerate(p.stages)]
        act = mbs * plan.sequence_length * model.hidden_size * act_bytes(plan.precision)
        send_f = [0.0] * S
        send_b = [0.0] * S
        for si in range(S - 1):
            t = self.network.p2p_time(list(p.stages[si].devices), list(p.stages[si + 1].devices), act)
            send_f[si] = t
            send_b[si + 1] = t
        T = pipeline_time(tuple(r[0] for r in rows), tuple(r[1] for r in rows), tuple(send_f),
                          tuple(send_b), p.micro_batches, plan.schedule)
        mems = []
        for si, st in enumerate(p.stages):
            D = reps[si]
            mem = self._memory(model, plan, st, si, S, p.micro_batches, mbs, D, D > 1)
            mems.append((mem, min(devs[d].gpu.memory_bytes for d in st.devices)))
        # what every pipeline of this signature reports per stage (its StageEstimate after the indices)
        out_rows = [(r[5], st.layers, st.tp, st.dp_size, st.ep, r[0], r[1], r[2], r[3], r[4], send_f[si],
                     send_b[si], mem.total, cap, r[6])
                    for si, (st, r, (mem, cap)) in enumerate(zip(p.stages, rows, mems))]
        return (rows, send_f, send_b, T, mems, self._pipeline_optimizer_time(model, plan, p, reps), out_rows,
                sum(len(st.devices) for st in p.stages), all(r[12] <= r[13] for r in out_rows),
                max(r[12] for r in out_rows))

    def _optimizer_time(self, model: ModelSpec, plan: Plan, replicas: dict[tuple[int, int], int]) -> float:
        """Adam step: HBM traffic over the parameters each device updates (ZeRO-1: its shard)."""
        return max((self._pipeline_optimizer_time(model, plan, p, tuple(replicas.get((pi, si), 1)
                                                                         for si in range(len(p.stages))))
                    for pi, p in enumerate(plan.pipelines)), default=0.0)

    def _pipeline_optimizer_time(self, model: ModelSpec, plan: Plan, p, reps: tuple[int, ...]) -> float:
        cal = self.cal.memory
        per_param = cal.optimizer_bytes_per_param_fp32 if plan.precision == "fp32" else cal.optimizer_bytes_per_param_mixed
        worst = 0.0
        devs = self.cluster.devices
        S = len(p.stages)
        for si, st in enumerate(p.stages):
            params = _stage_params_cached(model, st.layers[0], st.layers[1], si == 0, si == S - 1, S, st.tp, st.ep)
            if plan.zero_stage == 1:
                params /= reps[si]
            hbm = min(devs[d].gpu.hbm_bandwidth for d in st.devices)
            worst = max(worst, params * per_param / (hbm * cal.optimizer_hbm_efficiency))
        return worst


_PARAMS_CACHE: dict[tuple, float] = {}
_ACTS_CACHE: dict[tuple, float] = {}


def _block_acts_cached(model: ModelSpec, a: int, z: int, seq: int, b: float, tp: int, precision: str, cal) -> float:
    key = (model.key, a, z, seq, b, tp, precision, cal)
    v = _ACTS_CACHE.get(key)
    if v is None:
        v = _ACTS_CACHE[key] = sum(block_activation_bytes(model, i, seq, b, tp, precision, cal) for i in range(a, z))
    return v


def _stage_params_cached(model: ModelSpec, a: int, b: int, first: bool, last: bool, S: int, tp: int, ep: int) -> float:
    key = (model.key, a, b, first, last, S, tp, ep)
    v = _PARAMS_CACHE.get(key)
    if v is None:
        v = _PARAMS_CACHE[key] = stage_params(model, a, b, first, last, S, tp, ep)
    return v
