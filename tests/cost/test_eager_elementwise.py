"""Eager element-wise ops (``elementwise_kernels: eager``): the norms and rotary embedding of a block run as eager
PyTorch kernels, priced from the component measurements in ``data/components/elementwise.yaml``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from arachne.cost import CostModel
from arachne.cost.calibration import DEFAULT_CALIBRATION
from arachne.cost.compute import EAGER_NORM_BYTES, EAGER_ROPE_BYTES, ComputeModel, eager_extra_bytes
from arachne.cost.recompute import op_selective_fwd
from arachne.errors import InputError
from arachne.plan import Plan, plan_from_dict
from arachne.spec.cluster import load_cluster
from arachne.spec.model import load_model, model_catalog

ROOT = Path(__file__).resolve().parents[2]
V2 = ROOT / "examples" / "v2"
DATA = ROOT / "data" / "components" / "elementwise.yaml"


@pytest.fixture(scope="module")
def h100():
    return load_cluster(V2 / "h100-2x8.yaml")


def test_the_constants_are_the_anchor_rows_of_the_component_data():
    """EAGER_NORM_BYTES from the RMSNorm rows of width 8192 and EAGER_ROPE_BYTES from the rope rows of 8192
    tokens: (eager - compiled) seconds x the card's nominal bandwidth / elements."""
    doc = yaml.safe_load(DATA.read_text())
    bw = doc["gpu"]["hbm_tbps"] * 1e12
    rows = doc["rows"]
    for op, const, pick, elements in (
            ("rms_norm", EAGER_NORM_BYTES, lambda r: r["width"] == 8192, lambda r: r["tokens"] * r["width"]),
            ("rope", EAGER_ROPE_BYTES, lambda r: r["tokens"] == 8192 and r["q_heads"] * r["head_dim"] == 8192,
             lambda r: r["tokens"] * (r["q_heads"] + r["kv_heads"]) * r["head_dim"])):
        for i, d in enumerate(("fwd", "bwd")):
            (row,) = [r for r in rows if r["op"] == op and r["direction"] == d and pick(r)]
            per = (row["eager_ms"] - row["compiled_ms"]) * 1e-3 * bw / elements(row)
            assert const[i] == pytest.approx(per, abs=0.05)


def test_eager_block_time_hand_computed(h100):
    """Llama 3 8B, 8192 tokens, tp 2, bf16 on H100: eager adds (2 norms x h/tp x 67.7 or 148.1 bytes + rotary on
    (32 + 8) heads / tp x 128 x 49.2 or 44.2 bytes) per token over the card's HBM bandwidth, forward and
    backward; fp32 (its fitted element-wise count is unfused already) is unchanged."""
    m = load_model("llama-3-8b")
    gpu = h100.devices["h100-0:0"].gpu
    cm = ComputeModel(None, DEFAULT_CALIBRATION.compute)
    tok, tp = 8192, 2
    f0, b0 = cm.analytic_block(m, gpu, "bf16", tok, 1.0, tp, 1, False)
    f1, b1 = cm.analytic_block(m, gpu, "bf16", tok, 1.0, tp, 1, False, eager="split")
    norm, rope = 2 * tok * 4096 / tp, tok * 40 * 128 / tp
    assert f1 - f0 == pytest.approx((67.7 * norm + 49.2 * rope) / gpu.hbm_bandwidth, rel=1e-9)
    assert b1 - b0 == pytest.approx((148.1 * norm + 44.2 * rope) / gpu.hbm_bandwidth, rel=1e-9)
    assert cm.analytic_block(m, gpu, "fp32", tok, 1.0, tp, 1, False, eager="split") == \
        cm.analytic_block(m, gpu, "fp32", tok, 1.0, tp, 1, False)
    # torchtitan's op-level selective recomputation runs the element-wise forward again: eagerly, too
    assert op_selective_fwd(cm, m, gpu, "bf16", tok, 1.0, tp, "split") - \
        op_selective_fwd(cm, m, gpu, "bf16", tok, 1.0, tp) == pytest.approx(f1 - f0, rel=1e-9)
    # without sequence parallelism every tp rank normalises the whole sequence
    fr, _ = cm.analytic_block(m, gpu, "bf16", tok, 1.0, tp, 1, False, eager="replicated")
    assert fr - f0 == pytest.approx((67.7 * norm * tp + 49.2 * rope) / gpu.hbm_bandwidth, rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(["llama-3-8b", "GPT-3-1.3B", "DeepSeek-V3", "Qwen3-30B-A3B", "Mixtral-8x22B"]),
       tokens=st.integers(1, 1 << 17), tp=st.sampled_from([1, 2, 4, 8]))
def test_eager_extra_is_linear_in_tokens_and_replicated_norms_cost_more(name, tokens, tp):
    m = model_catalog().get(name)
    f, b = eager_extra_bytes(m, tokens, tp, "split")
    f2, b2 = eager_extra_bytes(m, 2 * tokens, tp, "split")
    fr, br = eager_extra_bytes(m, tokens, tp, "replicated")
    assert 0 <= f <= fr and 0 <= b <= br
    assert f2 == pytest.approx(2 * f) and b2 == pytest.approx(2 * b)
    if tp == 1:
        assert (f, b) == (fr, br)
    if m.bias:  # LayerNorm: eager nn.LayerNorm is one native kernel; only rotary embedding (if any) is extra
        assert fr == f
    if m.position_embedding != "rope":
        assert f == pytest.approx(0.0 if m.bias else EAGER_NORM_BYTES[0] * 2 * tokens * m.hidden_size / tp)


def _doc():
    return json.loads((V2 / "interleaved-sp-selective.json").read_text())


def test_an_eager_plan_is_slower_and_fused_spelled_out_changes_nothing(h100):
    doc = _doc()
    base = CostModel(h100).estimate(Plan.model_validate(doc))
    fused = CostModel(h100).estimate(Plan.model_validate(dict(doc, elementwise_kernels="fused")))
    eager = CostModel(h100).estimate(Plan.model_validate(dict(doc, elementwise_kernels="eager")))
    assert fused.iteration_time_s == base.iteration_time_s
    assert eager.iteration_time_s > base.iteration_time_s
    assert eager.max_memory_bytes == base.max_memory_bytes  # a time term only


def test_one_cost_model_prices_each_kernel_choice_apart(h100):
    """Kernel choices key every cache above the stage's: one cost model pricing the same plan fused, eager and
    with FlashAttention-2 in turn gives what a fresh cost model gives each (it once returned the fused time)."""
    doc = _doc()
    shared = CostModel(h100)
    for extra in ({}, {"elementwise_kernels": "eager"}, {"attention_kernel": "flash2"},
                  {"elementwise_kernels": "eager", "attention_kernel": "flash2"}, {}):
        plan = Plan.model_validate(dict(doc, **extra))
        assert shared.estimate(plan).iteration_time_s == CostModel(h100).estimate(plan).iteration_time_s, extra


def test_the_field_is_version_2_and_checked():
    doc = _doc()
    with pytest.raises(InputError) as e:
        plan_from_dict(dict(doc, elementwise_kernels="jit"))
    assert "elementwise_kernels" in str(e.value)
    v1 = json.loads((ROOT / "examples" / "plans" / "a100-v100-cloud__llama2-7b-two-pipelines.json").read_text())
    assert v1["format"] == "arachne-plan/1"
    with pytest.raises(InputError) as e:
        plan_from_dict(dict(v1, elementwise_kernels="eager"))
    assert str(e.value).startswith("elementwise_kernels: a version-2 key")
