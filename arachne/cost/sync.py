"""Data-parallel gradient synchronisation: the all-reduce among every group holding the same layers
(across pipelines of different structure), priced on the network model (NCCL's ring, or its tree / NVLink SHARP
where faster; the ring alone under a sharded optimizer, whose reduce-scatter and all-gather are rings)."""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict

from arachne.cost.features import expert_tp
from arachne.plan import Plan, Stage
from arachne.spec.model import ModelSpec

IDENTITY_CACHE_SIZE = 100_000  # entries of the caches keyed by stage identity (each holds its stages alive)


class SyncMixin:
    """CostModel's gradient-sync part (uses ``self.network``, ``self._sync_cache``, ``self._leader_nodes``,
    ``self._dev_node``)."""

    def _sync(self, model: ModelSpec, plan: Plan) -> tuple[float, list[tuple[int, ...]], list[tuple[float, ...]]]:
        """The gradient all-reduce time (the slowest stage's), per pipeline the number of replicas of each
        stage's layers, and per pipeline each stage's sync time.
        Cached by the identity of the plan's stage objects (a search re-prices the same stages with other
        micro-batch counts and sizes); the entry holds them alive, so equal ids are the same stages."""
        key = (model.key, plan.precision, plan.zero_stage >= 1, plan.grad_reduce_in_fp32 is False,
               tuple(tuple(map(id, p.stages)) for p in plan.pipelines))
        hit = self._sync_cache.get(key)
        if hit is None:
            if len(self._sync_cache) >= IDENTITY_CACHE_SIZE:
                self._sync_cache.clear()
            hit = self._sync_cache[key] = ([p.stages for p in plan.pipelines], self._new_sync(model, plan))
        return hit[1]

    def _new_sync(self, model: ModelSpec, plan: Plan) -> tuple[float, list[tuple[int, ...]], list[tuple[float, ...]]]:
        # gradients are reduced in fp32 unless the plan says otherwise (``grad_reduce_in_fp32``: Megatron-LM
        # with bf16 and torchtitan's FSDP reduce in fp32 by default)
        grad_b = grad_bytes(plan)
        # a sharded optimizer reduce-scatters the gradients (grad_b) and all-gathers the parameters (their
        # 16-bit copies): the all-reduce-equivalent time below becomes RS + AG at their own bytes
        zero_scale = 0.5 + 0.5 * param_bytes(plan) / grad_b if plan.zero_stage >= 1 else 1.0
        # a sharded optimizer reduce-scatters gradients and all-gathers parameters: NCCL rings, never the
        # all-reduce's tree or NVLink SHARP (docs/cost-model.md, "Communication")
        alg = "ring" if plan.zero_stage >= 1 else None
        L = model.num_layers
        # segment boundaries: every stage boundary of every pipeline. An interleaved pipeline (``fold`` = its
        # stage count) syncs as one pseudo-stage per chunk in model order: its stage's devices (what the sync
        # reads of a stage besides its first layer), starting at the chunk's first layer
        views: list[tuple] = []  # per pipeline: its (pseudo-)stages
        starts: list[tuple[int, ...]] = []
        folds: list[int] = []
        for p in plan.pipelines:
            if p.virtual_stages == 1:
                views.append(p.stages)
                starts.append(tuple([st.layers[0] for st in p.stages]))
                folds.append(0)
            else:
                S = len(p.stages)
                views.append(tuple(p.stages[si] for _ in range(p.virtual_stages) for si in range(S)))
                starts.append(tuple(p.stages[si].ranges[c][0] for c in range(p.virtual_stages) for si in range(S)))
                folds.append(S)
        bounds = sorted({0, L}.union(*starts))
        # pipelines with the same stage boundaries hold the same layers stage by stage: aggregate them
        shapes: dict[tuple[tuple[int, ...], int], list[int]] = {}
        for pi, st_starts in enumerate(starts):
            shapes.setdefault((st_starts, folds[pi]), []).append(pi)
        agg = []  # per shape, per stage: (dp sum, min tp, max tp, min ep, max ep, leader nodes, min etp, max etp,
        # any etp)
        info, cache = self._sync_stage_info, self._leader_nodes
        for (st_starts, _), pis in shapes.items():
            rows = []
            for col in zip(*[views[pi] for pi in pis]):  # per stage, the shape's pipelines' (equal lengths)
                infos = [cache.get((st.devices, st.tp, st.dp, st.cp, st.ep, st.etp)) or info(st) for st in col]
                if len(infos) == 1:  # (a stage's leader nodes are distinct)
                    nodes: dict[str, int] = dict(infos[0][0])
                else:
                    nodes = defaultdict(int)
                    for inf in infos:
                        for n, k in inf[0]:
                            nodes[n] += k
                _, dps, tps, eps, ets, has_et = zip(*infos)
                rows.append((sum(dps), min(tps), max(tps), min(eps), max(eps), nodes, min(ets), max(ets),
                             any(has_et)))
            agg.append((st_starts, rows, [0] * len(st_starts), [0.0] * len(st_starts)))
        for lo, hi in itertools.pairwise(bounds):
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
            t = self.network.ring_all_reduce_time(D, nodes, dense / min_tp * grad_b, max_tp, alg)
            if expert and any(r[8] for r in parts):  # etp != tp: the expert replicas (edp), etp fastest then ep
                ep_bytes = expert / (min(r[6] for r in parts) * min(r[3] for r in parts)) * grad_b
                ring = []
                for pi, stages in enumerate(views):
                    s = stages[bisect.bisect_right(starts[pi], lo) - 1]
                    ring += s.devices[::s.ep * (expert_tp(s) or s.tp)]
                t += self.network.all_reduce_time(ring, ep_bytes, max(r[7] for r in parts), alg)
            elif expert:
                ep = max(r[4] for r in parts)
                ep_bytes = expert / (min_tp * min(r[3] for r in parts)) * grad_b
                if ep > 1:  # the expert rings: every ep-th group leader, in pipeline order
                    groups = []
                    for pi, stages in enumerate(views):
                        groups += stages[bisect.bisect_right(starts[pi], lo) - 1].groups()
                    t += self.network.all_reduce_time([grp[0] for grp in groups][::ep], ep_bytes, max_tp, alg)
                else:
                    t += self.network.ring_all_reduce_time(D, nodes, ep_bytes, max_tp, alg)
            for k, si in held:
                agg[k][3][si] += t * zero_scale
        replicas: list[tuple[int, ...]] = [()] * len(plan.pipelines)
        stage_times: list[tuple[float, ...]] = [()] * len(plan.pipelines)
        t_sync = 0.0
        for (_, _, mins, times), pis in zip(agg, shapes.values()):
            fold = folds[pis[0]]
            if fold:  # an interleaved stage syncs its chunks one after another, on the same devices
                mins = [min(mins[c * fold + si] for c in range(len(mins) // fold)) for si in range(fold)]
                times = [sum(times[c * fold + si] for c in range(len(times) // fold)) for si in range(fold)]
            reps = tuple(mins)
            for pi in pis:
                replicas[pi] = reps
                stage_times[pi] = tuple(times)
            t_sync = max(t_sync, max(times))
        return t_sync, replicas, stage_times

    def _group_leader_nodes(self, st: Stage) -> tuple[tuple[str, int], ...]:
        """(node, count) of the first device of each of the stage's TP groups (they join the DP rings)."""
        return self._sync_stage_info(st)[0]

    def _sync_stage_info(self, st: Stage) -> tuple:
        """What the gradient sync reads of a stage: (:meth:`_group_leader_nodes`, dp x cp, tp, ep, expert tp or
        tp, whether expert tp differs), cached by the fields it depends on (many stages share them: the same
        devices with other layers)."""
        key = (st.devices, st.tp, st.dp, st.cp, st.ep, st.etp)
        hit = self._leader_nodes.get(key)
        if hit is None:
            c: dict[str, int] = defaultdict(int)
            for grp in st.groups():
                c[self._dev_node[grp[0]]] += 1
            et = expert_tp(st)
            hit = self._leader_nodes[key] = (tuple(c.items()), st.dp_size * st.cp, st.tp, st.ep, et or st.tp,
                                             et is not None)
        return hit


def grad_bytes(plan: Plan) -> float:
    """Bytes per parameter of the gradient reduction: fp32 unless the plan says ``grad_reduce_in_fp32: false``
    (Megatron-LM with bf16 and torchtitan's FSDP reduce in fp32 by default)."""
    return 2.0 if plan.grad_reduce_in_fp32 is False and plan.precision != "fp32" else 4.0


def param_bytes(plan: Plan) -> float:
    """Bytes per parameter of a sharded optimizer's parameter all-gather (the 16-bit compute copy)."""
    return 4.0 if plan.precision == "fp32" else 2.0


def gather_share(plan: Plan) -> float:
    """The parameter all-gather's share of a sharded sync (RS of gradients + AG of parameters)."""
    g, p = grad_bytes(plan), param_bytes(plan)
    return p / (g + p)


MEGATRON_BUCKET_PARAMS = 40_000_000
"""Megatron-LM's default gradient bucket (``DistributedDataParallelConfig.bucket_size``: max(40M, 1M x dp)
parameters; megatron/core/distributed/distributed_data_parallel.py); we use the 40M floor."""


def exposed_sync(t: float, params: float, bwd_window: float, fwd_window: float, zero: bool,
                 overlap_grad: bool, overlap_param: bool, ag_share: float = 0.5) -> float:
    """The part of one stage's gradient sync ``t`` (seconds, for ``params`` parameters per device) not hidden by
    overlap. With a sharded optimizer (``zero``) the sync is a reduce-scatter and an all-gather (``ag_share``
    of ``t``: :func:`gather_share`); without, one all-reduce (the reduce part). The reduction overlaps the
    last micro-batch's backward (``bwd_window``) bucket by bucket, all but the last bucket; the parameter
    gather overlaps the next iteration's forward up to this stage (``fwd_window``), all but the first bucket."""
    frac = min(1.0, MEGATRON_BUCKET_PARAMS / params) if params > 0 else 1.0
    rs, ag = (t * (1 - ag_share), t * ag_share) if zero else (t, 0.0)
    if overlap_grad:
        rs = max(rs * frac, rs - bwd_window)
    if overlap_param:
        ag = max(ag * frac, ag - fwd_window)
    return rs + ag
