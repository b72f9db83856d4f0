"""Formats v2 model fields (contract section 6): head_dim, relu/geglu, alibi/none, bias, MLA, capacity_factor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arachne.cost.calibration import DEFAULT_CALIBRATION
from arachne.cost.compute import ComputeModel
from arachne.cost.memory import block_activation_bytes, stage_params
from arachne.errors import InputError
from arachne.spec.gpus import gpu_catalog
from arachne.spec.model import (
    ModelSpec,
    load_model,
    model_catalog,
    model_from_dict,
    model_ref,
)

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = json.loads((Path(__file__).parent / "data" / "model_v1_reference.json").read_text())

# DeepSeek-V3 (arXiv 2412.19437, section 4.2 and the released config.json): 671B total, 37B activated.
DEEPSEEK_V3 = dict(name="dsv3", num_layers=61, hidden_size=7168, ffn_hidden_size=18432, num_attention_heads=128,
                   vocab_size=129280, max_sequence_length=4096, mlp="swiglu", bias=False, position_embedding="rope",
                   attention="mla", q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                   v_head_dim=128, num_experts=256, experts_top_k=8, moe_ffn_hidden_size=2048, num_shared_experts=1,
                   shared_expert_ffn_hidden_size=2048, first_dense_layers=3)
# Qwen3-30B-A3B (Qwen/Qwen3-30B-A3B config.json; model card: 30.5B total, 3.3B activated): head_dim 128 while
# hidden_size / heads = 64.
QWEN3_30B = dict(name="q3", num_layers=48, hidden_size=2048, ffn_hidden_size=6144, num_attention_heads=32,
                 num_kv_heads=4, head_dim=128, vocab_size=151936, mlp="swiglu", bias=False, position_embedding="rope",
                 num_experts=128, experts_top_k=8, moe_ffn_hidden_size=768)


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_catalog_models_count_exactly_as_version_1(name):
    """Every model of the version-1 catalog (its entry as shipped then, stored with the numbers the version-1
    code computed) keeps its parameters and FLOPs bit for bit."""
    ref = REFERENCE[name]
    m = ModelSpec(**ref["spec"])
    assert m.num_params == ref["num_params"]
    assert m.active_params == ref["active_params"]
    assert m.model_flops_per_sequence(2048) == ref["flops_2048"]
    assert m.model_flops_per_sequence(128) == ref["flops_128"]


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_catalog_costs_match_the_version_1_formulas(name):
    """compute.py and memory.py price catalog models exactly as the version-1 formulas (written out here)."""
    m = ModelSpec(**REFERENCE[name]["spec"])
    gpu = gpu_catalog().get("A100-SXM4-40GB")
    cm = ComputeModel(None, DEFAULT_CALIBRATION.compute)
    c = DEFAULT_CALIBRATION.compute
    seq, b, tp = 1024, 2.0, 2
    peak = cm.gemm_peak(gpu, "bf16")  # the dense peak times the measured efficiency of its generation
    h, kvd, a = m.hidden_size, m.kv_heads * (m.hidden_size // m.num_attention_heads), m.num_attention_heads
    tokens = b * seq
    mats = 3 if m.mlp == "swiglu" else 2
    gemm = cm._gemm(2 * tokens * h * (h + 2 * kvd) / tp, peak) + cm._gemm(2 * tokens * h * h / tp, peak)
    gemm += 2 * cm._gemm(2 * b * a / tp * seq * seq * (h // a), peak)
    moe = m.is_moe
    if not moe:
        gemm += mats * cm._gemm(2 * tokens * h * m.ffn_hidden_size / tp, peak)
        elem = c.elementwise_passes * tokens * h * 2 * (c.replicated_fraction + (1 - c.replicated_fraction) / tp)
        elem += 2 * tokens * m.ffn_hidden_size / tp * 2 * mats
        launch = c.kernel_launch_s * c.kernels_per_block_fwd
        want = gemm + elem / gpu.hbm_bandwidth + launch  # Ampere has no measured attention kernel: whole-matrix GEMMs
        assert cm.analytic_block(m, gpu, "bf16", seq, b, tp, 1, False)[0] == pytest.approx(want, rel=1e-12)
    cal = DEFAULT_CALIBRATION.memory
    i = m.num_layers - 1
    if m.moe_layers[i]:
        k = m.experts_top_k
        ffn = k * m.expert_ffn * (mats - 1) + 2 * k * h
        if m.num_shared_experts:
            ffn += (m.shared_expert_ffn_hidden_size or m.expert_ffn * m.num_shared_experts) * (mats - 1)
    else:
        ffn = m.ffn_hidden_size * (mats - 1)
    elems = seq * b * (cal.act_replicated_sh * h + ((h + 2 * kvd) + h + ffn) / tp)
    # fp32 keeps the version-1 accounting (Sailor's measurements); 16-bit follows Megatron's (tests/cost/test_memory.py)
    scores = a / tp * seq * seq * b * 4
    assert block_activation_bytes(m, i, seq, b, tp, "fp32", cal) == pytest.approx(elems * 4 + scores, rel=1e-12)
    p = 0.0
    for j in range(2):
        e = m.block_expert_params(j)
        p += (m.block_params(j) - e) / tp + e / (tp * 2)
    assert stage_params(m, 0, 2, False, False, 2, tp, 2) == p


def test_published_totals_mla_and_head_dim():
    v3 = ModelSpec(**DEEPSEEK_V3)
    assert v3.num_params == pytest.approx(671e9, rel=0.005)
    assert v3.active_params == pytest.approx(37e9, rel=0.03)  # 37B activated, published rounded down
    q3 = ModelSpec(**QWEN3_30B)
    assert q3.num_params == pytest.approx(30.5e9, rel=0.005)
    assert q3.active_params == pytest.approx(3.3e9, rel=0.02)
    lite = load_model(str(ROOT / "examples" / "v2" / "mla-moe-model.yaml"))
    assert lite.num_params == pytest.approx(15.7e9, rel=0.005)  # DeepSeek-V2-Lite, arXiv 2405.04434 app. B


def test_head_dim_sets_projection_widths():
    q3 = ModelSpec(**QWEN3_30B)
    h, qd, kvd = 2048, 32 * 128, 4 * 128
    assert q3.head_dim == 128 and q3.v_dim == 128
    assert q3.attention_params == h * (qd + 2 * kvd) + qd * h
    seq = 1000
    assert q3.attention_flops(seq) == 2 * seq * (h * (qd + 2 * kvd) + qd * h) + 4 * seq * seq * 32 * 128
    same = ModelSpec(**{**QWEN3_30B, "head_dim": None})
    assert same.head_dim == 64 and same.attention_params < q3.attention_params


def test_mla_projections_and_scores():
    v3 = ModelSpec(**DEEPSEEK_V3)
    h, a = 7168, 128
    expect = (h * 1536 + 1536 * a * 192 + h * (512 + 64) + 512 * a * (128 + 128) + a * 128 * h + (1536 + 512))
    assert v3.attention_params == expect
    assert v3.attention_replicated_params == h * 1536 + h * 576 + 1536 + 512
    seq = 512
    proj = 2 * seq * (expect - 1536 - 512)
    assert v3.attention_flops(seq) == proj + 2 * seq * seq * a * (192 + 128)
    no_q = ModelSpec(**{**DEEPSEEK_V3, "q_lora_rank": None})
    assert no_q.attention_params == h * a * 192 + h * 576 + 512 * a * 256 + a * 128 * h + 512
    biased = ModelSpec(**{**DEEPSEEK_V3, "bias": True})
    outs = 1536 + a * 192 + 576 + a * 256 + h
    assert biased.attention_params == expect + outs + 1536 + 512  # output biases, norm biases


@pytest.mark.parametrize("plain,gated", [("gelu", "swiglu"), ("relu", "geglu")])
def test_gated_mlps_have_three_matrices(plain, gated):
    base = dict(name="m", num_layers=2, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4, vocab_size=1000)
    p, g = ModelSpec(**base, mlp=plain), ModelSpec(**base, mlp=gated)
    assert p.mlp_matrices == 2 and g.mlp_matrices == 3
    assert g.mlp_params(256) - p.mlp_params(256) == 64 * 256 + 256  # one more matrix and its bias
    assert g.block_flops(0, 10) - p.block_flops(0, 10) == 2 * 10 * 64 * 256
    assert ModelSpec(**base, mlp="relu").num_params == ModelSpec(**base, mlp="gelu").num_params


@pytest.mark.parametrize("pos", ["rope", "alibi", "none"])
def test_only_learned_positions_hold_parameters(pos):
    base = dict(name="m", num_layers=2, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4, vocab_size=1000,
                max_sequence_length=100)
    assert ModelSpec(**base).num_params - ModelSpec(**base, position_embedding=pos).num_params == 100 * 64


@pytest.mark.parametrize("change,field,words", [
    ({"attention": "mla", "kv_lora_rank": None}, "", "needs kv_lora_rank"),
    ({"attention": "mla", "v_head_dim": None}, "", "needs v_head_dim"),
    ({"head_dim": 64}, "", "head_dim is for mha"),
    ({"num_kv_heads": 32}, "", "num_kv_heads must equal"),
    ({"attention": "mha"}, "", "only for attention mla"),
    ({"kv_lora_rank": 0}, "kv_lora_rank", "greater than or equal to 1"),
    ({"capacity_factor": -1}, "capacity_factor", "greater than 0"),
    ({"mlp": "silu"}, "mlp", "gelu"),
    ({"position_embedding": "sinusoidal"}, "position_embedding", "alibi"),
    ({"first_dense_layers": 99}, "", "exceeds num_layers"),
])
def test_v2_model_rules_name_the_field(change, field, words):
    doc = {**DEEPSEEK_V3, **change}
    with pytest.raises(InputError) as info:
        model_from_dict(doc, "m.yaml", "model")
    assert info.value.field == ("model." + field if field else "model")
    assert words in info.value.reason


def test_capacity_factor_needs_experts_and_hidden_divisibility_needs_head_dim():
    base = dict(name="m", num_layers=2, hidden_size=2880, ffn_hidden_size=2880, num_attention_heads=64,
                num_kv_heads=8, vocab_size=1000)
    with pytest.raises(InputError, match="divisible by num_attention_heads"):
        model_from_dict({**base, "hidden_size": 100, "num_attention_heads": 3, "num_kv_heads": 1})
    assert model_from_dict({**base, "hidden_size": 100, "num_attention_heads": 3, "num_kv_heads": 1,
                            "head_dim": 32}).head_dim == 32
    gpt_oss = model_from_dict({**base, "head_dim": 64})  # GPT-OSS: 2880 wide, 64 heads of 64 (not 45)
    assert gpt_oss.head_dim == 64 and gpt_oss.attention_gemms[0] == (2880, 64 * 64 + 2 * 8 * 64, True)
    with pytest.raises(InputError, match="only for MoE"):
        model_from_dict({**base, "head_dim": 64, "capacity_factor": 1.25})


def test_inline_model_round_trips_with_head_dim_and_mla():
    for doc in (QWEN3_30B, DEEPSEEK_V3):
        m = ModelSpec(**doc)
        ref = model_ref(m)
        assert isinstance(ref, dict) and ModelSpec(**ref) == m and ModelSpec(**m.model_dump()) == m
    assert model_ref(ModelSpec(**QWEN3_30B))["head_dim"] == 128
    assert ModelSpec(**QWEN3_30B).model_dump()["head_dim"] == 128  # the document's key, everywhere
    # a version-1 inline model writes no version-2 key
    v1 = model_catalog().get("llama-3-8b").model_copy(update={"name": "mine"})
    assert not {"head_dim", "attention", "capacity_factor"} & set(model_ref(v1))


def test_etp_rules():
    mix = model_catalog().get("mixtral-8x7b")
    assert mix.tp_error(2, etp=1) is None
    assert "etp 3" in mix.tp_error(2, etp=3)
    assert mix.etp_error(4) is None
    dense = model_catalog().get("llama-3-8b")
    assert "dense" in dense.etp_error(2)


def test_cost_model_prices_head_dim_and_mla_through_the_model():
    gpu = gpu_catalog().get("H100-SXM5-80GB")
    cm = ComputeModel(None, DEFAULT_CALIBRATION.compute)
    wide = ModelSpec(**{**QWEN3_30B, "num_experts": 1, "experts_top_k": 1})
    narrow = ModelSpec(**{**QWEN3_30B, "num_experts": 1, "experts_top_k": 1, "head_dim": None})
    f_wide = cm.analytic_block(wide, gpu, "bf16", 4096, 1, 1, 1, False)[0]
    f_narrow = cm.analytic_block(narrow, gpu, "bf16", 4096, 1, 1, 1, False)[0]
    assert f_wide > f_narrow  # twice the query width and scores
    cal = DEFAULT_CALIBRATION.memory
    assert (block_activation_bytes(wide, 0, 4096, 1, 1, "bf16", cal)
            > block_activation_bytes(narrow, 0, 4096, 1, 1, "bf16", cal))
    v3 = ModelSpec(**DEEPSEEK_V3)
    # MLA's down projections are not split by tp: per-rank time falls less than 1/tp
    t1 = cm.analytic_block(v3, gpu, "bf16", 4096, 1, 1, 1, False)[0]
    t8 = cm.analytic_block(v3, gpu, "bf16", 4096, 1, 8, 1, False)[0]
    assert t8 > t1 / 8
    p1 = stage_params(v3, 0, 3, False, False, 2, 1, 1)
    p8 = stage_params(v3, 0, 3, False, False, 2, 8, 1)
    assert p8 == pytest.approx((p1 - 3 * v3.attention_replicated_params) / 8 + 3 * v3.attention_replicated_params)


@settings(max_examples=60, deadline=None)
@given(heads=st.integers(1, 64), kv_div=st.sampled_from([1, 2, 4]), hd=st.integers(1, 256), h=st.integers(1, 4096),
       mlp=st.sampled_from(["gelu", "relu", "swiglu", "geglu"]), bias=st.booleans(), seq=st.integers(1, 4096))
def test_mha_params_and_flops_follow_the_widths(heads, kv_div, hd, h, mlp, bias, seq):
    """For any head_dim, attention params and FLOPs are those of q (heads*hd), k/v (kv*hd) and output."""
    kv = heads // kv_div if heads % kv_div == 0 else heads
    m = ModelSpec(name="p", num_layers=1, hidden_size=h, ffn_hidden_size=8, num_attention_heads=heads,
                  num_kv_heads=kv, head_dim=hd, vocab_size=10, mlp=mlp, bias=bias)
    qd, kvd = heads * hd, kv * hd
    weights = h * (qd + 2 * kvd) + qd * h
    assert m.attention_params == weights + ((qd + 2 * kvd + h) if bias else 0)
    assert m.attention_flops(seq) == 2 * seq * weights + 4 * seq * seq * qd
    assert m.block_params(0) == m.attention_params + m.norm_params + m.mlp_params(8)
