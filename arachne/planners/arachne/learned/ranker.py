"""The learned screening order: a small MLP that ranks whole templates (the policy's proposals and
the mixed-pipeline rules together) before any is priced, so the few that a large cluster leaves time
to screen are the most promising ones. Several trained rankers (different seeds and rule pools) are
averaged: one alone reorders single cases by up to 16% when it is retrained (see :class:`RankerEnsemble`).

It reads the planning problem (the policy's global features) and, per template, the pieces of a
cheap pipeline model -- stage speed from the same per-layer times completion uses, 1F1B bubble,
stage-to-stage transfer, gradient ring, memory room -- and learns how they combine into the
cost model's screened throughput (``arachne train-ranker``). Inference is plain numpy.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from arachne.cost.compute import act_bytes
from arachne.planners.arachne.actions import Action, State
from arachne.planners.arachne.context import PlanningContext
from arachne.planners.arachne.learned.features import FeatureBuilder
from arachne.planners.arachne.learned.policy import Policy, load_shipped

RANKER_FILE = "ranker.npz"  # the first member; further members are ranker_2.npz, ranker_3.npz, ...
TEMPLATE_DIM = 14 + 22


@dataclass
class _Group:
    """One pipeline shape of a template: per slot (class, action), its replicas and micro-batch size."""

    slots: list[tuple[int, Action]]
    replicas: int
    mbs: int


def _groups(st: State) -> list[_Group]:
    out = []
    mix = [(ci, a) for ci, a in enumerate(st.actions) if a.kind == "mix"]
    if mix and st.mix_replicas:
        out.append(_Group(mix, st.mix_replicas, max(a.dp for _, a in mix)))
    for ci, a in enumerate(st.actions):
        if a.kind == "own" and a.replicas > 0:
            out.append(_Group([(ci, a)], a.replicas, a.dp))
    return out


def template_vector(ctx: PlanningContext, feats: FeatureBuilder, st: State, from_rule: bool) -> np.ndarray:
    """Features of one complete template (a decision sequence). Every group is modelled as pipelines
    whose layers are split in proportion to stage speed; the global batch is shared in proportion to
    group speed; the step is the slowest group's (bubble, transfers and gradient ring included)."""
    m, job = ctx.model, ctx.job
    L = m.num_layers
    gb = job.global_batch_size
    grad_bytes = 2 * m.num_params / L
    groups = _groups(st)
    rows = []
    for g in groups:
        S = sum(a.stages for _, a in g.slots)
        act = g.mbs * job.sequence_length * m.hidden_size * act_bytes(job.precision)
        rate, slow, p2p, room, sync_rate = 0.0, 0.0, 0.0, 0.0, []
        m_guess = max(1, gb // max(1, g.replicas * g.mbs))
        for ci, a in g.slots:
            c = ctx.classes[ci]
            prof = ctx.slot_profile(ci, a.tp, a.dp, a.ep, g.mbs, S, g.replicas * a.dp, False)
            r = L / max(float(prof.time_prefix[L]), 1e-12)  # layers per second of one stage
            rate += a.stages * r
            slow = max(slow, 1.0 / r)
            if c.node_size > 1:
                p2p = max(p2p, 2 * act / a.tp * c.node_size / c.inter_node_bw)
            per_layer = (prof.mem_param_prefix[L] + min(S, m_guess) * prof.mem_act_prefix[L]) / L
            room += a.stages * max(0.0, prof.capacity - prof.mem_fixed) / max(float(per_layer), 1.0)
            sync_rate.append((a, c, r))
        tau = max(L / rate, slow) + p2p
        sync = 0.0
        if g.replicas > 1:
            for a, c, r in sync_rate:
                bw = c.inter_node_bw if c.node_size > 1 or c.count > 1 else c.gpu.collective_bandwidth
                sync = max(sync, 2 * L * r / rate * grad_bytes / a.tp / (a.ep if m.is_moe else 1) / bw)
        rows.append((g, S, tau, p2p, sync, room / L))
    speed = [g.replicas * g.mbs / tau for g, _, tau, *_ in rows]
    total = sum(speed) or 1e-12
    step, bubble, sync_f, p2p_f, room_min, m_min = 0.0, 0.0, 0.0, 0.0, 8.0, 1e9
    for (g, S, tau, p2p, sync, room), sp in zip(rows, speed):
        mb = max(1.0, gb * sp / total / (g.replicas * g.mbs))  # micro-batches per replica
        t = (mb + S - 1) * tau + sync
        if t > step:
            step, bubble, sync_f, p2p_f = t, (S - 1) / (mb + S - 1), sync / t, p2p / tau
        room_min = min(room_min, room)
        m_min = min(m_min, mb)
    seqs = gb / step if step > 0 else 0.0
    used = [ci for ci, a in enumerate(st.actions) if a.kind != "skip"]
    gpus = sum(a.tp * a.dp * a.stages * a.replicas for a in st.actions if a.kind != "skip")
    flops_used = sum(feats.flops[ci] * a.tp * a.dp * a.stages * a.replicas / ctx.classes[ci].count
                     for ci, a in enumerate(st.actions) if a.kind != "skip")
    speeds = [ctx.classes[ci].gpu.peak_flops(job.precision) for ci in used] or [1.0]
    n_gpus = sum(c.count for c in ctx.classes)
    acts = [a for a in st.actions if a.kind != "skip"] or [Action("skip")]
    w = [a.tp * a.dp * a.stages * a.replicas for a in acts]
    mean_tp = sum(math.log2(a.tp) * x for a, x in zip(acts, w)) / max(1, sum(w))
    ideal = feats.total_flops / feats.flops_per_seq  # sequences per second at 100% of peak
    vec = np.array([
        math.log(max(seqs, 1e-12) / ideal) / 4, bubble, sync_f, p2p_f, min(room_min, 8.0) / 8,
        math.log2(max(room_min, 1e-3)) / 4, gpus / n_gpus, flops_used / feats.total_flops,
        len(groups) / 4, float(any(a.kind == "mix" for a in st.actions)), len(used) / len(ctx.classes),
        max(math.log2(a.tp) for a in acts) / 3, mean_tp / 3, max(math.log2(a.dp) for a in acts) / 3,
        max(math.log2(a.ep) for a in acts) / 3, max((S for _, S, *_ in rows), default=0) / max(1, L),
        math.log2(sum(g.replicas for g in groups) + 1) / 8, min(speeds) / max(speeds),
        math.log2(max(m_min, 1.0)) / 8, float(from_rule), math.log2(max(seqs, 1e-12)) / 16, 0.0,
    ])
    return np.concatenate([feats.global_vec, vec])


def template_matrix(ctx: PlanningContext, states: list[State], from_rule: list[bool],
                    feats: FeatureBuilder | None = None) -> np.ndarray:
    """:func:`template_vector` for a pool of templates; the last column is each one's proxy relative
    to the pool's best (log), which is what a ranking within one problem turns on."""
    feats = feats or FeatureBuilder(ctx)
    x = np.array([template_vector(ctx, feats, st, r) for st, r in zip(states, from_rule)], dtype=np.float64)
    if len(x):
        x[:, -1] = x[:, -2] - x[:, -2].max()
    return x.reshape(len(states), TEMPLATE_DIM)


def ranked_pool(proposed: list[State], rules: list[State]) -> tuple[list[State], list[bool]]:
    """The pool the ranker orders: the policy's proposals, then the rule templates, each template once
    (a proposal and a rule can build the same one); with a flag per template saying it came from the rules."""
    pool, from_rule, seen = [], [], set()
    for st, rule in [(s, False) for s in proposed] + [(s, True) for s in rules]:
        tpl = st.template()
        if not st.is_empty() and tpl not in seen:
            seen.add(tpl)
            pool.append(st)
            from_rule.append(rule)
    return pool, from_rule


@dataclass
class RankerEnsemble:
    """Rankers averaged: each member's scores standardised over the pool, then summed. A member alone
    is noisy where a large cluster leaves time to screen only a handful of templates; the average keeps
    near the front what the members agree on."""

    members: list[Policy]

    @property
    def info(self) -> dict:
        """The first member's training record (each member carries its own)."""
        return self.members[0].info

    def logits(self, x: np.ndarray) -> np.ndarray:
        total = np.zeros(len(x))
        for m in self.members:
            v = m.logits(x)
            total += (v - v.mean()) / (v.std() + 1e-9) if len(self.members) > 1 else v
        return total


def rank_states(ctx: PlanningContext, ranker: Policy | RankerEnsemble, states: list[State], from_rule: list[bool],
                feats: FeatureBuilder | None = None) -> list[State]:
    """The pool, most promising first by the learned score (ties keep the given order)."""
    if not states:
        return []
    ctx.work.rank_rows += len(states)
    # each further member's forward pass is charged as policy rows (the same small MLP)
    ctx.work.policy_rows += len(states) * (len(ranker.members) - 1 if isinstance(ranker, RankerEnsemble) else 0)
    score = ranker.logits(template_matrix(ctx, states, from_rule, feats))
    order = sorted(range(len(states)), key=lambda i: (-score[i], i))
    return [states[i] for i in order]


def member_file(n: int, name: str = RANKER_FILE) -> str:
    """The file of ensemble member ``n`` (1-based): ``ranker.npz``, ``ranker_2.npz``, ...; with ``name``
    its report or curve (``ranker_report.json`` -> ``ranker_2_report.json``)."""
    return name if n == 1 else name.replace("ranker", f"ranker_{n}", 1)


RANKER_OUTPUTS = ("ranker.npz", "ranker_report.json", "ranker_curve.png")


def install_ranker(out: Path, target: Path, add: bool) -> int:
    """Copy a training run's ranker (weights, report, curve) from ``out`` into the weights folder
    ``target``: as the only member (the others are removed), or with ``add`` as the next member.
    Returns its member number."""
    n = 1
    while (target / member_file(n)).is_file():
        n += 1
    if not add:
        for k in range(2, n):
            for f in RANKER_OUTPUTS:
                (target / member_file(k, f)).unlink(missing_ok=True)
        n = 1
    for f in RANKER_OUTPUTS:
        shutil.copy(out / f, target / member_file(n, f))
    return n


@lru_cache(maxsize=1)
def shipped_ranker() -> RankerEnsemble | None:
    """The ranker checkpoints inside the package (members 1, 2, ... until one is missing), or None when
    none has been trained."""
    members = []
    while (m := load_shipped(member_file(len(members) + 1))) is not None:
        members.append(m)
    return RankerEnsemble(members) if members else None
