"""The one cost model: ``CostModel(cluster).estimate(plan) -> Estimate`` for every planner.

Per stage and data-parallel group it prices compute (profiles or analytic), TP collectives and
MoE all-to-all on the group's links; simulates each pipeline's schedule with point-to-point
delays between stages; adds the gradient all-reduce among every group holding the same layers
(across pipelines of different structure) and the optimizer step; and sums memory per device.
Primitives are cached by value, so re-pricing similar plans is cheap.
"""

from __future__ import annotations

from typing import Self

from arachne.cost.calibration import DEFAULT_CALIBRATION, MOE_OVERLAP_SM_SHARE, Calibration
from arachne.cost.compute import ComputeModel, LayerCosts, act_bytes
from arachne.cost.estimate import Estimate, StageEstimate
from arachne.cost.expert_comm import dispatch_dedup
from arachne.cost.features import (
    FP8_WEIGHT_COPY_BYTES,
    attention_core_fwd,
    block_acts_v2,
    cp_ring_exposed,
    cp_ring_step,
    expert_tp,
    fp8_act_saving,
    fp8_extra_state_bytes,
    recompute_mode,
    recomputed_blocks,
)
from arachne.cost.group_kinds import group_kinds
from arachne.cost.memory import (
    MemoryBreakdown,
    block_transient_bytes,
    convention,
    head_transient_bytes,
    optimizer_options,
    peak_transient,
    stage_expert_params,
)
from arachne.cost.network import Network
from arachne.cost.pipeline import (
    PipelineMixin,
    _stage_params_cached,
)
from arachne.cost.recompute import dropped_bytes, modules_fwd, op_selective_fwd, recomputed_collectives
from arachne.cost.schedule import in_flight, pairs_micro_batches
from arachne.cost.sync import IDENTITY_CACHE_SIZE, MEGATRON_BUCKET_PARAMS, SyncMixin, gather_share
from arachne.errors import InputError
from arachne.plan import Plan, Stage, validate_plan
from arachne.plan_rules import FEATURES, unpriced_features, uses_v2
from arachne.profiles.format import ProfileDB, default_profile_db
from arachne.spec.cluster import Cluster
from arachne.spec.gpus import GPUType
from arachne.spec.model import ModelSpec

BREAKDOWN_KEYS = ("compute_s", "pipeline_bubble_s", "p2p_s", "tp_comm_s", "dp_sync_s", "ep_comm_s", "optimizer_s")
PRICED_V2_FEATURES: frozenset[str] = frozenset({"virtual_stages", "sequence_parallel", "selective_recompute",
                                                "recompute_layers", "overlap_grad_reduce",
                                                "overlap_param_gather", "zero_stage", "fp8", "etp", "cp",
                                                "framework", "grad_reduce_in_fp32", "recompute_modules",
                                                "fp8_params", "master_weights", "optimizer_state_dtype", "loss",
                                                "attention_kernel", "elementwise_kernels", "overlap_moe_comm",
                                                "moe_kernels"})  # plan_rules.v2_fields_used features it prices
_ALL_PRICED = PRICED_V2_FEATURES >= set(FEATURES)  # then no plan needs the (per-stage) check in estimate

__all__ = ["BREAKDOWN_KEYS", "PRICED_V2_FEATURES", "CostModel", "Estimate", "StageEstimate"]


def eager_mode(plan, st: Stage) -> str | None:
    """The ``eager`` argument of :meth:`CostModel.layer_costs` for a stage of ``plan`` (:data:`~.compute.EAGER_MODES`):
    None unless the plan says ``elementwise_kernels: eager``; then ``split`` with sequence parallelism or tp 1, else
    ``replicated``. ``plan`` may be a Job (baselines price with one): fused."""
    if getattr(plan, "elementwise_kernels", None) != "eager":
        return None
    return "split" if st.sequence_parallel or st.tp == 1 else "replicated"


def _slowest(gpus: list[GPUType], precision: str) -> GPUType:
    return min(gpus, key=lambda g: (g.peak_flops(precision), g.hbm_bandwidth))


class _Signature(tuple):
    """A pipeline signature (:meth:`CostModel._pipeline_signature`): a tuple (equal to, and hashing as, the
    plain tuple of its items) that computes its hash once."""

    _hash: int

    def __new__(cls, items: tuple) -> Self:
        self = super().__new__(cls, items)
        self._hash = tuple.__hash__(self)
        return self

    def __hash__(self) -> int:
        return self._hash


class CostModel(SyncMixin, PipelineMixin):
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
        self._ring_cache: dict[tuple, dict[int, float]] = {}  # cp rings' step times, by layout and shape
        self.estimates = 0  # plans priced so far (planners report it)
        self.estimated_stages = 0  # their stages and GPUs: the work priced, for work-bounded planners
        self.estimated_devices = 0
        self.estimated_cells = 0  # stage x micro-batch cells of the distinct pipelines' schedules
        self._sig_cache: dict[tuple, tuple] = {}
        self._kinds_cache: dict[tuple, tuple] = {}  # a stage layout's TP groups, one of each kind (group_kinds.py)
        self._mem_cache: dict[tuple, MemoryBreakdown] = {}
        self._pipe_cache: dict[tuple, tuple] = {}
        self._exposed_cache: dict[tuple, float] = {}  # a pipeline's exposed gradient sync, by shape and sync times
        self._leader_nodes: dict[tuple, tuple] = {}
        self._pipe_sigs: dict[tuple, tuple] = {}  # each pipeline signature, interned
        self._pipe_ids: dict[tuple, tuple] = {}  # pipelines' stage objects (by identity) -> their signature
        self._sync_cache: dict[tuple, tuple] = {}
        self._starts: dict[int, tuple] = {}
        self._dev_flops: dict[str, dict[str, float]] = {}
        self._dev_attr: dict[str, dict[str, float]] = {}  # a GPU property by device (_least)
        self._node_class = {n.name: (n.gpu.name, n.inter_node_bw, n.intra_node_bw, n.per_flow_bw, n.network)
                            for n in cluster.nodes}
        self._dev_node = cluster.device_node  # each device's node name (read only)
        self._prices = {d: dev.node.price_per_gpu_hour for d, dev in cluster.devices.items()}

    # ---- helpers --------------------------------------------------------------------------------
    def _least(self, attr: str, devices: tuple[str, ...]) -> float:
        """The least of GPU property ``attr`` (``memory_bytes``, ``hbm_bandwidth``) over ``devices``."""
        table = self._dev_attr.get(attr)
        if table is None:
            table = self._dev_attr[attr] = {d: getattr(dev.gpu, attr) for d, dev in self.cluster.devices.items()}
        return min(map(table.__getitem__, devices))

    def resolve_model(self, plan: Plan) -> ModelSpec:
        key = plan.model if isinstance(plan.model, str) else repr(sorted(plan.model.items()))
        m = self._model_cache.get(key)
        if m is None:
            m = self._model_cache[key] = plan.resolve_model()
        return m

    def layer_costs(self, model: ModelSpec, gpu: GPUType, precision: str, seq: int, b: float, tp: int,
                    ep: int = 1, etp: int | None = None, kernel: str | None = None,
                    eager: str | None = None, moe_kernels: str | None = None) -> LayerCosts:
        """Per-layer times on one GPU type (what planners use as leaf costs); ``kernel``: the plan's
        ``attention_kernel``; ``eager``: its ``elementwise_kernels`` is ``eager`` (:func:`eager_mode`);
        ``moe_kernels``: its MoE layer implementation."""
        h = model.hidden_size

        def tp_comm(t: int) -> float:
            return self.tp_block_time(gpu, t, b * seq * h * act_bytes(precision))

        return self.compute.layer_costs(model, gpu, precision, seq, b, tp, ep, tp_comm, etp, kernel, eager,
                                        moe_kernels)

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

    def _stage(self, model: ModelSpec, st: Stage, first: bool, last: bool, mbs: int, plan: Plan,
               layers: tuple[int, int] | None = None, rec_blocks: int | None = None) -> tuple:
        """(fwd, bwd, compute, tp_comm, ep_comm, gpu name, source, recompute) per micro-batch for a stage (or,
        interleaved, for its chunk ``layers`` of which the first ``rec_blocks`` blocks are fully recomputed)."""
        a, z = st.layers if layers is None else layers
        mode = recompute_mode(st)
        k = rec_blocks if rec_blocks is not None else recomputed_blocks(st, z - a)
        et = expert_tp(st)
        mods = st.recompute_modules if mode == "selective" else None
        # torchtitan's op-level policy is what "selective" means under the torch convention (memory.py)
        op_sel = mode == "selective" and mods is None and plan.precision != "fp32" and \
            (plan.framework or convention(plan.zero_stage)) == "torch"
        kern = getattr(plan, "attention_kernel", None)  # baselines price stages with a Job (the default kernel)
        eager = eager_mode(plan, st)
        moe_k = getattr(plan, "moe_kernels", None)
        hide_ep = getattr(plan, "overlap_moe_comm", False)
        sig = self._layout_signature(st)
        key = (model.key, (a, z), sig, st.tp, st.dp_size, st.ep, mode, k, first, last,
               mbs, plan.precision, plan.sequence_length, et, st.cp, mods, op_sel, kern, eager, moe_k, hide_ep)
        hit = self._stage_cache.get(key)
        if hit is not None:
            return hit
        seq, prec = plan.sequence_length, plan.precision
        dp, tp, ep = st.dp_size, st.tp, st.ep
        b = mbs / dp
        if st.cp > 1:  # b/cp full-length sequences: linear work b s/cp, attention core b s^2/cp (balanced halves)
            b = b / st.cp
        h = model.hidden_size
        devs = self.cluster.devices
        groups = st.groups()
        n_moe = sum(model.moe_layers[a:z])
        full = mode == "full" and k == z - a  # the whole stage (chunk): priced exactly as version 1
        worst = None
        a2a: dict[tuple, float] = {}  # each all-to-all ring priced once (its members share it)
        rings = self._ring_cache.setdefault((model.key, sig, tp, st.cp, b, seq, prec), {}) if st.cp > 1 else None
        ids, classes = sig
        alike: dict[tuple, tuple] = {}  # groups alike (node classes, node sharing, their rings' times) price alike
        has_cp, moe = st.cp > 1, bool(n_moe) and (et is not None or ep > 1)
        memo = tp > 1 or has_cp or moe
        kinds_key = (sig, tp, st.cp, ep, et, moe)
        kinds = self._kinds_cache.get(kinds_key)
        if kinds is None:  # one group of each kind: the others price as it does (group_kinds.py)
            kinds = self._kinds_cache[kinds_key] = group_kinds(ids, classes, tp, st.cp, ep, et, moe, len(groups))
        for gi, ring_at, conc in kinds:
            g = groups[gi]
            ep_f = 0.0
            if moe:  # ep x etp x edp, etp fastest (docs/cost-model.md, "Expert tp")
                ring = [st.devices[i] for i in ring_at]
                if (ring_key := (tuple(ring), conc)) not in a2a:
                    nbytes = b * seq * model.experts_top_k * h * act_bytes(prec) / tp
                    a2a[ring_key] = 2 * n_moe * self.network.all_to_all_time(
                        ring, nbytes, concurrent=conc, cross_fraction=dispatch_dedup(self._dev_node, model, ring))
                ep_f = a2a[ring_key]
            step = cp_ring_step(self.network, model, prec, seq, b, tp, st.cp, groups, gi, rings) if has_cp else 0.0
            like = cand = None
            if memo:  # (a lone GPU's row without collectives is cheaper to price than to look up)
                gids = ids[gi * tp:(gi + 1) * tp]
                like = (tuple(classes[i] for i in gids), tuple(gids.index(i) for i in gids), ep_f, step)
                cand = alike.get(like)
            if cand is None:
                gpu = _slowest([devs[d].gpu for d in g], prec)
                lc = self.layer_costs(model, gpu, prec, seq, b, tp, ep, et, kern, eager, moe_k)
                f, bw = lc.blocks(a, z)
                if first:
                    f += lc.emb_fwd
                    bw += lc.emb_bwd
                if last:
                    f += lc.head_fwd
                    bw += lc.head_bwd
                rec = 0.0
                if full:
                    rec = lc.blocks(a, z)[0]
                elif mode == "full" and k:
                    rec = lc.blocks(a, a + k)[0]
                elif mode == "selective" and mods is not None:  # the chosen modules (recompute.py)
                    rec = modules_fwd(self.compute, model, gpu, prec, seq, b, tp, ep, et, st.sequence_parallel, mods,
                                      a, z, attention_core_fwd(self.compute, model, gpu, prec, seq, b, tp, kern), moe_k)
                elif op_sel:
                    # (a profiled block measured its own kernels: no eager term on its recomputation either)
                    rec = (z - a) * op_selective_fwd(self.compute, model, gpu, prec, seq, b, tp,
                                                     eager if lc.source == "analytic" else None)
                elif mode == "selective":
                    rec = (z - a) * attention_core_fwd(self.compute, model, gpu, prec, seq, b, tp, kern)
                bw += rec
                tp_f = 0.0
                per = 0.0
                if tp > 1 and not lc.includes_tp_comm:
                    nbytes = b * seq * h * act_bytes(prec)
                    per = 2 * self.network.all_reduce_time(g, nbytes)
                    tp_f = per * (z - a) + (per / 2 if first else 0.0) + (per / 2 if last else 0.0)
                if full:
                    tp_b, ep_b = tp_f * 2, ep_f * 2
                elif mode == "full" and k:  # the recomputed blocks' forward collectives again
                    tp_b = tp_f + per * k
                    ep_b = ep_f + (ep_f * sum(model.moe_layers[a:a + k]) / n_moe if n_moe else 0.0)
                elif mods is not None:  # a recomputed MLP / MoE layer's forward collectives again
                    n_tp, n_ep = recomputed_collectives(model, mods, a, z)
                    tp_b = tp_f + per / 2 * n_tp
                    ep_b = ep_f + (ep_f * n_ep / n_moe if n_moe else 0.0)
                else:
                    tp_b, ep_b = tp_f, ep_f
                cp_f = cp_b = 0.0
                if has_cp:  # the K/V ring per block, again for recomputed attention
                    one_f, one_b = cp_ring_exposed(self.network, self.compute, model, gpu, prec, seq, b, tp, st.cp,
                                                   groups, gi, kern, rings)
                    redo = (z - a) if full or (mode == "selective" and not op_sel) else (k if mode == "full" else 0)
                    cp_f, cp_b = one_f * (z - a), one_b * (z - a) + one_f * redo
                again = rec + (tp_b - tp_f) + (ep_b - ep_f)  # recomputation and its collectives
                g_ep_f = ep_f
                if hide_ep:  # a forward's all-to-alls under a backward's compute, and the other way round; the
                    # compute under them runs without the dispatcher's SMs (MOE_OVERLAP_SM_SHARE)
                    slow = MOE_OVERLAP_SM_SHARE / (1 - MOE_OVERLAP_SM_SHARE)
                    hid_f, hid_b = min(g_ep_f, bw + tp_b), min(ep_b, f + tp_f)
                    g_ep_f, ep_b = g_ep_f - hid_f * (1 - slow), ep_b - hid_b * (1 - slow)
                    again = min(again, rec + (tp_b - tp_f) + ep_b)
                fwd, bwd = f + tp_f + g_ep_f + cp_f, bw + tp_b + ep_b + cp_b
                cand = (fwd, bwd, f + bw, tp_f + tp_b, g_ep_f + ep_b, gpu.name, lc.source, again)
                if has_cp:
                    cand = (*cand, 0.0, cp_f + cp_b)  # [8]: ZeRO-3's slot (pipeline.zero3_row), [9]: cp_comm
                if like is not None:
                    alike[like] = cand
            if worst is None or cand[0] + cand[1] > worst[0] + worst[1]:
                worst = cand
        self._stage_cache[key] = worst
        return worst

    # ---- memory ---------------------------------------------------------------------------------
    def stage_memory(self, model: ModelSpec, layers: tuple[int, int], first: bool, last: bool, num_stages: int,
                     tp: int, ep: int, b: float, in_flight_mbs: int, precision: str, seq: int,
                     zero_shards: int = 1, replicated: bool = False, recompute: bool | str = False,
                     rec_blocks: int | None = None, sp: bool = False, zero_level: int = 1,
                     etp: int | None = None, framework: str | None = None,
                     grads_fp32: bool = True, modules: tuple[str, ...] | None = None,
                     options: tuple = ()) -> MemoryBreakdown:
        """Bytes on one device of a stage holding ``layers`` with ``b`` sequences per micro-batch and
        ``in_flight_mbs`` micro-batches of activations alive (ZeRO-1 when ``zero_shards > 1``).
        Version 2: ``recompute`` may be ``"selective"``; with full recomputation ``rec_blocks`` (default all)
        leading blocks are recomputed; ``sp`` splits the non-GEMM activations over tp; ``zero_level`` 2 shards
        the gradients as well as the optimizer state over ``zero_shards``; ``framework`` the plan's memory
        convention (None: by ``zero_level``); ``grads_fp32`` false keeps Megatron's main gradients in 16 bits;
        ``modules`` a selective stage's ``recompute_modules``; ``options`` the plan's optional memory settings
        (:meth:`memory_options`: ``fp8_params``, ``master_weights``, ``optimizer_state_dtype``, ``loss``)."""
        key = (model.key, layers, first, last, num_stages, tp, ep, b, in_flight_mbs, precision, seq, zero_shards,
               replicated, recompute, rec_blocks, sp, zero_level, etp, framework, grads_fp32, modules, options)
        hit = self._mem_cache.get(key)
        if hit is None:
            hit = self._mem_cache[key] = self._stage_memory(model, layers, first, last, num_stages, tp, ep, b,
                                                            in_flight_mbs, precision, seq, zero_shards, recompute,
                                                            rec_blocks, sp, zero_level, etp, framework,
                                                            grads_fp32, modules, *(options or (False, None, None,
                                                                                               None)))
        return hit

    def _stage_memory(self, model: ModelSpec, layers: tuple[int, int], first: bool, last: bool, num_stages: int,
                      tp: int, ep: int, b: float, in_flight_mbs: int, precision: str, seq: int, zero_shards: int,
                      recompute: bool | str, rec_blocks: int | None = None, sp: bool = False,
                      zero_level: int = 1, etp: int | None = None, framework: str | None = None,
                      grads_fp32: bool = True, modules: tuple[str, ...] | None = None, fp8_params: bool = False,
                      master: str | None = None, states: str | None = None,
                      loss: str | None = None) -> MemoryBreakdown:
        cal = self.cal.memory
        a, z = layers
        conv = framework or convention(zero_level)  # default: zero_stage 3 -> plain torch, else Megatron
        params = _stage_params_cached(model, a, z, first, last, num_stages, tp, ep, etp)
        (w, g, o), (fsdp_w, fsdp_g, fsdp_o) = optimizer_options(precision, cal, master, states)
        if not grads_fp32 and precision != "fp32":  # main gradients in the 16-bit type
            g = act_bytes(precision)
        if precision == "fp32":
            g += cal.fp32_grad_buffer
        # ZeRO-1 shards optimizer state over the replicas of each parameter: every replica holds the
        # dense part, only 1/ep of them hold a given expert
        if etp is None:
            expert = stage_expert_params(model, a, z, tp, ep) if ep > 1 else 0.0
            opt_params = (params - expert) / max(1, zero_shards) + expert / max(1, zero_shards // ep)
        else:  # experts' replicas: edp = (the stage's devices zero_shards x tp) / (ep x etp)
            expert = stage_expert_params(model, a, z, tp, ep, etp)
            opt_params = (params - expert) / max(1, zero_shards) + expert / max(1, zero_shards * tp // (ep * etp))
        ab = act_bytes(precision)
        selective = recompute == "selective"
        k = 0 if not recompute or selective else (z - a if rec_blocks is None else min(rec_blocks, z - a))
        split = tp if sp else 1
        h = model.hidden_size

        def acts(i: int, sel: bool) -> float:
            return block_acts_v2(model, i, seq, b, tp, precision, cal, sp, sel, etp, conv, modules if sel else None)

        per_mb = k * seq * b * h * ab / split  # fully recomputed blocks keep their input
        per_mb += sum(acts(i, selective) for i in range(a + k, z))
        # a recomputed block's activations exist again while its backward runs
        transient = max((acts(i, False) for i in range(a, a + k)), default=0.0)
        if selective and conv == "torch" and precision != "fp32" and modules is None:
            transient = max(transient, max((acts(i, False) for i in range(a, z)), default=0.0))
        elif selective and modules is not None:  # one block's recomputed modules exist again during its backward
            transient = max(transient, max((dropped_bytes(model, i, seq, b, tp, precision, sp, etp, modules)
                                            for i in range(a, z)), default=0.0))
        if first:
            per_mb += seq * b * h * ab / split
        fp8 = 0.0  # fp8 (version 2): weight copies and scaling state; GEMM inputs saved in fp8
        te_fp8 = precision == "fp8" and conv == "megatron"  # torchao's float8 caches no weight copies (memory.py)
        if precision == "fp8":
            per_mb -= (z - a - k) * fp8_act_saving(model, seq, b, tp, sp)
        gemm_params = 0.0  # fp8_params: the blocks' weights kept in fp8 only, their 16-bit copy dropped
        if te_fp8:
            block_params = _stage_params_cached(model, a, z, False, False, num_stages, tp, ep, etp)
            fp8 = fp8_extra_state_bytes(model, block_params, a, z, ep)
            gemm_params = block_params if fp8_params else 0.0
        activations = per_mb * in_flight_mbs
        # transients peak at two different moments (memory.py, "two phases"): a block's backward (its
        # recomputed activations, workspace, gathered parameters) and, on the last stage, the loss (logits)
        transient += block_transient_bytes(model, seq, b, tp, precision, cal)
        head = head_transient_bytes(model, seq, b, tp, cal, precision, conv, loss) if last else 0.0
        fixed = cal.fp32_overhead_bytes if precision == "fp32" else cal.mixed_overhead_bytes
        if zero_level >= 3 and zero_shards > 1 and num_stages > 1 and precision != "fp32":
            # FSDP inside a pipeline (torchtitan): a stage's parameters are gathered once per iteration and kept
            # (no reshard after forward), gradients accumulate unsharded over the micro-batches (fp32, the
            # reduce dtype) and are reduce-scattered after the last one; the fp32 state stays sharded
            weights = opt_params * fsdp_w + (params - gemm_params) * ab + fp8
            grads = opt_params * fsdp_g + params * cal.fsdp_pipeline_grad_bytes
            optim = opt_params * fsdp_o
        elif zero_level >= 3 and zero_shards > 1:  # FSDP: everything sharded; gathered 16-bit blocks as workspace
            block = max((_stage_params_cached(model, i, i + 1, False, False, num_stages, tp, ep, etp)
                         for i in range(a, z)), default=0.0)
            gathered = block * (cal.fsdp_gathered_blocks * ((0.0 if fp8_params else ab)
                                                            + (FP8_WEIGHT_COPY_BYTES if te_fp8 else 0.0))
                                + cal.fsdp_unsharded_grad_bytes)
            if last:  # the output layer, and the last block kept for its backward, gathered while the loss runs
                head += (model.head_params(tp) / tp + block) * ab
            transient += gathered
            if precision == "fp32":
                weights, grads, optim = opt_params * w, opt_params * g, opt_params * o
            else:
                weights, grads, optim = opt_params * fsdp_w, opt_params * fsdp_g, opt_params * fsdp_o
            weights += fp8 * (opt_params / params if params else 0.0)  # the shard's copies; the gathered blocks' above
        elif zero_level >= 2 and zero_shards > 1:  # ZeRO-2: main gradients sharded like the optimizer state, plus
            bucket = min(params, MEGATRON_BUCKET_PARAMS) * g  # one bucket of full gradients being reduced,
            transient += bucket  # filled from the output layer's backward on: alive in both phases
            head += bucket if last else 0.0
            weights, grads, optim = (params - gemm_params) * w + fp8, opt_params * g, opt_params * o
        else:
            weights, grads, optim = (params - gemm_params) * w + fp8, params * g, opt_params * o
        peak = peak_transient(transient, head)
        overhead = fixed + cal.allocator_reserve * (activations + peak)
        return MemoryBreakdown(weights, grads, optim, activations, peak, overhead, transient + head - peak)

    def _memory(self, model: ModelSpec, plan: Plan, st: Stage, s: int, S: int, m: int, mbs: int,
                zero_shards: int, replicated: bool) -> MemoryBreakdown:
        return self.stage_memory(model, st.layers, s == 0, s == S - 1, S, st.tp, st.ep,
                                 mbs / st.dp_size / st.cp if st.cp > 1 else mbs / st.dp_size,
                                 in_flight(s, S, m, plan.schedule, pairs_micro_batches(model, plan), st.num_layers),
                                 plan.precision, plan.sequence_length,
                                 zero_shards if plan.zero_stage >= 1 else 1, replicated, st.recompute,
                                 st.recompute_layers, st.sequence_parallel, plan.zero_stage, expert_tp(st),
                                 plan.framework, plan.grad_reduce_in_fp32 is not False, st.recompute_modules,
                                 self.memory_options(plan))

    @staticmethod
    def memory_options(plan: Plan) -> tuple:
        """The plan's optional memory settings as :meth:`stage_memory` takes them (empty when none is set)."""
        opts = (plan.fp8_params, plan.master_weights, plan.optimizer_state_dtype, plan.loss)
        return () if opts == (False, None, None, None) else opts

    @staticmethod
    def kernel_options(plan) -> tuple:
        """The plan's kernel choices that set stage times (empty when unset): part of every cache key above the
        stage's own. ``plan`` may be a Job (baselines price with one): the default kernels."""
        opts = (getattr(plan, "attention_kernel", None), getattr(plan, "elementwise_kernels", None),
                getattr(plan, "moe_kernels", None), getattr(plan, "overlap_moe_comm", False))
        return () if opts == (None, None, None, False) else opts

    def _pipeline_signature(self, p) -> tuple:
        """A pipeline's shape with its nodes renamed by first use: equal signatures price equally
        (time, transfers and memory depend on node classes and which stages share a node, not names).
        Cached by the identity of the pipeline's stages (most pipelines a search prices are new, their stages
        too: computing the signature costs no more than a key of its parts would), and interned: equal
        signatures are one :class:`_Signature` object, whose hash is computed once (it keys the pipeline cache
        and each estimate's set of shapes, hashed and compared several times per pipeline priced)."""
        stages = p.stages
        ids = tuple(map(id, stages))
        hit = self._pipe_ids.get(ids)
        if hit is not None:  # the entry holds those stages alive, so equal ids are the same (frozen) stages
            return hit[1]
        sig = _Signature(self._new_pipeline_signature(p))
        if len(self._pipe_sigs) >= IDENTITY_CACHE_SIZE:
            self._pipe_sigs.clear()
        sig = self._pipe_sigs.setdefault(sig, sig)  # one object per signature: equal keys compare by identity
        if len(self._pipe_ids) >= IDENTITY_CACHE_SIZE:
            self._pipe_ids.clear()
        self._pipe_ids[ids] = (stages, sig)
        return sig

    def _new_pipeline_signature(self, p) -> tuple:
        local: dict[str, int] = {}
        dev_node = self._dev_node
        parts = []
        for st in p.stages:
            devs = st.devices
            if len(devs) == 1:
                n = dev_node[devs[0]]
                i = local.get(n)
                if i is None:
                    i = local[n] = len(local)
                ids: tuple[int, ...] = (i,)
            else:
                ids = tuple([local.setdefault(dev_node[d], len(local)) for d in devs])
            dp, cp = st.dp, st.cp
            # (expert_tp is None without cp > 1 or an etp; dp_size is dp where set: both only skipped calls)
            parts.append((st.layers, st.tp, dp if dp is not None else st.dp_size, st.ep, st.recompute,
                          st.recompute_layers, st.sequence_parallel, ids,
                          expert_tp(st) if cp > 1 or st.etp is not None else None, cp, st.recompute_modules))
        node_class = self._node_class
        return tuple(parts), tuple([node_class[n] for n in local]), p.virtual_stages

    # ---- the estimate ---------------------------------------------------------------------------
    def estimate(self, plan: Plan, validate: bool = True, source: str = "") -> Estimate:
        """Price ``plan``. With ``validate`` (default) an invalid plan raises ``InputError`` (naming ``source``),
        as does, always, a version-2 feature this cost model does not price yet."""
        self.estimates += 1
        model = self.resolve_model(plan)
        if validate:
            validate_plan(plan, self.cluster, model, source)
        v2 = uses_v2(plan)
        # ZeRO-3 gathers and reduce-scatters per micro-batch only without pipelining; with stages, FSDP
        # gathers once per iteration (torchtitan's FSDP + PP), which is ZeRO-2's traffic
        z3 = plan.zero_stage == 3 and all(len(p.stages) == 1 for p in plan.pipelines)
        if v2 and not _ALL_PRICED and (bad := unpriced_features(plan, PRICED_V2_FEATURES)):
            raise InputError(source, bad[0][0], f"not priced yet by this version's cost model ({FEATURES[bad[0][1]]})")
        devs = self.cluster.devices
        prec = plan.precision
        t_sync, replicas, stage_sync = self._sync(model, plan)
        overlap = plan.overlap_grad_reduce or plan.overlap_param_gather
        finish = 0.0  # with overlap: the latest end of a pipeline's backward plus its exposed reduction
        parts: list[tuple] = []
        max_mem = 0.0
        fits = True
        worst_pp = -1.0
        crit = None
        t_opt = 0.0
        shapes: set[tuple] = set()
        # the key's parts that are the plan's, not the pipeline's
        common = (plan.schedule, prec, plan.sequence_length, plan.zero_stage)
        tail = (plan.framework, plan.grad_reduce_in_fp32, self.memory_options(plan), self.kernel_options(plan))
        # what a pipeline's exposed sync depends on beyond its key and its stages' sync times
        exposed_key = (plan.overlap_grad_reduce, plan.overlap_param_gather, gather_share(plan)) if overlap else None
        for pi, p in enumerate(plan.pipelines):
            S = len(p.stages)
            mbs = p.micro_batch_size or plan.micro_batch_size
            reps = replicas[pi]
            key = (self._pipeline_signature(p), model.key, mbs, p.micro_batches, reps, common,
                   (stage_sync[pi], plan.overlap_param_gather, plan.overlap_grad_reduce) if z3 else None, tail)
            if key not in shapes:
                shapes.add(key)
                self.estimated_cells += S * min(p.micro_batches, 4 * S + 64)
            hit = self._pipe_cache.get(key)
            if hit is None:
                hit = self._pipe_cache[key] = self._price_pipeline(model, plan, p, mbs, reps,
                                                                            stage_sync[pi] if z3 else None)
            rows, send_f, send_b, T, mems, opt, out_rows, n_devs, pipe_fits, pipe_max = hit
            t_opt = max(t_opt, opt)
            fits = fits and pipe_fits
            max_mem = max(max_mem, pipe_max)
            self.estimated_stages += S
            self.estimated_devices += n_devs
            parts.append((pi, p, out_rows, mems))
            if overlap:  # a shared collective: what each pipeline leaves exposed counts from its own end
                finish = max(finish, T + self._exposed_cached((key, stage_sync[pi], exposed_key), model, plan, p,
                                                              rows, stage_sync[pi]))
            if T > worst_pp:
                worst_pp, crit = T, (pi, rows, send_f, send_b, p.micro_batches)
        exposed = max(0.0, finish - worst_pp) if overlap else 0.0
        if z3:  # gradients reduce-scattered per micro-batch, inside the pipeline (zero_comm_s)
            t_sync = exposed = 0.0
        iteration = worst_pp + (exposed if overlap else t_sync) + t_opt
        # breakdown of the critical pipeline, by its bottleneck stage
        pi, rows, send_f, send_b, m = crit
        b_idx = max(range(len(rows)), key=lambda i: rows[i][0] + rows[i][1] + send_f[i] + send_b[i])
        r = rows[b_idx]
        compute_s = m * r[2]
        tp_s = m * r[3]
        ep_s = m * r[4]
        p2p_s = m * (send_f[b_idx] + send_b[b_idx])
        zc = m * r[8] if z3 else 0.0
        bubble = max(0.0, worst_pp - compute_s - tp_s - ep_s - p2p_s - zc)
        scale = 1.0
        if compute_s + tp_s + ep_s + p2p_s + zc > worst_pp:
            scale = worst_pp / (compute_s + tp_s + ep_s + p2p_s + zc)
        breakdown = {
            "compute_s": compute_s * scale, "pipeline_bubble_s": bubble, "p2p_s": p2p_s * scale,
            "tp_comm_s": tp_s * scale, "dp_sync_s": t_sync, "ep_comm_s": ep_s * scale, "optimizer_s": t_opt,
        }
        if v2:  # formats v2 section 9
            breakdown["recompute_s"] = m * r[7] * scale
            breakdown["dp_sync_exposed_s"] = exposed if overlap else t_sync
            breakdown["zero_comm_s"] = zc * scale
            breakdown["cp_comm_s"] = m * (r[9] if len(r) > 9 else 0.0) * scale
        gbs = plan.global_batch_size
        tokens = gbs * plan.sequence_length
        flops = self._dev_flops.get(prec)
        if flops is None:
            # an fp8 plan runs only on GPUs with an FP8 rate; the others' figure (bf16) is never read for it
            flops = self._dev_flops[prec] = {d: dev.gpu.peak_flops(prec if prec != "fp8" or dev.gpu.fp8_tflops
                                                                    else "bf16") for d, dev in devs.items()}
        return Estimate(
            iteration_time_s=iteration, samples_per_s=gbs / iteration, tokens_per_s=tokens / iteration,
            max_memory_bytes=max_mem, fits=fits, breakdown=breakdown, parts=parts,
            model_flops_per_s=model.model_flops_per_sequence(plan.sequence_length) * gbs / iteration,
            device_flops=flops, device_prices=self._prices, pricer=self,
        )
