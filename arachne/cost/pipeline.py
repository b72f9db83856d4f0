"""One pipeline's price: per-stage rows, point-to-point transfers, the schedule's makespan, memory per
stage, and the optimizer step (CostModel's pipeline part)."""

from __future__ import annotations

from arachne.cost.compute import act_bytes
from arachne.cost.features import chunk_recomputed_blocks, expert_tp
from arachne.cost.memory import MemoryBreakdown, block_activation_bytes, stage_params
from arachne.cost.schedule import interleaved_in_flight, interleaved_time, pairs_micro_batches, pipeline_time
from arachne.cost.sync import IDENTITY_CACHE_SIZE, exposed_sync, gather_share
from arachne.plan import Plan
from arachne.spec.model import ModelSpec


def zero3_row(r: tuple, t: float, n_blocks: int, overlap_gather: bool, overlap_reduce: bool,
              ag_share: float = 0.5) -> tuple:
    """A stage row with ZeRO-3's traffic per micro-batch: the stage's parameters all-gathered before the
    forward and again before the backward, its gradients reduce-scattered after it, each half of the
    stage's all-reduce-equivalent sync ``t`` on the same replica rings (ring all-reduce = reduce-scatter +
    all-gather). Overlapped (``overlap_param_gather`` / ``overlap_grad_reduce``) the traffic hides behind
    the pass's compute block by block, all but one block's share; otherwise it is exposed. Appends the
    exposed seconds per micro-batch (``zero_comm_s``)."""
    ag, rs, n = t * ag_share, t * (1 - ag_share), max(1, n_blocks)
    g_f = max(ag / n, ag - r[0]) if overlap_gather else ag
    hidden = (ag if overlap_gather else 0.0) + (rs if overlap_reduce else 0.0)
    g_b = (t - hidden) + (max(hidden / n, hidden - r[1]) if hidden else 0.0)
    return (r[0] + g_f, r[1] + g_b, *r[2:8], g_f + g_b, *r[9:])


class PipelineMixin:
    """CostModel's per-pipeline pricing (uses ``self._stage``, ``self._memory``, ``self.network``)."""

    def _price_pipeline(self, model: ModelSpec, plan: Plan, p, mbs: int, reps: tuple[int, ...],
                        zero3_sync: tuple[float, ...] | None = None) -> tuple:
        """Per stage times and (memory, capacity), the transfers and the schedule's time of one pipeline
        (``zero3_sync``: with ZeRO-3, each stage's all-reduce-equivalent sync time, see :func:`zero3_row`)."""
        if p.virtual_stages > 1:
            return self._price_interleaved(model, plan, p, mbs, reps, zero3_sync)
        S = len(p.stages)
        rows = [self._stage(model, st, si == 0, si == S - 1, mbs, plan) for si, st in enumerate(p.stages)]
        if zero3_sync is not None:
            rows = [zero3_row(r, zero3_sync[si], st.num_layers, plan.overlap_param_gather, plan.overlap_grad_reduce,
                              gather_share(plan))
                    for si, (st, r) in enumerate(zip(p.stages, rows))]
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
            mems.append((mem, self._least("memory_bytes", st.devices)))
        # what every pipeline of this signature reports per stage (its StageEstimate after the indices)
        out_rows = [(r[5], st.layers, st.tp, st.dp_size, st.ep, r[0], r[1], r[2], r[3], r[4], send_f[si],
                     send_b[si], mem.total, cap, r[6])
                    for si, (st, r, (mem, cap)) in enumerate(zip(p.stages, rows, mems))]
        return (rows, send_f, send_b, T, mems, self._pipeline_optimizer_time(model, plan, p, reps), out_rows,
                sum(len(st.devices) for st in p.stages), all(r[12] <= r[13] for r in out_rows),
                max(r[12] for r in out_rows))

    def _price_interleaved(self, model: ModelSpec, plan: Plan, p, mbs: int, reps: tuple[int, ...],
                           zero3_sync: tuple[float, ...] | None = None) -> tuple:
        """:meth:`_price_pipeline` for ``virtual_stages > 1``: every chunk priced on its own (embedding with
        chunk 0 of stage 0, head with the last chunk of the last stage), transfers between consecutive chunks
        (the last stage's chunk j sends to stage 0's chunk j + 1: the link that crosses back), the
        interleaved 1F1B timeline, and memory of the chunks in flight. With ZeRO-3 each chunk gathers and
        reduce-scatters its own blocks' share of the stage's sync (:func:`zero3_row`). Rows report per stage
        the sums over its chunks."""
        crows, sf, sb = self.interleaved_chunks(model, plan, p, mbs)
        if zero3_sync is not None:
            crows = [[zero3_row(r, zero3_sync[si] * (b - a) / st.num_layers, b - a, plan.overlap_param_gather,
                                plan.overlap_grad_reduce, gather_share(plan)) for r, (a, b) in zip(cr, st.ranges)]
                     for si, (st, cr) in enumerate(zip(p.stages, crows))]
        T = interleaved_time(tuple(tuple(r[0] for r in cr) for cr in crows), tuple(tuple(r[1] for r in cr) for cr in crows),
                             sf, sb, p.micro_batches)
        rows = [tuple(sum(r[i] for r in cr) for i in range(5)) + (cr[0][5], cr[0][6], sum(r[7] for r in cr))
                + tuple(sum(r[i] for r in cr) for i in range(8, len(cr[0]))) for cr in crows]
        send_f, send_b = [sum(x) for x in sf], [sum(x) for x in sb]
        mems = []
        for si, st in enumerate(p.stages):
            mem = self._interleaved_memory(model, plan, p, st, si, mbs, reps[si])
            mems.append((mem, self._least("memory_bytes", st.devices)))
        out_rows = [(r[5], st.layers, st.tp, st.dp_size, st.ep, r[0], r[1], r[2], r[3], r[4], send_f[si],
                     send_b[si], mem.total, cap, r[6])
                    for si, (st, r, (mem, cap)) in enumerate(zip(p.stages, rows, mems))]
        return (rows, send_f, send_b, T, mems, self._pipeline_optimizer_time(model, plan, p, reps), out_rows,
                sum(len(st.devices) for st in p.stages), all(r[12] <= r[13] for r in out_rows),
                max(r[12] for r in out_rows))

    def interleaved_chunks(self, model: ModelSpec, plan: Plan, p, mbs: int) -> tuple:
        """Per stage, the stage rows of each chunk (:meth:`_stage`), and the per-chunk transfer times forward
        and backward between consecutive chunks (the last stage's chunk j sends to stage 0's chunk j + 1)."""
        S, v = len(p.stages), p.virtual_stages
        crows = []
        for si, st in enumerate(p.stages):
            ks = chunk_recomputed_blocks(st)
            crows.append([self._stage(model, st, si == 0 and c == 0, si == S - 1 and c == v - 1, mbs, plan, rng, ks[c])
                          for c, rng in enumerate(st.ranges)])
        act = mbs * plan.sequence_length * model.hidden_size * act_bytes(plan.precision)
        link = [self.network.p2p_time(list(p.stages[si].devices), list(p.stages[si + 1].devices), act)
                for si in range(S - 1)]
        back = self.network.p2p_time(list(p.stages[-1].devices), list(p.stages[0].devices), act)
        sf = tuple(tuple(link[si] if si < S - 1 else (back if c < v - 1 else 0.0) for c in range(v)) for si in range(S))
        sb = tuple(tuple(link[si - 1] if si else (back if c else 0.0) for c in range(v)) for si in range(S))
        return crows, sf, sb

    def _interleaved_memory(self, model: ModelSpec, plan: Plan, p, st, si: int, mbs: int, D: int) -> MemoryBreakdown:
        """One device of an interleaved stage: the model state of all its chunks, the activations of the chunk
        forwards in flight at its peak (:func:`interleaved_in_flight`), the largest chunk's transient."""
        S, v = len(p.stages), p.virtual_stages
        counts = interleaved_in_flight(si, S, v, p.micro_batches, pairs_micro_batches(model, plan))
        ks = chunk_recomputed_blocks(st)
        parts = [self.stage_memory(model, rng, si == 0 and c == 0, si == S - 1 and c == v - 1, S, st.tp, st.ep,
                                   mbs / st.dp_size / st.cp if st.cp > 1 else mbs / st.dp_size, counts[c],
                                   plan.precision, plan.sequence_length,
                                   D if plan.zero_stage >= 1 else 1, D > 1, st.recompute, ks[c] if st.recompute is True
                                   else None, st.sequence_parallel, plan.zero_stage, expert_tp(st), plan.framework,
                                   plan.grad_reduce_in_fp32 is not False, st.recompute_modules,
                                   self.memory_options(plan))
                 for c, rng in enumerate(st.ranges)]
        cal = self.cal.memory
        acts = sum(x.activations for x in parts)
        transient = max(x.transient for x in parts)
        fixed = cal.fp32_overhead_bytes if plan.precision == "fp32" else cal.mixed_overhead_bytes
        return MemoryBreakdown(sum(x.weights for x in parts), sum(x.gradients for x in parts),
                               sum(x.optimizer for x in parts), acts, transient,
                               fixed + cal.allocator_reserve * (acts + transient),
                               max(x.transient + x.cached for x in parts) - transient)

    def _exposed_cached(self, key: tuple, model: ModelSpec, plan: Plan, p, rows, times: tuple[float, ...]) -> float:
        """:meth:`_exposed_sync`, cached by ``key`` (the pipeline's shape, its stages' sync times and the plan's
        overlap settings): a plan of many replicas has few distinct pipelines."""
        ex = self._exposed_cache.get(key)
        if ex is None:
            if len(self._exposed_cache) >= IDENTITY_CACHE_SIZE:
                self._exposed_cache.clear()
            ex = self._exposed_cache[key] = self._exposed_sync(model, plan, p, rows, times)
        return ex

    def _exposed_sync(self, model: ModelSpec, plan: Plan, p, rows, times: tuple[float, ...]) -> float:
        """The slowest stage's gradient sync left exposed by ``overlap_grad_reduce``/``overlap_param_gather``
        (:func:`exposed_sync`): windows are the stage's backward of one micro-batch, and the forwards of one
        micro-batch up to and including the stage (the next iteration reaches it no earlier)."""
        S = len(p.stages)
        worst, fwd_before = 0.0, 0.0
        for si, st in enumerate(p.stages):
            fwd_before += rows[si][0]
            params = sum(_stage_params_cached(model, a, z, si == 0 and c == 0,
                                              si == S - 1 and c == len(st.ranges) - 1, S, st.tp, st.ep, expert_tp(st))
                         for c, (a, z) in enumerate(st.ranges))
            worst = max(worst, exposed_sync(times[si], params, rows[si][1], fwd_before, plan.zero_stage >= 1,
                                            plan.overlap_grad_reduce, plan.overlap_param_gather, gather_share(plan)))
        return worst

    def _optimizer_time(self, model: ModelSpec, plan: Plan, replicas: dict[tuple[int, int], int]) -> float:
        """Adam step: HBM traffic over the parameters each device updates (ZeRO-1: its shard)."""
        return max((self._pipeline_optimizer_time(model, plan, p, tuple(replicas.get((pi, si), 1)
                                                                         for si in range(len(p.stages))))
                    for pi, p in enumerate(plan.pipelines)), default=0.0)

    def _pipeline_optimizer_time(self, model: ModelSpec, plan: Plan, p, reps: tuple[int, ...]) -> float:
        cal = self.cal.memory
        per_param = cal.optimizer_bytes_per_param_fp32 if plan.precision == "fp32" else cal.optimizer_bytes_per_param_mixed
        worst = 0.0
        S = len(p.stages)
        for si, st in enumerate(p.stages):
            if p.virtual_stages > 1:
                params = sum(_stage_params_cached(model, a, z, si == 0 and c == 0, si == S - 1 and c == len(st.ranges) - 1,
                                                  S, st.tp, st.ep, expert_tp(st)) for c, (a, z) in enumerate(st.ranges))
            else:
                params = _stage_params_cached(model, st.layers[0], st.layers[1], si == 0, si == S - 1, S, st.tp, st.ep,
                                              expert_tp(st))
            if plan.zero_stage >= 1:
                params /= reps[si]
            hbm = self._least("hbm_bandwidth", st.devices)
            worst = max(worst, params * per_param / (hbm * cal.optimizer_hbm_efficiency))
        return worst


_PARAMS_CACHE: dict[tuple, float] = {}
_ACTS_CACHE: dict[tuple, float] = {}


def _block_acts_cached(model: ModelSpec, a: int, z: int, seq: int, b: float, tp: int, precision: str, cal,
                       etp: int | None = None) -> float:
    key = (model.key, a, z, seq, b, tp, precision, cal, etp)
    v = _ACTS_CACHE.get(key)
    if v is None:
        v = _ACTS_CACHE[key] = sum(block_activation_bytes(model, i, seq, b, tp, precision, cal, etp) for i in range(a, z))
    return v


def _stage_params_cached(model: ModelSpec, a: int, b: int, first: bool, last: bool, S: int, tp: int, ep: int,
                         etp: int | None = None) -> float:
    key = (model.key, a, b, first, last, S, tp, ep, etp)
    v = _PARAMS_CACHE.get(key)
    if v is None:
        v = _PARAMS_CACHE[key] = stage_params(model, a, b, first, last, S, tp, ep, etp)
    return v
