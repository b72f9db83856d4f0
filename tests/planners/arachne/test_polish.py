"""Stage-boundary polish (completion/polish.py): the moves it prices; the final winner's polish (planner.py)."""

from __future__ import annotations

from arachne.cost import CostModel
from arachne.plan import plan_from_dict, validate_plan
from arachne.planners.arachne.completion.polish import polish_splits, split_neighbours
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
