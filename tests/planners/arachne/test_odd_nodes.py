"""Nodes whose GPU count is not a power of two: parts, whole-node views and the planner on them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as hst
from planner_cases import ctx_for, odd_node_cluster, small_cluster

from arachne.cost import CostModel
from arachne.planners.arachne.completion.place import place
from arachne.planners.arachne.context import PlanningContext
from arachne.planners.arachne.template import Group, Slot, Template
from arachne.planners.harness import run_planner
from arachne.planners.protocol import SearchBudget
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.job import Job
from arachne.spec.model import model_catalog
from arachne.spec.runtimes import Legality


@pytest.mark.slow
def test_a_longer_target_keeps_the_default_pass_on_odd_nodes():
    """On nodes of 6 and 7 GPUs the planner splits its target between a quick pass over the nodes' parts and the
    search over whole nodes; a longer target splits its default pass the same way and gives the extra time to
    the whole-node search (it used to re-split it: a slower plan here, 8% slower on odd108-rerun/rob-022)."""
    cl = cluster_from_dict({"name": "odd", "nodes": [
        {"name": "h{i}", "count": 1, "gpu": "H100", "gpus_per_node": 8},
        {"name": "a{i}", "count": 1, "gpu": "A100-80", "gpus_per_node": 8},
        {"name": "t{i}", "count": 1, "gpu": "Titan-RTX", "gpus_per_node": 8},
        {"name": "r6-{i}", "count": 1, "gpu": "RTX-2080-Ti", "gpus_per_node": 6},
        {"name": "r7-{i}", "count": 1, "gpu": "RTX-2080-Ti", "gpus_per_node": 7},
        {"name": "m{i}", "count": 3, "gpu": "MI250X", "gpus_per_node": 1},
        {"name": "s{i}", "count": 2, "gpu": "Titan-RTX", "gpus_per_node": 1}]})
    m, job = model_catalog().get("Qwen2-57B-A14B"), Job(global_batch_size=512, sequence_length=1024)
    est = {t: run_planner("arachne", cl, m, job, CostModel(cl), SearchBudget(time_budget_s=30),
                          legality=Legality.of("arachne"), target_s=t)[1] for t in (0.8, 1.2)}
    assert est[1.2].tokens_per_s >= est[0.8].tokens_per_s * (1 - 1e-9)


@given(hst.integers(1, 64))
def test_node_parts_tile_a_node_with_powers_of_two_largest_first(n):
    from arachne.planners.arachne.template import node_parts

    parts = node_parts(n)
    assert sum(size for _, size in parts) == n
    assert all(size & (size - 1) == 0 for _, size in parts)
    assert [size for _, size in parts] == sorted({size for _, size in parts}, reverse=True)  # distinct, descending
    assert [off for off, _ in parts] == [sum(s for _, s in parts[:k]) for k in range(len(parts))]


def test_odd_nodes_are_planned_as_power_of_two_parts_covering_every_gpu_once():
    cl = odd_node_cluster()
    ctx = ctx_for("Mixtral-8x7B", gbs=64, seq=4096, cluster=cl)
    assert [(c.gpu.name, c.node_size, c.count) for c in ctx.classes] == [
        ("H100-SXM5-80GB", 4, 8), ("H100-SXM5-80GB", 2, 4), ("H100-SXM5-80GB", 1, 2), ("L4", 1, 3)]
    devs = [d for c in ctx.classes for node in c.node_devices() for d in node]
    assert sorted(devs) == sorted(cl.devices)


@pytest.mark.slow
def test_on_odd_nodes_a_pipeline_uses_wider_tp_than_divides_the_node():
    """Mixtral-8x7B needs all 14 H100s of two 7-GPU nodes. Before node parts, tp had to divide 7 (tp 1
    only, 14 one-GPU stages with recomputation, 0.70x Metis); a pipeline over the parts placed class by
    class crossed between the nodes at every part. Metis's plan (three tp 2 stages and one tp 1 stage
    per node, one crossing) is the reference arachne must reach."""
    from arachne.plan import Pipeline, Plan, Stage

    cl = odd_node_cluster()
    model = model_catalog().get("Mixtral-8x7B")
    job = Job(global_batch_size=64, sequence_length=4096)
    cm = CostModel(cl)
    plan, est, _ = run_planner("arachne", cl, model, job, cm)
    assert max(st.tp for p in plan.pipelines for st in p.stages) >= 2  # tp 4 since the MoE layer's traffic
    cuts = [(0, 5), (5, 10), (10, 14), (14, 16), (16, 18), (18, 23), (23, 28), (28, 32)]
    devs = [("h0:0", "h0:1"), ("h0:2", "h0:3"), ("h0:4", "h0:5"), ("h0:6",), ("h1:6",), ("h1:0", "h1:1"),
            ("h1:2", "h1:3"), ("h1:4", "h1:5")]
    metis = Plan(model="Mixtral-8x7B", global_batch_size=64, sequence_length=4096, micro_batch_size=1,
                 pipelines=[Pipeline(micro_batches=64, stages=[Stage(layers=a, devices=d, tp=len(d))
                                                               for a, d in zip(cuts, devs)])])
    ref = cm.estimate(metis)
    # with Megatron's fp32 main gradients (the memory model of 2026-12-02 afternoon) the tp 2 stages next to
    # the embedding and head need recomputation to fit: the reference recomputes the stages over capacity
    over = {r.stage for r in ref.stages if r.memory_bytes > r.capacity_bytes}
    if over:
        metis = metis.model_copy(update={"pipelines": [metis.pipelines[0].model_copy(update={"stages": [
            st.model_copy(update={"recompute": True}) if i in over else st
            for i, st in enumerate(metis.pipelines[0].stages)]})]})
        ref = cm.estimate(metis)
    assert ref.fits
    assert est.tokens_per_s >= 0.99 * ref.tokens_per_s
    # not class by class (a crossing at every part). Since the MoE layer's measured traffic (2026-12-03) the plan
    # has tp 4, 2 and 1 stages on both nodes, and node_contiguous orders within a run of one shape only: 3
    # crossings of 5 (a mirrored order, tp 4-2-1 on one node then 1-2-4, would cross once; 41,617 tokens/s
    # against the Metis planner's 41,983, which crosses once)
    nodes = [st.devices[0].split(":")[0] for p in plan.pipelines for st in p.stages]
    assert sum(a != b for a, b in zip(nodes, nodes[1:])) < len(nodes) - 1


def test_node_contiguous_groups_interchangeable_stages_by_node():
    from arachne.planners.arachne.completion.place import node_contiguous

    keys = [("H100", 2, 1, 1)] * 6 + [("H100", 1, 1, 1)] * 2
    devs = [("h0:0", "h0:1"), ("h0:2", "h0:3"), ("h1:0", "h1:1"), ("h1:2", "h1:3"), ("h0:4", "h0:5"),
            ("h1:4", "h1:5"), ("h0:6",), ("h1:6",)]
    out = node_contiguous(keys, devs)
    assert sorted(out) == sorted(devs)
    assert [d[0][:2] for d in out] == ["h0", "h0", "h0", "h1", "h1", "h1", "h1", "h0"]
    same = [("a:0",), ("a:1",), ("b:0",), ("b:1",)]
    assert node_contiguous([("A100", 1, 1, 1)] * 4, same) == same  # already contiguous: unchanged


def test_whole_node_view_keeps_every_slot_on_whole_nodes_or_inside_one():
    """Odd-sized nodes as whole-node classes (the second view): the MoE rule's tp 2 x dp 8 (16 GPUs) does not
    tile 6-GPU nodes, and placement refuses such a slot instead of handing the cost model a short stage (a
    crash on odd101/rob-001)."""
    from arachne.planners.arachne.search.rules import rule_own_actions
    from arachne.planners.arachne.template import slot_fits_nodes

    cl = cluster_from_dict({"name": "six", "nodes": [{"name": "r{i}", "count": 8, "gpu": "RTX-4090",
                                                      "gpus_per_node": 6}]})
    model, job = model_catalog().get("Qwen1.5-MoE-A2.7B"), Job(global_batch_size=96, sequence_length=8192)
    ctx = PlanningContext(cl, model, job, CostModel(cl), node_parts=False)
    assert [c.node_size for c in ctx.classes] == [6]
    acts = rule_own_actions(ctx, 0)
    assert acts and all(slot_fits_nodes(a.tp * a.dp, 6) for a in acts)
    assert place(Template((Group((Slot(0, 2, 8, 4),), 1),)), ctx) is None


@pytest.mark.slow
def test_odd_nodes_get_a_quick_pass_by_parts_then_whole_nodes_and_the_faster_plan_wins():
    """With odd-sized nodes (up to 512 GPUs) arachne first takes a quick pass over the nodes' power-of-two
    parts, then searches whole nodes as classes, and returns the faster plan: here tp 2 on the 7-GPU nodes
    (parts) beats whole nodes, which allow tp 1 only. Without odd nodes, one search."""
    from arachne.planners.arachne.planner import ArachnePlanner

    cl = odd_node_cluster()
    model, job = model_catalog().get("Mixtral-8x7B"), Job(global_batch_size=64, sequence_length=4096)
    cm = CostModel(cl)
    res = ArachnePlanner().plan(cl, model, job, cm, SearchBudget(time_budget_s=30))
    views = res.stats.notes["node_views"]
    assert set(views) == {"parts", "whole"} and views["parts"] < 0.8 * views["whole"]
    assert res.scores[0] == min(views.values())
    assert cm.estimate(res.plans[0]).iteration_time_s == pytest.approx(res.scores[0], rel=1e-6)
    whole = ArachnePlanner(parts_share=0).plan(cl, model, job, cm, SearchBudget(time_budget_s=30))
    assert "node_views" not in whole.stats.notes and whole.scores[0] == pytest.approx(views["whole"], rel=1e-9)
    big = ArachnePlanner(parts_max_gpus=16).plan(cl, model, job, cm, SearchBudget(time_budget_s=30))
    assert "node_views" not in big.stats.notes
    even = ArachnePlanner().plan(small_cluster(), model_catalog().get("GPT-3-1.3B"),
                                 Job(global_batch_size=64, sequence_length=2048), CostModel(small_cluster()),
                                 SearchBudget(time_budget_s=30))
    assert "node_views" not in even.stats.notes
