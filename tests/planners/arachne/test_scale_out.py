"""The lock-step grid with cp built in, for a batch too small for its cluster (scale_out.py)."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arachne.cost import CostModel
from arachne.plan import plan_errors, validate_plan
from arachne.planners.arachne import scale_out as so
from arachne.planners.arachne.context import PlanningContext
from arachne.planners.arachne.planner import ArachnePlanner
from arachne.planners.protocol import Deadline, SearchBudget
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.constraints import Constraints
from arachne.spec.job import Job
from arachne.spec.model import model_catalog
from arachne.spec.runtimes import Legality


def cluster(nodes: int = 32, gpu: str = "H100"):
    return cluster_from_dict({"name": "c", "nodes": [{"name": "n-{i}", "count": nodes, "gpu": gpu,
                                                      "gpus_per_node": 8, "inter_node_gbps": 50.0}]})


def ctx_for(gbs: int, seq: int = 4096, model: str = "Llama-3.1-8B", nodes: int = 32) -> PlanningContext:
    cl = cluster(nodes)
    return PlanningContext(cl, model_catalog().get(model), Job(global_batch_size=gbs, sequence_length=seq),
                           CostModel(cl))


def test_starved_only_past_the_batch_and_where_cp_is_allowed():
    assert so.starved(ctx_for(16), None)  # 256 GPUs, 16 sequences x 8 GPUs = 128
    assert not so.starved(ctx_for(32), None)  # 32 x 8 = 256: the batch fills the cluster at tp 8
    assert not so.starved(ctx_for(16), Legality.of("arachne"))  # arachne's runtime has no cp
    assert so.starved(ctx_for(16), Legality.of("megatron"))
    assert not so.starved(ctx_for(16, seq=512), None)  # no cp degree keeps CP_RANK_TOKENS a rank


@settings(max_examples=60, deadline=None)
@given(seq=st.integers(1, 1 << 17), max_cp=st.one_of(st.none(), st.integers(1, 64)))
def test_cp_degrees_split_into_balanced_halves_within_the_limits(seq, max_cp):
    legality = None if max_cp is None else Legality.of("megatron", Constraints(max_cp=max_cp))
    degrees = so.cp_degrees(seq, legality)
    assert degrees[0] == 1
    for c in degrees[1:]:
        assert c & (c - 1) == 0 and c <= so.MAX_CP and (max_cp is None or c <= max_cp)
        assert seq % (2 * c) == 0 and seq // c >= so.CP_RANK_TOKENS


def test_shapes_fit_their_class_divide_the_batch_and_come_fastest_bound_first():
    ctx = ctx_for(16)
    shapes = so.shapes(ctx, None)
    assert shapes and [s.bound_s for s in shapes] == sorted(s.bound_s for s in shapes)
    (cls,) = ctx.classes
    for s in shapes:
        assert s.stages * s.tp * s.cp * s.dp <= cls.count and 16 % s.dp == 0 and cls.node_size % s.tp == 0
    assert {s.cp for s in shapes} > {1} and max(s.stages for s in shapes) > 1


def test_bound_is_below_the_cost_model_price_of_the_cut():
    ctx = ctx_for(16)
    devices = [d for node in ctx.classes[0].node_devices() for d in node]
    for s in so.shapes(ctx, None)[:25]:
        cut = so.cut_plan(ctx, s, devices)
        validate_plan(cut, ctx.cluster, ctx.model)
        assert s.bound_s <= ctx.cost_model.estimate(cut, validate=False).iteration_time_s


def test_family_plans_are_valid_use_cp_or_depth_and_put_idle_gpus_to_work():
    ctx = ctx_for(16)
    got = so.scale_out_plans(ctx, Deadline(60.0, time.perf_counter), lambda _p: True, None)
    assert got
    for plan, est in got:
        assert est.fits and not plan_errors(plan, ctx.cluster, ctx.model)
        validate_plan(plan, ctx.cluster, ctx.model)
    best = max(got, key=lambda r: r[1].tokens_per_s)[0]
    assert len(best.devices) > 16 * 8  # more GPUs than one stage of tp 8 per sequence can use


def test_family_respects_the_runtime_rules():
    ctx = ctx_for(16)
    legality = Legality.of("megatron", Constraints(max_cp=2, virtual_stages=False))
    got = so.scale_out_plans(ctx, Deadline(60.0, time.perf_counter), lambda p: not legality.errors(p, ctx.cluster),
                             legality)
    assert got and all(st_.cp <= 2 for p, _ in got for pl in p.pipelines for st_ in pl.stages)
    assert all(pl.virtual_stages == 1 for p, _ in got for pl in p.pipelines)


def test_interleaving_only_lowers_the_bound_of_deep_shapes():
    ctx = ctx_for(16)
    flat = {(s.cls, s.stages, s.tp, s.cp, s.dp): s.bound_s for s in so.shapes(ctx, Legality.of(
        "megatron", Constraints(virtual_stages=False)))}
    chunked = {(s.cls, s.stages, s.tp, s.cp, s.dp): s.bound_s for s in so.shapes(ctx, None)}
    assert flat.keys() == chunked.keys()
    assert all(chunked[k] <= flat[k] for k in flat)
    assert all(chunked[k] == flat[k] for k in flat if k[1] == 1)
    assert any(chunked[k] < flat[k] for k in flat)


@pytest.mark.slow
def test_planner_on_a_starved_cluster_returns_the_familys_best_or_better():
    ctx = ctx_for(16)
    fam = so.scale_out_plans(ctx, Deadline(60.0, time.perf_counter), lambda _p: True, None)
    cm = CostModel(ctx.cluster)
    plan = ArachnePlanner().plan(ctx.cluster, ctx.model, ctx.job, cm, SearchBudget(time_budget_s=30.0)).plans[0]
    est = cm.estimate(plan)
    assert est.fits
    assert est.tokens_per_s >= 0.97 * max(e.tokens_per_s for _, e in fam)


@settings(max_examples=15, deadline=None)
@given(nodes=st.integers(4, 24), node_size=st.sampled_from([4, 8]), gbs=st.sampled_from([2, 4, 6, 8]),
       seq=st.sampled_from([2048, 4096, 8192]), gpu=st.sampled_from(["H100", "A100-80", "L4"]))
def test_every_shape_is_within_its_class_and_its_cut_is_a_valid_plan(nodes, node_size, gbs, seq, gpu):
    cl = cluster_from_dict({"name": "c", "nodes": [{"name": "n-{i}", "count": nodes, "gpu": gpu,
                                                    "gpus_per_node": node_size}]})
    ctx = PlanningContext(cl, model_catalog().get("Llama-3.1-8B"), Job(global_batch_size=gbs, sequence_length=seq),
                          CostModel(cl))
    shapes = so.shapes(ctx, None)
    assert not shapes or any(c.count > gbs * c.node_size for c in ctx.classes)  # only on a class past the batch
    devices = [d for node in ctx.classes[0].node_devices() for d in node]
    for s in shapes[:8]:
        assert s.stages * s.tp * s.cp * s.dp <= ctx.classes[s.cls].count and gbs % s.dp == 0
        validate_plan(so.cut_plan(ctx, s, devices), ctx.cluster, ctx.model)


def test_an_moe_models_shapes_are_bounded_and_built_with_its_experts_parallel():
    ctx = ctx_for(16, model="Mixtral-8x22B")
    shapes = so.shapes(ctx, None)
    assert any(s.stages == 1 for s in shapes)  # (at ep 1 a whole Mixtral-8x22B stage does not fit tp 8)
    got = so.scale_out_plans(ctx, Deadline(60.0, time.perf_counter), lambda _p: True, None)
    assert got and all(est.fits for _, est in got)
    assert any(st_.ep > 1 for p, _ in got for pl in p.pipelines for st_ in pl.stages)
