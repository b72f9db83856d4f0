"""The arachne planner end to end: search modes, the oracle bound, budgets and targets."""

from __future__ import annotations

import pytest
from planner_cases import ctx_for, h100_h800_t4_cluster, small_cluster

from arachne.cost import CostModel
from arachne.plan import validate_plan
from arachne.planners.arachne.actions import Action, State
from arachne.planners.arachne.context import PlanningContext
from arachne.planners.harness import run_planner
from arachne.planners.protocol import SearchBudget
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.job import Job
from arachne.spec.model import model_catalog


@pytest.mark.parametrize("mode", ["policy", "teacher", "floor", "random"])
def test_every_mode_returns_valid_fitting_plans(mode):
    cl = small_cluster()
    model = model_catalog().get("GPT-3-1.3B")
    plan, est, res = run_planner("arachne", cl, model, Job(global_batch_size=64, sequence_length=2048),
                                 budget=SearchBudget(time_budget_s=30), mode=mode)
    validate_plan(plan, cl, model)
    assert est.fits and est.tokens_per_s > 0
    assert plan.planner == "arachne" and plan.estimate["fits"]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["OPT-350M", "GPT-3-1.3B"])
def test_exhaustive_oracle_bounds_arachne_and_arachne_is_close(model):
    cl = small_cluster()
    spec = model_catalog().get(model)
    job = Job(global_batch_size=64, sequence_length=2048)
    # the version-1 template space: both without the version-2 knobs
    _, ea, _ = run_planner("arachne", cl, spec, job, budget=SearchBudget(time_budget_s=30), modern_knobs=False)
    _, eo, _ = run_planner("exhaustive", cl, spec, job, budget=SearchBudget(time_budget_s=120), modern_knobs=False)
    assert eo.tokens_per_s >= ea.tokens_per_s * (1 - 1e-9) or ea.tokens_per_s / eo.tokens_per_s < 1.01
    assert ea.tokens_per_s >= 0.95 * eo.tokens_per_s
    # and with the knobs on both sides (the oracle gives them to more of its plans, with more estimates)
    _, ek, _ = run_planner("arachne", cl, spec, job, budget=SearchBudget(time_budget_s=30))
    _, eok, _ = run_planner("exhaustive", cl, spec, job, budget=SearchBudget(time_budget_s=120))
    assert eok.tokens_per_s >= eo.tokens_per_s * (1 - 1e-9)
    assert ek.tokens_per_s >= 0.95 * eok.tokens_per_s


@pytest.mark.slow
def test_moe_plans_use_expert_parallelism():
    cl = cluster_from_dict({"nodes": [{"name": "h{i}", "count": 2, "gpu": "H100"}]})
    model = model_catalog().get("Mixtral-8x7B")
    plan, est, _ = run_planner("arachne", cl, model, Job(global_batch_size=64, sequence_length=2048),
                               budget=SearchBudget(time_budget_s=30))
    assert est.fits
    assert any(s.ep > 1 for p in plan.pipelines for s in p.stages)


def test_tiny_budget_still_returns_a_plan_and_infeasible_says_so():
    from arachne.errors import NoFeasiblePlanError

    cl = small_cluster()
    plan, est, _ = run_planner("arachne", cl, model_catalog().get("GPT-3-1.3B"),
                               Job(global_batch_size=64, sequence_length=2048), budget=SearchBudget(time_budget_s=0.01))
    validate_plan(plan, cl, model_catalog().get("GPT-3-1.3B"))  # raises on a broken plan
    assert est.fits
    with pytest.raises(NoFeasiblePlanError, match="no plan fits"):  # LLaMA-2-70B cannot fit in 8 GPUs of 16-40 GB
        run_planner("arachne", cl, model_catalog().get("LLaMA-2-70B"), Job(global_batch_size=64, sequence_length=2048),
                    budget=SearchBudget(time_budget_s=0.5))


@pytest.mark.slow
def test_a_longer_target_extends_the_default_pass_and_never_loses():
    """Beyond the default target the planner runs the default pass first, then keeps improving on it."""
    cl = cluster_from_dict({"name": "m", "nodes": [
        {"name": "h{i}", "count": 2, "gpu": "H100", "gpus_per_node": 8},
        {"name": "a{i}", "count": 3, "gpu": "A100-40", "gpus_per_node": 8},
        {"name": "t{i}", "count": 8, "gpu": "T4", "gpus_per_node": 4}]})
    m, job = model_catalog().get("LLaMA-2-13B"), Job(global_batch_size=256, sequence_length=2048)
    _, short, r1 = run_planner("arachne", cl, m, job, CostModel(cl), SearchBudget(time_budget_s=10), target_s=0.8)
    plan, long_, r2 = run_planner("arachne", cl, m, job, CostModel(cl), SearchBudget(time_budget_s=10), target_s=2.0)
    assert "extended_s" not in r1.stats.notes and "extended_s" in r2.stats.notes
    assert long_.tokens_per_s >= short.tokens_per_s * (1 - 1e-9)
    validate_plan(plan, cl)
    assert long_.fits


@pytest.mark.slow
def test_on_a_crawling_inter_node_network_the_job_stays_in_one_node():
    """Data parallelism over 10 Gb/s links loses to one node's worth of GPUs: arachne must see that (a pipeline
    may still cross the link: its stages send only activations)."""
    cl = cluster_from_dict({"name": "slow", "nodes": [
        {"name": "b{i}", "count": 4, "gpu": "B200", "gpus_per_node": 8, "inter_node_gbps": 1.25}]})
    m, job = model_catalog().get("Qwen2-57B-A14B"), Job(global_batch_size=256, sequence_length=1024)
    ctx = PlanningContext(cl, m, job, CostModel(cl))
    from arachne.planners.arachne.search.pricer import Pricer

    in_node = Pricer(ctx).price_state(State(0, (Action("own", 4, 1, 1, 2, 1),)))
    # a 2 s target: the default pass, then more; keeps a slow CI machine from deciding the outcome
    plan, est, _ = run_planner("arachne", cl, m, job, CostModel(cl), SearchBudget(time_budget_s=10), target_s=2.0)
    assert in_node > 0 and est.tokens_per_s >= 0.99 * in_node
    assert all(len({d.split(":")[0] for d in s.devices}) == 1 for p in plan.pipelines for s in p.stages)
    assert len(plan.pipelines) == 1  # no replica across the link either


@pytest.mark.slow
def test_the_planner_beats_sailors_pipeline_on_the_h100_h800_t4_cluster():
    """odd108/rob-001: Sailor's one-GPU-stage pipeline (212,397 tokens/s under the cost model of 2026-12-02, when
    arachne needed a widened head stage to pass it) against arachne's plan, both priced by today's model (since
    the MoE layer's measured traffic one stage of dp 16 x ep 4 wins by about 2x)."""
    ctx = ctx_for("DeepSeek-MoE-16B", gbs=128, seq=512, cluster=h100_h800_t4_cluster())
    _, est, _ = run_planner("arachne", ctx.cluster, ctx.model, ctx.job, ctx.cost_model)
    _, sailor, _ = run_planner("sailor", ctx.cluster, ctx.model, ctx.job, ctx.cost_model)
    assert est.tokens_per_s >= sailor.tokens_per_s
