"""Modern knobs: the formats-v2 plan dimensions (section 7) chosen on completed, priced plans.

The search builds version-1 plans (pipelines, stages, tp/dp/ep, all-or-nothing recomputation); this pass
takes the few best of them and prices a small set of version-2 variants of each, greedily, one coordinate
at a time, keeping a change only when the plan still fits and is faster (or, for the changes every modern
framework makes by default, no slower):

1. ``fp8`` where the job allows it and every GPU of the plan has an FP8 rate;
2. overlapped gradient reduction (and parameter gather, with ZeRO) when layers are replicated;
3. sequence parallelism on every stage with ``tp > 1`` (same time, less activation memory);
4. per-stage recomputation: the fastest of none / selective / the first k blocks / full that fits; a plan that
   recomputes nothing gets the even split of each run of like stages instead, with the recomputation it needs;
5. context parallelism ``cp`` in {2, 4} for sequences of :data:`LONG_SEQUENCE` tokens or more, replacing
   stage data parallelism (or merging identical pipelines), then recomputation again;
6. micro-batches twice as large (up to twice in a row, while faster), with the sharding or the per-stage
   recomputation that makes them fit;
7. experts: ``etp`` in {1, tp} with ``ep`` over ``dp * cp * tp``, each layout also with its all-to-alls overlapped;
8. interleaved 1F1B, ``virtual_stages`` in {2, 3, 4} where ``micro_batches`` is a multiple of the stages (a
   stage short of ``v`` blocks takes them from the stage with the most);
9. overlapped expert all-to-alls (``overlap_moe_comm``) where a stage has ``ep > 1``, also interleaved and with
   selective recomputation (what Megatron-Core's pairing needs), with the recomputation its memory needs;
10. ZeRO-2/3 when faster (with the recomputation the freed memory allows).

From :data:`CP_FOR_TP_SEQUENCE` tokens, the best starts with ``cp = k`` in place of a ``k``-th of their stages'
tp (no per-layer tp collectives, ``k`` times the parameters per GPU) are starts too, each given every knob above
(:func:`_cp_starts`, with time of its own): the swap changes what the later knobs can do (a plan faster with it
can be slower once interleaved), so it opens a search of its own rather than being one greedy step.

Steps 4 (the even split) and 6 reshape a plan; :func:`modernize` runs them inline (the seeds' knobs), while
:func:`modern_variants` runs the others on every start first and then the reshaping ones, with their own time,
on the best plans and the first starts as the others left them (:func:`_reshaped`).

Each plan gets at most :data:`MAX_ESTIMATES` estimates, within the caller's deadline; every variant
passes the caller's legality predicate and the format's rules (a plan that would not is never returned).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from arachne.cost import CostModel, Estimate
from arachne.errors import InputError
from arachne.plan import PLAN_FORMAT_V2, Pipeline, Plan, Stage, plan_errors
from arachne.plan_rules import uses_v2
from arachne.planners.arachne.completion.plan_edits import (
    cp_for_tp,
    even_split,
    expert_layouts,
    interleavings,
    map_stages,
    recomputes,
    replicated,
    with_cp,
    with_micro_batch_size,
    with_pipelines,
    with_recompute,
)
from arachne.planners.arachne.work_clock import Work
from arachne.planners.protocol import Deadline
from arachne.spec.model import ModelSpec
from arachne.spec.runtimes import Legality

MAX_ESTIMATES = 60
"""Estimates spent on one plan, at most."""
TOP_PLANS = 3
"""The fastest version-1 plans given modern knobs."""
EXTRA_PLANS = 5
"""The next fastest, given them with what the first :data:`TOP_PLANS` leave of the deadline (a plan a few
percent slower as version 1 can interleave where the fastest cannot)."""
LONG_SEQUENCE = 32768
"""Context parallelism is tried from this sequence length on."""
CP_DEGREES = (2, 4)
CP_FOR_TP_SEQUENCE = 4096
"""Context parallelism in place of tensor parallelism is tried from this sequence length on."""
CP_FOR_TP_DEGREES = (2, 4, 8)
CP_RANK_TOKENS = 1024
"""Tokens of each sequence a cp rank keeps, at least, for that swap."""
RESHAPE_PLANS = 3
"""The best plans after the knobs that the reshaping knobs (even split, larger micro-batches) then take."""
MBS_DOUBLINGS = 2
"""Times the micro-batch size is doubled, while each doubling is faster."""
RECOMPUTE_REPAIRS = 2
"""Re-pricings of a per-stage recomputation choice whose estimated partial memory was a little short."""

Priced = tuple[Plan, Estimate]
Check = Callable[[Plan], bool]


# ---- the search ----------------------------------------------------------------------------------------
@dataclass
class Knobs:
    """One plan's greedy search: the best fitting plan so far and what is left to spend."""

    cm: CostModel
    model: ModelSpec
    ok: Check
    best: Priced
    left: int = MAX_ESTIMATES
    deadline: Deadline | None = None
    work: Work | None = None  # the planner's tally: variants priced and their stages (the work clock)
    reshape: bool = True  # the knobs that move layers or resize micro-batches

    def spent(self) -> bool:
        return self.left <= 0 or (self.deadline is not None and self.deadline.expired())

    def price(self, plan: Plan) -> Estimate | None:
        """The estimate of ``plan`` (None when the budget is spent or the plan is not allowed)."""
        if self.spent() or not self.ok(plan):
            return None
        self.left -= 1
        if self.work is not None:
            self.work.knob_plans += 1
            self.work.knob_stages += sum(len(p.stages) for p in plan.pipelines)
        try:
            return self.cm.estimate(plan, validate=False)
        except (InputError, ValueError):  # a feature this cost model refuses: not a candidate
            return None

    def offer(self, plan: Plan, est: Estimate | None = None, ties: bool = False) -> bool:
        """Keep ``plan`` when it fits and is faster than the best (``ties``: or as fast)."""
        est = est if est is not None else self.price(plan)
        if est is None or not est.fits:
            return False
        t, bar = est.iteration_time_s, self.best[1].iteration_time_s
        if t < bar * (1 - 1e-9) or (ties and t <= bar):
            self.best = (plan, est)
            return True
        return False

    # -- the coordinates, in the order they are tried
    def fp8(self) -> None:
        plan = self.best[0]
        devs = self.cm.cluster.devices
        if plan.precision != "fp8" and all(devs[d].gpu.fp8_tflops is not None for d in plan.devices):
            cand = plan.model_copy(update={"precision": "fp8", "format": PLAN_FORMAT_V2})
            est = self.price(cand)
            if est is not None and not self.offer(cand, est) and (not est.fits or recomputes(cand)):
                self.relax(cand, est)  # fp8 activations are smaller: less recomputation may fit

    def overlap(self) -> None:
        plan = self.best[0]
        if replicated(plan) and not plan.overlap_grad_reduce:
            upd = {"overlap_grad_reduce": True, "overlap_param_gather": plan.zero_stage >= 1}
            self.offer(with_pipelines(plan, plan.pipelines, **upd), ties=True)

    def sequence_parallel(self) -> None:
        plan = self.best[0]
        if any(st.tp > 1 and not st.sequence_parallel for p in plan.pipelines for st in p.stages):
            self.offer(map_stages(plan, lambda _a, _b, _p, st: st.model_copy(update={"sequence_parallel": True})
                                  if st.tp > 1 and not st.sequence_parallel else st), ties=True)

    def recompute(self) -> None:
        plan, est = self.best
        if recomputes(plan):
            self.relax(plan, est)
        elif self.reshape:
            self.even()

    def even(self) -> None:
        """A plan that recomputes nothing: the even split of its like stages, with what makes it fit."""
        plan = self.best[0]
        if recomputes(plan):
            return
        cand = even_split(plan, self.cm.cluster)
        e = self.price(cand) if cand is not None else None
        if e is not None and not self.offer(cand, e):
            self.fit_if_faster(cand, e)

    def context_parallel(self) -> None:
        if self.best[0].sequence_length < LONG_SEQUENCE:
            return
        for c in CP_DEGREES:
            cand = with_cp(self.best[0], c)
            est = self.price(cand) if cand is not None else None
            if est is None:
                continue
            if not self.offer(cand, est) and est.fits and not recomputes(cand):
                continue
            self.relax(cand, est)  # less activation memory per GPU: less recomputation

    def batch(self) -> None:
        """Larger micro-batches (twice, then twice again while that is faster), with the recomputation or the
        sharding that makes them fit: the completion recomputes only where nothing fits without it, so a
        larger micro-batch that fits by recomputing some stages is priced here."""
        for _ in range(MBS_DOUBLINGS):
            cand = with_micro_batch_size(self.best[0], 2)
            est = self.price(cand) if cand is not None else None
            if est is None:
                return
            before = self.best
            if not self.offer(cand, est):
                self.fit_if_faster(cand, est)
            if self.best is before:
                return

    def interleave(self) -> None:
        for cand in interleavings(self.best[0]):
            est = self.price(cand)
            if est is not None and not self.offer(cand, est) and not est.fits:
                self.make_fit(cand, est)

    def fit_if_faster(self, plan: Plan, est: Estimate) -> None:
        """:meth:`make_fit` for a variant short of memory whose estimate as it is beats the best: sharding and
        recomputation only add time, so a variant no faster before them is not priced with them."""
        if not est.fits and est.iteration_time_s < self.best[1].iteration_time_s:
            self.make_fit(plan, est)

    def make_fit(self, plan: Plan, est: Estimate) -> None:
        """A variant short of memory: first with its gradients sharded too (ZeRO-2: the same traffic as the
        distributed optimizer's reduce-scatter and gather), kept where that alone makes it fit; else with the
        recomputation that makes it fit. A recomputing ZeRO-2 variant is not taken here: it would keep the ZeRO
        knob from trying ZeRO-2 on the plan without the variant's change (decision 0024)."""
        if replicated(plan) and plan.zero_stage < 2:
            z2 = with_pipelines(plan, plan.pipelines, zero_stage=2, overlap_param_gather=plan.overlap_grad_reduce,
                                 format=PLAN_FORMAT_V2)
            e2 = self.price(z2)
            if e2 is not None and e2.fits:
                self.offer(z2, e2)
                return
        self.relax(plan, est)

    def experts(self) -> None:
        if not self.model.is_moe:
            return
        plan = self.best[0]
        moe = {(pi, si): expert_layouts(st, self.model) for pi, p in enumerate(plan.pipelines)
               for si, st in enumerate(p.stages) if any(self.model.moe_layers[a:b] for a, b in st.ranges)}
        for i in range(max(map(len, moe.values()), default=0)):
            def pick(pi: int, si: int, _p: Pipeline, st: Stage, i: int = i) -> Stage:
                opts = moe.get((pi, si), [])
                if i >= len(opts):
                    return st
                ep, etp = opts[i]
                return st.model_copy(update={"ep": ep, "etp": etp})

            cand = map_stages(plan, pick)
            est = self.price(cand)
            if est is not None and not self.offer(cand, est) and not est.fits:
                self.make_fit(cand, est)  # fewer GPUs per expert: more expert memory (ZeRO-2 first)
            if not cand.overlap_moe_comm and any(st.ep > 1 for p in cand.pipelines for st in p.stages):
                # each layout also with its all-to-alls overlapped: the overlap can decide between layouts
                self.offer(with_pipelines(cand, cand.pipelines, overlap_moe_comm=True, format=PLAN_FORMAT_V2))

    def moe_overlap(self) -> None:
        """``overlap_moe_comm`` on a plan with expert parallelism: as it is, interleaved (Megatron-Core pairs
        micro-batches only in an interleaved pipeline) and with selective instead of full recomputation (the
        pairing refuses full); the pairing holds one more forward's activations, so a variant that no longer
        fits gets the recomputation that makes it fit."""
        plan = self.best[0]
        if not self.model.is_moe or plan.overlap_moe_comm or all(st.ep == 1 for p in plan.pipelines for st in p.stages):
            return
        on = with_pipelines(plan, plan.pipelines, overlap_moe_comm=True, format=PLAN_FORMAT_V2)
        cands = [on]
        if recomputes(on):
            cands.append(map_stages(on, lambda _a, _b, _p, st: with_recompute(st, "selective")
                                    if st.recompute is True else st))
        cands += interleavings(on)
        for cand in cands:
            est = self.price(cand)
            if est is not None and not self.offer(cand, est) and not est.fits:
                self.make_fit(cand, est)

    def zero(self) -> None:
        plan = self.best[0]
        if not replicated(plan):
            return
        for z in (1, 2, 3):
            if z <= plan.zero_stage:
                continue
            cand = with_pipelines(plan, plan.pipelines, zero_stage=z, overlap_param_gather=plan.overlap_grad_reduce)
            est = self.price(cand)
            # ZeRO-1 (the distributed optimizer) wherever it is no slower; 2 and 3 only when faster, also with
            # the recomputation their memory savings allow
            if est is not None and not self.offer(cand, est, ties=z == 1) and recomputes(cand):
                self.relax(cand, est)

    # -- per-stage recomputation
    def relax(self, plan: Plan, est: Estimate) -> None:
        """Per stage, the fastest recomputation that fits, from three probes (every stage at none, selective
        and full; the first k blocks interpolated between none and full), priced and offered."""
        probes: dict[str, Estimate] = {}
        kinds = {("selective" if st.recompute == "selective" else "full" if st.recompute else "none")
                 if st.recompute_layers is None else "partial" for p in plan.pipelines for st in p.stages}
        if len(kinds) == 1 and (kind := next(iter(kinds))) != "partial":
            probes[kind] = est
        for kind in ("none", "selective", "full"):
            if kind not in probes:
                cand = map_stages(plan, lambda _a, _b, _p, st, k=kind: with_recompute(st, k))
                e = self.price(cand)
                if e is None:
                    if self.spent():
                        return
                    continue
                probes[kind] = e
                self.offer(cand, e)
        if "none" not in probes or "full" not in probes:
            return
        rows = {kind: {(s.pipeline, s.stage): s for s in e.stages} for kind, e in probes.items()}
        choice: dict[tuple[int, int], tuple[str, int | None]] = {}
        for key, none in rows["none"].items():
            full = rows["full"][key]
            n = plan.pipelines[key[0]].stages[key[1]].num_layers
            choice[key] = _fastest_fit(none, full, rows.get("selective", {}).get(key), n)
        for _ in range(RECOMPUTE_REPAIRS + 1):
            cand = map_stages(plan, lambda pi, si, _p, st: with_recompute(st, *choice[(pi, si)]))
            same = set(choice.values())
            kind, k = next(iter(same))
            # every stage at one probe's setting: that probe's estimate (already offered), not priced again
            e = probes[kind] if len(same) == 1 and k is None and kind in probes else self.price(cand)
            if e is None:
                return
            if e.fits:
                self.offer(cand, e)
                return
            over = [(s.pipeline, s.stage) for s in e.stages if s.memory_bytes > s.capacity_bytes]
            for key in over:  # a partial choice short of memory: a few more blocks recomputed
                kind, k = choice[key]
                n = plan.pipelines[key[0]].stages[key[1]].num_layers
                choice[key] = ("full", None) if kind != "full" or k is None or k + 1 >= n else \
                    ("full", min(n, k + max(1, n // 8)))


def _fastest_fit(none, full, sel, n: int) -> tuple[str, int | None]:
    """One stage's recomputation: the fastest of none, selective, the first k blocks and full whose memory
    (k: interpolated between none and full) fits; full when nothing else does."""
    cap = none.capacity_bytes
    t = {"none": none.fwd_s + none.bwd_s, "full": full.fwd_s + full.bwd_s}
    opts: list[tuple[float, int, str, int | None]] = []
    if none.memory_bytes <= cap:
        opts.append((t["none"], 0, "none", None))
    if sel is not None and sel.memory_bytes <= cap:
        opts.append((sel.fwd_s + sel.bwd_s, 1, "selective", None))
    saved = (none.memory_bytes - full.memory_bytes) / n
    if saved > 0 and n > 1:
        k = max(1, math.ceil((none.memory_bytes - cap) / saved))
        if k < n:
            opts.append((t["none"] + k / n * (t["full"] - t["none"]), 2, "full", k))
    opts.append((t["full"], 3, "full", None))
    _, _, kind, k = min(opts)
    return kind, k


def legal_check(legality: Legality | None, base: Plan, cluster) -> Check:
    """A variant is allowed when it breaks no rule of ``legality`` that ``base`` keeps (the harness mends a
    ZeRO stage or Megatron split ``base`` breaks the same way for both; an interleaved plan it cannot)."""
    if legality is None or legality.free:
        return lambda _p: True
    known = set(legality.errors(base, cluster))

    def ok(p: Plan) -> bool:
        errs = set(legality.errors(p, cluster))
        return not errs or (errs <= known and all(q.virtual_stages == 1 for q in p.pipelines))

    return ok


def modernize(plan: Plan, est: Estimate, cost_model: CostModel, *, legality: Legality | None = None,
              allow_fp8: bool = False, deadline: Deadline | None = None,
              max_estimates: int = MAX_ESTIMATES, work: Work | None = None, reshape: bool = True) -> Priced:
    """The fastest fitting variant of ``plan`` found by the knobs (``plan`` itself when none is faster); a
    variant is never slower than ``plan`` under ``cost_model`` and always valid and within ``legality``.
    ``reshape``: also the knobs that move layers or resize micro-batches (the even split, larger micro-batches)."""
    model = cost_model.resolve_model(plan)
    knobs = Knobs(cost_model, model, legal_check(legality, plan, cost_model.cluster), (plan, est),
                  max_estimates, deadline, work, reshape)
    steps = [knobs.overlap, knobs.sequence_parallel, knobs.recompute, knobs.context_parallel] + \
        ([knobs.batch] if reshape else []) + [knobs.experts, knobs.interleave, knobs.moe_overlap, knobs.zero]
    if recomputes(plan) and replicated(plan):  # short of memory: what ZeRO frees comes first, before the deadline
        steps = [knobs.overlap, knobs.zero] + [s for s in steps if s not in (knobs.overlap, knobs.zero)]
    for step in ([knobs.fp8] if allow_fp8 else []) + steps:
        if knobs.spent():
            break
        step()
    best = knobs.best
    if best[0] is plan or best[1].iteration_time_s > est.iteration_time_s or \
            plan_errors(best[0], cost_model.cluster, model):
        return plan, est
    return best


def modern_variants(results: Iterable[Priced], cost_model: CostModel, *, legality: Legality | None = None,
                    allow_fp8: bool = False, deadline: Deadline | None = None, top: int = TOP_PLANS,
                    max_estimates: int = MAX_ESTIMATES,
                    key: Callable[[Estimate], float] | None = None, work: Work | None = None,
                    extra: int = EXTRA_PLANS, last: bool = True, reshape_s: float | None = None,
                    cp_s: float | None = None) -> list[Priced]:
    """:func:`modernize` on the ``top`` best version-1 plans of ``results`` (by ``key``, lower is better;
    default: iteration time): the faster variants found (the first plan gets half the deadline, the second
    half of the rest, the third the rest); then, while the deadline lasts (the first ``top`` finished early),
    on up to ``extra`` more, each again half of what is left. ``last``: the run's last knobs pass, which also
    prices, before the extras, the plan the overlap lifts most (:func:`_lifted`), and, after every start, the
    knobs that reshape a plan (:func:`_reshaped`, within ``reshape_s`` more on the deadline's clock; None: what
    the deadline leaves); a base pass that a longer target extends keeps to the others, since each estimate there
    shifts the extension (decision 0033). In the last pass, before the reshaping, the first starts with cp in place
    of part of their tp are given the knobs too (:func:`_cp_starts`, within ``cp_s`` more; None: not tried). A
    variant runs on its plan's GPUs, so faster is also cheaper."""
    rank = key or (lambda e: e.iteration_time_s)
    results = list(results)
    # (the search's plans: version 1, with sequence parallelism where tp > 1 by the completion's rule)
    start = sorted((r for r in results if not uses_v2(r[0], sequence_parallel=False)), key=lambda r: rank(r[1]))
    out: list[Priced] = []
    firsts: list[Priced] = []
    i = 0
    while i < min(len(start), top + extra):
        if deadline is not None and deadline.expired():
            break
        if last and i == top > 0:  # before the extras, the plan the overlap lifts most (with the time the first left)
            out += _lifted(start, top, rank, cost_model, legality, deadline, work)
        plan, est = start[i]
        final = i == min(top, len(start)) - 1 or i == min(len(start), top + extra) - 1
        sub = deadline.child(deadline.remaining / (1 if final else 2)) if deadline is not None else None
        better = modernize(plan, est, cost_model, legality=legality, allow_fp8=allow_fp8, deadline=sub,
                           max_estimates=max_estimates, work=work, reshape=False)
        if better[0] is not plan:
            out.append(better)
        if i < top:
            firsts.append(better)
        i += 1
    if last and cp_s is not None:
        out += _cp_starts(start, top, cost_model, legality, allow_fp8, deadline if deadline is None else
                          Deadline(cp_s, deadline.clock, deadline.cap), max_estimates, work)
    if last:  # the best plans now and the first starts as the knobs left them, each once (the search, the seeds
        # and the knobs often return one plan as several objects; two plans can share a price)
        pick: list[Priced] = []
        for r in sorted(out + results, key=lambda r: rank(r[1])):
            if len(pick) == RESHAPE_PLANS:
                break
            if all(r[0] != p for p, _ in pick):
                pick.append(r)
        pick += [r for i, r in enumerate(firsts) if all(r[0] != p for p, _ in pick + firsts[:i])]
        after = deadline if deadline is None or reshape_s is None else Deadline(reshape_s, deadline.clock, deadline.cap)
        out += _reshaped(pick, cost_model, legality, after, max_estimates, work)
    return out


def _reshaped(best: list[Priced], cost_model: CostModel, legality: Legality | None, deadline: Deadline | None,
              max_estimates: int, work: Work | None) -> list[Priced]:
    """The reshaping knobs (the even split, larger micro-batches; each with what makes it fit) on ``best``, the
    ``j``-th plan with a share of ``deadline`` weighted ``1 / (j + 1)`` (what one leaves goes to the following
    ones; decision 0035): the faster variants found. They run after the other knobs, on
    the plans those made the best, so that the others' time and order stay as they were (decision 0033)."""
    out = []
    weights = [1.0 / (j + 1) for j in range(len(best))]
    for j, (plan, est) in enumerate(best):
        if deadline is not None and deadline.expired():
            break
        sub = deadline.child(deadline.remaining * weights[j] / sum(weights[j:])) if deadline is not None else None
        model = cost_model.resolve_model(plan)
        knobs = Knobs(cost_model, model, legal_check(legality, plan, cost_model.cluster), (plan, est), max_estimates,
                      sub, work)
        knobs.even()
        knobs.batch()
        if knobs.best[0] is not plan and not plan_errors(knobs.best[0], cost_model.cluster, model):
            out.append(knobs.best)
    return out


def _cp_starts(start: list[Priced], top: int, cost_model: CostModel, legality: Legality | None, allow_fp8: bool,
               deadline: Deadline | None, max_estimates: int, work: Work | None) -> list[Priced]:
    """Of the first ``top`` starts with a stage of tp > 1, each variant with cp in place of part of its tp
    (:func:`cp_for_tp`, every degree :data:`CP_FOR_TP_DEGREES` from :data:`CP_FOR_TP_SEQUENCE` tokens with
    :data:`CP_RANK_TOKENS` per rank) that fits or is made to fit (:meth:`Knobs.make_fit`), then :func:`modernize`
    on it: each an equal share of what ``deadline`` has left, the starts in order and each start's degrees from
    the fastest as priced."""
    seq = start[0][0].sequence_length if start else 0
    firsts = [r for r in start[:top] if any(st.tp > 1 for p in r[0].pipelines for st in p.stages)]
    if not firsts or seq < CP_FOR_TP_SEQUENCE:
        return []
    degrees = [k for k in CP_FOR_TP_DEGREES if seq // k >= CP_RANK_TOKENS]
    out = []
    for j, (plan, est) in enumerate(firsts):
        if deadline is not None and deadline.expired():
            break
        share = deadline.child(deadline.remaining / (len(firsts) - j)) if deadline is not None else None
        model = cost_model.resolve_model(plan)
        ok = legal_check(legality, plan, cost_model.cluster)
        swaps: list[Priced] = []
        for k in degrees:
            knobs = Knobs(cost_model, model, ok, (plan, est), max_estimates, share, work, reshape=False)
            cand = cp_for_tp(plan, k)
            e = knobs.price(cand) if cand is not None else None
            if e is None:
                continue
            if not e.fits:  # made to fit, compared only with its own variants (the sharding or recomputation)
                knobs.best = (plan, replace(est, iteration_time_s=math.inf))  # any fitting variant is kept
                knobs.make_fit(cand, e)
                cand, e = knobs.best
            if cand is not plan:
                swaps.append((cand, e))
        swaps.sort(key=lambda r: r[1].iteration_time_s)
        for i, (cand, e) in enumerate(swaps):
            if share is not None and share.expired():
                break
            sub = share.child(share.remaining / (len(swaps) - i)) if share is not None else None
            out.append(modernize(cand, e, cost_model, legality=legality, allow_fp8=allow_fp8, deadline=sub,
                                 max_estimates=max_estimates, work=work, reshape=False))
    return out


def _lifted(start: list[Priced], top: int, rank: Callable[[Estimate], float], cost_model: CostModel,
            legality: Legality | None, deadline: Deadline | None, work: Work | None) -> list[Priced]:
    """Of ``start[top:]``, the plan that would be the fastest with its gradient sync hidden (a bound: the overlap
    hides at most all of it), overlapped (one estimate), where that bound beats the ``top``-th plan and the
    overlapped plan is faster than the plan as it was. Version-1 plans leave the sync exposed, so a one-stage
    data-parallel plan that the overlap makes the fastest ranks low without it (seed35-rerun/rob-007: Megatron's
    tp 4 x dp 8 on 32 H20). Only this knob, and the extras keep their order (decision 0026)."""
    def hidden(r: Priced) -> float:
        return rank(r[1]) * (1 - r[1].breakdown.get("dp_sync_s", 0.0) / r[1].iteration_time_s)

    lift = min(start[top:], key=hidden, default=None)
    if lift is None or hidden(lift) >= rank(start[top - 1][1]):
        return []
    knobs = Knobs(cost_model, cost_model.resolve_model(lift[0]), legal_check(legality, lift[0], cost_model.cluster),
                  lift, 1, deadline, work)
    knobs.overlap()
    return [] if knobs.best is lift else [knobs.best]


MODERN_SHARE = 0.1
"""The knobs' work, as a share of the planner's target, on the planner's clock (beyond the target)."""
RESHAPE_SHARE = 0.025
"""The reshaping knobs' work after the others (:func:`_reshaped`), as a share of the target, beyond theirs."""
CP_SHARE = 0.15
"""The starts with cp in place of part of their tp (:func:`_cp_starts`), as a share of the target, beyond the
knobs' (spent only from :data:`CP_FOR_TP_SEQUENCE` tokens, on plans with tp > 1)."""


def fp8_allowed(job) -> bool:
    """Whether the job lets a plan run FP8 GEMMs: only when it asked for precision ``fp8`` (``Job.fp8``)."""
    return bool(getattr(job, "fp8", False))


def modern_pass(results: Iterable[Priced], cost_model: CostModel, job, legality: Legality | None,
                clock: Callable[[], float], target_s: float, cap: Deadline | None = None,
                key: Callable[[Estimate], float] | None = None, work: Work | None = None,
                last: bool = True) -> list[Priced]:
    """The planner's hook: :func:`modern_variants` for :data:`MODERN_SHARE` of ``target_s`` on ``clock`` (the
    planner's work clock), and never past ``cap`` (the caller's budget on the wall clock); ``key``: the
    planner's score; ``work``: the planner's tally (``knob_plans``, ``knob_stages``); ``last``: the run's last
    knobs pass."""
    deadline = Deadline(MODERN_SHARE * target_s, clock, cap)
    return modern_variants(results, cost_model, legality=legality, allow_fp8=fp8_allowed(job), deadline=deadline,
                           key=key, work=work, last=last, reshape_s=RESHAPE_SHARE * target_s,
                           cp_s=CP_SHARE * target_s)
