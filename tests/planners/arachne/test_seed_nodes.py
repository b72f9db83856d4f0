"""The seeds' pass over the largest uniform sub-cluster: the GPUs megatron-oblivious plans over, as arachne's seeds."""

from __future__ import annotations

import pytest
from planner_cases import throughputs

from arachne.cost import CostModel
from arachne.planners.arachne import seeds
from arachne.planners.arachne.context import PlanningContext
from arachne.planners.arachne.template import Group, Slot, Template
from arachne.planners.protocol import Deadline
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.job import Job
from arachne.spec.model import model_catalog

ROB016 = {"name": "rob-016", "nodes": [
    {"name": "h100-x8-{i}", "count": 6, "gpu": "H100", "gpus_per_node": 8},
    {"name": "h20-x8-{i}", "count": 21, "gpu": "H20", "gpus_per_node": 8},
    {"name": "h100-x1-{i}", "count": 49, "gpu": "H100", "gpus_per_node": 1, "inter_node_gbps": 50},
    {"name": "h800-x4-{i}", "count": 5, "gpu": "H800", "gpus_per_node": 4},
    {"name": "h800-x1-{i}", "count": 21, "gpu": "H800", "gpus_per_node": 1, "zone": "row-2"},
    {"name": "titan-rtx-x1-{i}", "count": 86, "gpu": "Titan-RTX", "gpus_per_node": 1},
    {"name": "titan-rtx-x2-{i}", "count": 43, "gpu": "Titan-RTX", "gpus_per_node": 2, "inter_node_gbps": 6.25},
    {"name": "a100-80-x8-{i}", "count": 7, "gpu": "A100-80", "gpus_per_node": 8, "zone": "row-4"}]}
"""Fresh hold-out seed107/rob-016: 534 GPUs of five types in nodes of 1, 2, 4 and 8."""


def ctx_for(nodes: list[dict], model: str = "LLaMA-2-70B", gbs: int = 256, seq: int = 2048) -> PlanningContext:
    cl = cluster_from_dict({"name": "c", "nodes": nodes})
    return PlanningContext(cl, model_catalog().get(model), Job(global_batch_size=gbs, sequence_length=seq),
                           CostModel(cl))


def names(ctx: PlanningContext, sub: tuple[int, ...]) -> set[tuple[str, int]]:
    return {(ctx.classes[i].gpu.name, ctx.classes[i].node_size) for i in sub}


def test_the_uniform_nodes_are_the_node_size_with_the_most_gpus_over_several_types():
    ctx = ctx_for([{"name": "h{i}", "count": 2, "gpu": "H100", "gpus_per_node": 8},
                   {"name": "a{i}", "count": 3, "gpu": "A100-80", "gpus_per_node": 8},
                   {"name": "s{i}", "count": 10, "gpu": "H100", "gpus_per_node": 1},
                   {"name": "t{i}", "count": 4, "gpu": "T4", "gpus_per_node": 4}])
    sub, size = seeds.uniform_nodes(ctx)
    assert size == 8 and names(ctx, sub) == {("H100-SXM5-80GB", 8), ("A100-SXM4-80GB", 8)}
    # one type has every GPU of that size: nothing new to seed
    one = ctx_for([{"name": "h{i}", "count": 4, "gpu": "H100", "gpus_per_node": 8},
                   {"name": "t{i}", "count": 4, "gpu": "T4", "gpus_per_node": 4}])
    assert seeds.uniform_nodes(one) is None
    # a tie in GPUs goes to the larger nodes
    tie = ctx_for([{"name": "h{i}", "count": 1, "gpu": "H100", "gpus_per_node": 8},
                   {"name": "a{i}", "count": 1, "gpu": "A100-80", "gpus_per_node": 8},
                   {"name": "t{i}", "count": 4, "gpu": "T4", "gpus_per_node": 4}])
    assert seeds.uniform_nodes(tie)[1] == 8


@pytest.mark.slow
def test_the_seeds_price_the_uniform_nodes_right_after_the_incumbents_own_tp(monkeypatch):
    """The walk over the incumbent's GPU type (here the H20) used up the seeds' time on seed107/rob-016 before any
    subset with the H100 and A100 nodes of 8; megatron-oblivious's one stage of tp 8 x dp 32 over those nodes was
    1.198x arachne's plan."""
    cl = cluster_from_dict(ROB016)
    ctx = PlanningContext(cl, model_catalog().get("DeepSeek-V3"), Job(global_batch_size=1024, sequence_length=2048),
                          CostModel(cl))
    sub, _ = seeds.uniform_nodes(ctx)
    assert names(ctx, sub) == {("H100-SXM5-80GB", 8), ("A100-SXM4-80GB", 8), ("H20", 8)}
    order: list[tuple[tuple[int, ...], int]] = []

    def logged(tpl, ctx_, mbs, *a, **k):  # the order only: nothing is priced
        order.append((tuple(sorted({s.cls for g in tpl.groups for s in g.slots})), tpl.groups[0].slots[0].tp))
        return []

    monkeypatch.setattr(seeds, "complete_seed", logged)
    h20 = {"H20"}
    seeds.seed_plans(ctx, Deadline(60), first=h20, tps={2})
    lead = order[0]
    assert names(ctx, lead[0]) == {("H20", 8)}
    other_tp = next(i for i, (s, tp) in enumerate(order) if s == lead[0] and tp != lead[1])
    spans = [i for i, (s, _) in enumerate(order)
             if set(s) <= set(sub) and len({ctx.classes[c].gpu.name for c in s}) > 1]
    assert spans and spans[0] < other_tp


@pytest.mark.slow
def test_the_planner_passes_megatron_oblivious_on_deepseek_v3_over_five_types():
    runs = throughputs(ROB016, "DeepSeek-V3", 1024, 2048, ("arachne", "megatron-oblivious"))
    assert runs["arachne"] >= runs["megatron-oblivious"]


def test_a_lock_step_form_that_leaves_a_third_of_its_class_idle_is_priced_at_the_depth_that_fills_it(monkeypatch):
    """104 GH200 and a batch of 1,024: one lock-step stage runs dp 64 (dp divides the batch), leaving 40 GPUs idle;
    three stages of dp 32 use 96 (Megatron's grid on seed89/rob-003, GPT-OSS-120B). The walk one depth at a time
    (1, 2, ...) ran out of the seeds' time before the third."""
    from arachne.planners.arachne.seed_scope import lockstep_fill_depth

    gh = [{"name": "g{i}", "count": 52, "gpu": "GH200", "gpus_per_node": 2}]
    ctx = ctx_for(gh, model="GPT-OSS-120B", gbs=1024, seq=1024)
    assert lockstep_fill_depth(ctx, 0, 1, 1) == 3
    full = ctx_for([{"name": "g{i}", "count": 64, "gpu": "GH200", "gpus_per_node": 2}], "GPT-OSS-120B", 1024, 1024)
    assert lockstep_fill_depth(full, 0, 1, 1) is None  # dp 128 at one stage: nothing idles
    class Deeper(Exception):
        pass

    real = seeds.complete_seed

    def first_deeper(tpl, *a, **k):  # the first lock-step form deeper than one stage ends the run
        g = tpl.groups[0]
        if len(tpl.groups) == 1 and g.replicas == 1 and g.slots[0].dp > 1 and len(g.slots) > 1:
            raise Deeper(len(g.slots))
        return real(tpl, *a, **k)

    monkeypatch.setattr(seeds, "complete_seed", first_deeper)
    with pytest.raises(Deeper) as deeper:
        seeds.seed_plans(ctx, Deadline(60))
    assert deeper.value.args[0] == 3


ROB014 = {"name": "rob-014", "nodes": [
    {"name": "rtx-3090-x4-{i}", "count": 11, "gpu": "RTX-3090", "gpus_per_node": 4},
    {"name": "rtx-3090-x8-{i}", "count": 6, "gpu": "RTX-3090", "gpus_per_node": 8, "inter_node_gbps": 3.125},
    {"name": "a10g-x2-{i}", "count": 43, "gpu": "A10G", "gpus_per_node": 2, "intra_node_gbps": 300, "zone": "row-1"},
    {"name": "h100-x2-{i}", "count": 22, "gpu": "H100", "gpus_per_node": 2, "inter_node_gbps": 3.125,
     "zone": "row-2"},
    {"name": "h100-x8-{i}", "count": 6, "gpu": "H100", "gpus_per_node": 8, "inter_node_gbps": 6.25},
    {"name": "l40s-x8-{i}", "count": 5, "gpu": "L40S", "gpus_per_node": 8},
    {"name": "a100-80-x8-{i}", "count": 14, "gpu": "A100-80", "gpus_per_node": 8, "inter_node_gbps": 12.5}]}
"""Fresh hold-out seed169/rob-014: 422 GPUs of five types; megatron-oblivious ran LLaMA-3-8B (a batch of 512 x 512)
as one lock-step pipeline of 16 stages, each data parallel over one node of 8 (H100, L40S, A100)."""


@pytest.mark.slow
def test_a_dense_model_gets_the_type_oblivious_lock_step_pipeline_of_node_wide_stages_over_the_uniform_nodes(
        monkeypatch):
    """The seeds priced that form for MoE models only; for a dense model their replicas were pipelines of one GPU
    per stage, whose sends of a small micro-batch cost more than the node-wide stage's (seed169/rob-014: 0.956x
    megatron-oblivious). Each stage data parallel inside one node, each type's nodes consecutive stages, without
    the class on a network 8x slower than the best (the RTX-3090 nodes of 8 on 3.125 GB/s)."""
    cl = cluster_from_dict(ROB014)
    ctx = PlanningContext(cl, model_catalog().get("LLaMA-3-8"), Job(global_batch_size=512, sequence_length=512),
                          CostModel(cl))
    sub, size = seeds.uniform_nodes(ctx)
    assert size == 8 and ("RTX-3090", 8) in names(ctx, sub)
    tpls: list = []
    real = seeds.complete_seed

    def logged(tpl, ctx_, mbs, *a, **k):  # the templates only: nothing is priced
        tpls.append(tpl)
        return []

    monkeypatch.setattr(seeds, "complete_seed", logged)
    seeds.seed_plans(ctx, Deadline(60), first={"A100-SXM4-80GB"}, tps={1})
    ix = {(ctx.classes[i].gpu.name[:4], ctx.classes[i].node_size): i for i in sub}
    h, lo, a = ix[("H100", 8)], ix[("L40S", 8)], ix[("A100", 8)]
    want = (Slot(h, 1, dp=8),) * 6 + (Slot(lo, 1, dp=8),) * 5 + (Slot(a, 1, dp=8),) * 14
    assert Template((Group(want, 1),)) in tpls
    assert not any(len(t.groups) == 1 and t.groups[0].slots[0].dp > 1 and t.groups[0].replicas == 1
                   and ix[("RTX-", 8)] in {s.cls for s in t.groups[0].slots} for t in tpls)
    assert seeds.mixed_lockstep_templates(ctx, sub, 1) == []  # (not from the walk over subsets: MoE only there)
    # a model one stage holds there: not at all (re-run odd104-rerun/rob-019 lost the one-stage seed it wins with
    # to the lock-step forms' time)
    small = PlanningContext(cl, model_catalog().get("GPT-3-2.7B"), Job(global_batch_size=512, sequence_length=512),
                            CostModel(cl))
    tpls.clear()

    def one_stage(tpl, ctx_, mbs, *a, **k):  # one-stage templates priced (the pass's depth 1 fits), the rest logged
        tpls.append(tpl)
        return real(tpl, ctx_, mbs, *a, **k) if all(len(g.slots) == 1 for g in tpl.groups) else []

    monkeypatch.setattr(seeds, "complete_seed", one_stage)
    seeds.seed_plans(small, Deadline(60), first={"A100-SXM4-80GB"}, tps={1})
    assert tpls and not any(len(t.groups) == 1 and t.groups[0].replicas == 1 and t.groups[0].slots[0].dp > 1
                            and len({small.classes[s.cls].gpu.name for s in t.groups[0].slots}) > 1 for t in tpls)


@pytest.mark.slow
def test_the_planner_passes_megatron_oblivious_on_llama_3_8b_over_node_wide_stages():
    runs = throughputs(ROB014, "LLaMA-3-8", 512, 512, ("arachne", "megatron-oblivious"))
    assert runs["arachne"] >= runs["megatron-oblivious"]



ROB028 = {"name": "rob-028", "nodes": [
    {"name": "a10g-x2-{i}", "count": 5, "gpu": "A10G", "gpus_per_node": 2},
    {"name": "h200-x8-{i}", "count": 4, "gpu": "H200", "gpus_per_node": 8, "inter_node_gbps": 100},
    {"name": "h800-x8-{i}", "count": 4, "gpu": "H800", "gpus_per_node": 8}]}
"""Fresh hold-out seed142/rob-028: 74 GPUs; megatron-oblivious ran LLaMA-2-7B (a batch of 128 x 512) as one
lock-step pipeline of 8 stages, each data parallel over one node of 8 (the H200 nodes, then the H800 nodes)."""


@pytest.mark.slow
def test_where_the_walk_holds_the_uniform_nodes_a_dense_model_still_gets_their_lock_step_pipeline(monkeypatch):
    """The incumbent runs on the H200 and H800 nodes, so the walk over subsets starts there and the uniform nodes'
    pass stood down, and with it the one form the walk has not: the lock-step pipeline of node-wide stages
    (seed142/rob-028: 0.987x megatron-oblivious; decision 0043). Its walk by depth stays the walk's."""
    cl = cluster_from_dict(ROB028)
    ctx = PlanningContext(cl, model_catalog().get("LLaMA-2-7B"), Job(global_batch_size=128, sequence_length=512),
                          CostModel(cl))
    sub, size = seeds.uniform_nodes(ctx)
    first = {"H200-SXM-141GB", "H800-SXM5-80GB"}
    assert size == 8 and sub in seeds.class_subsets(ctx, first)
    tpls: list = []

    def logged(tpl, ctx_, mbs, *a, **k):  # the templates only: nothing is priced
        tpls.append(tpl)
        return []

    monkeypatch.setattr(seeds, "complete_seed", logged)
    seeds.seed_plans(ctx, Deadline(60), first=first, tps={1})
    ix = {ctx.classes[i].gpu.name[:4]: i for i in sub}
    want = (Slot(ix["H200"], 1, dp=8),) * 4 + (Slot(ix["H800"], 1, dp=8),) * 4
    assert Template((Group(want, 1),)) in tpls
    # an MoE model's type-oblivious stages come from the walk over its subsets there: nothing more
    moe = PlanningContext(cl, model_catalog().get("Mixtral-8x7B"), Job(global_batch_size=128, sequence_length=512),
                          CostModel(cl))
    tpls.clear()
    seeds.seed_plans(moe, Deadline(60), first=first, tps={1})
    walked = list(tpls)
    tpls.clear()
    monkeypatch.setattr(seeds, "uniform_nodes", lambda c: None)
    seeds.seed_plans(moe, Deadline(60), first=first, tps={1})
    assert walked == tpls


@pytest.mark.slow
def test_the_planner_passes_megatron_oblivious_on_llama_2_7b_over_node_wide_stages():
    runs = throughputs(ROB028, "LLaMA-2-7B", 128, 512, ("arachne", "megatron-oblivious"))
    assert runs["arachne"] >= runs["megatron-oblivious"]


ROB004 = {"name": "rob-004", "nodes": [
    {"name": "t4-x2-{i}", "count": 7, "gpu": "T4", "gpus_per_node": 2, "inter_node_gbps": 25},
    {"name": "titan-rtx-x4-{i}", "count": 9, "gpu": "Titan-RTX", "gpus_per_node": 4, "inter_node_gbps": 1.25,
     "zone": "row-5"},
    {"name": "t4-x8-{i}", "count": 2, "gpu": "T4", "gpus_per_node": 8},
    {"name": "a10-x8-{i}", "count": 5, "gpu": "A10", "gpus_per_node": 8},
    {"name": "rtx-3090-x1-{i}", "count": 44, "gpu": "RTX-3090", "gpus_per_node": 1},
    {"name": "p100-x4-{i}", "count": 10, "gpu": "P100", "gpus_per_node": 4},
    {"name": "l40s-x8-{i}", "count": 3, "gpu": "L40S", "gpus_per_node": 8, "zone": "row-3"}]}
"""Fresh hold-out seed150/rob-004: 214 GPUs of seven classes; megatron-oblivious ran DeepSeek-MoE-16B (a batch of
384 x 1,024) as one lock-step pipeline of 4 stages, each data parallel over 16 GPUs of the L40S and A10 nodes of 8."""


def test_the_type_oblivious_stages_go_deeper_at_most_twice_as_deep_at_depths_that_divide_the_blocks():
    assert [seeds.deeper_divisor(28, d) for d in (1, 2, 4)] == [2, 4, None]  # (DeepSeek-MoE-16B: 7 is no seed depth)
    assert seeds.deeper_divisor(61, 1) is None  # DeepSeek-V3: the next divisor is 61 stages
    assert [seeds.deeper_divisor(32, d) for d in (1, 2, 4, 8, 16, 32)] == [2, 4, 8, 16, 32, None]
    assert seeds.deeper_divisor(94, 2) is None and seeds.deeper_divisor(94, 1) == 2


@pytest.mark.slow
def test_an_moe_models_type_oblivious_stages_over_the_uniform_nodes_go_deeper_while_faster(monkeypatch):
    """The pass over the largest uniform sub-cluster priced an MoE model's type-oblivious lock-step stage at its
    shallowest depth only (one stage of dp 64 over L40S and A10 nodes: 55,614 tokens/s at best); Megatron's grid
    runs the depth that pays. Deeper at the depths that divide the 28 blocks, while each prices faster: 2 stages,
    then 4 (dp 16), the fastest."""
    cl = cluster_from_dict(ROB004)
    ctx = PlanningContext(cl, model_catalog().get("DeepSeek-MoE-16B"), Job(global_batch_size=384,
                                                                              sequence_length=1024), CostModel(cl))
    sub, size = seeds.uniform_nodes(ctx)
    got: dict[int, float] = {}
    real = seeds.complete_seed

    def logged(tpl, ctx_, mbs, *a, **k):
        out = real(tpl, ctx_, mbs, *a, **k)
        g = tpl.groups[0]
        if len(tpl.groups) == 1 and g.replicas == 1 and set(g.slots[0].span) == {sub[0], sub[1]}:
            got[len(g.slots)] = max([e.tokens_per_s for _, e in out] + [got.get(len(g.slots), 0.0)])
        return out

    monkeypatch.setattr(seeds, "complete_seed", logged)
    seeds.seed_plans(ctx, Deadline(60), first={"L40S"}, tps={1})
    assert {1, 2, 4} <= set(got) and got[4] > max(got[1], got[2])


@pytest.mark.slow
def test_the_planner_passes_megatron_oblivious_on_deepseek_moe_over_four_type_oblivious_stages():
    runs = throughputs(ROB004, "DeepSeek-MoE-16B", 384, 1024, ("arachne", "megatron-oblivious"))
    assert runs["arachne"] >= runs["megatron-oblivious"]


ROB024 = {"name": "rob-024", "nodes": [
    {"name": "rtx-4090-x4-{i}", "count": 51, "gpu": "RTX-4090", "gpus_per_node": 4},
    {"name": "h100-x1-{i}", "count": 53, "gpu": "H100", "gpus_per_node": 1, "inter_node_gbps": 50},
    {"name": "a100-80-x8-{i}", "count": 40, "gpu": "A100-80", "gpus_per_node": 8, "inter_node_gbps": 1.25},
    {"name": "h100-x8-{i}", "count": 7, "gpu": "H100", "inter_node_gbps": 1.25}]}
"""Fresh hold-out seed175/rob-024: 633 GPUs; megatron-oblivious ran Qwen3-235B-A22B (a batch of 1,024 x 1,024) as
one lock-step pipeline of 47 stages of tp 2 x dp 4 (ep 4), each inside one of the A100 and H100 nodes of 8, whose
NICs (1.25 GB/s) are about 200 times slower than their NVLink; arachne's seeds, shallowest first, never got there
(0.934x)."""


@pytest.mark.slow
def test_an_moe_model_on_nodes_with_slow_nics_is_seeded_first_with_node_wide_stages(monkeypatch):
    """Every stage inside one node (tp x dp = 8), the A100 and H100 nodes' stages in one lock-step pipeline,
    priced before the walk over class subsets; not where the same nodes have their catalog networks."""
    def first_templates(doc: dict) -> tuple[PlanningContext, list]:
        cl = cluster_from_dict(doc)
        ctx = PlanningContext(cl, model_catalog().get("Qwen3-235B-A22B"),
                              Job(global_batch_size=1024, sequence_length=1024), CostModel(cl))
        tpls: list = []

        def logged(tpl, ctx_, mbs, *a, **k):  # the order only: nothing is priced
            tpls.append(tpl)
            return []

        monkeypatch.setattr(seeds, "complete_seed", logged)
        seeds.seed_plans(ctx, Deadline(60), first={"A100-SXM4-80GB"}, tps={1})
        return ctx, tpls

    def node_wide(ctx: PlanningContext, tpl) -> bool:
        slots = tpl.groups[0].slots
        return len(tpl.groups) == 1 and tpl.groups[0].replicas == 1 and len(slots) == 47 and \
            all(s.tp * s.dp == 8 for s in slots) and \
            {ctx.classes[s.cls].gpu.name for s in slots} == {"H100-SXM5-80GB", "A100-SXM4-80GB"}

    ctx, tpls = first_templates(ROB024)
    sub, size = seeds.uniform_nodes(ctx)
    assert size == 8 and names(ctx, sub) == {("H100-SXM5-80GB", 8), ("A100-SXM4-80GB", 8)}
    # after the one-stage forms over the GPU types that share the batch best, before the walk
    at = next(i for i, t in enumerate(tpls) if node_wide(ctx, t))
    assert all(len(t.groups[0].slots) == 1 for t in tpls[:at])
    # the same nodes on their catalog networks: not first (the walk's forms are)
    fast = {**ROB024, "nodes": [{k: v for k, v in n.items() if k != "inter_node_gbps"} for n in ROB024["nodes"]]}
    ctx, tpls = first_templates(fast)
    assert not any(node_wide(ctx, t) for t in tpls[:10])


def test_node_wide_mixed_lock_step_stages_keep_tp_times_dp_inside_a_node():
    cl = cluster_from_dict(ROB024)
    ctx = PlanningContext(cl, model_catalog().get("Qwen3-235B-A22B"), Job(global_batch_size=1024, sequence_length=1024),
                          CostModel(cl))
    sub, _ = seeds.uniform_nodes(ctx)
    for tp in (1, 2, 4):
        wide = seeds.mixed_lockstep_templates(ctx, sub, tp, 1)  # the widest degree: stages over several nodes
        inside = seeds.mixed_lockstep_templates(ctx, sub, tp, 1, in_nodes=True)
        assert inside and all(s.tp * s.dp == 8 for t in inside for s in t.groups[0].slots)
        assert all(s.tp * s.dp > 8 for t in wide for s in t.groups[0].slots)


@pytest.mark.slow
def test_the_planner_passes_megatron_oblivious_on_qwen3_235b_over_node_wide_stages():
    runs = throughputs(ROB024, "Qwen3-235B-A22B", 1024, 1024, ("arachne", "megatron-oblivious"))
    assert runs["arachne"] >= runs["megatron-oblivious"]
