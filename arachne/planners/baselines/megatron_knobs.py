"""The Megatron-LM launch options the grid searches (docs/baselines.md §2.1): which values each knob takes
for one (tp, cp, pp, dp) shape, how a grid point becomes a plan, and the recomputation ladder (the least
recomputation that fits, as a practitioner tunes ``--recompute-granularity``/``--recompute-num-layers``).
With an fp8 job (``Job.fp8``) every point runs ``--fp8-format hybrid`` on GPUs that all have an FP8 rate, and
in bf16 when it fits in no other way.

The planner (:mod:`arachne.planners.baselines.megatron`) loops over the shapes and these menus and calls
:func:`ladder` per point; every plan is priced by the one ``CostModel``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from arachne.plan import Pipeline, Plan, Stage
from arachne.planners.baselines.common import (
    DEFAULT_MBS,
    Ctx,
    divisors,
    even_split,
    powers_of_two,
)
from arachne.spec.model import ModelSpec

RECOMPUTE_ALL = 0  # ladder rung: full recomputation of every block (no ``recompute_layers``)


@dataclass(frozen=True)
class MegatronKnobs:
    """Which Megatron-LM options the grid searches; the defaults are Megatron-LM's full menu, pruned as its
    documentation advises (docs/baselines.md §2.1). ``v1=True`` is the version-1 grid (before formats v2)."""

    micro_batch_sizes: tuple[int, ...] = DEFAULT_MBS
    """``--micro-batch-size`` menu (sequences per data-parallel rank)."""
    recompute: bool = True
    """``--recompute-granularity selective|full`` (+ ``--recompute-num-layers``): the least that fits."""
    distributed_optimizer: bool = True
    """``--use-distributed-optimizer`` (ZeRO-1) whenever a stage has replicas (dp x cp > 1)."""
    sequence_parallel: bool = True
    """``--sequence-parallel`` whenever tp > 1 (never slower under the common model, less memory)."""
    overlap: bool = True
    """``--overlap-grad-reduce`` and, with the distributed optimizer, ``--overlap-param-gather``."""
    max_virtual_stages: int = 4
    """``--num-layers-per-virtual-pipeline-stage``: v chunks per stage, 2 <= v <= this (1: off)."""
    context_parallel: bool = True
    """``--context-parallel-size``: cp > 1 for long sequences."""
    cp_min_sequence: int = 8192
    """cp > 1 only from this sequence length on (long-context training, where Megatron's recipes use it)."""
    max_cp: int = 16
    """Largest context-parallel degree tried (powers of two)."""
    expert_tp: bool = True
    """MoE: ``--expert-tensor-parallel-size`` etp in {1, tp} besides ``--expert-model-parallel-size`` ep."""
    fp8: bool = True
    """``--fp8-format hybrid`` when the job allows fp8 and every GPU of the point has an FP8 rate (a point that
    does not fit in fp8 even with full recomputation is tried in bf16)."""
    moe_overlap: bool = True
    """``--overlap-moe-expert-parallel-comm`` with ``--delay-wgrad-compute`` (a plan's ``overlap_moe_comm``) on the
    fastest fitting MoE points that Megatron-Core runs it on (ep > 1; pp = 1 or interleaved; no full
    recomputation), kept where faster (it hides all-to-alls, takes SMs and holds one more forward)."""
    v1: bool = False
    """The version-1 grid: ZeRO-1 on/off, recompute none/full, ep | dp, nothing else (for comparisons)."""


# ---- shapes ------------------------------------------------------------------------------------------
def tp_menu(model: ModelSpec, node_size: int, knobs: MegatronKnobs) -> list[int]:
    """Powers of two dividing the node size that the model's shapes allow; on an MoE model with etp
    searched, the experts' width need only split etp = 1 ways."""
    etp = 1 if model.is_moe and knobs.expert_tp and not knobs.v1 else None
    return [t for t in powers_of_two(node_size) if node_size % t == 0 and model.tp_error(t, etp=etp) is None]


def cp_menu(seq: int, knobs: MegatronKnobs) -> list[int]:
    """cp = 1, and for long sequences the powers of two up to ``max_cp`` with ``seq % (2 cp) == 0``."""
    if knobs.v1 or not knobs.context_parallel or seq < knobs.cp_min_sequence:
        return [1]
    return [1] + [c for c in powers_of_two(knobs.max_cp) if c > 1 and seq % (2 * c) == 0]


def virtual_menu(num_layers: int, pp: int, knobs: MegatronKnobs) -> list[int]:
    """v = 1, and with pp > 1 every v in 2..max_virtual_stages with ``num_layers % (pp v) == 0``."""
    if knobs.v1 or pp == 1:
        return [1]
    return [1] + [v for v in range(2, knobs.max_virtual_stages + 1) if num_layers % (pp * v) == 0]


def expert_menu(model: ModelSpec, tp: int, cp: int, dp: int, knobs: MegatronKnobs) -> list[tuple[int, int | None]]:
    """(ep, etp) pairs; etp None means etp = tp (version 1's spelling). Version 1: ep | gcd(dp, experts).
    Version 2: ep | experts, etp in {tp, 1} (the experts' width permitting), ``ep x etp | dp x cp x tp``."""
    if not model.is_moe:
        return [(1, None)]
    if knobs.v1:
        return [(ep, None) for ep in divisors(math.gcd(dp, model.num_experts))]
    etps = [tp] if model.etp_error(tp) is None and model.expert_ffn % tp == 0 else []
    if knobs.expert_tp and tp > 1 and model.etp_error(1) is None:
        etps.append(1)
    out: list[tuple[int, int | None]] = []
    for etp in etps:
        for ep in divisors(model.num_experts):
            if (dp * cp * tp) % (ep * etp):
                continue
            # etp = tp without cp is exactly version 1's rule (ep | dp): write it that way
            out.append((ep, None) if etp == tp and cp == 1 else (ep, etp))
    return out


# ---- plans -------------------------------------------------------------------------------------------
def stage_layers(num_layers: int, pp: int, v: int) -> list[tuple[int, int] | tuple[tuple[int, int], ...]]:
    """Per stage its block range, or with v > 1 its v chunks (chunk j of stage s is range j*pp + s)."""
    if v == 1:
        return list(even_split(num_layers, pp))
    c = num_layers // (pp * v)
    return [tuple(((j * pp + s) * c, (j * pp + s + 1) * c) for j in range(v)) for s in range(pp)]


@dataclass(frozen=True)
class Point:
    """One grid point before recomputation: shape, chunks, micro-batch and experts."""

    tp: int
    cp: int
    pp: int
    dp: int
    v: int
    b: int
    ep: int
    etp: int | None
    fp8: bool = True
    """fp8 where the builder allows it (False: the job's own precision)."""

    @property
    def num_devices(self) -> int:
        return self.pp * self.dp * self.cp * self.tp


class PlanBuilder:
    """Builds a shape's plans, sharing stage objects between micro-batch sizes (the cost model caches by
    stage identity)."""

    def __init__(self, ctx: Ctx, devices: list[str], knobs: MegatronKnobs):
        self.ctx, self.devices, self.knobs = ctx, devices, knobs
        self._stages: dict[tuple, tuple[Stage, ...]] = {}
        self._fp8: dict[int, bool] = {}

    def uses_fp8(self, pt: Point) -> bool:
        """Whether ``pt`` runs in fp8: the knob is on, the job allows it and every GPU it uses has an FP8 rate
        (in the real cluster, whatever cluster prices the plan)."""
        if not (pt.fp8 and self.knobs.fp8 and not self.knobs.v1 and self.ctx.job.fp8):
            return False
        n = pt.num_devices
        hit = self._fp8.get(n)
        if hit is None:
            devs = self.ctx.cluster.devices
            hit = self._fp8[n] = all(devs[d].gpu.fp8_tflops is not None for d in self.devices[:n])
        return hit

    def stages(self, pt: Point, recompute: bool | str, rec_layers: int | None) -> tuple[Stage, ...]:
        key = (pt.tp, pt.cp, pt.pp, pt.dp, pt.v, pt.ep, pt.etp, recompute, rec_layers)
        hit = self._stages.get(key)
        if hit is None:
            per = pt.dp * pt.cp * pt.tp
            sp = pt.tp > 1 and self.knobs.sequence_parallel and not self.knobs.v1
            layers = stage_layers(self.ctx.model.num_layers, pt.pp, pt.v)
            hit = self._stages[key] = tuple(
                Stage(layers=layers[s], devices=tuple(self.devices[s * per:(s + 1) * per]), tp=pt.tp, dp=pt.dp,
                      cp=pt.cp, ep=pt.ep, etp=pt.etp, sequence_parallel=sp, recompute=recompute,
                      recompute_layers=rec_layers) for s in range(pt.pp))
        return hit

    def plan(self, pt: Point, recompute: bool | str = False, rec_layers: int | None = None,
             zero: int | None = None) -> Plan:
        """The plan of ``pt``; ``zero`` None means the knobs' choice (distributed optimizer with replicas)."""
        G = self.ctx.job.global_batch_size
        pipe = Pipeline(micro_batches=G // (pt.dp * pt.b), virtual_stages=pt.v,
                        stages=self.stages(pt, recompute, rec_layers))
        plan = self.ctx.plan(pt.dp * pt.b, [pipe], zero_stage=0 if zero is None else zero)
        if self.uses_fp8(pt):
            plan = plan.model_copy(update={"precision": "fp8"})
        replicas = pt.dp * pt.cp > 1
        if zero is None and not self.knobs.v1 and replicas:
            dist = self.knobs.distributed_optimizer
            ov = self.knobs.overlap
            update = {"zero_stage": 1 if dist else 0, "overlap_grad_reduce": ov, "overlap_param_gather": ov and dist}
            plan = plan.model_copy(update=update)
        return plan


def recompute_rungs(block_counts: list[int], v: int) -> list[int]:
    """``--recompute-num-layers`` values for full recomputation, fewest first, ending with every block
    (:data:`RECOMPUTE_ALL`). Megatron counts per model chunk; the plan counts per stage, so with v > 1 only
    the whole-stage rung is expressible."""
    if v > 1:
        return [RECOMPUTE_ALL]
    return list(range(1, min(block_counts))) + [RECOMPUTE_ALL]


@dataclass(frozen=True)
class Priced:
    """What the grid keeps of one estimate."""

    fits: bool
    time_s: float
    """Iteration time under the pricing cost model."""
    floor_s: float
    """The iteration time less the critical pipeline's bubble: what interleaving could at best reach."""
    ep_s: float = 0.0
    """The critical pipeline's expert all-to-all time: what overlapping them could at best save."""


Fits = Callable[[Plan], Priced]


@dataclass
class Rung:
    """The outcome of :func:`ladder` for one point."""

    found: list[tuple[Plan, Priced]]
    """Fitting plans with their prices (not repeating a ``plain`` passed in)."""
    may_fit: bool
    """False when even full recomputation of every block does not fit (a larger micro-batch will not)."""
    plain: Priced
    """The point without recomputation."""


def ladder(builder: PlanBuilder, pt: Point, fits: Fits, bound: float = math.inf, plain: Priced | None = None) -> Rung:
    """The least recomputation that fits for ``pt``: none; else selective and the fewest fully recomputed
    blocks that fit (both kept: either may be faster).

    ``bound``: a time no plan worth keeping reaches (the ranking's k-th best). Recomputation only adds time,
    so when ``pt`` without it is already at ``bound`` or slower the ladder stops there (reporting that a
    plan may fit, so that larger micro-batches are still tried); ``-inf`` prices the point without
    recomputation only. ``plain``: that price, when known already. An fp8 point that fits in no way is
    climbed again in the job's own precision."""
    rung = _ladder(builder, pt, fits, bound, plain)
    if not rung.found and not rung.may_fit and builder.uses_fp8(pt):
        return _ladder(builder, dataclasses.replace(pt, fp8=False), fits, bound, None)
    return rung


def _ladder(builder: PlanBuilder, pt: Point, fits: Fits, bound: float, plain: Priced | None) -> Rung:
    knobs = builder.knobs
    if knobs.v1:  # the version-1 grid: every (recompute, ZeRO) combination
        out, first = [], None
        zeros = (0, 1) if knobs.distributed_optimizer and pt.dp > 1 else (0,)
        for rc in ((False, True) if knobs.recompute else (False,)):
            for z in zeros:
                plan = builder.plan(pt, rc, None, zero=z)
                got = fits(plan)
                first = first or got
                if got.fits:
                    out.append((plan, got))
        assert first is not None
        return Rung(out, bool(out), first)
    if plain is None:
        plan = builder.plan(pt)
        plain = fits(plan)
        if plain.fits:
            return Rung([(plan, plain)], True, plain)
    if plain.fits:
        return Rung([], True, plain)
    if not knobs.recompute:
        return Rung([], False, plain)
    if plain.time_s >= bound:
        return Rung([], True, plain)
    out = []
    plan = builder.plan(pt, "selective")
    sel = fits(plan)
    if sel.fits:
        out.append((plan, sel))
    counts = [r[1] - r[0] if isinstance(r[0], int) else sum(b - a for a, b in r)
              for r in stage_layers(builder.ctx.model.num_layers, pt.pp, pt.v)]
    full = _fewest_fitting(builder, pt, recompute_rungs(counts, pt.v), fits)
    if full is not None:
        out.append(full)
    return Rung(out, bool(out), plain)


def _fewest_fitting(builder: PlanBuilder, pt: Point, rungs: list[int], fits: Fits) -> tuple[Plan, Priced] | None:
    """Binary search over the rungs (memory falls as more blocks are recomputed) for the first that fits."""
    def make(k: int) -> Plan:
        return builder.plan(pt, True, None if k == RECOMPUTE_ALL else k)

    last = make(rungs[-1])
    got = fits(last)
    if not got.fits:
        return None
    best = (last, got)
    lo, hi = 0, len(rungs) - 1  # rungs[hi] fits
    while lo < hi:
        mid = (lo + hi) // 2
        plan = make(rungs[mid])
        got = fits(plan)
        if got.fits:
            best, hi = (plan, got), mid
        else:
            lo = mid + 1
    return best


def moe_overlap_variant(plan: Plan, model: ModelSpec, knobs: MegatronKnobs) -> Plan | None:
    """``plan`` with ``overlap_moe_comm`` where the knob is on and Megatron-Core runs the pairing on it (the
    megatron runtime's rules, :func:`arachne.spec.runtimes.moe_overlap_errors`); None otherwise."""
    from arachne.plan import PLAN_FORMAT_V2
    from arachne.spec.runtimes import moe_overlap_errors

    if not (knobs.moe_overlap and not knobs.v1 and model.is_moe) or plan.overlap_moe_comm:
        return None
    cand = plan.model_copy(update={"overlap_moe_comm": True, "format": PLAN_FORMAT_V2})
    return None if moe_overlap_errors(cand, "megatron") else cand


def micro_batch_menu(global_batch: int, dp: int, knobs: MegatronKnobs) -> list[int]:
    """``--micro-batch-size`` values b with ``global_batch % (dp b) == 0``, smallest first."""
    return [b for b in sorted(knobs.micro_batch_sizes) if global_batch % (dp * b) == 0]
