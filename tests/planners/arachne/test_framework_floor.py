"""Under a framework's rules the arachne planner prices that framework's own grid as a floor
(``rules_view.framework_floor``): once per plan (not again in the second search), in a forked process where the
other core is free, and the type-oblivious grid only where the cluster has more than one GPU type."""

from __future__ import annotations

from arachne.cost import CostModel
from arachne.planners import registry
from arachne.planners.arachne import planner as planner_module
from arachne.planners.arachne import rules_view
from arachne.planners.arachne.planner import ArachnePlanner
from arachne.planners.arachne.portfolio import Forked
from arachne.planners.protocol import SearchBudget
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.job import Job
from arachne.spec.model import model_catalog
from arachne.spec.runtimes import Legality

MIXED = {"name": "mixed", "nodes": [{"name": "h{i}", "count": 2, "gpu": "H100", "gpus_per_node": 8},
                                    {"name": "a{i}", "count": 2, "gpu": "A100-40", "gpus_per_node": 8}]}
ONE_TYPE = {"name": "one", "nodes": [{"name": "h{i}", "count": 4, "gpu": "H100", "gpus_per_node": 8}]}


def _problem(doc):
    cl = cluster_from_dict(doc)
    return cl, model_catalog().get("GPT-3-1.3B"), Job(global_batch_size=64, sequence_length=1024)


def _grids_run(monkeypatch, doc) -> list[dict]:
    seen: list[dict] = []

    class Grid:
        def __init__(self, opts):
            self.opts = opts

        def plan(self, cluster, model, job, cost_model, budget):
            seen.append(self.opts)
            raise ValueError("no layout")

    monkeypatch.setattr(registry, "get_planner", lambda name, **opts: Grid(opts))
    cl, m, job = _problem(doc)
    assert rules_view.framework_floor(cl, m, job, CostModel(cl), SearchBudget(time_budget_s=5), lambda e: 0.0) == []
    return seen


def test_the_type_oblivious_grid_runs_only_on_mixed_clusters(monkeypatch):
    assert _grids_run(monkeypatch, MIXED) == [{}, {"oblivious": True}]
    assert _grids_run(monkeypatch, ONE_TYPE) == [{}]


def test_on_one_gpu_type_the_oblivious_grid_adds_nothing():
    """What the skip relies on: on one GPU type both grids keep the same plans."""
    cl, m, job = _problem(ONE_TYPE)
    cm, budget = CostModel(cl), SearchBudget(time_budget_s=30, cpu=True)
    plans = []
    for opts in ({}, {"oblivious": True}):
        res = registry.get_planner("megatron", **opts).plan(cl, m, job, cm, budget)
        plans.append({p.model_dump_json(exclude={"planner"}) for p in res.plans})
    assert plans[0] and plans[0] == plans[1]


def _restricted(runtime: str = "megatron") -> ArachnePlanner:
    p = ArachnePlanner(target_s=0.1)
    p.restrict(Legality.of(runtime), None)
    return p


def test_the_forked_floor_returns_what_the_floor_in_this_process_does():
    cl, m, job = _problem(MIXED)
    planner, budget = _restricted(), SearchBudget(time_budget_s=30)
    forked, _, error = planner._floor(cl, m, job, CostModel(cl), budget, fork=True).result()
    inline, _, _ = planner._floor(cl, m, job, CostModel(cl), budget, fork=False).result()
    assert error is None and forked
    assert [(s, p.model_dump_json()) for s, p in forked] == [(s, p.model_dump_json()) for s, p in inline]
    assert _restricted("arachne")._floor(cl, m, job, CostModel(cl), budget, fork=True) is None


def test_the_floor_is_priced_once_per_plan_not_again_by_the_second_search(monkeypatch):
    calls = []
    real = rules_view.framework_floor

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    # both searches in this process (the second one's Forked does not fork), so every floor is counted here
    monkeypatch.setattr(planner_module, "framework_floor", counted)
    monkeypatch.setattr(planner_module, "Forked", lambda fn, fork=True: Forked(fn, fork=False))
    cl, m, job = _problem(MIXED)
    res = _restricted().plan(cl, m, job, CostModel(cl), SearchBudget(time_budget_s=30))
    assert res.plans and "second_look" in res.stats.notes
    assert len(calls) == 1
