"""What recomputation charges an MoE block's all-to-alls (issue 26, "cost model validated on published runs").

Megatron-Core's full recomputation (``--recompute-granularity full``) re-runs each checkpointed layer's whole
forward through its reentrant ``tensor_parallel.checkpoint`` / ``te_checkpoint`` (megatron/core/recompute.py), the
token dispatcher's dispatch and combine included; ``--recompute-modules moe`` re-runs the MoE layer alone and
``moe_act`` only the activation (megatron/core/transformer/moe/moe_layer.py). The cost model prices exactly that:
these tests pin it (docs/cost-model.md, "MoE all-to-all" and "Recomputed modules")."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arachne.cost import CostModel
from arachne.plan import Pipeline, Plan, Stage
from arachne.spec.cluster import cluster_from_dict

MODEL = "Qwen3-30B-A3B"
LAYERS = 48


def _cluster():
    return cluster_from_dict({"nodes": [{"name": "h{i}", "count": 2, "gpu": "H100"}]})


def _plan(ep: int, gpus: int, mbs: int, m: int, **stage) -> Plan:
    devs = tuple(f"h{i // 8}:{i % 8}" for i in range(gpus))
    return Plan(model=MODEL, global_batch_size=mbs * m, sequence_length=2048, micro_batch_size=mbs,
                pipelines=(Pipeline(micro_batches=m, stages=(
                    Stage(layers=(0, LAYERS), devices=devs, tp=1, dp=gpus, ep=ep, **stage),)),))


def _priced(cm: CostModel, plan: Plan) -> dict[str, float]:
    return dict(cm.estimate(plan).breakdown)


@settings(max_examples=25, deadline=None)
@given(ep=st.sampled_from([2, 4, 8]), nodes=st.sampled_from([1, 2]), mbs_per_gpu=st.sampled_from([1, 2]),
       m=st.integers(1, 4))
def test_full_recompute_repays_the_forward_dispatch_and_combine(ep, nodes, mbs_per_gpu, m):
    """Full recomputation: the backward pays each block's forward all-to-alls once more (ep_comm x 3/2) and
    ``recompute_s`` is exactly the forward compute plus those all-to-alls (``recompute_layers`` = every block: a
    version-2 plan, whose breakdown has ``recompute_s``)."""
    gpus = 8 * nodes
    cm = CostModel(_cluster())
    none = _priced(cm, _plan(ep, gpus, mbs_per_gpu * gpus, m))
    full = _priced(cm, _plan(ep, gpus, mbs_per_gpu * gpus, m, recompute=True, recompute_layers=LAYERS))
    assert none["ep_comm_s"] > 0
    assert full["ep_comm_s"] == pytest.approx(1.5 * none["ep_comm_s"], rel=1e-9)
    extra = (full["compute_s"] - none["compute_s"]) + (full["ep_comm_s"] - none["ep_comm_s"])
    assert full["recompute_s"] == pytest.approx(extra, rel=1e-9)


def test_selective_moe_repays_the_all_to_alls_and_moe_act_does_not():
    cm = CostModel(_cluster())
    base = _priced(cm, _plan(8, 8, 8, 2))
    moe = _priced(cm, _plan(8, 8, 8, 2, recompute="selective", recompute_modules=("moe",)))
    act = _priced(cm, _plan(8, 8, 8, 2, recompute="selective", recompute_modules=("moe_act",)))
    assert moe["ep_comm_s"] == pytest.approx(1.5 * base["ep_comm_s"], rel=1e-9)
    assert act["ep_comm_s"] == pytest.approx(base["ep_comm_s"], rel=1e-9)
    assert 0 < act["recompute_s"] < moe["recompute_s"]
