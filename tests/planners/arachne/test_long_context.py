"""Context-parallel seeds (long_context.py): proxy-job plans rewritten to cp plans of the real job."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arachne.cost import CostModel
from arachne.plan import plan_errors, validate_plan
from arachne.planners.arachne import long_context as lc
from arachne.planners.arachne import seeds
from arachne.planners.arachne.context import PlanningContext
from arachne.planners.arachne.planner import ArachnePlanner
from arachne.planners.arachne.template import Group, Slot, Template
from arachne.planners.protocol import Deadline, SearchBudget
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.job import Job
from arachne.spec.model import model_catalog

H100_32 = {"name": "h100-32", "nodes": [{"name": "h-{i}", "count": 4, "gpu": "H100", "gpus_per_node": 8,
                                         "inter_node_gbps": 50.0}]}


def ctx_for(model: str, seq: int, doc=H100_32) -> PlanningContext:
    cl = cluster_from_dict(doc)
    return PlanningContext(cl, model_catalog().get(model), Job(global_batch_size=2**22 // seq, sequence_length=seq),
                           CostModel(cl))


def proxy_plans(ctx: PlanningContext, c: int, tp: int, stages: int, mbs: int):
    """Plans of the proxy job for a uniform template (every pipeline ``stages`` x ``tp``), as the seeds build them."""
    pctx = lc.proxy_context(ctx, c)
    (cls,) = pctx.classes
    tpl = Template((Group((Slot(cls.index, tp),) * stages, cls.count // (tp * stages)),))
    return pctx, seeds.complete_seed(tpl, pctx, mbs, lambda _p: True)


def test_proxy_job_keeps_the_tokens_and_sizes_with_sequence_parallelism():
    ctx = ctx_for("Llama-3.1-8B", 32768)
    p = lc.proxy_context(ctx, 4)
    assert p.job.sequence_length * p.job.global_batch_size == ctx.job.sequence_length * ctx.job.global_batch_size
    assert p.job.sequence_length == 8192 and p.sequence_parallel and p.work is ctx.work
    assert lc.proxy_context(ctx_for("Llama-3.1-8B", 32768 + 2), 4) is None  # no load-balanced halves


@pytest.mark.parametrize("c,tp,stages,mbs", [(2, 4, 2, 1), (2, 8, 1, 2), (4, 2, 2, 4), (8, 2, 2, 8)])
def test_cp_from_proxy_same_devices_tokens_and_tokens_per_gpu(c, tp, stages, mbs):
    ctx = ctx_for("Llama-3.1-8B", 65536)
    pctx, priced = proxy_plans(ctx, c, tp, stages, mbs)
    seq, gbs = ctx.job.sequence_length, ctx.job.global_batch_size
    converted = 0
    for proxy, proxy_est in priced:
        plan = lc.cp_from_proxy(proxy, c, seq, gbs)
        if plan is None:
            continue
        converted += 1
        assert not plan_errors(plan, ctx.cluster, ctx.model)
        validate_plan(plan, ctx.cluster, ctx.model)
        assert sorted(plan.devices) == sorted(proxy.devices)
        assert plan.sequence_length == seq and plan.global_batch_size == gbs
        assert all(s.cp == c for p in plan.pipelines for s in p.stages)
        # tokens per GPU per micro-batch are the proxy's: a cp rank holds 1/c of each sequence
        per_gpu = {(plan.mbs(p) / s.dp_size) * seq / c for p in plan.pipelines for s in p.stages}
        proxy_per_gpu = {(proxy.mbs(p) / s.dp_size) * pctx.job.sequence_length
                         for p in proxy.pipelines for s in p.stages}
        assert per_gpu == proxy_per_gpu
        # priced as the real job: each rank's share of attention over the whole sequence is c times the
        # proxy's attention over a sequence c times shorter
        assert ctx.cost_model.estimate(plan).iteration_time_s > proxy_est.iteration_time_s
    assert converted


@settings(max_examples=25, deadline=None)
@given(c=st.sampled_from([2, 4, 8]), pipes=st.integers(1, 4), dp=st.sampled_from([1, 2, 4]))
def test_cp_from_proxy_converts_exactly_or_refuses(c, pipes, dp):
    """Property: a conversion keeps the global batch and every device, or there is none."""
    ctx = ctx_for("Llama-3.1-8B", 65536)
    pctx = lc.proxy_context(ctx, c)
    (cls,) = pctx.classes
    if pipes * dp > cls.count:
        return
    tpl = Template((Group((Slot(cls.index, 1, dp=dp),), pipes),))
    for proxy, _ in seeds.complete_seed(tpl, pctx, 8 * dp, lambda _p: True):
        plan = lc.cp_from_proxy(proxy, c, ctx.job.sequence_length, ctx.job.global_batch_size)
        if plan is None:
            continue
        assert sum(p.micro_batches * plan.mbs(p) for p in plan.pipelines) == ctx.job.global_batch_size
        assert sorted(plan.devices) == sorted(proxy.devices)
        assert not plan_errors(plan, ctx.cluster, ctx.model)


def test_cp_seeds_fit_where_no_plan_without_cp_does():
    """70B at 64k tokens on 32 H100: no seed without cp fits; the cp seeds find fitting plans (Megatron's grid
    with cp does too)."""
    ctx = ctx_for("Llama-3.1-70B", 65536)
    assert not seeds.seed_plans(ctx, Deadline(30))
    found = lc.cp_seed_plans(ctx, Deadline(30), None, lambda _p: True, None, None)
    assert found and all(e.fits for _, e in found)
    assert all(max(s.cp for p in plan.pipelines for s in p.stages) > 1 for plan, _ in found)


@pytest.mark.slow
def test_the_planner_plans_long_sequences_with_cp():
    ctx = ctx_for("Llama-3.1-70B", 65536)
    res = ArachnePlanner().plan(ctx.cluster, ctx.model, ctx.job, ctx.cost_model, SearchBudget(time_budget_s=20))
    assert res.plans
    plan = res.plans[0]
    validate_plan(plan, ctx.cluster, ctx.model)
    assert max(s.cp for p in plan.pipelines for s in p.stages) > 1


def test_mixed_template_spans_every_type_in_proportion():
    doc = {"name": "h100-a100-32", "nodes": [
        {"name": "h-{i}", "count": 2, "gpu": "H100", "gpus_per_node": 8, "inter_node_gbps": 50.0},
        {"name": "a-{i}", "count": 2, "gpu": "A100-80", "gpus_per_node": 8, "inter_node_gbps": 25.0}]}
    ctx = ctx_for("Llama-3.1-70B", 65536, doc)
    every = seeds.class_subsets(ctx)[0]
    tpl = seeds.mixed_template(ctx, every, 4, 4)
    (g,) = tpl.groups
    h100, a100 = (c.gpu.name for c in ctx.classes)
    assert g.replicas == 2 and [ctx.classes[s.cls].gpu.name for s in g.slots] == [h100, h100, a100, a100]
    assert seeds.mixed_template(ctx, every[:1], 4, 4) is None  # one type: the uniform template is that
    # no cp seed of per-type pipelines fits 70B at 64k on 16 GPUs of a type; the pipelines over both types do
    found = lc.cp_seed_plans(ctx, Deadline(60), None, lambda _p: True, None, None)
    assert found and all(e.fits for _, e in found)
    assert all({ctx.cluster.devices[d].gpu.name for s in p.pipelines[0].stages for d in s.devices}
               == {h100, a100} for p, _ in found)


def test_a_cp_depth_that_fits_only_recomputing_is_followed_by_one_deeper_at_once(monkeypatch):
    """8B at 64k on 32 H100: one stage at tp 1 and cp 8 fits only with full recomputation; the two-stage form
    fits without (Megatron's grid runs pp 2 x cp 8 there) and is priced next."""
    ctx = ctx_for("Llama-3.1-8B", 65536)
    tried: list[tuple[int, int, int]] = []
    real = seeds.lockstep_template

    def spy(pctx, subset, tp, S, *rest):
        tried.append((ctx.job.sequence_length // pctx.job.sequence_length, tp, S))
        return real(pctx, subset, tp, S, *rest)

    monkeypatch.setattr(seeds, "lockstep_template", spy)
    found = lc.cp_seed_plans(ctx, Deadline(30), None, lambda _p: True, None, None)
    shapes = {(len(p.stages), max(s.tp for s in p.stages), max(s.cp for s in p.stages),
               any(s.recompute for s in p.stages)) for plan, _ in found for p in plan.pipelines}
    assert (1, 1, 8, True) in shapes and (2, 1, 8, False) in shapes
    at8 = [(tp, S) for c, tp, S in tried if c == 8]
    assert at8[at8.index((1, 1)) + 1] == (1, 2)


@pytest.mark.slow
def test_the_seed_just_behind_the_fastest_gets_the_knobs_too():
    """8B at 64k on 32 H100: the fastest seed priced first is one stage (tp 2, cp 4); the next, two stages at cp
    8, is faster once the knobs interleave it (157,431 tokens/s at 1d2558b), which they do only if it is given
    them. Since the seeds try only micro-batch sizes that fit, a one-stage cp 8 seed (163,441) is found too: the
    plan returned is at least the interleaved one, and uses cp 8."""
    ctx = ctx_for("Llama-3.1-8B", 65536)
    res = ArachnePlanner().plan(ctx.cluster, ctx.model, ctx.job, ctx.cost_model, SearchBudget(time_budget_s=20))
    plan = res.plans[0]
    validate_plan(plan, ctx.cluster, ctx.model)
    assert ctx.cost_model.estimate(plan).tokens_per_s >= 157_000
    assert max(s.cp for p in plan.pipelines for s in p.stages) == 8
