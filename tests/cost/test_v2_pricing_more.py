"""Pricing of the remaining version-2 features (issue 26 item 2): FP8 precision (Linear GEMMs at the GPU's
``fp8_tflops``, attention core / router / output layer in bf16; TE's fp8 weight copies, scaling state and
fp8-saved GEMM inputs); expert tensor parallelism ``etp != tp`` (``ep x etp x edp``); context parallelism ``cp`` (load-balanced halves, K/V ring overlapped with attention)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arachne.cost import CostModel
from arachne.cost.calibration import DEFAULT_CALIBRATION, MOE_LAYER_PASSES
from arachne.cost.compute import ComputeModel
from arachne.cost.expert_comm import expert_a2a_ring
from arachne.cost.features import (
    TE_AMAX_HISTORY_LEN,
    attention_core_fwd,
    cp_ring_exposed,
    fp8_gemm_count,
)
from arachne.cost.model import PRICED_V2_FEATURES
from arachne.cost.pipeline import _stage_params_cached
from arachne.plan import Plan, load_plan
from arachne.spec.cluster import load_cluster
from arachne.spec.model import load_model

ROOT = Path(__file__).resolve().parents[2]
V2 = ROOT / "examples" / "v2"


@pytest.fixture(scope="module")
def h100():
    return load_cluster(V2 / "h100-2x8.yaml")


def _doc(precision: str = "bf16"):
    d = json.loads((V2 / "interleaved-sp-selective.json").read_text())
    d["precision"] = precision
    return d


def _model(h100):
    return CostModel(h100).resolve_model(Plan.model_validate(_doc()))


def test_fp8_priced_and_others_still_refused(h100):
    assert "fp8" in PRICED_V2_FEATURES
    assert {"fp8", "etp", "cp"} <= PRICED_V2_FEATURES


def test_fp8_block_time_hand_computed(h100):
    """Only the Linear GEMMs move to the fp8 rate (H100 SXM: 1979 vs 989 TFLOPS peak, 1453.4 vs 792.1
    achievable): the fp8 block forward is the bf16 one minus, per projection and MLP matrix, its bf16 GEMM time
    plus its fp8 GEMM time."""
    m = _model(h100)
    gpu = h100.devices["h100-0:0"].gpu
    cm = ComputeModel(None, DEFAULT_CALIBRATION.compute)
    seq, b, tp = 4096, 1.0, 2
    f8, b8 = cm.analytic_block(m, gpu, "fp8", seq, b, tp, 1, False)
    f16, b16 = cm.analytic_block(m, gpu, "bf16", seq, b, tp, 1, False)
    p8, p16 = gpu.peak_flops("fp8"), gpu.peak_flops("bf16")
    assert p8 == pytest.approx(1979e12) and p16 == pytest.approx(989e12)
    tokens = b * seq
    lin = [2 * tokens * i * o / (tp if split else 1) for i, o, split in m.attention_gemms]
    lin += [2 * tokens * m.hidden_size * m.ffn_hidden_size / tp] * m.mlp_matrices
    e8, e16 = cm.gemm_peak(gpu, "fp8"), cm.gemm_peak(gpu, "bf16")  # the measured achievable rates (MAMF)
    assert e8 == pytest.approx(1453.4e12) and e16 == pytest.approx(792.1e12)
    saved = sum(cm._gemm(x, e16) - cm._gemm(x, e8) for x in lin)
    assert saved > 0
    assert f16 - f8 == pytest.approx(saved, rel=1e-9)
    assert b16 - b8 == pytest.approx(DEFAULT_CALIBRATION.compute.bwd_over_fwd * saved, rel=1e-9)
    # the output layer stays bf16: the ends are priced identically
    assert cm.analytic_ends(m, gpu, "fp8", seq, b, tp) == cm.analytic_ends(m, gpu, "bf16", seq, b, tp)


def test_fp8_memory_hand_computed(h100):
    """Per device: + 2 B per block parameter (fp8 weight + transpose) + 3 fp32 amax histories of 1024 (+ scale,
    inverse scale) per GEMM; activations - 2 s b h bytes per block kept (the two norm outputs in fp8)."""
    m = _model(h100)
    cm = CostModel(h100)
    seq, b, tp, n_mb = 4096, 1.0, 2, 3
    args = {"first": False, "last": False, "num_stages": 4, "tp": tp, "ep": 1, "b": b, "in_flight_mbs": n_mb,
            "seq": seq}
    m8 = cm.stage_memory(m, (0, 8), precision="fp8", **args)
    m16 = cm.stage_memory(m, (0, 8), precision="bf16", **args)
    params = _stage_params_cached(m, 0, 8, False, False, 4, tp, 1)
    gemms = 8 * (len(m.attention_gemms) + m.mlp_matrices)
    assert fp8_gemm_count(m, 0, 1) == len(m.attention_gemms) + m.mlp_matrices
    assert m8.weights - m16.weights == pytest.approx(2 * params + gemms * 3 * (TE_AMAX_HISTORY_LEN + 2) * 4)
    assert m16.activations - m8.activations == pytest.approx(n_mb * 8 * 2 * seq * b * m.hidden_size)
    assert m8.gradients == m16.gradients and m8.optimizer == m16.optimizer
    # sequence parallel splits the saving over tp; fully recomputed blocks keep only their input (no saving)
    sp8 = cm.stage_memory(m, (0, 8), precision="fp8", sp=True, **args)
    sp16 = cm.stage_memory(m, (0, 8), precision="bf16", sp=True, **args)
    assert sp16.activations - sp8.activations == pytest.approx(n_mb * 8 * 2 * seq * b * m.hidden_size / tp)
    r8 = cm.stage_memory(m, (0, 8), precision="fp8", recompute=True, **args)
    r16 = cm.stage_memory(m, (0, 8), precision="bf16", recompute=True, **args)
    assert r8.activations == r16.activations


def test_fp8_plan_estimates_faster_than_bf16(h100):
    cm = CostModel(h100)
    e8 = cm.estimate(Plan.model_validate(_doc("fp8")))
    e16 = cm.estimate(Plan.model_validate(_doc("bf16")))
    assert e8.breakdown["compute_s"] < e16.breakdown["compute_s"]
    assert e8.iteration_time_s < e16.iteration_time_s
    assert e8.breakdown["tp_comm_s"] == e16.breakdown["tp_comm_s"]  # bf16 activations on the wire
    assert e8.fits


@settings(max_examples=40, deadline=None)
@given(seq=st.sampled_from([512, 2048, 8192]), b=st.sampled_from([1.0, 2.0, 4.0]), tp=st.sampled_from([1, 2, 4, 8]),
       ratio=st.floats(1.0, 4.0), moe=st.booleans())
def test_fp8_never_slower_than_bf16(seq, b, tp, ratio, moe):
    """With an achievable fp8 GEMM rate >= the bf16 one, no block is slower in fp8 than in bf16 (Hopper's
    measured fp8 efficiency is below its bf16 one: the fp8 peak is scaled so that the achievable rates keep
    ``ratio``)."""
    from arachne.cost.calibration import MATMUL_EFFICIENCY

    ratio *= MATMUL_EFFICIENCY["hopper", "bf16"] / MATMUL_EFFICIENCY["hopper", "fp8"]
    cl = load_cluster(V2 / "h100-2x8.yaml")
    base = cl.devices["h100-0:0"].gpu
    gpu = base.model_copy(update={"fp8_tflops": base.peak_tflops * ratio})
    from arachne.spec.model import load_model
    m = load_model("mixtral-8x7b") if moe else CostModel(cl).resolve_model(Plan.model_validate(_doc()))
    cm = ComputeModel(None, DEFAULT_CALIBRATION.compute)
    f8 = cm.analytic_block(m, gpu, "fp8", seq, b, tp, 2 if moe else 1, moe)
    f16 = cm.analytic_block(m, gpu, "bf16", seq, b, tp, 2 if moe else 1, moe)
    assert f8[0] <= f16[0] and f8[1] <= f16[1]


@settings(max_examples=40, deadline=None)
@given(n_mb=st.integers(1, 8), b=st.sampled_from([0.5, 1.0, 2.0]), tp=st.sampled_from([1, 2, 4]),
       sp=st.booleans(), layers=st.sampled_from([(0, 1), (0, 8), (8, 32)]))
def test_fp8_memory_more_state_fewer_activations(n_mb, b, tp, sp, layers):
    cl = load_cluster(V2 / "h100-2x8.yaml")
    cm = CostModel(cl)
    m = cm.resolve_model(Plan.model_validate(_doc()))
    kw = {"first": layers[0] == 0, "last": layers[1] == m.num_layers, "num_stages": 2, "tp": tp, "ep": 1, "b": b,
          "in_flight_mbs": n_mb, "seq": 2048, "sp": sp}
    m8 = cm.stage_memory(m, layers, precision="fp8", **kw)
    m16 = cm.stage_memory(m, layers, precision="bf16", **kw)
    assert m8.weights > m16.weights
    assert m8.activations < m16.activations
    assert m8.transient == m16.transient


# ---- expert tensor parallelism (etp != tp) ---------------------------------------------------------------

def _moe_doc(etp):
    d = json.loads((V2 / "moe-ep-etp-fp8.json").read_text())
    for s in d["pipelines"][0]["stages"]:
        if etp is None:
            s.pop("etp")
        else:
            s["etp"] = etp
    return d


def test_etp_example_estimates_and_etp_equal_tp_is_version_1(h100):
    e = CostModel(h100).estimate(load_plan(V2 / "moe-ep-etp-fp8.json"))
    assert e.iteration_time_s > 0 and e.breakdown["ep_comm_s"] > 0
    same = CostModel(h100).estimate(Plan.model_validate(_moe_doc(2)))  # etp == tp: version 1's spelling
    v1 = CostModel(h100).estimate(Plan.model_validate(_moe_doc(None)))
    assert same.iteration_time_s == v1.iteration_time_s and same.max_memory_bytes == v1.max_memory_bytes


def test_etp_memory_hand_computed(h100):
    """Mixtral, blocks [0, 16), tp 2, ep 4, etp 1 on 8 devices: experts / (etp ep) = / 4 per device (not / 8);
    ZeRO-1 over D = 4 dense replicas, experts over edp = 4 x 2 / (4 x 1) = 2 replicas."""
    cm = CostModel(h100)
    m = cm.resolve_model(Plan.model_validate(_moe_doc(1)))
    X = sum(m.block_expert_params(i) for i in range(16))
    rep = m.attention_replicated_params
    dense = sum(m.block_params(i) - m.block_expert_params(i) - rep for i in range(16)) / 2 + 16 * rep
    kw = {"first": False, "last": False, "num_stages": 2, "tp": 2, "ep": 4, "b": 2.0, "in_flight_mbs": 1,
          "precision": "bf16", "seq": 4096, "zero_shards": 4}
    mem = cm.stage_memory(m, (0, 16), etp=1, **kw)
    assert mem.weights == pytest.approx(2 * (dense + X / 4))
    assert mem.optimizer == pytest.approx(12 * (dense / 4 + X / 4 / 2))
    v1 = cm.stage_memory(m, (0, 16), **kw)
    assert v1.weights == pytest.approx(2 * (dense + X / 8))


def test_etp_block_time_hand_computed(h100):
    """Only the routed experts change: E/ep local experts, each with tokens*k*ep*etp/(E*tp) tokens, width
    ffn/etp (the same FLOPs per device, other GEMM shapes), and the MoE layer's traffic over those outputs and
    weights (MOE_LAYER_PASSES, grouped)."""
    cm = ComputeModel(None, DEFAULT_CALIBRATION.compute)
    m = CostModel(h100).resolve_model(Plan.model_validate(_moe_doc(1)))
    gpu = h100.devices["h100-0:0"].gpu
    seq, b, tp, ep = 4096, 2.0, 2, 4
    f1, _ = cm.analytic_block(m, gpu, "bf16", seq, b, tp, ep, True, 1)
    f0, _ = cm.analytic_block(m, gpu, "bf16", seq, b, tp, ep, True)
    assert cm.analytic_block(m, gpu, "bf16", seq, b, tp, ep, True, tp)[0] == pytest.approx(f0, rel=1e-12)
    E, k, h, ffn, peak = m.num_experts, m.experts_top_k, m.hidden_size, m.expert_ffn, gpu.peak_flops("bf16")
    tokens = b * seq
    old = (E / ep) * m.mlp_matrices * cm._gemm(2 * tokens * k * ep / E * h * ffn / tp, peak)
    new = (E / ep) * m.mlp_matrices * cm._gemm(2 * tokens * k * ep * 1 / (E * tp) * h * ffn / 1, peak)
    out_f, w_f = MOE_LAYER_PASSES["grouped"][:2]
    mats = m.mlp_matrices
    bw = gpu.hbm_bandwidth
    old += (out_f * tokens * k * ((mats - 1) * ffn / tp + h) + w_f * (E / ep) * mats * h * ffn / tp) * 2 / bw
    new += (out_f * tokens * k / tp * ((mats - 1) * ffn + h) + w_f * (E / ep) * mats * h * ffn) * 2 / bw
    assert f1 - f0 == pytest.approx(new - old, rel=1e-9, abs=1e-12)


def test_etp_all_to_all_group_and_expert_sync_ring(h100):
    """Device order ep x etp x edp, etp fastest: etp 1, ep 4 on 8 devices -> groups [0..3], [4..7] (2 per node
    share its network); the expert gradient ring is the edp replicas of a slot: devices 0 and 4."""
    cm = CostModel(h100)
    p = load_plan(V2 / "moe-ep-etp-fp8.json")
    st0 = p.pipelines[0].stages[0]
    ring, conc = expert_a2a_ring(cm._dev_node, st0, st0.devices.index("h100-0:5"), 1)
    assert ring == [f"h100-0:{i}" for i in range(4, 8)] and conc == 2
    st2 = st0.model_copy(update={"ep": 2, "etp": 2, "tp": 4, "dp": 2})
    ring2, _ = expert_a2a_ring(cm._dev_node, st2, st2.devices.index("h100-0:5"), 2)
    assert ring2 == ["h100-0:5", "h100-0:7"]
    m = cm.resolve_model(p)
    _, _, stage_times = cm._sync(m, p)
    X = sum(m.block_expert_params(i) for i in range(16)) / 4 * 2  # bf16 gradients of one device's experts
    expert_t = cm.network.all_reduce_time(["h100-0:0", "h100-0:4"], X, concurrent=1)
    v1 = CostModel(h100)
    p1 = Plan.model_validate(_moe_doc(2))
    dense_and_v1 = v1._sync(m, p1)[2][0][0]
    assert expert_t > 0 and stage_times[0][0] > expert_t
    assert stage_times[0][0] != dense_and_v1


@settings(max_examples=30, deadline=None)
@given(ep=st.sampled_from([1, 2, 4, 8]), zero=st.sampled_from([1, 2, 4]), tp=st.sampled_from([1, 2, 4, 8]))
def test_etp_memory_monotone(ep, zero, tp):
    """More expert tensor parallelism never adds model state per device (ZeRO-1 off: no edp effect)."""
    cl = load_cluster(V2 / "h100-2x8.yaml")
    cm = CostModel(cl)
    m = cm.resolve_model(Plan.model_validate(_moe_doc(1)))
    kw = {"first": False, "last": False, "num_stages": 2, "tp": tp, "ep": ep, "b": 1.0, "in_flight_mbs": 1,
          "precision": "bf16", "seq": 2048}
    prev = None
    for etp in (1, 2, 4, 8, 16):
        mem = cm.stage_memory(m, (0, 16), etp=etp, zero_shards=1, **kw)
        state = mem.weights + mem.gradients + mem.optimizer
        assert prev is None or state <= prev
        prev = state


# ---- context parallelism (cp) ------------------------------------------------------------------------------

def _cp_doc(cp: int, zero: int = 1):
    d = json.loads((V2 / "cp-zero3.json").read_text())
    d["zero_stage"] = zero
    d["sequence_length"] = 8192
    s = d["pipelines"][0]["stages"][0]
    s["cp"], s["dp"] = cp, 2
    s["devices"] = s["devices"][:2 * cp * 2]
    if cp == 1:
        s.pop("cp")
    return d


def test_cp_example_estimates(h100):
    e = CostModel(h100).estimate(load_plan(V2 / "cp-zero3.json"))
    assert e.fits and e.iteration_time_s > 0
    assert "cp_comm_s" in e.breakdown and e.breakdown["zero_comm_s"] >= 0


class _FakeNet:
    """Records the ring's sends; every hop costs ``t`` seconds."""

    def __init__(self, t):
        self.t, self.calls = t, []

    def p2p_time(self, src, dst, nbytes):
        self.calls.append((tuple(src), tuple(dst), nbytes))
        return self.t


def test_cp_ring_hand_computed(h100):
    """Llama 3.1 8B (8 KV heads x 128), s 8192, b 1 sequence per rank-share (already / cp), tp 2, cp 4:
    a hop moves b s x 2 x 8 x 128 / tp x 2 B per device (x tp devices per group pair); 3 steps forward, each
    exposing max(0, 1 s - core/cp); backward 3 steps of twice the bytes behind the core's backward / cp."""
    cm = CostModel(h100)
    m = cm.resolve_model(Plan.model_validate(_cp_doc(4)))
    gpu = h100.devices["h100-0:0"].gpu
    st0 = Plan.model_validate(_cp_doc(4)).pipelines[0].stages[0]
    groups = st0.groups()
    net = _FakeNet(1.0)
    b, seq, tp, cp = 0.25, 8192, 2, 4
    f, bw = cp_ring_exposed(net, cm.compute, m, gpu, "bf16", seq, b, tp, cp, groups, 5)
    assert len(net.calls) == 4 and net.calls[0][0] == groups[4] and net.calls[-1][1] == groups[4]
    assert net.calls[0][2] == pytest.approx(b * seq * 2 * 8 * 128 / tp * 2 * tp)
    core_f, core_b = cm.compute.attention_core(m, gpu, "bf16", seq, b, tp)
    assert f == pytest.approx(3 * (1.0 - core_f / cp)) and bw == pytest.approx(3 * (2.0 - core_b / cp))
    fast = cp_ring_exposed(_FakeNet(0.0), cm.compute, m, gpu, "bf16", seq, b, tp, cp, groups, 5)
    assert fast == (0.0, 0.0)  # fully hidden behind the attention of each step


def test_cp_splits_activations_and_syncs_over_dp_cp(h100):
    cm = CostModel(h100)
    p1, p2 = Plan.model_validate(_cp_doc(1)), Plan.model_validate(_cp_doc(2))
    e1, e2 = cm.estimate(p1), cm.estimate(p2)
    a1 = next(iter(e1.memory_detail.values())).activations
    a2 = next(iter(e2.memory_detail.values())).activations
    assert a2 == pytest.approx(a1 / 2)
    m = cm.resolve_model(p1)
    assert cm._sync(m, p1)[1] == [(2,)] and cm._sync(m, p2)[1] == [(4,)]
    assert e2.breakdown["compute_s"] < e1.breakdown["compute_s"]


@settings(max_examples=30, deadline=None)
@given(seq=st.sampled_from([4096, 16384, 65536]), b=st.sampled_from([0.5, 1.0, 2.0]), tp=st.sampled_from([1, 2, 4]),
       cp=st.sampled_from([2, 4, 8]), hop=st.floats(0.0, 0.05))
def test_cp_halves_attention_but_adds_ring_traffic(seq, b, tp, cp, hop):
    """Per rank the attention core is at most 1/cp of the unsplit one (plus one launch: the GEMM efficiency
    curve only loses on smaller GEMMs); the ring exposes at least ``(cp-1)(comm - step)`` and never less
    than zero, and more when hops get slower."""
    cl = load_cluster(V2 / "h100-2x8.yaml")
    cm = CostModel(cl)
    m = cm.resolve_model(Plan.model_validate(_cp_doc(2)))
    gpu = cl.devices["h100-0:0"].gpu
    full = attention_core_fwd(cm.compute, m, gpu, "bf16", seq, b, tp)
    split = attention_core_fwd(cm.compute, m, gpu, "bf16", seq, b / cp, tp)
    launch = cm.compute.cal.kernel_launch_s
    assert split <= (full - launch) / cp * 1.5 + launch and split < full
    groups = [(f"h100-{j // 8}:{j % 8}",) for j in range(cp)]
    f, bw = cp_ring_exposed(_FakeNet(hop), cm.compute, m, gpu, "bf16", seq, b / cp, 1, cp, groups, 0)
    f2, bw2 = cp_ring_exposed(_FakeNet(hop + 0.01), cm.compute, m, gpu, "bf16", seq, b / cp, 1, cp, groups, 0)
    step = cm.compute.attention_core(m, gpu, "bf16", seq, b / cp, 1)[0] / cp
    assert 0.0 <= f <= f2 and 0.0 <= bw <= bw2
    assert f == pytest.approx((cp - 1) * max(0.0, hop - step), abs=1e-15)
    slow, _ = cp_ring_exposed(_FakeNet(step + 0.01), cm.compute, m, gpu, "bf16", seq, b / cp, 1, cp, groups, 0)
    assert slow == pytest.approx((cp - 1) * 0.01)


# ---- attention kernels ----------------------------------------------------------------------------

def test_attention_kernels_hand_computed(h100):
    """Llama 3.1 8B, 8192 tokens, one sequence, tp 1, bf16 on H100 (989 TFLOPS dense): half the score matrix's
    FLOPs, 32 heads x 8192^2 x (128 + 128), forward at the kernel's measured rate and 2.5x that backward (cuDNN
    529 / 541, FlashAttention-2 333 / 299 TFLOPS at 8K tokens); fp32 keeps the whole-matrix GEMMs."""
    cm = CostModel(h100)
    m = load_model("llama-3-8b")
    gpu = h100.devices["h100-0:0"].gpu
    flops = 32 * 8192 * 8192 * 256
    for kernel, (f_tf, b_tf) in (("cudnn", (529, 541)), ("flash2", (333, 299)), (None, (529, 541))):
        f, bw = cm.compute.attention_core(m, gpu, "bf16", 8192, 1.0, 1, kernel)
        assert f == pytest.approx(flops / (f_tf * 1e12), rel=1e-9)
        assert bw == pytest.approx(2.5 * flops / (b_tf * 1e12), rel=1e-9)
    f32, b32 = cm.compute.attention_core(m, gpu, "fp32", 8192, 1.0, 1)
    gemm = 2 * cm.compute._gemm(2 * 32 * 8192 * 8192 * 128, cm.compute.gemm_peak(gpu, "fp32"))
    assert f32 > gemm and b32 == pytest.approx(2 * f32)  # plus the fp32 score passes
    # shorter sequences run the kernel slower: s / (s + 400), relative to 8K
    f2k, _ = cm.compute.attention_core(m, gpu, "bf16", 2048, 1.0, 1, "cudnn")
    rate = (2048 / 2448) / (8192 / 8592)
    assert f2k == pytest.approx(32 * 2048 * 2048 * 256 / (529e12 * rate), rel=1e-9)


def test_a_plans_attention_kernel_reaches_its_estimate(h100):
    """The same plan priced with flash2 is slower than with cudnn (the default on Hopper), and spelling the
    default out changes nothing."""
    doc = _cp_doc(1)
    base = CostModel(h100).estimate(Plan.model_validate(doc))
    spelled = CostModel(h100).estimate(Plan.model_validate(dict(doc, attention_kernel="cudnn")))
    fa2 = CostModel(h100).estimate(Plan.model_validate(dict(doc, attention_kernel="flash2")))
    assert spelled.iteration_time_s == base.iteration_time_s
    assert fa2.iteration_time_s > base.iteration_time_s


@pytest.mark.parametrize("slow_at", [0, 1, 2])
@pytest.mark.parametrize("cp", [1, 2])
def test_a_stage_is_as_slow_as_its_slowest_group_wherever_it_sits(slow_at, cp):
    """Groups alike (node classes, node sharing, their rings) are priced once (CostModel._stage): a TP group on a
    slower node is priced apart and decides the stage, first, in the middle or last, with and without cp."""
    from arachne.plan import Pipeline, Stage
    from arachne.spec.cluster import cluster_from_dict

    cl = cluster_from_dict({"name": "m", "nodes": [{"name": "h{i}", "count": 2, "gpu": "H100", "gpus_per_node": 8},
                                                   {"name": "a{i}", "count": 1, "gpu": "A100-80",
                                                    "gpus_per_node": 8}]})
    nodes = ["h0", "h1"]
    nodes.insert(slow_at, "a0")
    devices = tuple(f"{n}:{i}" for n in nodes for i in range(8))
    stage = Stage(layers=(0, 32), devices=devices, tp=8 // cp, cp=cp, sequence_parallel=True)
    pipe = Pipeline(micro_batches=4, stages=(stage,))
    plan = Plan(model="Llama-3.1-8B", global_batch_size=24, sequence_length=8192, micro_batch_size=6, pipelines=(pipe,))
    est = CostModel(cl).estimate(plan)
    (row,) = est.stages
    assert "A100" in row.gpu
    first = tuple(f"{n}:{i}" for n in ["a0", "h0", "h1"] for i in range(8))
    ref = plan.model_copy(update={"pipelines": (pipe.model_copy(update={
        "stages": (stage.model_copy(update={"devices": first}),)}),)})
    assert CostModel(cl).estimate(ref).iteration_time_s == pytest.approx(est.iteration_time_s, rel=1e-12)
