"""The baselines' building blocks against the behaviour docs/baselines.md describes."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from arachne.plan import Pipeline, Plan, Stage, plan_errors
from arachne.planners.baselines.common import (
    divisors,
    even_split,
    expert_parallel_postpass,
    ext_cuts_to_blocks,
    merge_aligned_pipelines,
    minmax_partition,
    uniform_subcluster,
)
from arachne.planners.baselines.flashflex import (
    chain_parts,
    gpipe_steps,
    kway_partition,
)
from arachne.planners.baselines.metis import (
    compute_balance,
    device_group_sequences,
    permutation_units,
    rebalance_shares,
)
from arachne.planners.baselines.sailor import (
    compositions,
    dp_candidates,
    uniform_ext_split,
)
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.model import load_model


# ---- extended layer list (§1) -------------------------------------------------------------------------
def test_ext_cuts_map_back_to_blocks_and_forbid_lonely_ends() -> None:
    assert ext_cuts_to_blocks([0, 3, 8], 6) == [(0, 2), (2, 6)]
    assert ext_cuts_to_blocks([0, 3, 5, 8], 6) == [(0, 2), (2, 4), (4, 6)]
    assert ext_cuts_to_blocks([0, 1, 8], 6) is None       # embedding alone
    assert ext_cuts_to_blocks([0, 3, 7, 8], 6) is None    # head alone


def test_minmax_partition_is_optimal() -> None:
    rng = random.Random(1)
    for _ in range(200):
        n = rng.randint(4, 9)
        costs = [rng.random() for _ in range(n)]
        parts = rng.randint(1, n - 2)
        cuts = minmax_partition(costs, parts)
        brute = None
        for inner in itertools.combinations(range(1, n), parts - 1):
            c = [0, *inner, n]
            if parts > 1 and (c[1] < 2 or n - c[-2] < 2):
                continue
            v = max(sum(costs[a:b]) for a, b in zip(c, c[1:]))
            brute = v if brute is None else min(brute, v)
        assert cuts is not None and len(cuts) == parts + 1
        got = max(sum(costs[a:b]) for a, b in zip(cuts, cuts[1:]))
        assert got == pytest.approx(brute)


def test_even_split_and_divisors() -> None:
    assert even_split(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert even_split(10, 3, extra_last=True) == [(0, 3), (3, 6), (6, 10)]
    assert divisors(12) == [1, 2, 3, 4, 6, 12]


def test_uniform_subcluster_keeps_the_largest_node_size_class() -> None:
    c = cluster_from_dict({"name": "x", "nodes": [
        {"name": "a{i}", "count": 2, "gpu": "A100-40", "gpus_per_node": 8},
        {"name": "b{i}", "count": 3, "gpu": "L4", "gpus_per_node": 4}]})
    sub, note = uniform_subcluster(c)
    assert {n.name for n in sub.nodes} == {"a0", "a1"} and "12 GPUs" in note
    same, none = uniform_subcluster(sub)
    assert same is sub and none is None


# ---- Metis (§4) ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n,variance,k,expected", [(16, 0.5, 4, 254), (16, 0.5, 10, 3595), (32, 0.5, 4, 2154),
                                                   (16, 1.0, 4, 146)])
def test_device_group_counts_match_the_measured_table(n: int, variance: float, k: int, expected: int) -> None:
    total = sum(sum(1 for _ in device_group_sequences(n, s, variance, k)) for s in range(1, n + 1))
    assert total == expected


def test_permutation_units_example() -> None:
    assert permutation_units([1, 1, 1, 1, 1, 1, 2], 6) == [(1, 1), (1, 1), (1, 1), (2,)]


def test_device_groups_are_powers_of_two_summing_to_n() -> None:
    for seq in device_group_sequences(12, 3, 0.5, 4):
        assert sum(seq) == 12 and all(g & (g - 1) == 0 for g in seq)


def test_compute_balance_follows_shares() -> None:
    w = [1 / 26] * 26
    counts = compute_balance([0.75, 0.25], w)
    assert sum(counts) == 26 and counts[0] > counts[1] >= 1
    assert abs(counts[0] / 26 - 0.75) < 0.1


def test_rebalance_moves_share_away_from_the_oom_stage() -> None:
    new = rebalance_shares([0.5, 0.5], caps=[10.0, 40.0], demands=[20.0, 10.0])
    assert new is not None and new[0] < 0.5 < new[1]
    assert rebalance_shares([0.5, 0.5], caps=[10.0, 10.0], demands=[20.0, 20.0]) is None


# ---- Sailor (§6) -------------------------------------------------------------------------------------------------
def test_sailor_uniform_split_gives_extras_to_the_last_stages() -> None:
    assert uniform_ext_split(24, 4) == [(0, 5), (5, 11), (11, 18), (18, 24)]   # 26 = 6+6+7+7
    assert uniform_ext_split(24, 20) is None             # the first stage would be the embedding alone


def test_dp_candidates_only_where_micro_batch_count_changes() -> None:
    cands = dp_candidates(64, 4, 16)
    assert cands == sorted(cands, reverse=True)
    counts = [-(-64 // (4 * d)) for d in cands]
    assert len(set(counts)) == len(counts)
    assert cands[0] == 16


def test_compositions() -> None:
    got = list(compositions(3, [2, 5]))
    assert got == [(2, 1), (1, 2), (0, 3)]
    assert all(sum(c) == 4 for c in compositions(4, [4, 4, 4]))


# ---- FlashFlex (§5) ------------------------------------------------------------------------------------------------
def test_kway_partition_balances_and_cuts_the_cheap_edges() -> None:
    # two 4-GPU machines: fast edges inside, slow between; bandwidth weights keep machines together
    n = 8
    W = np.full((n, n), 1.0)
    for m in (range(4), range(4, 8)):
        for i in m:
            for j in m:
                W[i, j] = 100.0
    np.fill_diagonal(W, 0)
    parts = kway_partition(W, np.ones(n), 2, np.random.default_rng(0))
    assert sorted(map(sorted, parts)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    inv = np.where(W > 0, 1 / np.where(W > 0, W, 1), 0)
    striped = kway_partition(inv, np.ones(n), 4, np.random.default_rng(0))
    assert all(len(p) == 2 and (p[0] < 4) != (p[1] < 4) for p in striped)   # one GPU of each machine


def test_chain_parts_intended_vs_reference() -> None:
    w = np.array([[0, 9, 1], [9, 0, 5], [1, 5, 0]], dtype=float)
    assert chain_parts(w, 3, faithful=False) in ([0, 1, 2], [2, 1, 0])
    assert chain_parts(w, 3, faithful=True) != chain_parts(w, 3, faithful=False)


def test_gpipe_steps() -> None:
    assert gpipe_steps([1.0, 1.0, 1.0], 4) == pytest.approx(6.0)
    assert gpipe_steps([1.0, 3.0], 2) == pytest.approx(1 + 3 + 3)


@pytest.mark.parametrize("seed", range(20))
def test_gpipe_steps_in_closed_form_equals_the_step_by_step_count(seed) -> None:
    """Each of the m+S-1 steps takes its slowest active stage; the closed form (fill, full steps, drain)
    gives the same total without a loop over the micro-batches."""
    rng = random.Random(seed)
    compute = [rng.uniform(0.1, 5.0) for _ in range(rng.randint(1, 9))]
    m = rng.randint(1, 30)
    S = len(compute)
    steps = sum(max(compute[max(0, t - m + 1):min(S - 1, t) + 1]) for t in range(m + S - 1))
    assert gpipe_steps(compute, m) == pytest.approx(steps, rel=1e-12)


# ---- EP post-pass ------------------------------------------------------------------------------------------------------
def test_merge_aligned_pipelines_and_ep_postpass() -> None:
    c = cluster_from_dict({"name": "x", "nodes": [{"name": "h", "gpu": "H100", "gpus_per_node": 8}]})
    model = load_model("Mixtral-8x7B")
    pipes = tuple(Pipeline(micro_batches=4, stages=(Stage(layers=(0, 16), devices=(f"h:{2 * k}",)),
                                                    Stage(layers=(16, 32), devices=(f"h:{2 * k + 1}",))))
                  for k in range(4))
    plan = Plan(model="Mixtral-8x7B", global_batch_size=32, sequence_length=1024, micro_batch_size=2,
                pipelines=pipes)
    merged = merge_aligned_pipelines(plan)
    assert len(merged.pipelines) == 1 and merged.micro_batch_size == 8
    assert [s.dp_size for s in merged.pipelines[0].stages] == [4, 4]
    ep = expert_parallel_postpass(plan, model)
    assert [s.ep for s in ep.pipelines[0].stages] == [4, 4]
    assert plan_errors(ep, c, model) == []
