"""The cost model prices one TP group of each kind of a stage (``group_kinds``): on any layout it must give what
pricing every group gives."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from arachne.cost import CostModel
from arachne.cost import model as model_module
from arachne.cost.expert_comm import expert_a2a_ring
from arachne.cost.features import expert_tp
from arachne.cost.group_kinds import group_kinds
from arachne.plan import Stage, load_plan
from arachne.spec.cluster import cluster_from_dict

ROOT = Path(__file__).resolve().parents[2]
# Mixtral-8x7B: the plan-wide settings of a version-2 MoE plan, in bf16 (the A100s have no fp8 rate)
PLAN = load_plan(ROOT / "examples" / "v2" / "moe-ep-etp-fp8.json").model_copy(update={"precision": "bf16"})

# nodes of 4 GPUs in three classes: two NIC rates on H100, and A100
CLUSTER = cluster_from_dict({"name": "kinds", "nodes": [
    {"name": "h{i}", "count": 3, "gpu": "H100", "gpus_per_node": 4, "inter_node_gbps": 50},
    {"name": "s{i}", "count": 2, "gpu": "H100", "gpus_per_node": 4, "inter_node_gbps": 12.5},
    {"name": "a{i}", "count": 3, "gpu": "A100-80", "gpus_per_node": 4, "inter_node_gbps": 25}]})


def _every_group(cm: CostModel, stage: Stage, moe: bool, etp: int | None):
    """Every TP group with its all-to-all ring as the device-name rule gives it (no kinds)."""
    on = Counter(cm._dev_node[d] for d in stage.devices)
    out = []
    for gi in range(len(stage.groups())):
        if not moe:
            out.append((gi, (), 0))
        elif etp is not None:
            ring, conc = expert_a2a_ring(cm._dev_node, stage, gi * stage.tp, etp, on)
            out.append((gi, tuple(stage.devices.index(d) for d in ring), conc))
        else:
            out.append((gi, tuple((gi - gi % stage.ep + k) * stage.tp for k in range(stage.ep)), stage.tp))
    return tuple(out)


@st.composite
def stages(draw):
    tp, cp, ep = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2, 4]))
    etp = draw(st.sampled_from([None, 1, 2]))
    unit = tp * cp * ep * (etp or 1)
    assume(unit <= 32)
    n = unit * draw(st.integers(1, 32 // unit))
    devices = draw(st.permutations(sorted(CLUSTER.devices)))[:n]
    dp = n // (tp * cp)
    layers = draw(st.sampled_from([(0, 2), (3, 5)]))
    return Stage(layers=layers, devices=tuple(devices), tp=tp, cp=cp, dp=dp, ep=ep, etp=etp,
                 allow_cross_node_tp=True), draw(st.booleans())


@settings(max_examples=150, deadline=None)
@given(stages())
def test_one_group_of_each_kind_prices_as_every_group(drawn):
    stage, hide = drawn
    plan = PLAN.model_copy(update={"overlap_moe_comm": hide})
    mbs = stage.dp_size * 2
    fast = CostModel(CLUSTER)
    model = fast.resolve_model(plan)
    got = fast._stage(model, stage, True, False, mbs, plan)
    slow = CostModel(CLUSTER)
    et = expert_tp(stage)
    moe = bool(sum(model.moe_layers[slice(*stage.layers)])) and (et is not None or stage.ep > 1)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(model_module, "group_kinds", lambda *a: _every_group(slow, stage, moe, et))
        want = slow._stage(model, stage, True, False, mbs, plan)
    assert got == want


def test_identical_nodes_need_one_group_and_a_slow_node_its_own():
    ids = tuple(i // 4 for i in range(32))  # 8 nodes of 4, TP groups of 4: one per node
    assert [k[0] for k in group_kinds(ids, ("fast",) * 8, 4, 1, 1, None, False, 8)] == [0]
    slow = ("fast",) * 5 + ("slow",) + ("fast",) * 2
    assert [k[0] for k in group_kinds(ids, slow, 4, 1, 1, None, False, 8)] == [0, 5]
    # TP groups of 2 across the node boundary pattern: both halves of a node are alike
    assert [k[0] for k in group_kinds(ids, ("fast",) * 8, 2, 1, 1, None, False, 16)] == [0]


@pytest.mark.parametrize("etp", [None, 1])
def test_expert_rings_that_cross_more_nodes_are_their_own_kind(etp):
    ids = (0, 0, 0, 0, 1, 1, 2, 3)  # a stage with 4 devices on node 0, then one or two on others
    kinds = group_kinds(ids, ("c",) * 4, 1, 1, 4, etp, True, 8)
    # node 0's four share a ring; over nodes 1-3, a group on node 1 (4, 5), on node 2 (6), on node 3 (7)
    assert [k[0] for k in kinds] == [0, 4, 6, 7]


def test_rings_alike_but_sharing_busier_nodes_are_their_own_kind():
    """Rings over two nodes each, alike but for how many of the stage's devices their nodes hold (the rings that
    share a node's network): ring (0, 1) on nodes holding 3 and 2 of the stage's devices, (2, 3) on nodes
    holding one each, (6, 7) on nodes holding 2 and 1; (4, 5) on one node."""
    ids = (0, 1, 2, 3, 0, 0, 1, 4)
    kinds = group_kinds(ids, ("c",) * 5, 1, 1, 2, 1, True, 8)
    assert [(gi, conc) for gi, _, conc in kinds] == [(0, 3), (1, 3), (2, 1), (3, 1), (4, 1), (6, 2), (7, 2)]
