"""Pricing of the optional memory settings of an ``arachne-plan/2`` plan (issue 26, "a plan that ran in production
must fit"): ``recompute_modules`` (memory and time), ``fp8_params``, ``master_weights``, ``optimizer_state_dtype``
and ``loss``. Absent, every plan prices exactly as before they existed; set to their defaults, exactly the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from arachne.cost import CostModel
from arachne.cost.calibration import DEFAULT_CALIBRATION
from arachne.cost.compute import act_bytes
from arachne.cost.features import block_acts_v2
from arachne.cost.memory import head_transient_bytes
from arachne.cost.recompute import dropped_bytes, separate_norms
from arachne.plan import plan_from_dict
from arachne.spec.cluster import load_cluster
from arachne.spec.model import load_model

ROOT = Path(__file__).resolve().parents[2]
V2 = ROOT / "examples" / "v2"
CAL = DEFAULT_CALIBRATION.memory


@pytest.fixture(scope="module")
def h100():
    return load_cluster(V2 / "h100-2x8.yaml")


def _doc(name: str) -> dict:
    return json.loads((V2 / name).read_text())


def _est(cluster, doc: dict):
    return CostModel(cluster).estimate(plan_from_dict(doc))


def _mem(est) -> list:
    return [m for _, m in sorted(est.memory_detail.items())]


@pytest.mark.parametrize("name", ["interleaved-sp-selective.json", "moe-ep-etp-fp8.json", "cp-zero3.json"])
def test_defaults_spelled_out_price_bit_identically(h100, name):
    doc = _doc(name)
    base = _est(h100, doc)
    spelled = dict(doc, fp8_params=False, master_weights="fp32", optimizer_state_dtype="fp32", loss="standard")
    same = _est(h100, spelled)
    assert same.iteration_time_s == base.iteration_time_s
    assert same.max_memory_bytes == base.max_memory_bytes
    assert [m.total for m in _mem(same)] == [m.total for m in _mem(base)]
    assert plan_from_dict(doc).to_doc() == plan_from_dict(json.loads(json.dumps(doc))).to_doc()
    for key in ("fp8_params", "master_weights", "optimizer_state_dtype", "loss"):
        assert key not in plan_from_dict(doc).to_doc()


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_core_attn_alone_is_the_default_selective(h100, precision):
    """``recompute_modules: [core_attn]`` is what ``recompute: selective`` always meant: same memory (fp32: the
    score matrix dropped), and the same recomputation time up to summation order."""
    doc = dict(_doc("interleaved-sp-selective.json"), precision=precision)
    base = _est(h100, doc)
    for p in doc["pipelines"]:
        for st in p["stages"]:
            st["recompute_modules"] = ["core_attn"]
    est = _est(h100, doc)
    assert [m.total for m in _mem(est)] == [m.total for m in _mem(base)]
    assert est.iteration_time_s == pytest.approx(base.iteration_time_s, rel=1e-12)
    assert est.breakdown["recompute_s"] == pytest.approx(base.breakdown["recompute_s"], rel=1e-12)


def test_no_modules_recomputes_nothing(h100):
    doc = _doc("interleaved-sp-selective.json")
    for p in doc["pipelines"]:
        for st in p["stages"]:
            st["recompute_modules"] = []
    est = _est(h100, doc)
    assert est.breakdown["recompute_s"] == 0.0
    assert est.iteration_time_s < _est(h100, _doc("interleaved-sp-selective.json")).iteration_time_s


def test_moe_act_drops_the_routed_fc2_input():
    """Per MoE block and token: ``k`` experts' fc2 inputs of ``expert_ffn`` elements, 2 bytes, split over tp."""
    m = load_model("mixtral-8x7b", "", "model")
    seq, b, tp = 4096, 2.0, 2
    got = dropped_bytes(m, 0, seq, b, tp, "bf16", False, None, ("moe_act",))
    assert got == seq * b * m.experts_top_k * m.expert_ffn * 2 / tp
    kept = block_acts_v2(m, 0, seq, b, tp, "bf16", CAL, False, True, None, "megatron", ("moe_act",))
    base = block_acts_v2(m, 0, seq, b, tp, "bf16", CAL, False, True, None, "megatron", ("core_attn",))
    assert kept == pytest.approx(base - got, rel=1e-15)


def test_layernorm_drops_only_separate_norm_outputs():
    """Under Megatron's TE spec a dense block fuses both norms into the next GEMM (nothing to drop); an MoE block's
    pre-MLP norm runs apart (``h`` per token); under MLA the input norm too. With sequence parallelism the norm
    output is split over tp; under fp8 the count keeps it at 1 byte already."""
    dense = load_model("llama-3-8b", "", "model")
    moe = load_model("mixtral-8x7b", "", "model")
    mla = load_model(yaml.safe_load((V2 / "mla-moe-model.yaml").read_text()), "", "model")
    assert separate_norms(dense, 0) == 0 and separate_norms(moe, 0) == 1
    assert separate_norms(mla, 0) == 1 and separate_norms(mla, 5) == 2  # first block dense, then MoE
    seq, b = 2048, 1.0
    assert dropped_bytes(dense, 0, seq, b, 2, "bf16", True, None, ("layernorm",)) == 0.0
    assert dropped_bytes(moe, 0, seq, b, 4, "bf16", True, None, ("layernorm",)) == seq * b * moe.hidden_size * 2 / 4
    assert dropped_bytes(moe, 0, seq, b, 4, "fp8", False, None, ("layernorm",)) == seq * b * moe.hidden_size * 1


def test_mla_up_proj_drops_q_k_v_not_the_output():
    mla = load_model(yaml.safe_load((V2 / "mla-moe-model.yaml").read_text()), "", "model")
    seq, b, tp = 2048, 1.0, 2
    a = mla.num_attention_heads
    got = dropped_bytes(mla, 3, seq, b, tp, "bf16", False, None, ("mla_up_proj",))
    assert got == seq * b * (2 * a * mla.head_dim + a * mla.v_dim) * 2 / tp
    split, _ = mla.attention_activation_widths
    assert got < seq * b * split * 2 / tp  # the attention output (a * v_dim) stays


def test_moe_covers_moe_act_and_shared_experts():
    mla = load_model(yaml.safe_load((V2 / "mla-moe-model.yaml").read_text()), "", "model")
    args = (mla, 3, 1024, 1.0, 1, "bf16", False, None)
    whole = dropped_bytes(*args, ("moe",))
    assert whole == dropped_bytes(*args, ("moe", "moe_act", "shared_experts"))
    assert whole > dropped_bytes(*args, ("moe_act", "shared_experts")) > dropped_bytes(*args, ("moe_act",)) > 0
    assert dropped_bytes(mla, 0, 1024, 1.0, 1, "bf16", False, None, ("moe",)) == 0.0  # dense first block


def test_recompute_modules_price_memory_and_time(h100):
    """On an MoE fp8 plan, [layernorm, moe_act, moe] drop activations and add recomputation time; ``moe`` re-runs
    the all-to-all of its blocks too."""
    doc = _doc("moe-ep-etp-fp8.json")
    for p in doc["pipelines"]:
        for st in p["stages"]:
            st["recompute"] = "selective"
    sel = _est(h100, doc)
    results = {}
    for mods in (["layernorm", "moe_act"], ["moe"]):
        d = json.loads(json.dumps(doc))
        for p in d["pipelines"]:
            for st in p["stages"]:
                st["recompute_modules"] = mods
        results[tuple(mods)] = _est(h100, d)
    small, big = results[("layernorm", "moe_act")], results[("moe",)]
    assert max(m.activations for m in _mem(big)) < max(m.activations for m in _mem(small)) \
        < max(m.activations for m in _mem(sel))
    assert big.breakdown["recompute_s"] > small.breakdown["recompute_s"] > 0.0
    assert big.breakdown["ep_comm_s"] > sel.breakdown["ep_comm_s"]


def test_fp8_params_drop_the_16_bit_copy_of_block_weights(h100):
    doc = _doc("moe-ep-etp-fp8.json")
    base, est = _est(h100, doc), _est(h100, dict(doc, fp8_params=True))
    for m0, m1 in zip(_mem(base), _mem(est)):
        assert m1.weights < m0.weights
        assert (m0.gradients, m0.optimizer, m0.activations) == (m1.gradients, m1.optimizer, m1.activations)
    plan = plan_from_dict(doc)
    cm = CostModel(h100)
    model = cm.resolve_model(plan)
    st = plan.pipelines[0].stages[0]
    from arachne.cost.features import expert_tp
    from arachne.cost.pipeline import _stage_params_cached

    blocks = _stage_params_cached(model, st.start, st.end, False, False, len(plan.pipelines[0].stages), st.tp,
                                  st.ep, expert_tp(st))
    dev = st.devices[0]
    assert base.memory_detail[dev].weights - est.memory_detail[dev].weights == pytest.approx(2 * blocks, rel=1e-12)


def test_optimizer_settings_bytes_per_parameter(h100):
    """ZeRO-1 under Megatron: optimizer 12 B/param (master 4 + m, v 8) -> 8 without master weights -> 4 with bf16
    moments; gradients 4 -> 2 (the 16-bit parameters' own)."""
    doc = _doc("interleaved-sp-selective.json")
    base = _est(h100, doc)
    none = _est(h100, dict(doc, master_weights="none"))
    both = _est(h100, dict(doc, master_weights="none", optimizer_state_dtype="bf16"))
    for m0, m1, m2 in zip(_mem(base), _mem(none), _mem(both)):
        assert m1.optimizer == pytest.approx(m0.optimizer * 8 / 12, rel=1e-12)
        assert m2.optimizer == pytest.approx(m0.optimizer * 4 / 12, rel=1e-12)
        assert m1.gradients == pytest.approx(m0.gradients / 2, rel=1e-12)
        assert m1.weights == m0.weights


def test_fsdp_without_master_weights(h100):
    """ZeRO-3 (FSDP): the fp32 shard (4 B) becomes the 16-bit parameter (2 B), its gradient 4 -> 2, Adam's
    moments 8 -> 4 in bf16."""
    doc = _doc("cp-zero3.json")
    base = _est(h100, doc)
    est = _est(h100, dict(doc, master_weights="none", optimizer_state_dtype="bf16"))
    for m0, m1 in zip(_mem(base), _mem(est)):
        assert m1.optimizer == pytest.approx(m0.optimizer / 2, rel=1e-12)
        assert m1.total < m0.total


def test_fused_loss_keeps_16_bit_logits_and_gradient():
    m = load_model("llama-3-8b", "", "model")
    seq, b, tp = 8192, 2.0, 1
    fused = head_transient_bytes(m, seq, b, tp, CAL, "bf16", "torch", "fused")
    assert fused == (2 * act_bytes("bf16") * m.padded_vocab(tp) + 4) * seq * b
    assert fused < head_transient_bytes(m, seq, b, tp, CAL, "bf16", "megatron") \
        < head_transient_bytes(m, seq, b, tp, CAL, "bf16", "torch")
    assert head_transient_bytes(m, seq, b, tp, CAL, "bf16", "torch", "standard") == \
        head_transient_bytes(m, seq, b, tp, CAL, "bf16", "torch")


def test_fused_loss_lowers_the_last_stage_only(h100):
    doc = _doc("interleaved-sp-selective.json")
    base, est = _est(h100, doc), _est(h100, dict(doc, loss="fused"))
    assert est.iteration_time_s == base.iteration_time_s
    m0, m1 = _mem(base), _mem(est)
    assert sum(x.reserved for x in m1) < sum(x.reserved for x in m0)
    assert all(a.total >= b.total for a, b in zip(m0, m1))


def test_cache_separates_plans_that_differ_only_in_settings(h100):
    """One CostModel prices a plan with and without a setting: the pipeline cache must not hand one the other's
    memory."""
    cm = CostModel(h100)
    doc = _doc("interleaved-sp-selective.json")
    a = cm.estimate(plan_from_dict(doc))
    b = cm.estimate(plan_from_dict(dict(doc, master_weights="none")))
    c = cm.estimate(plan_from_dict(doc))
    assert b.max_memory_bytes < a.max_memory_bytes == c.max_memory_bytes
