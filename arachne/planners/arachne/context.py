"""One planning problem as the arachne planner, its search and its completion see it: the inputs, the
device classes, the per-slot layer profiles (cached) and the plan parts built once per problem."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from arachne.cost import CostModel, Estimate
from arachne.cost.compute import act_bytes
from arachne.cost.memory import block_activation_bytes
from arachne.plan import Pipeline, Stage
from arachne.planners.arachne.options import GROUP_WITHIN
from arachne.planners.arachne.template import (
    DeviceClass,
    device_classes,
)
from arachne.planners.arachne.work_clock import Work
from arachne.spec.cluster import Cluster
from arachne.spec.job import Job
from arachne.spec.model import ModelSpec


def _like(proto, **values):
    """A model equal to ``type(proto).model_construct(**values)`` where ``proto`` was built that way with the same
    field names: ``proto`` copied with ``values`` (as pydantic's ``__copy__`` does), without resolving every
    default again (2-3 times cheaper; completion builds tens of thousands of stages on a large cluster)."""
    cls = proto.__class__
    obj = cls.__new__(cls)
    d = proto.__dict__.copy()
    d.update(values)
    object.__setattr__(obj, "__dict__", d)
    object.__setattr__(obj, "__pydantic_fields_set__", set(proto.__pydantic_fields_set__))
    object.__setattr__(obj, "__pydantic_extra__", proto.__pydantic_extra__)
    object.__setattr__(obj, "__pydantic_private__", proto.__pydantic_private__)
    return obj


_STAGE = Stage.model_construct(layers=(0, 1), devices=("",), tp=1, dp=None, ep=1, recompute=False,
                               allow_cross_node_tp=False)
_PIPELINE = Pipeline.model_construct(micro_batches=1, stages=(_STAGE,), micro_batch_size=None)


@dataclass
class SlotProfile:
    """Per-layer time (fwd+bwd per micro-batch, TP traffic included) and a linear memory model. The prefix
    sums are kept as lists of floats: the layer split reads them hundreds of thousands of times per plan,
    and a list index is several times cheaper than a numpy scalar's (the values are the same doubles)."""

    time_prefix: list[float]
    emb: float
    head: float
    mem_fixed: float
    mem_param_prefix: list[float]
    mem_act_prefix: list[float]
    mem_first_param: float
    mem_first_act: float
    mem_last: float
    capacity: float
    fwd_prefix: list[float] | None = None  # the forward's part of ``time_prefix`` (None: a third of it)
    emb_fwd: float = 0.0
    head_fwd: float = 0.0

    def __post_init__(self) -> None:
        for name in ("time_prefix", "mem_param_prefix", "mem_act_prefix"):
            setattr(self, name, np.asarray(getattr(self, name), dtype=float).tolist())
        if self.fwd_prefix is None:
            self.fwd_prefix = [t / 3 for t in self.time_prefix]
            self.emb_fwd, self.head_fwd = self.emb / 3, self.head / 3
        else:
            self.fwd_prefix = np.asarray(self.fwd_prefix, dtype=float).tolist()

    def time(self, a: int, z: int, first: bool, last: bool) -> float:
        t = self.time_prefix[z] - self.time_prefix[a]
        return t + (self.emb if first else 0.0) + (self.head if last else 0.0)

    def fwd(self, a: int, z: int, first: bool, last: bool) -> float:
        """The forward's part of :meth:`time`."""
        t = self.fwd_prefix[z] - self.fwd_prefix[a]
        return t + (self.emb_fwd if first else 0.0) + (self.head_fwd if last else 0.0)

    def memory(self, a: int, z: int, first: bool, last: bool, in_flight: int) -> float:
        m = self.mem_fixed + (self.mem_param_prefix[z] - self.mem_param_prefix[a])
        m += in_flight * (self.mem_act_prefix[z] - self.mem_act_prefix[a])
        if first:
            m += self.mem_first_param + in_flight * self.mem_first_act
        if last:
            m += self.mem_last
        return m


@dataclass
class PlanningContext:
    """Everything completion needs about one planning problem, with caches."""

    cluster: Cluster
    model: ModelSpec
    job: Job
    cost_model: CostModel
    classes: list[DeviceClass] = field(default_factory=list)
    memory_headroom: float = 1.0  # the cost model already charges allocator reserve
    closest_unfit: tuple[float, str] | None = None  # (worst used/capacity, description) of the nearest miss
    found_fit: bool = False  # a priced plan fits: no more pricing only to explain a failure
    even_split_notes: int = 0  # plans priced only to explain a failure (a few are enough)
    work: Work = field(default_factory=Work)  # work requested so far (a work-bounded planner's clock)
    balance_sends: bool = True  # a second layer split that also balances blocking sends (slow links)
    trim_last: bool = True  # with few micro-batches per stage, layers moved off the last stage (the 1F1B timeline)
    node_parts: bool = True  # classes of odd-sized nodes by power-of-two parts (see template.node_parts)
    same_gpus_first: bool = False  # the seeds' grid next to the incumbent: its same-GPU trades first (SearchOptions)
    whole_block_mix: bool = False  # the mixed rules in whole blocks per stage, a last pass (SearchOptions)
    mixed_rule_args: list = field(default_factory=list)  # (rule, its arguments) for that pass (search/whole_blocks)
    best_tok_s: float = 0.0  # the fastest fitting plan priced so far
    group_sizes: bool = True  # a group of pipelines may take its own micro-batch size (priced from the best)
    group_within: float = GROUP_WITHIN  # ... on templates priced within this share of the fastest plan so far
    by_value_prefixes: bool = True  # the floor's "fastest j classes" also by each class's value alone
    wide_small_batch: bool = True  # the floor's one-stage slots across nodes for a batch smaller than a class
    type_pools: bool = True  # pipelines over a GPU type pooled across its node sizes, priced after refinement
    sequence_parallel: bool = False  # stages of tp > 1 built and sized with sequence parallelism (version 2)
    _profiles: dict[tuple, SlotProfile] = field(default_factory=dict)
    _stages: dict[tuple, Stage] = field(default_factory=dict)
    _pipelines: dict[tuple, Pipeline] = field(default_factory=dict)

    def note_unfit(self, est: Estimate) -> None:
        """Remember the priced plan that came closest to fitting (for the no-plan message)."""
        worst = max(est.stages, key=lambda s: s.memory_bytes / s.capacity_bytes, default=None)
        if worst is None:
            return
        ratio = worst.memory_bytes / worst.capacity_bytes
        if self.closest_unfit is None or ratio < self.closest_unfit[0]:
            self.closest_unfit = (ratio, f"the closest layout found needs {worst.memory_bytes / 1e9:.1f} GB on a "
                                         f"{worst.gpu} ({worst.capacity_bytes / 1e9:.1f} GB; over by "
                                         f"{(worst.memory_bytes - worst.capacity_bytes) / 1e9:.1f} GB) for blocks "
                                         f"{worst.layers[0]}-{worst.layers[1]} at micro-batch 1 or more")

    def __post_init__(self) -> None:
        if not self.classes:
            self.classes = device_classes(self.cluster, self.job.precision, self.node_parts)

    def stage(self, layers: tuple[int, int], devices: tuple[str, ...], tp: int, dp: int, ep: int,
              recompute: bool) -> Stage:
        """A plan stage built from validated parts by completion: pydantic's validation is skipped, and equal
        stages (a template's candidates at other micro-batch sizes share them) are built once."""
        key = (layers, devices, tp, dp, ep, recompute)
        hit = self._stages.get(key)
        if hit is None:
            hit = self._stages[key] = _like(_STAGE, layers=layers, devices=devices, tp=tp, dp=dp if dp > 1 else None,
                                            ep=ep, recompute=recompute,
                                            sequence_parallel=self.sequence_parallel and tp > 1)
        return hit

    def pipeline(self, micro_batches: int, stages: tuple[Stage, ...], micro_batch_size: int | None) -> Pipeline:
        """A plan pipeline of :meth:`stage` objects, built once per (count, stages, size): the stages live in
        this context, so their ids name them."""
        key = (micro_batches, tuple(map(id, stages)), micro_batch_size)
        hit = self._pipelines.get(key)
        if hit is None:
            hit = self._pipelines[key] = _like(_PIPELINE, micro_batches=micro_batches, stages=stages,
                                               micro_batch_size=micro_batch_size)
        return hit

    # ---- slot primitives ------------------------------------------------------------------------
    def slot_profile(self, cls: int, tp: int, dp: int, ep: int, mbs: int, num_stages: int,
                     zero_shards: int, recompute: bool) -> SlotProfile:
        key = (cls, tp, dp, ep, mbs, num_stages > 1, zero_shards, recompute)
        self.work.profile_calls += 1
        hit = self._profiles.get(key)
        if hit is not None:
            return hit
        self.work.profiles += 1
        m, job, cm = self.model, self.job, self.cost_model
        gpu = self.classes[cls].gpu
        b = mbs / dp
        seq, prec = job.sequence_length, job.precision
        lc = cm.layer_costs(m, gpu, prec, seq, b, tp, ep)
        L = m.num_layers
        fwd = np.diff(lc.fwd_cum)
        per = fwd + np.diff(lc.bwd_cum)
        if recompute:
            per = per + fwd
        if tp > 1 and not lc.includes_tp_comm:
            tpc = cm.network.tp_block_time(self.classes[cls].nodes[0], tp, b * seq * m.hidden_size * act_bytes(prec))
            per = per + tpc * (3 if recompute else 2)
            fwd = fwd + tpc
        if ep > 1:
            nbytes = b * seq * m.experts_top_k * m.hidden_size * act_bytes(prec) / tp
            a2a = 4 * (2 * (ep - 1) / ep * nbytes / gpu.collective_bandwidth)
            moe = np.array([a2a if m.moe_layers[i] else 0.0 for i in range(L)])
            per, fwd = per + moe, fwd + moe / 2
        tprefix = np.concatenate([[0.0], np.cumsum(per)])
        # memory: linear in layers; measure the pieces with the cost model's own function
        S = max(2, num_stages)
        kw = dict(model=m, num_stages=S, tp=tp, ep=ep, b=b, precision=prec, seq=seq, zero_shards=zero_shards,
                  replicated=zero_shards > 1, recompute=recompute, sp=self.sequence_parallel and tp > 1)
        fixed0 = cm.stage_memory(layers=(0, 0), first=False, last=False, in_flight_mbs=0, **kw).total
        recompute_peak = 0.0
        if recompute:
            recompute_peak = max(block_activation_bytes(m, i, seq, b, tp, prec, cm.cal.memory) for i in range(L))
        kinds: dict[bool, tuple[float, float]] = {}
        p_inc, a_inc = np.zeros(L), np.zeros(L)
        for i in range(L):
            kind = m.moe_layers[i]
            if kind not in kinds:
                m0 = cm.stage_memory(layers=(i, i + 1), first=False, last=False, in_flight_mbs=0, **kw).total
                m1 = cm.stage_memory(layers=(i, i + 1), first=False, last=False, in_flight_mbs=1, **kw).total
                kinds[kind] = (m0 - fixed0 - recompute_peak, m1 - m0)
            p_inc[i], a_inc[i] = kinds[kind]
        f0 = cm.stage_memory(layers=(0, 0), first=True, last=False, in_flight_mbs=0, **kw).total
        f1 = cm.stage_memory(layers=(0, 0), first=True, last=False, in_flight_mbs=1, **kw).total
        last = cm.stage_memory(layers=(0, 0), first=False, last=True, in_flight_mbs=0,
                               **{**kw, "num_stages": num_stages}).total
        prof = SlotProfile(tprefix, lc.emb_fwd + lc.emb_bwd, lc.head_fwd + lc.head_bwd, fixed0 + recompute_peak,
                           np.concatenate([[0.0], np.cumsum(p_inc)]), np.concatenate([[0.0], np.cumsum(a_inc)]),
                           f0 - fixed0, f1 - f0, last - fixed0, gpu.memory_bytes * self.memory_headroom,
                           np.concatenate([[0.0], np.cumsum(fwd)]), lc.emb_fwd, lc.head_fwd)
        self._profiles[key] = prof
        return prof
