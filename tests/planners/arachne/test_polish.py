"""Stage-boundary polish (completion/polish.py): the moves it prices; the final winner's polish (planner.py)."""

from __future__ import annotations

import pytest

from arachne.cost import CostModel
from arachne.plan import plan_from_dict, validate_plan
from arachne.planners.arachne.completion.polish import polish_splits, split_neighbours, type_led
from arachne.planners.arachne.planner import ArachnePlanner
from arachne.planners.protocol import Deadline
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.model import model_catalog

MODEL = {"name": "polish-tiny", "num_layers": 12, "hidden_size": 256, "ffn_hidden_size": 1024,
         "num_attention_heads": 8, "vocab_size": 2048, "max_sequence_length": 128}


def plan(bounds):
    edges = [0, *bounds, 12]
    return plan_from_dict({"format": "arachne-plan/1", "model": MODEL, "global_batch_size": 8, "sequence_length": 128,
                           "micro_batch_size": 1, "pipelines": [{"micro_batches": 8, "stages": [
                               {"layers": [a, b], "devices": [f"n0:{i}"]} for i, (a, b) in
                               enumerate(zip(edges, edges[1:]))]}]}, "test")


def splits(plans):
    return [tuple(s.layers[0] for s in p.pipelines[0].stages[1:]) for p in plans]


def test_one_layer_off_the_last_stage_to_each_earlier_stage():
    got = splits(split_neighbours(plan([2, 5, 7, 9]), radius=1, limit=1000))
    # the boundary moves (one, or two neighbours together) and then the last stage unloaded into stage 1 and 0
    assert (3, 6, 8, 10) in got and (2, 6, 8, 10) in got
    assert got.index((2, 6, 8, 10)) > got.index((2, 5, 8, 9))  # after the neighbour moves
    assert len(got) == len(set(got))  # no move twice (the last two boundaries are the neighbour moves')


def test_the_limit_bounds_the_neighbour_moves_not_the_last_stage_moves():
    got = splits(split_neighbours(plan([2, 5, 7, 9]), radius=1, limit=3))
    assert len(got) == 3 + 2 and got[-2:] == [(2, 6, 8, 10), (3, 6, 8, 10)]


def test_no_move_empties_a_stage():
    for p in split_neighbours(plan([1, 2, 3, 11]), radius=1, limit=1000):
        assert all(s.layers[1] > s.layers[0] for s in p.pipelines[0].stages)


def test_a_moved_boundary_keeps_first_k_recomputation_only_while_k_is_fewer_than_the_stages_blocks():
    base = plan([3, 6, 9])
    first, *rest = base.pipelines[0].stages
    first = first.model_copy(update={"recompute": True, "recompute_layers": 2})
    p = base.model_copy(update={"pipelines": (base.pipelines[0].model_copy(update={"stages": (first, *rest)}),)})
    sizes = set()
    for q in split_neighbours(p, radius=1, limit=1000):
        s0 = q.pipelines[0].stages[0]
        n = s0.layers[1] - s0.layers[0]
        sizes.add(n)
        assert s0.recompute_layers == (2 if n > 2 else None)  # 2 of 2 blocks: every block, as without k
    assert {2, 4} <= sizes


def _overlapped_pipelines(cut: int):
    """8 pipelines of two one-GPU stages (OPT-350M, blocks split at ``cut``) on two B200 nodes behind slow NICs,
    one micro-batch each, the gradient reduction overlapped (as the seeds' and the knobs' plans run)."""
    cl = cluster_from_dict({"name": "b", "nodes": [{"name": "b{i}", "count": 2, "gpu": "B200", "gpus_per_node": 8,
                                                     "inter_node_gbps": 25.0}]})
    devs = [f"b{n}:{g}" for n in range(2) for g in range(8)]
    pipes = [{"micro_batches": 1, "stages": [{"layers": [0, cut], "devices": [devs[2 * r]]},
                                             {"layers": [cut, 24], "devices": [devs[2 * r + 1]]}]} for r in range(8)]
    p = plan_from_dict({"format": "arachne-plan/2", "model": "OPT-350M", "global_batch_size": 32,
                        "sequence_length": 1024, "micro_batch_size": 4, "zero_stage": 1, "overlap_grad_reduce": True,
                        "overlap_param_gather": True, "pipelines": pipes}, "test")
    return cl, p


def test_the_final_winner_has_its_stage_boundaries_moved_as_it_runs_overlapped():
    """The split balances compute; overlapped, the first stage's backward ends last and its gradients' reduction
    is what stays exposed, so a smaller first stage is faster (re-run odd102-rerun/rob-006: OPT-350M on 256 B200,
    arachne's 13/11 blocks 0.976x Megatron's even 12/12, 11/13 1.025x). The polish runs after the knobs, on the
    planner's best plan, within the runtime's rules."""
    cl, p13 = _overlapped_pipelines(13)
    cm = CostModel(cl)
    e13 = cm.estimate(p13)
    assert cm.estimate(_overlapped_pipelines(11)[1]).tokens_per_s > e13.tokens_per_s
    ((better, est),) = ArachnePlanner()._polish_final([(p13, e13)], cm, Deadline(10.0))
    assert est.tokens_per_s > e13.tokens_per_s and better.pipelines[0].stages[0].layers[1] < 13
    validate_plan(better, cl, model_catalog().get("OPT-350M"))
    # a runtime's rules bound the moves
    kept, _ = polish_splits(p13, e13, cm, ok=lambda q: q.pipelines[0].stages[0].layers[1] >= 12)
    assert kept.pipelines[0].stages[0].layers == (0, 12)
    # the fastest plan already balanced: nothing
    assert ArachnePlanner()._polish_final([(better, est)], cm, Deadline(10.0)) == []


ROB006 = {"name": "rob-006", "nodes": [
    {"name": "t4-x1-{i}", "count": 26, "gpu": "T4", "gpus_per_node": 1, "inter_node_gbps": 100, "zone": "row-0"},
    {"name": "h100-x8-{i}", "count": 11, "gpu": "H100", "gpus_per_node": 8, "inter_node_gbps": 50},
    {"name": "rtx-2080-ti-x2-{i}", "count": 14, "gpu": "RTX-2080-Ti", "gpus_per_node": 2},
    {"name": "rtx-2080-ti-x8-{i}", "count": 4, "gpu": "RTX-2080-Ti", "gpus_per_node": 8},
    {"name": "a100-80-x4-{i}", "count": 4, "gpu": "A100-80", "gpus_per_node": 4, "inter_node_gbps": 3.125},
    {"name": "a100-80-x8-{i}", "count": 2, "gpu": "A100-80", "gpus_per_node": 8},
    {"name": "gh200-x1-{i}", "count": 48, "gpu": "GH200", "gpus_per_node": 1},
    {"name": "gh200-x8-{i}", "count": 6, "gpu": "GH200", "gpus_per_node": 8, "inter_node_gbps": 100}]}
"""Fresh hold-out seed135/rob-006: 414 GPUs of six types."""


def _h100_led(bounds=(3, 7, 12, 16, 20, 24, 28)):
    """The arachne planner's plan on seed135/rob-006 before the type-led polish: LLaMA-2-7B, a batch of 32 x 4,096,
    four pipelines of five tp-4 stages on H100 nodes, then three on GH200 nodes."""
    edges = [0, *bounds, 32]
    pipes = []
    for r in range(4):
        nodes = [f"h100-x8-{2 * j + r // 2}" for j in range(5)] + [f"gh200-x8-{2 * j + r // 2}" for j in range(3)]
        pipes.append({"micro_batches": 8, "stages": [
            {"layers": [a, b], "tp": 4, "sequence_parallel": True,
             "devices": [f"{n}:{4 * (r % 2) + g}" for g in range(4)]} for n, a, b in zip(nodes, edges, edges[1:])]})
    return plan_from_dict({"format": "arachne-plan/2", "model": "LLaMA-2-7B", "global_batch_size": 32,
                           "sequence_length": 4096, "micro_batch_size": 1, "zero_stage": 1,
                           "overlap_grad_reduce": True, "overlap_param_gather": True, "pipelines": pipes}, "test")


def test_each_other_gpu_type_leads_with_its_stages_as_they_are():
    cl = cluster_from_dict(ROB006)
    p = _h100_led()
    (led,) = type_led(p, lambda d: cl.devices[d].gpu.name)
    validate_plan(led, cl, model_catalog().get("LLaMA-2-7B"))
    for before, after in zip(p.pipelines, led.pipelines):
        assert [s.devices for s in after.stages] == [s.devices for s in before.stages[5:] + before.stages[:5]]
        assert [s.layers for s in after.stages] == [(0, 4), (4, 8), (8, 12), (12, 15), (15, 19), (19, 24),
                                                    (24, 28), (28, 32)]  # each stage keeps its block count
        assert all(s.tp == 4 and s.sequence_parallel for s in after.stages)
    assert type_led(plan([3, 6, 9]), lambda d: "one type") == []


@pytest.mark.slow
def test_the_final_polish_also_polishes_each_other_gpu_type_leading():
    """seed135/rob-006: the planner's plan led by its H100 stages, polished, was 0.974x Megatron's grid over the
    same nodes (``megatron-oblivious``: 8 stages of tp 4 x dp 4, the GH200 nodes first, 349,051 tokens/s); led by
    the GH200 stages it is slower until the boundaries follow (polished, it passes it)."""
    cl = cluster_from_dict(ROB006)
    cm = CostModel(cl)
    p = _h100_led()
    e = cm.estimate(p)
    assert e.tokens_per_s < 0.98 * 349_051
    assert polish_splits(p, e, cm)[1].tokens_per_s < 349_051  # the boundaries alone do not get there
    (led,) = type_led(p, lambda d: cl.devices[d].gpu.name)
    assert cm.estimate(led).tokens_per_s < e.tokens_per_s  # nor the lead alone
    ((better, est),) = ArachnePlanner()._polish_final([(p, e)], cm, Deadline(10.0))
    assert est.tokens_per_s > 349_051
    assert better.pipelines[0].stages[0].devices[0].startswith("gh200")
    validate_plan(better, cl, model_catalog().get("LLaMA-2-7B"))
