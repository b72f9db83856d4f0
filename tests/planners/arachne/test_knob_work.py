"""The modern-knobs pass on the work clock: its variants are tallied (``knob_plans``, ``knob_stages``) and
charged; a recomputation choice equal to a probe is not priced twice; completion's fast stage construction
builds exactly what pydantic's ``model_construct`` builds."""

from __future__ import annotations

from arachne.cost import CostModel
from arachne.plan import Pipeline, Stage
from arachne.planners.arachne.completion import modern
from arachne.planners.arachne.completion.modern import modernize
from arachne.planners.arachne.completion.plan_edits import map_stages, with_recompute
from arachne.planners.arachne.context import _PIPELINE, _STAGE, _like
from arachne.planners.arachne.work_clock import RATES, Work, WorkClock
from arachne.planners.harness import run_planner
from arachne.planners.protocol import SearchBudget
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.job import Job
from arachne.spec.model import model_catalog


def cluster(groups):
    return cluster_from_dict({"name": "k", "nodes": [{"name": f"g{i}-{{i}}", "count": n, "gpu": g, "gpus_per_node": k}
                                                     for i, (g, n, k) in enumerate(groups)]})


def first_plan(cl, model, job):
    cm = CostModel(cl)
    _, _, res = run_planner("arachne", cl, model, job, cm, SearchBudget(time_budget_s=30), modern_knobs=False,
                            target_s=0.2)
    plan = res.plans[0]
    return cm, plan, cm.estimate(plan)


def test_the_knobs_tally_every_variant_they_price_and_the_clock_charges_it():
    cl = cluster([("A100-40", 4, 4)])
    cm, plan, est = first_plan(cl, model_catalog().get("LLaMA-2-13B"), Job(global_batch_size=64, sequence_length=2048))
    work = Work()
    clock = WorkClock(work, cm)
    n0 = cm.estimates
    modernize(plan, est, cm, max_estimates=20, work=work)
    w = clock.tally()
    assert 0 < w.knob_plans <= cm.estimates - n0 <= 20  # every variant priced is one estimate (some may fail)
    assert w.knob_stages >= w.knob_plans * min(len(p.stages) for p in plan.pipelines)
    # the variants' estimates are charged by the cost model's counters, and whatever building them costs beyond
    # that by the knob rates (fitted; 0 where the fit found that time carried by the per-estimate rates)
    charged = w.knob_plans * RATES["knob_plans"] + w.knob_stages * RATES["knob_stages"]
    assert clock() > charged >= 0 and clock() > 0
    before = Work()
    modernize(plan, est, cm, max_estimates=20)  # no tally given: nothing counted anywhere
    assert before == Work()


def test_the_planner_reports_the_knobs_work():
    cl = cluster([("A100-40", 4, 4)])
    model, job = model_catalog().get("LLaMA-2-13B"), Job(global_batch_size=64, sequence_length=2048)
    _, _, res = run_planner("arachne", cl, model, job, CostModel(cl), SearchBudget(time_budget_s=30), target_s=0.2)
    w = res.stats.notes["work"]
    assert w["knob_plans"] > 0 and w["knob_stages"] >= w["knob_plans"]


def test_a_uniform_recomputation_choice_reuses_its_probe():
    """Every stage of a plan that recomputes in full, where memory needs none: the per-stage choice is "none" on
    every stage, the none probe's plan: priced once (the probe), not again as the choice."""
    cl = cluster([("A100-40", 2, 4)])
    cm, plan, _ = first_plan(cl, model_catalog().get("LLaMA-2-7B"), Job(global_batch_size=64, sequence_length=2048))
    full = map_stages(plan, lambda _a, _b, _p, st: with_recompute(st, "full"))
    est = cm.estimate(full)
    priced = []
    knobs = modern.Knobs(cm, cm.resolve_model(full), lambda _p: True, (full, est))
    price = knobs.price

    def spy(p):
        priced.append(p)
        return price(p)

    knobs.price = spy
    knobs.relax(full, est)
    docs = [p.model_dump_json() for p in priced]
    assert len(docs) == len(set(docs))  # no plan priced twice
    none = map_stages(full, lambda _a, _b, _p, st: with_recompute(st, "none"))
    assert knobs.best[0].model_dump_json() == none.model_dump_json()  # memory needs no recomputation here
    assert knobs.best[1].iteration_time_s < est.iteration_time_s


def test_fast_stage_construction_equals_model_construct():
    kw = {"layers": (4, 9), "devices": ("a", "b", "c", "d"), "tp": 2, "dp": None, "ep": 1, "recompute": True}
    a, b = Stage.model_construct(**kw, allow_cross_node_tp=False), _like(_STAGE, **kw)
    assert a == b and a.model_dump() == b.model_dump() and a.__pydantic_fields_set__ == b.__pydantic_fields_set__
    assert b.dp_size == 2 and b.num_layers == 5 and b.__pydantic_fields_set__ is not _STAGE.__pydantic_fields_set__
    p = Pipeline.model_construct(micro_batches=3, stages=(a,), micro_batch_size=None)
    q = _like(_PIPELINE, micro_batches=3, stages=(b,), micro_batch_size=None)
    assert p == q and p.model_dump() == q.model_dump() and q.virtual_stages == 1
