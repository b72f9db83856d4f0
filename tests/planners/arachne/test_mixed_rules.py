"""The mixed-pipeline rules: plain, graded and wide rules, pooled classes, tails and MoE rules."""

from __future__ import annotations

import pytest
from planner_cases import ctx_for, five_type_cluster, rob021_cluster, split_type_cluster

from arachne.cost import CostModel
from arachne.plan import validate_plan
from arachne.planners.arachne.actions import Action, State, class_actions
from arachne.planners.arachne.completion.place import place
from arachne.planners.arachne.completion.price import price_template
from arachne.planners.arachne.template import Group, Slot, Template
from arachne.planners.harness import run_planner
from arachne.planners.protocol import SearchBudget
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.job import Job
from arachne.spec.model import model_catalog


def test_graded_mixed_rule_widens_tp_on_slower_types_and_may_leave_slow_classes_out():
    from arachne.planners.arachne.search.rules import mixed_rule_state

    ctx = ctx_for("LLaMA-2-13B", gbs=256, seq=4096, cluster=five_type_cluster())
    names = [c.gpu.name for c in ctx.classes]
    assert names[:3] == ["H100-SXM5-80GB", "A100-SXM4-80GB", "A100-SXM4-40GB"]
    st = mixed_rule_state(ctx, 2, 2, j=3, graded=True)  # an A100 is 3.2x slower than an H100: tp 8 for tp 2
    assert [(a.kind, a.tp) for a in st.actions] == [("mix", 2), ("mix", 8), ("mix", 8)]
    assert [a.stages for a in st.actions] == [8, 2, 1]  # every GPU of the three classes, in 2 replicas
    plain = mixed_rule_state(ctx, 2, 2)
    assert len(plain.actions) == 5 and {a.tp for a in plain.actions if a.kind == "mix"} == {2}
    assert mixed_rule_state(ctx, 2, 2, j=1) is None  # one class is not a mix


@pytest.mark.parametrize("model", ["LLaMA-2-13B", "Mixtral-8x7B"])
def test_mixed_rules_are_valid_distinct_and_keep_the_plain_rule_early(model):
    from arachne.planners.arachne.actions import mix_replica_options
    from arachne.planners.arachne.search.rules import (
        may_fit,
        mixed_floor_states,
        mixed_rule_state,
    )

    ctx = ctx_for(model, gbs=256, seq=4096, cluster=five_type_cluster())
    states = mixed_floor_states(ctx)
    templates = [st.template() for st in states]
    assert len(set(templates)) == len(templates)
    spare = sum(c.gpu.memory_bytes * c.count for c in ctx.classes)
    for st in states:
        assert st.template().fits_counts(ctx.classes)
        assert 0 < st.mixed_stages() <= ctx.model.num_layers
        assert may_fit(ctx, st, spare)
    graded = [st for st in states if len({a.tp for a in st.actions if a.kind == "mix"}) > 1]
    assert graded and any(len(st.actions) < len(ctx.classes) for st in states)
    # the one-tp-level rule over every class (with the most replicas) stays among the first two
    first = next(st for R in sorted(mix_replica_options(ctx.classes), reverse=True) if R
                 if (st := mixed_rule_state(ctx, R, 1)) is not None)
    assert first.template() in templates[:2]


@pytest.mark.slow
def test_a_graded_rule_over_the_classes_whose_nodes_hold_their_grade():
    """A slow type in one-GPU nodes cannot hold the tp its speed asks (RTX 4090: 8 against an H800); a graded rule
    over every class gives it many one-block stages. The graded rule over the classes whose nodes hold their grade
    leaves it out and runs the wide V100 node at tp 8, the fastest rule (Sailor's pipeline on seed109/rob-016)."""
    from arachne.planners.arachne.search.pricer import Pricer
    from arachne.planners.arachne.search.rules import mixed_floor_states

    cl = cluster_from_dict({"name": "g", "nodes": [
        {"name": "h{i}", "count": 1, "gpu": "H800", "gpus_per_node": 8},
        {"name": "l{i}", "count": 4, "gpu": "L40S", "gpus_per_node": 2},
        {"name": "r{i}", "count": 14, "gpu": "RTX-4090", "gpus_per_node": 1},
        {"name": "v{i}", "count": 1, "gpu": "V100-32", "gpus_per_node": 8}]})
    ctx = ctx_for("DeepSeek-MoE-16B", gbs=16, seq=3072, cluster=cl)
    assert [c.gpu.name for c in ctx.classes] == ["H800-SXM5-80GB", "L40S", "RTX-4090", "V100-SXM2-32GB"]
    pricer = Pricer(ctx)
    rules = mixed_floor_states(ctx)
    best = max(rules, key=lambda st: pricer.throughput(st.template()))
    assert [(a.kind, a.tp) for a in best.actions] == [("mix", 1), ("mix", 2), ("skip", 1), ("mix", 8)]
    with_rtx = max(pricer.throughput(st.template()) for st in rules
                   if len(st.actions) > 2 and st.actions[2].kind == "mix")
    assert pricer.throughput(best.template()) > 1.05 * with_rtx


def test_mix_proxy_prefers_leaving_a_class_on_a_crawling_network_out():
    from arachne.planners.arachne.search.rules import mix_guess, mixed_rule_state

    cl = cluster_from_dict({"name": "slow", "nodes": [
        {"name": "h{i}", "count": 4, "gpu": "H100", "gpus_per_node": 8},
        {"name": "t{i}", "count": 4, "gpu": "T4", "gpus_per_node": 8, "inter_node_gbps": 1}]})
    ctx = ctx_for("LLaMA-2-7B", gbs=256, seq=4096, cluster=cl)
    both = mixed_rule_state(ctx, 4, 1)
    assert both is not None and all(a.kind == "mix" for a in both.actions)
    fast_only = State(4, (both.actions[0], Action("skip")))
    assert mix_guess(ctx, fast_only, False)[0] > mix_guess(ctx, both, False)[0] > 0


def test_moe_mixed_rule_spreads_stages_over_the_node_with_experts_sharded():
    from arachne.planners.arachne.search.rules import (
        mixed_floor_states,
        mixed_rule_state,
    )

    ctx = ctx_for("Mixtral-8x7B", gbs=256, seq=4096, cluster=five_type_cluster())
    st = mixed_rule_state(ctx, 2, 1, j=2, experts=True)
    assert [(a.tp, a.dp, a.ep) for a in st.actions] == [(1, 8, 8), (1, 8, 8)]  # 8 experts over 8-GPU nodes
    assert all(a.stages * a.dp * a.tp * 2 <= c.count for a, c in zip(st.actions, ctx.classes))
    assert any(a.ep > 1 for s in mixed_floor_states(ctx) for a in s.actions if a.kind == "mix")
    dense = ctx_for("LLaMA-2-13B", gbs=256, seq=4096, cluster=five_type_cluster())
    assert all(a.dp == 1 for s in mixed_floor_states(dense) for a in s.actions)


def test_a_mixed_slot_pools_the_node_sizes_of_its_gpu_type():
    from arachne.planners.arachne.actions import kin_left, mix_replica_options

    ctx = ctx_for("OPT-350M", gbs=1024, seq=1024, cluster=split_type_cluster())
    a4, a1, t4 = ctx.classes
    assert a4.kin == a1.kin == ((0, 8, 4), (1, 6, 1)) and t4.kin == ((2, 16, 1),)
    assert 12 in mix_replica_options(ctx.classes)  # 14 A100s and 16 T4s can carry 12 replicas
    st = State(14)
    pooled = [a for a in class_actions(st, ctx.model, a4) if a.kind == "mix"]
    assert Action("mix", 1, 1, 1, 1, 14, pool=True) in pooled and all(a.pool for a in pooled)
    assert all(a.tp == 1 for a in pooled)  # single-GPU kin nodes take no tp 2 slots
    st = st.push(Action("mix", 1, 1, 1, 1, 14, pool=True))
    assert kin_left(st, a1) == {0: 0, 1: 0}
    assert class_actions(st, ctx.model, a1) == [Action("skip")]
    st = st.push(Action("skip")).push(Action("mix", 1, 1, 1, 1, 14))
    tpl = st.template()
    assert tpl.fits_counts(ctx.classes)
    devs = [d for rep in place(tpl, ctx)[0] for d in rep[0]]
    assert len(set(devs)) == 14 and sum(d.startswith("a") for d in devs) == 8
    assert price_template(tpl, ctx) is not None
    # without the pool the same slot does not fit; nor does a pooled one larger than the type
    assert not Template((Group((Slot(0, 1, 1, 1), Slot(2, 1, 1, 1)), 14),)).fits_counts(ctx.classes)
    assert not Template((Group((Slot(0, 1, 1, 1, True), Slot(2, 1, 1, 1)), 15),)).fits_counts(ctx.classes)


def test_replica_moves_reach_the_count_a_pooled_class_fills():
    from arachne.planners.arachne.search.refine import replica_moves

    ctx = ctx_for("OPT-350M", gbs=1024, seq=1024, cluster=split_type_cluster())
    st = State(12, (Action("mix", 1, 1, 1, 1, 12, pool=True), Action("own", 1, 1, 1, 2, 1),
                    Action("mix", 1, 1, 1, 1, 12)))
    assert [m.mix_replicas for m in replica_moves(ctx, st)] == [16, 8]  # a batch of 1024 shares evenly
    moves = {m.mix_replicas: m for m in replica_moves(ctx, st) + replica_moves(ctx, st, fill=True)}
    assert [m.mix_replicas for m in replica_moves(ctx, st, fill=True)] == [14]
    m = moves[14]
    assert m.actions == (Action("mix", 1, 1, 1, 1, 14, pool=True), Action("skip"), Action("mix", 1, 1, 1, 1, 14))
    assert m.template().fits_counts(ctx.classes)
    assert moves[8].actions[0] == Action("mix", 1, 1, 1, 1, 8)  # 8 replicas need no pool


@pytest.mark.slow
def test_mixed_rules_pool_a_split_gpu_type_and_try_the_count_it_fills():
    from arachne.planners.arachne.actions import type_fills
    from arachne.planners.arachne.search.pricer import Pricer
    from arachne.planners.arachne.search.rules import mixed_floor_states

    ctx = ctx_for("OPT-350M", gbs=1024, seq=1024, cluster=split_type_cluster())
    assert type_fills(ctx.classes) == [14]
    rules = mixed_floor_states(ctx)
    pricer = Pricer(ctx)
    best = max(rules, key=lambda st: pricer.throughput(st.template()))
    # 14 replicas of [A100 | T4]: the A100 stage from both node sizes; every unpooled rule is slower
    assert best.mix_replicas == 14 and best.actions[0].pool and best.actions[1].kind == "skip"
    unpooled = max(pricer.throughput(st.template()) for st in rules if not any(a.pool for a in st.actions))
    assert pricer.throughput(best.template()) > 1.05 * unpooled


def test_wide_rules_leave_out_the_classes_whose_nodes_are_too_narrow():
    """A small batch wants deep tp-8 stages: the rule over only the 8-GPU-node classes (V100 and T4 here,
    without the faster A100s in 4-GPU nodes) exists, and no fastest-j rule builds it."""
    from arachne.planners.arachne.search.rules import (
        mixed_floor_states,
        mixed_rule_state,
    )

    cl = cluster_from_dict({"name": "w", "nodes": [
        {"name": "a{i}", "count": 2, "gpu": "A100-80", "gpus_per_node": 4},
        {"name": "v{i}", "count": 3, "gpu": "V100-32", "gpus_per_node": 8},
        {"name": "t{i}", "count": 2, "gpu": "T4", "gpus_per_node": 8}]})
    ctx = ctx_for("LLaMA-2-7B", gbs=32, cluster=cl)
    assert [c.node_size for c in ctx.classes] == [4, 8, 8]

    def wide_tp8(st):
        if len(st.actions) != 3:
            return False
        a, v, t = st.actions
        return a.kind == "skip" and (v.kind, v.tp, t.kind, t.tp) == ("mix", 8, "mix", 8)

    st = mixed_rule_state(ctx, 1, 8, wide=True)
    assert st is not None and wide_tp8(st) and st.mixed_stages() == 5
    assert any(wide_tp8(s) for s in mixed_floor_states(ctx))
    assert not any(wide_tp8(s) for j in (2, 3) for tp in (1, 2, 4, 8) for g in (False, True)
                   if (s := mixed_rule_state(ctx, 1, tp, j, g)) is not None)


def test_tail_stages_hang_a_slow_node_off_a_fast_pipeline():
    """Refinement from a homogeneous pipeline of 8 one-GPU H800 stages can add a whole V100 node as one
    more stage (tp x dp inside the node): no dense rule builds a mixed slot with stage-level dp, and on
    this job the tail stage beats the H800 pipeline alone (Metis's plan on seed14/rob-022)."""
    from arachne.planners.arachne.search.pricer import Pricer
    from arachne.planners.arachne.search.refine import refine, tail_stages
    from arachne.planners.protocol import Deadline

    cl = cluster_from_dict({"name": "t", "nodes": [
        {"name": "h", "gpu": "H800", "inter_node_gbps": 100, "intra_node_gbps": 32},
        {"name": "v", "gpu": "V100-16", "inter_node_gbps": 12.5},
        {"name": "a{i}", "count": 2, "gpu": "A10", "gpus_per_node": 1}]})
    ctx = ctx_for("OPT-350", gbs=64, seq=512, cluster=cl)
    assert [c.gpu.name for c in ctx.classes] == ["H800-SXM5-80GB", "A10", "V100-SXM2-16GB"]
    own = State(0, (Action("own", 1, 1, 1, 8, 1), Action("skip"), Action("skip")))
    tails = tail_stages(ctx, own)
    assert [(a.kind, a.tp, a.dp, a.stages, a.replicas) for a in tails[-1].actions] == [
        ("mix", 1, 1, 8, 1), ("skip", 1, 1, 0, 0), ("mix", 2, 4, 1, 1)]
    assert len(tails) == 2 and all(t.mix_replicas == 1 for t in tails)
    assert tail_stages(ctx, tails[-1]) == []  # only from states without a mixed group
    pricer = Pricer(ctx)
    end = refine(ctx, pricer, own, Deadline(60))
    assert end.mix_replicas == 1 and end.actions[2].kind == "mix" and end.actions[2].dp > 1
    assert pricer.throughput(end.template()) > 1.02 * pricer.throughput(own.template())


def test_mixed_rules_also_leave_out_classes_on_a_much_slower_network():
    """GH200 nodes of 4 on 3 Gb/s come first in speed order, so every fastest-j rule mixes them in; the
    rule without them mixes the GH200 nodes of 2 (92 Gb/s) with the L40S nodes (seed17/rob-009)."""
    from arachne.planners.arachne.search.rules import (
        mixed_floor_states,
        mixed_rule_state,
        slow_network_classes,
    )

    cl = cluster_from_dict({"name": "n", "nodes": [
        {"name": "g4-{i}", "count": 4, "gpu": "GH200", "gpus_per_node": 4, "inter_node_gbps": 3.125},
        {"name": "g2-{i}", "count": 8, "gpu": "GH200", "gpus_per_node": 2, "inter_node_gbps": 92.5},
        {"name": "l-{i}", "count": 16, "gpu": "L40S", "gpus_per_node": 2, "inter_node_gbps": 25}]})
    ctx = ctx_for("LLaMA-2-7B", gbs=256, cluster=cl)
    assert [(c.gpu.name, c.node_size) for c in ctx.classes] == [("GH200-96GB", 4), ("GH200-96GB", 2), ("L40S", 2)]
    assert slow_network_classes(ctx.classes) == {0}

    def without_slow(st):
        return len(st.actions) == 3 and st.actions[0].kind == "skip" and all(
            a.kind == "mix" for a in st.actions[1:])

    assert any(without_slow(s) for s in mixed_floor_states(ctx))
    assert not any(without_slow(s) for R in (1, 2, 4, 8, 16) for tp in (1, 2) for j in (2, 3) for g in (False, True)
                   if (s := mixed_rule_state(ctx, R, tp, j, g)) is not None)


def test_deep_tail_when_too_few_slow_nodes_for_every_replica():
    """With two V100 nodes for four GH200 pipelines, every GH200 becomes one stage of a single pipeline
    and one V100 node (tp 8) its first stage: a small batch gains a stage and drops the gradient sync
    (Metis's plan at 60 s on seed10/rob-009). Its screen is loose, so it is priced from within 5%."""
    from arachne.planners.arachne.search.pricer import Pricer
    from arachne.planners.arachne.search.refine import refine, tail_stages
    from arachne.planners.protocol import Deadline

    cl = cluster_from_dict({"name": "t", "nodes": [
        {"name": "v{i}", "count": 2, "gpu": "V100-16", "gpus_per_node": 8, "inter_node_gbps": 12.5, "zone": "r0"},
        {"name": "a{i}", "count": 2, "gpu": "A10", "gpus_per_node": 4},
        {"name": "b", "gpu": "A10", "gpus_per_node": 8, "zone": "r1"},
        {"name": "g{i}", "count": 2, "gpu": "GH200", "gpus_per_node": 8, "zone": "r2"}]})
    ctx = ctx_for("LLAMA-3-8", gbs=16, seq=512, cluster=cl)
    assert [c.gpu.name for c in ctx.classes] == ["GH200-96GB", "A10", "A10", "V100-SXM2-16GB"]
    skip = Action("skip")
    own = State(0, (Action("own", 2, 1, 1, 2, 4), skip, skip, skip))
    assert tail_stages(ctx, own) == []  # no class has a node for each of the 4 replicas
    deep = tail_stages(ctx, own, deep=True)
    want = State(1, (Action("mix", 1, 1, 1, 16, 1), skip, skip, Action("mix", 8, 1, 1, 1, 1)))
    assert want in deep and all(t.mix_replicas == 1 for t in deep)
    pricer = Pricer(ctx)
    start = pricer.price_state(own)
    refine(ctx, pricer, own, Deadline(60))
    assert pricer.best()[2].tokens_per_s > 1.05 * start


def test_moe_rules_spread_experts_over_eight_tp2_groups_across_nodes():
    """Mixtral-8x22B on 17 MI300X nodes: Megatron's tp 2 x dp 64 x ep 8 (one stage) is 8 replicas of a
    stage of tp 2 x dp 8 x ep 8 over two nodes; the node-wide tp 1 rule alone needs two stages and is
    13% slower (seed22-b20/rob-027, where arachne was at 0.934x Megatron)."""
    from arachne.planners.arachne.search.pricer import Pricer
    from arachne.planners.arachne.search.rules import rule_own_actions

    cl = cluster_from_dict({"name": "m", "nodes": [{"name": "m{i}", "count": 17, "gpu": "MI300X"}]})
    ctx = ctx_for("Mixtral-8x22B", gbs=128, seq=8192, cluster=cl)
    acts = rule_own_actions(ctx, 0)
    megatron = Action("own", 2, 8, 8, 1, 8)
    assert megatron in acts and Action("own", 1, 8, 8, 2, 8) in acts
    pricer = Pricer(ctx)
    prices = {a: pricer.price_state(State(0, (a,))) for a in acts}
    assert max(prices, key=prices.get) == megatron
    assert prices[megatron] > 1.1 * prices[Action("own", 1, 8, 8, 2, 8)]
    assert all(a.tp * a.dp * a.stages * a.replicas <= 136 for a in acts)


def test_moe_rule_spreads_experts_over_eight_single_gpu_nodes():
    """64 single-GPU A100 nodes on a fast network: Megatron's one stage of dp 64 x ep 4 is 8 replicas of
    dp 8 x ep 4 across nodes; the tp 1 rule alone (no experts spread) is 11% slower (odd100/rob-017)."""
    from arachne.planners.arachne.search.pricer import Pricer
    from arachne.planners.arachne.search.rules import rule_own_actions

    cl = cluster_from_dict({"name": "ones", "nodes": [{"name": "a{i}", "count": 64, "gpu": "A100-80",
                                                       "gpus_per_node": 1, "inter_node_gbps": 200}]})
    ctx = ctx_for("Qwen1.5-MoE-A2.7B", gbs=2048, seq=512, cluster=cl)
    acts = rule_own_actions(ctx, 0)
    spread = Action("own", 1, 8, 4, 1, 8)
    assert spread in acts
    pricer = Pricer(ctx)
    prices = {a: pricer.price_state(State(0, (a,))) for a in acts}
    assert max(prices, key=prices.get) == spread
    assert prices[spread] > 1.1 * max(v for a, v in prices.items() if a.dp == 1)


def test_moe_rule_past_the_action_depths_runs_one_block_per_stage_with_experts_over_the_replicas():
    """DeepSeek-V3 (61 blocks) on 250 single-GPU H100 nodes fits at no depth of the action space (up to 32) with
    experts over 8 data-parallel groups: the rule goes on to two blocks and then one block per stage, with experts
    over the most data-parallel groups the class holds and recomputation, as Megatron's grid runs it (tp 1 x dp 4
    x ep 4 over 244 of them; fresh hold-out seed137/rob-026, where the class had no homogeneous rule at all and
    arachne reached 0.396x Megatron)."""
    from arachne.planners.arachne.search.pricer import Pricer
    from arachne.planners.arachne.search.rules import rule_own_actions

    cl = cluster_from_dict({"name": "ones", "nodes": [{"name": "h{i}", "count": 250, "gpu": "H100",
                                                       "gpus_per_node": 1, "inter_node_gbps": 50}]})
    ctx = ctx_for("DeepSeek-V3", gbs=1024, seq=8192, cluster=cl)
    acts = rule_own_actions(ctx, 0)
    deep = Action("own", 1, 4, 4, 61, 1)
    assert deep in acts and all(a.stages > 32 for a in acts if a.ep > 1)
    priced = Pricer(ctx)(State(0, (deep,)).template())
    assert priced is not None and priced[1].fits
    assert all(st.recompute for p in priced[0].pipelines for st in p.stages)


def test_floor_pairs_the_classes_that_do_best_alone_past_a_fast_type_on_a_slow_network():
    """L40S pairs on a 10 Gb/s network come first by speed, but the A800 and A100 nodes do more alone: the
    floor's data-parallel core then also holds those two together without the L40S, and it prices best."""
    from arachne.planners.arachne.search.pricer import Pricer
    from arachne.planners.arachne.search.rules import floor_states

    cl = cluster_from_dict({"name": "t", "nodes": [
        {"name": "l{i}", "count": 8, "gpu": "L40S", "gpus_per_node": 2, "inter_node_gbps": 10},
        {"name": "h{i}", "count": 2, "gpu": "A800-80", "gpus_per_node": 8, "inter_node_gbps": 100},
        {"name": "a{i}", "count": 4, "gpu": "A100-40", "gpus_per_node": 8, "inter_node_gbps": 100}]})
    best = {}
    for flag in (False, True):
        ctx = ctx_for("GPT-Neo-2.7B", gbs=256, seq=2048, cluster=cl)
        assert [c.gpu.name for c in ctx.classes][0] == "L40S"
        ctx.by_value_prefixes = flag
        pricer = Pricer(ctx)
        core, _ = floor_states(ctx, pricer, price=False)
        kinds = [tuple(a.kind for a in st.actions) for st in core]
        assert (("skip", "own", "own") in kinds) == flag
        best[flag] = max(pricer.price_state(st) for st in core)
    assert best[True] > 1.2 * best[False]


def test_a_batch_smaller_than_a_class_gets_one_stage_across_nodes_as_megatron_runs_it():
    """16 sequences on 32 A100 (4 nodes of 8): one stage of tp 2 x dp 16 (a sequence per group), past the
    policy's dp choices, is among the class's rule actions, and it completes to a fitting one-stage plan
    over all four nodes (odd113/rob-022: the Megatron grid's plan, 0.888x before the rule)."""
    from arachne.planners.arachne.search.rules import rule_own_actions

    cl = cluster_from_dict({"name": "t", "nodes": [
        {"name": "a{i}", "count": 4, "gpu": "A100-40", "gpus_per_node": 8, "inter_node_gbps": 100}]})
    for flag in (False, True):
        ctx = ctx_for("GPT-3-1.3B", gbs=16, seq=1024, cluster=cl)
        ctx.wide_small_batch = flag
        wide = [a for a in rule_own_actions(ctx, 0) if a.stages == 1 and a.dp == 16]
        assert bool(wide) == flag
    plan, est = price_template(State(0, (Action("own", 2, 16, 1, 1, 1),)).template(), ctx)
    validate_plan(plan, cl, ctx.model)
    (stage,) = [st for p in plan.pipelines for st in p.stages]
    assert est.fits and len(stage.devices) == 32 and stage.tp == 2 and stage.dp_size == 16


def test_the_wide_small_batch_rule_tries_every_tp():
    """32 sequences on 32 H20 (4 nodes of 8), OPT-30B: one stage of tp 4 x dp 8 is among the class's rule actions
    (the first rule tries only the least and the most tp; Megatron's grid found this one, seed35-rerun/rob-007)."""
    from arachne.planners.arachne.search.rules import rule_own_actions

    cl = cluster_from_dict({"name": "t", "nodes": [{"name": "h{i}", "count": 4, "gpu": "H20", "gpus_per_node": 8}]})
    ctx = ctx_for("OPT-30", gbs=32, seq=512, cluster=cl)
    acts = rule_own_actions(ctx, 0)
    assert Action("own", 4, 8, 1, 1, 1) in acts and len(acts) == len(set(acts))


@pytest.mark.slow
def test_a_gpu_type_split_across_node_sizes_is_pooled_into_identical_pipelines():
    """15 B200 in a node of 8 and a node of 7 (planned as parts 4, 2, 1): per class they make at most
    3 pipelines of 3 stages; pooled they make 5 pipelines of 3 over all 15, which beats data parallelism
    (a 7B model's whole gradient over every replica) and is what Sailor found (odd114/rob-010, 0.950x
    before the rule). The planner prices the pools once refinement is done."""
    from arachne.planners.arachne.search.pricer import Pricer
    from arachne.planners.arachne.search.rules import rule_pool, type_pool_states

    cl = cluster_from_dict({"name": "t", "nodes": [
        {"name": "b7", "count": 1, "gpu": "B200", "gpus_per_node": 7, "intra_node_gbps": 32},
        {"name": "b8", "count": 1, "gpu": "B200", "gpus_per_node": 8, "inter_node_gbps": 100}]})
    job = Job(global_batch_size=384, sequence_length=4096)
    for flag in (False, True):
        ctx = ctx_for("LLaMA-2-7B", gbs=384, seq=4096, cluster=cl)
        ctx.type_pools = flag
        assert bool(rule_pool(ctx, Pricer(ctx)).pools) == bool(flag)
    three = State(5, (Action("mix", 1, 1, 1, 3, 5, pool=True),) + (Action("skip"),) * (len(ctx.classes) - 1))
    assert three in type_pool_states(ctx, [Action("skip")] * len(ctx.classes))
    plan, est = price_template(three.template(), ctx)
    validate_plan(plan, cl, ctx.model)
    assert est.fits and len(plan.devices) == 15 and len(plan.pipelines) == 5
    got = {flag: run_planner("arachne", cl, ctx.model, job, CostModel(cl), SearchBudget(time_budget_s=30),
                             type_pools=flag, modern_knobs=False)[1].tokens_per_s for flag in (False, True)}
    # pooling wins by about 1.0% here (intra-node sends priced at NCCL's p2p share of the link)
    assert got[True] >= est.tokens_per_s > 1.005 * got[False]


@pytest.mark.slow
def test_the_mixed_rule_the_proxy_rates_best_is_screened_first():
    """Where the default pass screens 8 of 348 templates (seed35/rob-021), the mixed rule the throughput proxy
    rates best goes ahead of the ranker's order: 245,924 -> 278,805 tokens/s (0.983x -> 1.114x Sailor) with a
    batch of 256 under the cost model of 2026-12-02; since the MoE layer's measured traffic (2026-12-03) the
    rules' order decides it at a batch of 512: 189,218 -> 232,787 tokens/s."""
    cl = rob021_cluster()
    model, job = model_catalog().get("Qwen2-57B-A14B"), Job(global_batch_size=512, sequence_length=512)
    got = {k: run_planner("arachne", cl, model, job, CostModel(cl), SearchBudget(time_budget_s=30),
                          proxy_first=k, modern_knobs=False)[1].tokens_per_s for k in (0, 1)}
    assert got[1] >= 1.1 * got[0]


def test_speed_grade_is_the_power_of_two_nearest_the_peak_ratio():
    """Sailor's plan for DeepSeek-MoE-16B on H200 and A100-80 (fresh hold-out odd100-rerun/rob-028, 1.11x arachne's
    plan then) ran the A100 stages at tp 4 beside H200 stages at tp 1; the graded rule doubled tp per slower type."""
    from arachne.planners.arachne.search.rules import speed_grade
    from arachne.spec.gpus import gpu_catalog

    gpus = gpu_catalog()
    h200, h100, a100, v100 = (gpus.get(n) for n in ("H200", "H100", "A100-80", "V100-32"))
    assert speed_grade(h200, h100, "bf16") == 1  # the same compute
    assert speed_grade(h200, a100, "bf16") == 4  # 989 / 312 TFLOP/s
    assert speed_grade(h100, v100, "bf16") == 8  # 989 / 125
    assert speed_grade(a100, h100, "bf16") == 1  # never narrower than the fastest type's
    assert speed_grade(h100, a100, "fp8") == speed_grade(h100, a100, "bf16")  # the A100 has no fp8 rate


@pytest.mark.slow
def test_the_second_searchs_last_pass_builds_the_rules_at_the_replicas_their_whole_blocks_free():
    """96 blocks over 31 equal stages run at four blocks a stage, as 25 stages would: the second search's last
    pass (``whole_block_mix``) builds the rule at the replicas the freed GPUs make (5, a count the replica grid
    lacks), faster than every rule of the pool; the pool itself is the same with or without it (fresh hold-out
    seed200/rob-024's shape)."""
    from arachne.planners.arachne.search.pricer import Pricer
    from arachne.planners.arachne.search.rules import mix_guess, mixed_floor_states
    from arachne.planners.arachne.search.whole_blocks import finer_forms

    cl = cluster_from_dict({"name": "wb", "nodes": [
        {"name": "m{i}", "count": 122, "gpu": "MI300X", "gpus_per_node": 1},
        {"name": "v{i}", "count": 6, "gpu": "V100-16", "gpus_per_node": 8}]})
    pools = {}
    for whole in (False, True):
        ctx = ctx_for("GPT-3-175B", gbs=1024, seq=2048, cluster=cl)
        ctx.whole_block_mix = whole
        pools[whole] = mixed_floor_states(ctx)
        assert bool(ctx.mixed_rule_args) == whole
    assert [st.template() for st in pools[True]] == [st.template() for st in pools[False]]
    for st in pools[True]:
        fractional, blocks = mix_guess(ctx, st, False)[0], mix_guess(ctx, st, True)
        assert blocks[0] <= fractional * (1 + 1e-9) and blocks[1] >= ctx.model.num_layers
    finer = finer_forms(ctx)
    assert finer and {st.mix_replicas for st in finer} - {st.mix_replicas for st in pools[True]} == {5}
    pricer = Pricer(ctx)
    assert max(map(pricer.screen_state, finer)) > max(map(pricer.screen_state, pools[True]))
