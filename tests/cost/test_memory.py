"""Memory per device (issue 26): the per-term activation count against a torch trace, the framework
conventions zero_stage selects, the logits on the last stage, and monotonicity properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arachne.cost import CostModel
from arachne.cost.calibration import DEFAULT_CALIBRATION
from arachne.cost.memory import block_activation_bytes, convention, head_transient_bytes
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.model import load_model

CAL = DEFAULT_CALIBRATION.memory


@pytest.fixture(scope="module")
def cm() -> CostModel:
    return CostModel(cluster_from_dict({"nodes": [{"name": "n", "count": 1, "gpu": "H100-SXM5-80GB"}]}))


@pytest.fixture(scope="module")
def llama8b():
    return load_model("llama-3-8b")


def test_megatron_block_hand_computed(llama8b):
    """Llama 3 8B, bf16, s 4096, b 1, tp 2: 4h norms + (q h + k, v 2 x 1024 + out h + 3 x 14336) / 2 elements
    per token, 2 B each, + 32 heads / 2 x 4 B of softmax statistics."""
    s, h = 4096, 4096
    per_tok = (4 * h + (h + 2 * 1024 + h + 3 * 14336) / 2) * 2 + 32 / 2 * 4
    assert block_activation_bytes(llama8b, 0, s, 1, 2, "bf16", CAL) == pytest.approx(s * per_tok)


def test_torch_block_keeps_more(llama8b):
    """Plain torch: composite RMSNorm (10h with outputs), repeat_kv (K, V at 32 heads), silu(a)*b (4f)."""
    s, h = 4096, 4096
    per_tok = (10 * h + (h + 2 * h + h + 4 * 14336)) * 2 + 32 * 4
    assert block_activation_bytes(llama8b, 0, s, 1, 1, "bf16", CAL, convention="torch") == pytest.approx(s * per_tok)


def test_zero_stage_selects_the_convention():
    assert convention(0) == convention(1) == convention(2) == "megatron" and convention(3) == "torch"


def test_logits_bytes_per_convention(llama8b):
    n = 8192 * llama8b.padded_vocab(1)
    assert head_transient_bytes(llama8b, 8192, 1, 1, CAL, "bf16", "megatron") == pytest.approx(6 * n)
    assert head_transient_bytes(llama8b, 8192, 1, 1, CAL, "bf16", "torch") == pytest.approx(12 * n)
    assert head_transient_bytes(llama8b, 8192, 1, 1, CAL, "fp32") == pytest.approx(16 * n)


def test_megatron_state_bytes(cm, llama8b):
    """Megatron distributed optimizer: 2 + 4 + 12/d bytes per parameter; FSDP: 16/d."""
    kw = {"layers": (1, 3), "first": False, "last": False, "num_stages": 4, "tp": 1, "ep": 1, "b": 1.0,
          "in_flight_mbs": 1, "precision": "bf16", "seq": 1024}
    m1 = cm.stage_memory(llama8b, zero_shards=8, zero_level=1, **kw)
    p = m1.weights / 2
    assert m1.gradients == pytest.approx(4 * p) and m1.optimizer == pytest.approx(12 * p / 8)
    m3 = cm.stage_memory(llama8b, zero_shards=8, zero_level=3, **dict(kw, num_stages=1))
    assert m3.weights + m3.gradients + m3.optimizer == pytest.approx(16 * p / 8)
    # FSDP in a pipeline (4 stages): the bf16 parameters and fp32 gradients of the stage stay unsharded
    m3p = cm.stage_memory(llama8b, zero_shards=8, zero_level=3, **kw)
    assert m3p.weights + m3p.gradients + m3p.optimizer == pytest.approx(16 * p / 8 + 2 * p + 4 * p)


def _mem(cm, model, **kw) -> float:
    base = {"layers": (0, 4), "first": True, "last": True, "num_stages": 1, "tp": 1, "ep": 1, "b": 1.0,
            "in_flight_mbs": 1, "precision": "bf16", "seq": 2048, "zero_shards": 1, "zero_level": 1}
    base.update(kw)
    return cm.stage_memory(model, **base).total


precisions = st.sampled_from(["bf16", "fp32"])
levels = st.sampled_from([1, 2, 3])
recomputes = st.sampled_from([False, "selective", True])


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 8), prec=precisions, z=levels, rec=recomputes, sp=st.booleans())
def test_memory_grows_with_micro_batch(cm, llama8b, b, prec, z, rec, sp):
    kw = {"precision": prec, "zero_level": z, "zero_shards": 4, "recompute": rec, "sp": sp, "tp": 2}
    assert _mem(cm, llama8b, b=float(b + 1), **kw) > _mem(cm, llama8b, b=float(b), **kw)


@settings(max_examples=40, deadline=None)
@given(seq=st.sampled_from([256, 512, 1024, 2048]), prec=precisions, z=levels, rec=recomputes)
def test_memory_grows_with_sequence(cm, llama8b, seq, prec, z, rec):
    kw = {"precision": prec, "zero_level": z, "zero_shards": 4, "recompute": rec}
    assert _mem(cm, llama8b, seq=2 * seq, **kw) > _mem(cm, llama8b, seq=seq, **kw)


@settings(max_examples=40, deadline=None)
@given(tp=st.sampled_from([1, 2, 4]), prec=precisions, z=levels, rec=recomputes, sp=st.booleans())
def test_memory_falls_with_tp(cm, llama8b, tp, prec, z, rec, sp):
    kw = {"precision": prec, "zero_level": z, "zero_shards": 2, "recompute": rec, "sp": sp}
    assert _mem(cm, llama8b, tp=2 * tp, **kw) < _mem(cm, llama8b, tp=tp, **kw)


@settings(max_examples=40, deadline=None)
@given(d=st.sampled_from([1, 2, 4, 8, 16]), prec=precisions, z=levels, rec=recomputes)
def test_memory_never_grows_with_more_replicas(cm, llama8b, d, prec, z, rec):
    kw = {"precision": prec, "zero_level": z, "recompute": rec}
    assert _mem(cm, llama8b, zero_shards=2 * d, **kw) <= _mem(cm, llama8b, zero_shards=d, **kw)


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 4), prec=precisions, z=levels, sp=st.booleans(), n=st.integers(1, 4))
def test_recompute_never_increases_memory(cm, llama8b, b, prec, z, sp, n):
    kw = {"precision": prec, "zero_level": z, "zero_shards": 2, "sp": sp, "tp": 2, "b": float(b), "in_flight_mbs": n}
    none = _mem(cm, llama8b, **kw)
    assert _mem(cm, llama8b, recompute="selective", **kw) <= none
    assert _mem(cm, llama8b, recompute=True, **kw) <= _mem(cm, llama8b, recompute="selective", **kw)
    assert _mem(cm, llama8b, recompute=True, rec_blocks=2, **kw) <= none


# ---- two phases: the loss and a block's backward never hold their transients at the same time ----------------
def _stage(cm, model, **kw):
    base = {"layers": (0, 4), "first": True, "last": True, "num_stages": 1, "tp": 1, "ep": 1, "b": 1.0,
            "in_flight_mbs": 1, "precision": "bf16", "seq": 2048, "zero_shards": 1, "zero_level": 1}
    base.update(kw)
    return cm.stage_memory(model, **base)


def test_last_stage_transient_is_the_larger_phase_hand_computed(cm, llama8b):
    """Megatron, bf16, no recompute, 1 GPU: the loss phase (6 B per logit) against the block phase (the MLP
    backward workspace, 2 x 3 x ffn per token): the peak is the larger, the smaller is only cached."""
    s = 2048
    head = 6 * s * llama8b.padded_vocab(1)
    block = 2 * s * 14336 * 3 * 2
    m = _stage(cm, llama8b, seq=s)
    assert m.transient == pytest.approx(max(head, block)) and m.cached == pytest.approx(min(head, block))
    assert m.reserved == pytest.approx(m.total + min(head, block))
    inner = _stage(cm, llama8b, seq=s, last=False)  # not the last stage: the block phase only
    assert inner.transient == pytest.approx(block) and inner.cached == 0.0


def test_fsdp_loss_phase_holds_the_gathered_head_and_last_block(cm, llama8b):
    """ZeRO-3 (torch convention): while the loss runs, the gathered output layer and the last block (kept
    for its backward) in bf16 join the logits' buffers; the block phase holds two gathered blocks and
    one block's unsharded gradients."""
    s = 2048
    m = _stage(cm, llama8b, seq=s, zero_level=3, zero_shards=8)
    blk = llama8b.block_params(0)
    head = 12 * s * llama8b.padded_vocab(1) + (llama8b.head_params(1) + blk) * 2
    block = 2 * s * 14336 * 3 * 2 + blk * (2 * 2 + 6)
    assert m.transient == pytest.approx(max(head, block)) and m.cached == pytest.approx(min(head, block))


@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 8), prec=st.sampled_from(["bf16", "fp32", "fp8"]), z=levels, rec=recomputes,
       sp=st.booleans(), seq=st.sampled_from([512, 2048, 8192]))
def test_peak_between_one_phase_and_both(cm, llama8b, b, prec, z, rec, sp, seq):
    """The last stage's allocated peak is at least the inner stage's with the same blocks (the block phase
    is still there) and at most it plus the whole loss phase; the reserved bound adds exactly the smaller
    phase, so it never falls below the allocated peak."""
    kw = {"b": float(b), "precision": prec, "zero_level": z, "zero_shards": 4, "recompute": rec, "sp": sp,
          "tp": 2, "seq": seq, "first": False}
    last, inner = _stage(cm, llama8b, **kw), _stage(cm, llama8b, last=False, **kw)
    extra = last.weights + last.gradients + last.optimizer - (inner.weights + inner.gradients + inner.optimizer)
    assert last.transient >= inner.transient
    assert last.total >= (inner.total + extra) * (1 - 1e-12)
    assert last.reserved >= last.total and last.cached <= last.transient
    assert inner.reserved == inner.total


def test_fp8_weight_copies_only_under_transformer_engine(cm, llama8b):
    """fp8 adds Transformer Engine's cached fp8 weight and transpose (2 B/param) and scaling state under the
    megatron convention; torchao's float8 (torch convention) casts per use and caches nothing, so its fp8
    weights equal bf16's."""
    kw = {"layers": (1, 3), "first": False, "last": False, "num_stages": 4, "tp": 1, "ep": 1, "b": 1.0,
          "in_flight_mbs": 1, "seq": 1024, "zero_shards": 8, "zero_level": 3}
    for conv in ("megatron", "torch"):
        bf16 = cm.stage_memory(llama8b, precision="bf16", framework=conv, **kw)
        fp8 = cm.stage_memory(llama8b, precision="fp8", framework=conv, **kw)
        params = bf16.optimizer  # Adam 8 B over 8 shards
        if conv == "megatron":
            assert fp8.weights > bf16.weights + 2 * params
        else:
            assert fp8.weights == bf16.weights
