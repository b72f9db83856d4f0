"""Pricing of version-2 plan features (issue 26 item 2): interleaved 1F1B, sequence parallelism,
selective and partial recomputation, overlapped gradient reduction / parameter gather; version-1
plans priced bit-identically to the cost model before these features (golden file)."""

from __future__ import annotations

import copy
import itertools
import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arachne.cost import CostModel
from arachne.cost.calibration import DEFAULT_CALIBRATION
from arachne.cost.features import attention_core_fwd
from arachne.cost.model import PRICED_V2_FEATURES
from arachne.cost.pipeline import zero3_row
from arachne.cost.schedule import (
    interleaved_in_flight,
    interleaved_ops,
    interleaved_time,
    simulate,
    simulate_interleaved,
)
from arachne.cost.sync import MEGATRON_BUCKET_PARAMS, exposed_sync
from arachne.plan import Plan, load_plan
from arachne.spec.cluster import load_cluster
from arachne.spec.model import load_model

ROOT = Path(__file__).resolve().parents[2]
V2 = ROOT / "examples" / "v2"
GOLDEN = Path(__file__).with_name("v1_estimates_golden.json")


def _uniform(S: int, v: int, f: float, b: float, p2p: float = 0.0):
    fw = tuple(tuple([f / v] * v) for _ in range(S))
    bw = tuple(tuple([b / v] * v) for _ in range(S))
    sf = tuple(tuple(p2p if (s < S - 1 or c < v - 1) else 0.0 for c in range(v)) for s in range(S))
    sb = tuple(tuple(p2p if (s > 0 or c > 0) else 0.0 for c in range(v)) for s in range(S))
    return fw, bw, sf, sb


# ---- interleaved 1F1B ---------------------------------------------------------------------------

def test_interleaved_closed_form_hand_computed():
    # S=4 stages, v=2 chunks, m=8, f=1 s, b=2 s per micro-batch and stage: m(f+b) + (S-1)(f+b)/v
    assert simulate_interleaved(*_uniform(4, 2, 1.0, 2.0), 8) == pytest.approx(8 * 3 + 3 * 3 / 2)
    assert 8 * 3 + 3 * 3 / 2 == 28.5


@settings(max_examples=60, deadline=None)
@given(S=st.integers(1, 6), v=st.integers(1, 4), k=st.integers(1, 5),
       f=st.floats(0.1, 3.0), b=st.floats(0.1, 6.0))
def test_interleaved_bubble_is_closed_form(S, v, k, f, b):
    """Uniform stages, no p2p: bubble fraction (S-1)/(v m) (Narayanan et al. 2021, SC'21, section 2.2)."""
    m = k * S
    t = simulate_interleaved(*_uniform(S, v, f, b), m)
    assert t == pytest.approx(m * (f + b) * (1 + (S - 1) / (v * m)), rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(S=st.integers(1, 5), k=st.integers(1, 6), data=st.data())
def test_one_chunk_interleaved_equals_1f1b_ordering_free_cases(S, k, data):
    """v = 1 with uniform times: the same makespan as plain 1F1B (only warm-up counts differ)."""
    m = k * S
    f, b = data.draw(st.floats(0.1, 2.0)), data.draw(st.floats(0.1, 4.0))
    t1 = simulate((f,) * S, (b,) * S, (0.0,) * S, (0.0,) * S, m)
    assert simulate_interleaved(*_uniform(S, 1, f, b), m) == pytest.approx(t1, rel=1e-9)


@settings(max_examples=30, deadline=None)
@given(S=st.integers(2, 5), k=st.integers(1, 4), p2p=st.floats(0.0, 0.5))
def test_more_virtual_stages_shrink_bubble_but_add_p2p(S, k, p2p):
    m = k * S
    t1 = simulate_interleaved(*_uniform(S, 1, 1.0, 2.0, 0.0), m)
    t2 = simulate_interleaved(*_uniform(S, 2, 1.0, 2.0, 0.0), m)
    assert t2 <= t1 + 1e-12
    # p2p per chunk: more sends per micro-batch with more chunks
    with_p2p = simulate_interleaved(*_uniform(S, 2, 1.0, 2.0, p2p), m)
    assert with_p2p >= t2 - 1e-12


@settings(max_examples=30, deadline=None)
@given(S=st.integers(2, 5), k=st.integers(2, 4), p2p=st.floats(0.01, 0.5))
def test_interleaved_sends_overlap_compute(S, k, p2p):
    """Megatron's interleaved schedule overlaps p2p with compute (overlap_p2p_comm): a send delays only its
    receiver, so a uniform pipeline with enough micro-batches pays the transfers only in its warm-up and
    cool-down, never once per micro-batch as the blocking 1F1B simulation does."""
    m = k * S
    base = simulate_interleaved(*_uniform(S, 2, 1.0, 2.0, 0.0), m)
    t = simulate_interleaved(*_uniform(S, 2, 1.0, 2.0, p2p), m)
    assert base - 1e-12 <= t <= base + 2 * (2 * S) * p2p + 1e-9
    blocking = simulate((1.0,) * S, (2.0,) * S, (p2p,) * (S - 1) + (0.0,), (0.0,) + (p2p,) * (S - 1), m)
    assert blocking >= simulate((1.0,) * S, (2.0,) * S, (0.0,) * S, (0.0,) * S, m) + m * p2p - 1e-9


def test_interleaved_extrapolation_matches_full_simulation():
    args = _uniform(3, 2, 1.0, 2.0, 0.05)
    m = 3 * 120
    assert interleaved_time(*args, m) == pytest.approx(simulate_interleaved(*args, m), rel=1e-9)


def test_interleaved_order_and_in_flight_hand_computed():
    ops = interleaved_ops(2, 2, 2)
    # stage 0: warm-up (2-0-1)*2 + (2-1)*2 = 4 forwards: F c0 mb0, F c0 mb1, F c1 mb0, F c1 mb1; then backwards
    assert ops[0][:4] == ((0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1))
    assert ops[0][4:] == ((1, 1, 0), (1, 1, 1), (1, 0, 0), (1, 0, 1))
    # S=4, v=2: stage 0 holds (4-1)*2 + 4 + 1 = 11 chunk forwards (7 of chunk 0, 4 of chunk 1); the last 4+1
    assert interleaved_in_flight(0, 4, 2, 8) == (7, 4)
    assert interleaved_in_flight(3, 4, 2, 8) == (4, 1)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 6), st.integers(1, 4), st.integers(1, 8), st.booleans(), st.data())
def test_interleaved_in_flight_counts_the_first_forwards_of_the_schedule_order(S, v, rounds, paired, data):
    """The count reads the schedule's first forwards without building its operations (they grow with the
    micro-batches: a plan of 10^8 sequences built 20M of them and held 2 GB); it equals the count taken off
    :func:`interleaved_ops` and does not change once the micro-batches cover the warm-up."""
    stage, m = data.draw(st.integers(0, S - 1)), S * rounds
    ops = interleaved_ops(S, v, m)[stage]
    w = min((S - stage - 1) * 2 + (v - 1) * S + 1 + int(paired), m * v)
    counts = [0] * v
    for _, c, _ in [op for op in ops if op[0] == 0][:w]:
        counts[c] += 1
    assert interleaved_in_flight(stage, S, v, m, paired) == tuple(counts)
    assert interleaved_in_flight(stage, S, v, S * 10**9, paired) == interleaved_in_flight(stage, S, v, S * 64, paired)


# ---- end-to-end on the version-2 example ----------------------------------------------------

@pytest.fixture(scope="module")
def h100():
    return load_cluster(V2 / "h100-2x8.yaml")


def _doc():
    return json.loads((V2 / "interleaved-sp-selective.json").read_text())


def _flat(doc):
    """The same plan without interleaving: stage s holds blocks [8s, 8s + 8)."""
    d = copy.deepcopy(doc)
    for p in d["pipelines"]:
        p.pop("virtual_stages")
        for s, stg in enumerate(p["stages"]):
            stg["layers"] = [8 * s, 8 * s + 8]
    return d


def test_v2_example_with_enabled_features_estimates(h100):
    e = CostModel(h100).estimate(load_plan(V2 / "interleaved-sp-selective.json"))
    assert e.iteration_time_s > 0 and e.fits
    for key in ("recompute_s", "dp_sync_exposed_s"):
        assert key in e.breakdown
    assert 0 <= e.breakdown["dp_sync_exposed_s"] <= e.breakdown["dp_sync_s"]
    assert e.breakdown["recompute_s"] > 0


# every examples/v2 plan is priced now: tests/cost/test_v2_pricing_more.py


def test_interleaving_halves_bubble_and_adds_p2p(h100):
    doc = _doc()
    cm = CostModel(h100)
    inter = cm.estimate(Plan.model_validate(doc))
    flat = cm.estimate(Plan.model_validate(_flat(doc)))
    assert inter.breakdown["pipeline_bubble_s"] < 0.6 * flat.breakdown["pipeline_bubble_s"]
    assert inter.breakdown["p2p_s"] > flat.breakdown["p2p_s"]
    assert inter.breakdown["compute_s"] == pytest.approx(flat.breakdown["compute_s"], rel=1e-12)
    assert inter.iteration_time_s < flat.iteration_time_s
    # the first stage holds more in-flight activations when interleaved (Megatron)
    assert inter.max_memory_bytes > flat.max_memory_bytes


def test_overlap_flags_only_hide_sync(h100):
    doc = _doc()
    cm = CostModel(h100)
    on = cm.estimate(Plan.model_validate(doc))
    off_doc = dict(doc, overlap_grad_reduce=False, overlap_param_gather=False)
    off = cm.estimate(Plan.model_validate(off_doc))
    assert off.breakdown["dp_sync_exposed_s"] == off.breakdown["dp_sync_s"]
    assert on.iteration_time_s == pytest.approx(off.iteration_time_s - off.breakdown["dp_sync_s"]
                                                + on.breakdown["dp_sync_exposed_s"], rel=1e-12)


# ---- sequence parallelism, selective and partial recomputation ----------------------------------

def _mem(cm, model, **kw):
    base = {"layers": (0, 4), "first": False, "last": False, "num_stages": 4, "tp": 2, "ep": 1, "b": 1.0, "in_flight_mbs": 1,
                "precision": "bf16", "seq": 4096}
    base.update(kw)
    return cm.stage_memory(model, **base)


def test_sequence_parallel_memory_hand_computed(h100):
    """Korthikanti et al. 2022 (arXiv:2205.05198), eq. 4 -> 5: the non-GEMM activations split over tp. Here
    4 s b h of them per block (the norms' inputs and outputs, act_norm_sh_megatron; issue 26), bf16:
    4 blocks x 4096 x 1 x 4 x 4096 x 2 B x 1/2."""
    cm = CostModel(h100)
    model = load_model("llama-3-8b")
    assert DEFAULT_CALIBRATION.memory.act_norm_sh_megatron == 4.0
    d = _mem(cm, model).activations - _mem(cm, model, sp=True).activations
    assert d == pytest.approx(268_435_456)
    # the first stage's embedding output is scattered too: + s b h x 2 B x 1/2
    d1 = _mem(cm, model, first=True).activations - _mem(cm, model, first=True, sp=True).activations
    assert d1 == pytest.approx(268_435_456 + 4096 * 4096 * 2 / 2)


def test_selective_recompute_memory_and_time_hand_computed(h100):
    """fp32 (no flash attention): selective drops the score matrix, heads/tp x s^2 x b x 4 B per block."""
    cm = CostModel(h100)
    model = load_model("llama-3-8b")
    kw = {"precision": "fp32", "seq": 1024, "layers": (0, 2)}
    d = _mem(cm, model, **kw).activations - _mem(cm, model, recompute="selective", **kw).activations
    assert d == pytest.approx(2 * 32 / 2 * 1024 * 1024 * 1 * 4)  # 134 217 728
    # bf16 with flash attention keeps no scores: selective saves no memory
    assert _mem(cm, model, recompute="selective").activations == _mem(cm, model).activations


def _stage_times(h100, framework=None, **stage_kw):
    doc = _flat(_doc())
    if framework is not None:
        doc["framework"] = framework
    for p in doc["pipelines"]:
        for stg in p["stages"]:
            stg.pop("recompute", None)
            stg.pop("sequence_parallel", None)
            stg.update(stage_kw)
    doc["overlap_grad_reduce"] = doc["overlap_param_gather"] = False
    e = CostModel(h100).estimate(Plan.model_validate(doc))
    return e, e.stages[1]


def test_selective_recompute_adds_attention_core_forward(h100):
    base, s0 = _stage_times(h100)
    sel, s1 = _stage_times(h100, recompute="selective")
    cm = CostModel(h100)
    model = load_model("llama-3-8b")
    gpu = h100.devices["h100-0:0"].gpu
    core = attention_core_fwd(cm.compute, model, gpu, "bf16", 8192, 2.0, 2)
    assert s1.bwd_s - s0.bwd_s == pytest.approx(8 * core, rel=1e-9)
    assert s1.fwd_s == s0.fwd_s
    assert sel.breakdown["recompute_s"] > 0 and base.breakdown.get("recompute_s", 0.0) == 0


def test_torch_selective_recomputes_every_second_gemm(h100, monkeypatch):
    """Under the torch convention "selective" is torchtitan's op-level policy: every second mm of a block in
    execution order (k, the output projection and w3 of q, k, v, o, w1, w3, w2) and all element-wise work run
    again in backward; attention's output is kept, so the attention core does not."""
    from arachne.cost.recompute import op_selective_fwd

    _, s0 = _stage_times(h100, framework="torch")
    _, s1 = _stage_times(h100, recompute="selective", framework="torch")
    cm = CostModel(h100)
    model = load_model("llama-3-8b")
    gpu = h100.devices["h100-0:0"].gpu
    one = op_selective_fwd(cm.compute, model, gpu, "bf16", 8192, 2.0, 2)
    assert s1.bwd_s - s0.bwd_s == pytest.approx(8 * one, rel=1e-9) and s1.fwd_s == s0.fwd_s
    seen: list[float] = []
    monkeypatch.setattr(type(cm.compute), "_gemm", lambda self, flops, peak: seen.append(flops) or 0.0)
    op_selective_fwd(cm.compute, model, gpu, "bf16", 8192, 2.0, 2)
    h, f, kv = model.hidden_size, model.ffn_hidden_size, model.kv_heads * model.head_dim
    t = 2.0 * 8192
    assert seen == [2 * t * h * kv / 2, 2 * t * h * h / 2, 2 * t * h * f / 2]
    _, m1 = _stage_times(h100, recompute="selective", framework="megatron")
    assert s1.bwd_s > m1.bwd_s  # more than Megatron's attention core


def test_sequence_parallel_time_equals_all_reduce_time(h100):
    """Reduce-scatter + all-gather move the same bytes as one ring all-reduce: same time (documented)."""
    _, s0 = _stage_times(h100)
    _, s1 = _stage_times(h100, sequence_parallel=True)
    assert (s1.fwd_s, s1.bwd_s, s1.tp_comm_s) == (s0.fwd_s, s0.bwd_s, s0.tp_comm_s)
    assert s1.memory_bytes < s0.memory_bytes


def test_partial_recompute_all_blocks_equals_full(h100):
    _, full = _stage_times(h100, recompute="full")
    _, k8 = _stage_times(h100, recompute="full", recompute_layers=8)
    assert (k8.fwd_s, k8.bwd_s, k8.memory_bytes) == (full.fwd_s, full.bwd_s, full.memory_bytes)


def test_partial_recompute_monotone(h100):
    rows = [_stage_times(h100)[1]] + [_stage_times(h100, recompute="full", recompute_layers=k)[1]
                                      for k in range(1, 9)]
    for a, b in itertools.pairwise(rows):
        assert b.bwd_s >= a.bwd_s
        assert b.memory_bytes <= a.memory_bytes
    assert rows[-1].bwd_s > rows[0].bwd_s and rows[-1].memory_bytes < rows[0].memory_bytes


# ---- overlapped gradient reduction ----------------------------------------------------------

def test_exposed_sync_hand_computed():
    assert MEGATRON_BUCKET_PARAMS == 40_000_000
    # 80M params: 2 buckets; all-reduce 1 s overlapped with a 0.3 s backward -> 0.7 s exposed
    assert exposed_sync(1.0, 80e6, 0.3, 0.0, False, True, False) == pytest.approx(0.7)
    # a long backward hides all but the last bucket (0.5 s)
    assert exposed_sync(1.0, 80e6, 5.0, 0.0, False, True, False) == pytest.approx(0.5)
    # sharded optimizer: reduce-scatter 0.5 hidden to its last bucket 0.25, gather 0.5 hidden to 0.25
    assert exposed_sync(1.0, 80e6, 5.0, 5.0, True, True, True) == pytest.approx(0.5)
    assert exposed_sync(1.0, 80e6, 5.0, 5.0, True, False, False) == 1.0


@settings(max_examples=100, deadline=None)
@given(t=st.floats(0, 10), params=st.floats(1, 1e10), w1=st.floats(0, 10), w2=st.floats(0, 10),
       dw=st.floats(0, 5), zero=st.booleans(), og=st.booleans(), op=st.booleans())
def test_exposed_sync_bounded_and_monotone(t, params, w1, w2, dw, zero, og, op):
    e = exposed_sync(t, params, w1, w2, zero, og, op)
    assert 0 <= e <= t + 1e-12
    assert exposed_sync(t, params, w1 + dw, w2 + dw, zero, og, op) <= e + 1e-12


# ---- version 1 unchanged ----------------------------------------------------------------------

def test_priced_features():
    assert {"virtual_stages", "sequence_parallel", "selective_recompute", "recompute_layers",
            "overlap_grad_reduce", "overlap_param_gather", "zero_stage"} <= set(PRICED_V2_FEATURES)


# ---- ZeRO-2 (stage 3 refused) -------------------------------------------------------------------

def _zero(h100, stage: int, recompute=None):
    doc = _doc()
    doc["zero_stage"] = stage
    if recompute is not None:
        for p in doc["pipelines"]:
            for stg in p["stages"]:
                stg["recompute"] = recompute
    return CostModel(h100).estimate(Plan.model_validate(doc))


def test_zero2_shards_gradients_hand_computed(h100):
    """2 pipelines x dp 1 hold each layer: D = 2 replicas. ZeRO-2 halves the fp32 main gradients (4 B/param)
    and adds one 40M-parameter bucket of full gradients (160 MB) as transient; time unchanged (RS + AG = AR)."""
    z1, z2 = _zero(h100, 1), _zero(h100, 2)
    assert z2.iteration_time_s == z1.iteration_time_s
    for d in z1.memory_detail:
        m1, m2 = z1.memory_detail[d], z2.memory_detail[d]
        assert m2.gradients == pytest.approx(m1.gradients / 2)
        assert m2.transient - m1.transient == pytest.approx(min(m1.gradients, MEGATRON_BUCKET_PARAMS * 4))
        assert m2.weights == m1.weights and m2.optimizer == m1.optimizer


@settings(max_examples=30, deadline=None)
@given(shards=st.integers(1, 64), stage=st.sampled_from([1, 2, 3]))
def test_zero_memory_never_grows_with_more_shards(h100, shards, stage):
    cm = CostModel(h100)
    model = load_model("llama-3-8b")
    a = _mem(cm, model, zero_shards=shards, zero_level=stage)
    b = _mem(cm, model, zero_shards=2 * shards, zero_level=stage)
    assert b.weights + b.gradients + b.optimizer <= a.weights + a.gradients + a.optimizer


def test_zero3_in_a_pipeline_gathers_once_per_iteration(h100):
    """FSDP inside a pipeline (the interleaved example, 4 stages): parameters are gathered once per iteration
    and gradients reduce-scattered once (torchtitan's FSDP + PP), so the time is ZeRO-2's; memory keeps the
    stage's bf16 parameters and fp32 gradients unsharded, with the fp32 state sharded. (Compared without the
    example's selective recomputation: under ZeRO-3's torch convention it is torchtitan's op-level policy, which
    recomputes more; test_torch_selective_recomputes_every_second_gemm.)"""
    z2, z3 = _zero(h100, 2, recompute=False), _zero(h100, 3, recompute=False)
    assert z3.iteration_time_s == z2.iteration_time_s and z3.breakdown["zero_comm_s"] == 0
    z2, z3 = _zero(h100, 2), _zero(h100, 3)
    for d in z2.memory_detail:
        m2, m3 = z2.memory_detail[d], z3.memory_detail[d]
        assert m3.weights > m2.weights  # bf16 copy kept whole + the fp32 shard
        assert m3.optimizer < m2.optimizer  # Adam m, v only (8 B/param sharded, not 12)


def test_zero3_row_hand_computed():
    """Stage sync t = 1 s (an all-reduce's worth): per micro-batch a gather (0.5 s) before the forward, a gather
    and a reduce-scatter (0.5 + 0.5 s) with the backward; 4 blocks; fwd 2 s, bwd 0.6 s of compute."""
    r = (2.0, 0.6, 2.6, 0.0, 0.0, "gpu", "analytic", 0.0)
    assert zero3_row(r, 1.0, 4, False, False)[-1] == pytest.approx(1.5)
    on = zero3_row(r, 1.0, 4, True, True)
    # forward: max(0.5/4, 0.5 - 2) = 0.125; backward: max(1/4, 1 - 0.6) = 0.4
    assert on[0] == pytest.approx(2.125) and on[1] == pytest.approx(1.0) and on[-1] == pytest.approx(0.525)


def _single_stage(doc):
    """Each pipeline as one stage of all 32 blocks on its 8 devices (tp 2, dp 4), 8 micro-batches of 4."""
    d = copy.deepcopy(doc)
    d["micro_batch_size"] = 4
    for p in d["pipelines"]:
        p.pop("virtual_stages", None)
        devs = [x for stg in p["stages"] for x in stg["devices"]]
        st0 = dict(p["stages"][0], layers=[0, 32], devices=devs, dp=4)
        p["stages"] = [st0]
        p["micro_batches"] = 8
    return d


def test_zero3_end_to_end(h100):
    """Single-stage pipelines (plain FSDP): ZeRO-3 shards the weights (2 pipelines x dp 4 = 8 replicas), pays
    its traffic per micro-batch in zero_comm_s and no sync at the end; overlap hides most of it."""
    doc = _single_stage(_doc())
    cm = CostModel(h100)
    out = {}
    for z, og in ((2, False), (3, False), (3, True)):
        d = dict(doc, zero_stage=z, overlap_grad_reduce=og, overlap_param_gather=og)
        out[z, og] = cm.estimate(Plan.model_validate(d))
    z2, z3, z3o = out[2, False], out[3, False], out[3, True]
    assert z3.breakdown["dp_sync_exposed_s"] == 0 and z3.breakdown["zero_comm_s"] > 0
    assert z3o.breakdown["zero_comm_s"] < z3.breakdown["zero_comm_s"]
    assert z3o.iteration_time_s < z3.iteration_time_s
    assert z3.iteration_time_s > z2.iteration_time_s
    for dname, m2 in z2.memory_detail.items():
        m3 = z3.memory_detail[dname]
        # FSDP: fp32 params, grads, Adam m, v (16 B/param) over 8 replicas = the bf16 weights (2 B/param)
        assert m3.weights + m3.gradients + m3.optimizer == pytest.approx(m2.weights)
        assert m3.transient > m2.transient


def _golden_estimates() -> dict:
    out = {}
    for path in sorted((ROOT / "examples" / "plans").glob("*.json")):
        cl = load_cluster(ROOT / "examples" / "clusters" / f"{path.name.split('__')[0]}.yaml")
        e = CostModel(cl).estimate(load_plan(path))
        out[path.name] = {"iteration_time_s": repr(e.iteration_time_s), "max_memory_bytes": repr(e.max_memory_bytes),
                          "fits": e.fits, "breakdown": {k: repr(v) for k, v in e.breakdown.items()},
                          "stages": [[repr(s.fwd_s), repr(s.bwd_s), repr(s.memory_bytes)] for s in e.stages]}
    return out


def test_v1_example_plans_price_bit_identically():
    """Golden: every examples/plans/* plan as the cost model priced it when the file was last pinned, floats as
    repr, so a refactor cannot move an estimate unnoticed. A deliberate change of the model re-pins it with
    ``ARACHNE_REGEN_GOLDEN=1 python -m pytest tests/cost/test_v2_pricing.py -k golden_or_bit`` and says why in
    CHANGELOG.md."""
    got = _golden_estimates()
    if os.environ.get("ARACHNE_REGEN_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        pytest.skip("golden estimates re-pinned")
    golden = json.loads(GOLDEN.read_text())
    assert sorted(golden) == sorted(got)
    for name, want in golden.items():
        assert got[name] == want, name
