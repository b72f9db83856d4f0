"""The MoE dispatch's cross-node bytes when a token is sent once per destination node (expert_comm.dedup_fraction)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arachne.cost.expert_comm import dedup_fraction as _dedup_fraction


def test_two_nodes_hand_computed():
    # 8 experts, top-2, 16 members on 2 nodes: the other node (4 experts) is hit with 1 - C(4,2)/C(8,2) = 22/28,
    # against one remote copy per token on average (2 copies x 8/16 remote)
    assert _dedup_fraction(8, 2, 16, (8, 8)) == pytest.approx(22 / 28)


def test_top1_routing_sends_the_same_bytes():
    assert _dedup_fraction(64, 1, 32, (8, 8, 8, 8)) == pytest.approx(1.0)


@settings(max_examples=60, deadline=None)
@given(nodes=st.integers(2, 8), per=st.sampled_from([1, 2, 4, 8]), k=st.integers(1, 8),
       experts_per_member=st.integers(1, 8))
def test_dedup_never_sends_more_and_saves_with_more_experts_per_node(nodes, per, k, experts_per_member):
    n = nodes * per
    E = n * experts_per_member
    f = _dedup_fraction(E, k, n, (per,) * nodes)
    assert 0 < f <= 1 + 1e-12
    # the exact expectation, written out: remote nodes hit per token over remote copies per token
    k2 = min(k, E)
    hit = 1 - math.comb(E - E * per // n, k2) / math.comb(E, k2)
    assert f == pytest.approx(min(1.0, (nodes - 1) * hit / (k2 * (n - per) / n)))
