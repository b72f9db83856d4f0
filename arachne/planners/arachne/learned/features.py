"""Numeric features the policy reads: GPU types by their figures (never their names), counts,
node sizes, bandwidths, the model/job shape, the decisions so far and the candidate action."""

from __future__ import annotations

import math

import numpy as np

from arachne.cost.memory import state_bytes_per_param
from arachne.planners.arachne.actions import Action, State
from arachne.planners.arachne.template import DeviceClass

KINDS = ("skip", "own", "mix")


def _l(x: float) -> float:
    return math.log2(max(x, 1e-12))


class FeatureBuilder:
    """Builds the input vector of one (state, action) pair for one planning problem."""

    def __init__(self, ctx):
        self.ctx = ctx
        m, job, classes = ctx.model, ctx.job, ctx.classes
        prec = job.precision
        self.flops = [c.gpu.peak_flops(prec) * c.count for c in classes]
        self.total_flops = sum(self.flops)
        self.total_mem = sum(c.gpu.memory_bytes * c.count for c in classes)
        w, g, o = state_bytes_per_param(prec, ctx.cost_model.cal.memory)
        self.state_bytes = m.num_params * (w + g + o)
        self.flops_per_seq = m.model_flops_per_sequence(job.sequence_length)
        self.global_vec = np.array([
            _l(m.num_params) / 40, _l(m.active_params) / 40, m.num_layers / 100, _l(m.hidden_size) / 16,
            float(m.is_moe), _l(m.num_experts) / 8, m.experts_top_k / 8, _l(job.global_batch_size) / 16,
            _l(job.sequence_length) / 16, float(prec == "fp32"), _l(self.total_flops) / 64,
            _l(self.total_mem / self.state_bytes) / 8, len(classes) / 8,
            _l(self.flops_per_seq * job.global_batch_size / self.total_flops) / 8,
        ])
        self._class_vec = [self._class(c) for c in classes]

    def _class(self, c: DeviceClass) -> np.ndarray:
        prec = self.ctx.job.precision
        g = c.gpu
        return np.array([
            _l(g.peak_flops(prec)) / 64, _l(g.memory_bytes) / 40, _l(g.hbm_bandwidth) / 48,
            _l(g.collective_bandwidth) / 48, _l(c.inter_node_bw) / 48, _l(c.node_size) / 4, _l(c.count) / 12,
            self.flops[c.index] / self.total_flops, _l(g.memory_bytes * c.count / self.state_bytes) / 8,
            c.index / 8,
        ])

    def _state(self, st: State) -> np.ndarray:
        used = 0.0
        for ci, a in enumerate(st.actions):
            if a.kind == "own":
                used += self.flops[ci] * a.replicas * a.stages * a.tp * a.dp / self.ctx.classes[ci].count
            elif a.kind == "mix":
                used += self.flops[ci] * a.replicas * a.stages * a.tp * a.dp / self.ctx.classes[ci].count
        n_own = sum(1 for a in st.actions if a.kind == "own")
        return np.array([_l(st.mix_replicas + 1) / 8, st.mixed_stages() / 32, used / self.total_flops,
                         n_own / 8, st.step() / 8])

    def action(self, st: State, a: Action) -> np.ndarray:
        ci = st.step()
        c = self.ctx.classes[ci]
        m = self.ctx.model
        kind = [float(a.kind == k) for k in KINDS]
        g = a.tp * a.dp
        if a.kind == "skip":
            used = 0.0
            stages_total = st.mixed_stages()
            mem_press = 0.0
            reps = 0
        else:
            used = a.replicas * a.stages * g / c.count
            stages_total = a.stages + (st.mixed_stages() if a.kind == "mix" else 0)
            reps = a.replicas
            per_dev = self.state_bytes / max(1, stages_total) / (a.tp * (a.ep if m.is_moe else 1))
            mem_press = per_dev / c.gpu.memory_bytes
        vec = np.array([
            *kind, _l(a.tp) / 4, _l(a.dp) / 4, _l(a.ep) / 4, a.stages / 32, stages_total / 32,
            _l(reps + 1) / 10, used, min(mem_press, 8.0) / 8, _l(mem_press + 1e-3) / 10,
        ])
        return np.concatenate([self.global_vec, self._class_vec[ci], self._state(st), vec])

    def batch(self, st: State, actions: list[Action]) -> np.ndarray:
        """:meth:`action` for many actions at once (vectorised: the policy's beam search calls this a lot)."""
        ci = st.step()
        c = self.ctx.classes[ci]
        moe = self.ctx.model.is_moe
        raw = np.array([(a.kind == "skip", a.kind == "own", a.kind == "mix", a.tp, a.dp, a.ep, a.stages, a.replicas)
                        for a in actions], dtype=np.float64).reshape(len(actions), 8)
        kind, tp, dp, ep, stages, replicas = raw[:, :3], raw[:, 3], raw[:, 4], raw[:, 5], raw[:, 6], raw[:, 7]
        skip, mix = kind[:, 0] > 0, kind[:, 2] > 0
        ms = st.mixed_stages()
        g = tp * dp
        used = np.where(skip, 0.0, replicas * stages * g / c.count)
        stages_total = np.where(skip, ms, stages + np.where(mix, ms, 0))
        reps = np.where(skip, 0.0, replicas)
        per_dev = self.state_bytes / np.maximum(1, stages_total) / (tp * (ep if moe else 1.0))
        mem_press = np.where(skip, 0.0, per_dev / c.gpu.memory_bytes)
        lg = lambda x: np.log2(np.maximum(x, 1e-12))  # noqa: E731
        vec = np.column_stack([kind, lg(tp) / 4, lg(dp) / 4, lg(ep) / 4, stages / 32, stages_total / 32,
                               lg(reps + 1) / 10, used, np.minimum(mem_press, 8.0) / 8, lg(mem_press + 1e-3) / 10])
        head = np.concatenate([self.global_vec, self._class_vec[ci], self._state(st)])
        return np.hstack([np.broadcast_to(head, (len(actions), head.size)), vec])


FEATURE_DIM = 14 + 10 + 5 + 12
