"""The objective (issue 27 item 4): cost per token, hard limits, prices from the cluster or the catalog."""

from __future__ import annotations

from pathlib import Path

import pytest

from arachne.cost import CostModel
from arachne.errors import InputError, NoFeasiblePlanError
from arachne.planners.harness import run_planner, select
from arachne.planners.objective import Objective, usd_per_million_tokens
from arachne.planners.protocol import SearchBudget
from arachne.spec.cluster import cluster_from_dict, load_cluster
from arachne.spec.gpus import gpu_catalog
from arachne.spec.job import Job
from arachne.spec.model import load_model

ROOT = Path(__file__).resolve().parents[2]
SMALL = load_cluster(ROOT / "examples" / "clusters" / "small-mixed.yaml")
JOB = Job(global_batch_size=32, sequence_length=1024)
MODEL = load_model("OPT-350M")


def _plans(cm: CostModel) -> list:
    _, _, res = run_planner("arachne", SMALL, MODEL, JOB, cm, SearchBudget(time_budget_s=5.0, top_k=16))
    return res.plans


def test_catalog_prices_carry_a_source_and_a_date():
    priced = [g for g in gpu_catalog().gpus if g.price_per_gpu_hour is not None]
    assert len(priced) >= 9
    for g in priced:
        assert g.price_source and len(g.price_date) == 10 and g.price_per_gpu_hour > 0
    # the cluster takes the catalog's default where it gives none, its own price where it does
    assert {n.price_per_gpu_hour for n in SMALL.nodes} == {2.7447, 3.06}
    doc = {"name": "x", "nodes": [{"name": "a", "gpu": "A100-40", "gpus_per_node": 4, "price_per_gpu_hour": 1.0}]}
    assert cluster_from_dict(doc, "x").nodes[0].price_per_gpu_hour == 1.0


@pytest.mark.slow
def test_cost_per_token_is_what_the_objective_minimises():
    cm = CostModel(SMALL)
    plans = _plans(cm)
    ests = [e for e in (cm.estimate(p) for p in plans) if e.fits]
    best, _ = select(plans, cm, objective=Objective("cost"))
    assert best is not None
    assert usd_per_million_tokens(best[1]) == pytest.approx(min(usd_per_million_tokens(e) for e in ests))
    fastest, _ = select(plans, cm)
    assert fastest[1].tokens_per_s == pytest.approx(max(e.tokens_per_s for e in ests))
    e = best[1]
    assert usd_per_million_tokens(e) == pytest.approx(e.cost_per_hour / (e.tokens_per_s * 3600) * 1e6)
    doc = e.to_doc(details=False)
    assert doc["cost_per_hour"] == pytest.approx(e.cost_per_hour)
    assert doc["cost_per_million_tokens"] == pytest.approx(usd_per_million_tokens(e))


def test_limits_are_hard_and_say_which():
    cm = CostModel(SMALL)
    plans = _plans(cm)
    fastest, _ = select(plans, cm)
    cap = 0.99 * fastest[1].cost_per_hour
    within, _ = select(plans, cm, objective=Objective(max_cost_per_hour=cap))
    assert within is None or within[1].cost_per_hour <= cap
    none, why = select(plans, cm, objective=Objective(min_tokens_per_s=1e12))
    assert none is None and "--min-tokens-per-s" in why
    with pytest.raises(NoFeasiblePlanError, match="--max-cost-per-hour"):
        run_planner("megatron", SMALL, MODEL, JOB, CostModel(SMALL), SearchBudget(time_budget_s=2.0),
                    objective=Objective(max_cost_per_hour=0.01))


@pytest.mark.slow
def test_a_cost_optimal_plan_may_leave_gpus_idle_and_is_never_dearer_than_the_fastest():
    p, e, _ = run_planner("arachne", SMALL, MODEL, JOB, CostModel(SMALL), SearchBudget(time_budget_s=10.0),
                          objective=Objective("cost"))
    _, fast, _ = run_planner("arachne", SMALL, MODEL, JOB, CostModel(SMALL), SearchBudget(time_budget_s=10.0))
    assert usd_per_million_tokens(e) <= usd_per_million_tokens(fast) * 1.0001
    assert len(p.devices) <= SMALL.num_gpus


def test_no_price_refuses_naming_the_gpu_type():
    rtx = load_cluster(ROOT / "examples" / "clusters" / "rtx-lab.yaml")
    with pytest.raises(InputError) as info:
        Objective("cost").check_prices(rtx)
    assert info.value.field == "--objective" and "RTX" in info.value.reason
    Objective().check_prices(rtx)  # throughput needs no price
    with pytest.raises(InputError):
        Objective(max_cost_per_hour=-1.0)
    with pytest.raises(InputError):
        Objective("speed")  # type: ignore[arg-type]


def test_legal_variants_fix_the_zero_stage_and_megatron_split():
    from arachne.plan import plan_from_dict
    from arachne.planners.harness import legal_variants
    from arachne.spec.runtimes import Legality, megatron_split_error

    stage = lambda a, b, d: {"layers": [a, b], "devices": [d], "tp": 1}  # noqa: E731
    plan = plan_from_dict({"format": "arachne-plan/1", "model": "OPT-350M", "global_batch_size": 32,
                           "sequence_length": 1024, "micro_batch_size": 2, "precision": "bf16", "zero_stage": 1,
                           "pipelines": [{"micro_batches": 16, "stages": [
                               stage(0, 4, "a100:0"), stage(4, 14, "a100:1"), stage(14, 20, "a100:2"),
                               stage(20, 24, "a100:3")]}]})
    titan = legal_variants(plan, Legality.of("torchtitan"))
    assert sorted(p.zero_stage for p in titan) == [0, 2, 3]
    meg = legal_variants(plan, Legality.of("megatron"))
    assert meg[0] is plan and len(meg) > 1
    for p in meg[1:]:
        counts = [s.num_layers for s in p.pipelines[0].stages]
        assert sum(counts) == 24 and megatron_split_error(counts) is None
    cm = CostModel(SMALL)
    best, _ = select([plan], cm, Legality.of("megatron"))
    assert best is not None and Legality.of("megatron").errors(best[0], SMALL) == []


def test_under_a_priced_objective_the_seeds_get_a_larger_share_and_the_throughput_path_does_not():
    from arachne.planners.arachne import seeds
    from arachne.planners.arachne.planner import ArachnePlanner, _post_share

    assert seeds.seed_share(JOB, priced=True) == seeds.PRICED_SEED_SHARE > seeds.seed_share(JOB) == seeds.SEED_SHARE
    assert _post_share(JOB, True) > _post_share(JOB)
    planner = ArachnePlanner()
    for objective, priced in ((None, False), (Objective("throughput", min_tokens_per_s=1.0), False),
                              (Objective("cost"), True), (Objective("throughput", max_cost_per_hour=10.0), True)):
        planner.restrict(None, objective)
        assert planner._priced is priced


@pytest.mark.slow
def test_the_cost_plan_costs_less_per_token_than_megatrons_grid_on_hopper_ampere_512():
    """The grid's hopper-ampere-512 / Mixtral-8x22B: Megatron's grid (tp 2 x 8 stages of 16 H100, ep 8) cost 1.6%
    less per token than the cost objective's plan while the seeds had 0.08 of the target (they reached tp 1 only on
    the H100-only view); with ``PRICED_SEED_SHARE`` they reach it and the knobs improve on it."""
    from benchmarks import common

    case = next(c for c in common.GRID_CASES if c.name == "hopper-ampere-512/Mixtral-8x22B")
    cl = common.grid_cluster(case.cluster, list(case.groups))
    job, model = Job(global_batch_size=case.gbs, sequence_length=case.seq), load_model(case.model)
    _, meg, _ = run_planner("megatron", cl, model, job, CostModel(cl), SearchBudget(time_budget_s=10))
    _, est, _ = run_planner("arachne", cl, model, job, CostModel(cl), SearchBudget(time_budget_s=10),
                            objective=Objective("cost"))
    assert usd_per_million_tokens(est) < usd_per_million_tokens(meg)
