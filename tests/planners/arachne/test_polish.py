"""Stage-boundary polish (completion/polish.py): the moves it prices."""

from __future__ import annotations

from arachne.plan import plan_from_dict
from arachne.planners.arachne.completion.polish import split_neighbours

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
