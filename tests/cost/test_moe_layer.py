"""The MoE layer's implementation (``moe_kernels``) and overlapped expert all-to-alls (``overlap_moe_comm``):
priced from whole-layer measurements (``data/components/moe_layer.yaml``) and the 1F1B pairing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arachne.cost import CostModel
from arachne.cost.calibration import DEFAULT_CALIBRATION, MOE_LAYER_PASSES, MOE_OVERLAP_SM_SHARE
from arachne.cost.compute import ComputeModel
from arachne.cost.moe_layer import MOE_KERNELS, moe_extra_bytes
from arachne.errors import InputError
from arachne.plan import Plan, plan_from_dict
from arachne.runtime.export import megatron_export
from arachne.spec.cluster import load_cluster
from arachne.spec.model import load_model
from arachne.spec.runtimes import Legality, legality_errors

ROOT = Path(__file__).resolve().parents[2]
V2 = ROOT / "examples" / "v2"


@pytest.fixture(scope="module")
def h100():
    return load_cluster(V2 / "h100-2x8.yaml")


def _doc() -> dict:
    return json.loads((V2 / "moe-ep-etp-fp8.json").read_text())


def test_the_traffic_is_hand_computed():
    """Mixtral (8 experts, top 2, d 4096, n 14336, SwiGLU), 8192 tokens at tp 2, ep 4: outputs T k (2 n/tp + d),
    weights E/ep 3 d n/tp, two bytes each, times the grouped class's passes."""
    m = load_model("mixtral-8x7b")
    T, tp, ep = 8192, 2, 4
    out = T * 2 * (2 * 14336 / tp + 4096) * 2
    w = 8 / ep * 3 * 4096 * 14336 / tp * 2
    o_f, w_f, o_b, w_b = MOE_LAYER_PASSES["grouped"]
    f, b = moe_extra_bytes(m, T, tp, ep, None, 2)
    assert f == pytest.approx(o_f * out + w_f * w, rel=1e-12)
    assert b == pytest.approx(o_b * out + w_b * w, rel=1e-12)
    assert moe_extra_bytes(m, T, tp, ep, None, 2, "grouped") == (f, b)  # None reads grouped


def test_fused_kernels_are_cheaper_and_dense_blocks_ignore_the_choice(h100):
    cm = ComputeModel(None, DEFAULT_CALIBRATION.compute)
    gpu = h100.devices["h100-0:0"].gpu
    moe, dense = load_model("mixtral-8x7b"), load_model("llama-3-8b")
    g = cm.analytic_block(moe, gpu, "bf16", 4096, 2.0, 2, 4, True, moe_kernels="grouped")
    f = cm.analytic_block(moe, gpu, "bf16", 4096, 2.0, 2, 4, True, moe_kernels="fused")
    assert f[0] < g[0] and f[1] < g[1]
    assert cm.analytic_block(moe, gpu, "bf16", 4096, 2.0, 2, 4, True) == g
    assert cm.analytic_block(dense, gpu, "bf16", 4096, 2.0, 2, 1, False, moe_kernels="fused") == \
        cm.analytic_block(dense, gpu, "bf16", 4096, 2.0, 2, 1, False)


@settings(max_examples=40, deadline=None)
@given(tokens=st.integers(256, 65536), tp=st.sampled_from([1, 2, 4, 8]), ep=st.sampled_from([1, 2, 4, 8]),
       etp=st.sampled_from([None, 1, 2]), kernels=st.sampled_from(MOE_KERNELS))
def test_the_traffic_is_positive_and_linear_in_tokens_past_the_weights(tokens, tp, ep, etp, kernels):
    """More tokens never cost less, and doubling the tokens adds exactly the token part again."""
    m = load_model("mixtral-8x7b")
    one = moe_extra_bytes(m, tokens, tp, ep, etp, 2, kernels)
    two = moe_extra_bytes(m, 2 * tokens, tp, ep, etp, 2, kernels)
    four = moe_extra_bytes(m, 4 * tokens, tp, ep, etp, 2, kernels)
    for i in range(2):
        assert 0 < one[i] < two[i] < four[i]
        assert four[i] - two[i] == pytest.approx(2 * (two[i] - one[i]), rel=1e-9)


def test_the_plan_field_is_version_2_checked_and_priced_apart(h100):
    doc = _doc()
    with pytest.raises(InputError) as e:
        plan_from_dict(dict(doc, moe_kernels="sonic"))
    assert "moe_kernels" in str(e.value)
    v1 = json.loads((ROOT / "examples" / "plans" / "h100-a100-l4__mixtral-8x7b-ep.json").read_text())
    assert v1["format"] == "arachne-plan/1"
    for key, value in (("moe_kernels", "fused"), ("overlap_moe_comm", True)):
        with pytest.raises(InputError) as e:
            plan_from_dict(dict(v1, **{key: value}))
        assert str(e.value).startswith(f"{key}: a version-2 key")
    shared = CostModel(h100)
    times = {}
    for extra in ({}, {"moe_kernels": "fused"}, {"overlap_moe_comm": True}, {"moe_kernels": "grouped"}, {}):
        plan = Plan.model_validate(dict(doc, **extra))
        t = shared.estimate(plan).iteration_time_s
        assert t == CostModel(h100).estimate(plan).iteration_time_s, extra  # caches keyed by the choices
        times[json.dumps(extra)] = t
    assert times['{"moe_kernels": "fused"}'] < times["{}"] == times['{"moe_kernels": "grouped"}']
    assert times['{"overlap_moe_comm": true}'] < times["{}"]


def test_overlap_hides_the_all_to_alls_behind_the_other_pass(h100):
    """Each stage's forward all-to-alls hide under its backward compute and the other way round (the compute
    under them slowed by the dispatcher's SMs), never below zero: ep_comm falls, compute stays."""
    doc = _doc()
    plain = CostModel(h100).estimate(Plan.model_validate(doc))
    over = CostModel(h100).estimate(Plan.model_validate(dict(doc, overlap_moe_comm=True)))
    assert plain.breakdown["ep_comm_s"] > 0
    assert 0 <= over.breakdown["ep_comm_s"] < plain.breakdown["ep_comm_s"]
    # here every all-to-all is shorter than the other pass's compute: what stays is that compute slowed by the
    # dispatcher's SMs over the all-to-all's length
    share = MOE_OVERLAP_SM_SHARE / (1 - MOE_OVERLAP_SM_SHARE)
    assert over.breakdown["ep_comm_s"] == pytest.approx(share * plain.breakdown["ep_comm_s"], rel=1e-9)
    assert over.breakdown["compute_s"] == pytest.approx(plain.breakdown["compute_s"], rel=1e-12)
    for a, b in zip(plain.stages, over.stages):
        assert b.fwd_s <= a.fwd_s and b.bwd_s <= a.bwd_s


def test_runtimes_and_export_follow_the_fields():
    plan = Plan.model_validate(dict(_doc(), overlap_moe_comm=True))
    assert not [e for e in legality_errors(plan, Legality.of("megatron")) if e[0] == "overlap_moe_comm"]
    (err,) = [e for e in legality_errors(plan, Legality.of("torchtitan")) if e[0] == "overlap_moe_comm"]
    assert "does not execute" in err[1]
    fused = Plan.model_validate(dict(_doc(), moe_kernels="fused"))
    assert [e for e in legality_errors(fused, Legality.of("megatron")) if e[0] == "moe_kernels"]
    model = load_model("mixtral-8x7b")
    args = megatron_export(plan, model).args
    assert "--overlap-moe-expert-parallel-comm" in args and "--delay-wgrad-compute" in args
    assert any("moe_kernels fused" in r for r in megatron_export(fused, model).reasons)


def test_the_pairing_holds_one_more_forward():
    """``overlap_moe_comm`` pairs a forward with another micro-batch's backward: one more micro-batch at a
    pipelined stage's peak (one more chunk in the interleaved warm-up), one more block without pipelining, and
    nothing more with a single micro-batch or on a dense model (:func:`pairs_micro_batches`)."""
    from arachne.cost.schedule import in_flight, interleaved_in_flight, pairs_micro_batches

    assert in_flight(0, 4, 32, "1f1b", True) == 5 and in_flight(3, 4, 32, "1f1b", True) == 2
    assert in_flight(0, 4, 4, "1f1b", True) == 4  # never more than the micro-batches there are
    assert in_flight(0, 1, 8, "1f1b", True, blocks=16) == pytest.approx(1 + 1 / 16)
    assert in_flight(0, 1, 1, "1f1b", True, blocks=16) == 1 == in_flight(0, 1, 8, "1f1b")
    for s in range(4):
        plain, more = interleaved_in_flight(s, 4, 2, 16), interleaved_in_flight(s, 4, 2, 16, True)
        assert sum(more) == sum(plain) + 1
    plan = Plan.model_validate(dict(_doc(), overlap_moe_comm=True))
    assert pairs_micro_batches(load_model("mixtral-8x7b"), plan) and not pairs_micro_batches(load_model("llama-3-8b"), plan)
    assert not pairs_micro_batches(load_model("mixtral-8x7b"), Plan.model_validate(_doc()))


def test_the_pairing_costs_activation_memory(h100):
    """The same plan with ``overlap_moe_comm``: the same weights, more activations on every stage (a two-stage
    pipeline: one more micro-batch on each), so a plan that ran close to the limit may no longer fit."""
    doc = dict(_doc(), precision="bf16")
    plain = CostModel(h100).estimate(Plan.model_validate(doc))
    over = CostModel(h100).estimate(Plan.model_validate(dict(doc, overlap_moe_comm=True)))
    for d, m in plain.memory_detail.items():
        o = over.memory_detail[d]
        assert o.weights == m.weights and o.optimizer == m.optimizer
        assert o.activations > m.activations
    first = next(iter(plain.memory_detail))  # stage 0 of 2 holds 2 micro-batches, 3 when paired
    assert over.memory_detail[first].activations == pytest.approx(1.5 * plain.memory_detail[first].activations)


def test_megatron_runs_the_pairing_only_where_megatron_core_does():
    """The megatron runtime's rules for ``overlap_moe_comm`` (Megatron-Bridge v0.3.0's checks): ep > 1, an
    interleaved pipeline with pp > 1, no full or partial recomputation; export refuses the rest."""
    from arachne.spec.runtimes import moe_overlap_errors

    base = dict(_doc(), overlap_moe_comm=True)
    errs = moe_overlap_errors(Plan.model_validate(base), "megatron")
    assert [f for f, _ in errs] == ["pipelines[0].virtual_stages"]
    inter = json.loads(json.dumps(base))
    inter["pipelines"][0]["virtual_stages"] = 2
    for si, st_ in enumerate(inter["pipelines"][0]["stages"]):
        st_["layers"] = [[8 * si, 8 * si + 8], [16 + 8 * si, 24 + 8 * si]]
    assert moe_overlap_errors(Plan.model_validate(inter), "megatron") == []
    for rec in (True, "selective"):
        d = json.loads(json.dumps(inter))
        for st_ in d["pipelines"][0]["stages"]:
            st_["recompute"] = rec
        errs = moe_overlap_errors(Plan.model_validate(d), "megatron")
        assert (errs == []) == (rec == "selective")
    no_ep = json.loads(json.dumps(inter))
    for st_ in no_ep["pipelines"][0]["stages"]:
        st_["ep"], st_["etp"] = 1, None
    assert [f for f, _ in moe_overlap_errors(Plan.model_validate(no_ep), "megatron")] == ["overlap_moe_comm"]
    assert any(f == "pipelines[0].virtual_stages" for f, _ in legality_errors(Plan.model_validate(base),
                                                                               Legality.of("megatron")))
