"""The cost model: each term, the schedule simulation, measured data, and its invariants."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arachne.cost import CostModel
from arachne.cost.calibration import DEFAULT_CALIBRATION
from arachne.cost.memory import state_bytes_per_param
from arachne.cost.network import Link, Network
from arachne.cost.schedule import in_flight, pipeline_time, simulate
from arachne.plan import Pipeline, Plan, Stage
from arachne.profiles.format import default_profile_db
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.model import model_catalog

SAILOR = Path(__file__).resolve().parents[2] / "data" / "sailor"  # measurements, copied with their licence


def gpu_type(name: str, scale: float) -> dict:
    return {"name": name, "memory_gb": 80, "peak_tflops": 300 * scale, "memory_bandwidth_gbps": 2000 * scale,
            "intra_node_gbps": 600 * scale, "inter_node_gbps": 50 * scale, "fp32_tflops": 20 * scale,
            "tf32_tflops": 150 * scale}


def two_type_cluster(per_node: int = 8, nodes: int = 2, slow_scale: float = 0.5):
    return cluster_from_dict({
        "name": "t", "gpu_types": [gpu_type("Fast", 1.0), gpu_type("Slow", slow_scale)],
        "nodes": [{"name": "f{i}", "count": nodes, "gpu": "Fast", "gpus_per_node": per_node},
                  {"name": "s{i}", "count": nodes, "gpu": "Slow", "gpus_per_node": per_node}]})


def one_pipeline_plan(model: str, stages: list[tuple[tuple[int, int], list[str], int]], gbs: int = 16,
                      mbs: int = 2, seq: int = 1024, precision: str = "bf16", zero: int = 0) -> Plan:
    return Plan(model=model, global_batch_size=gbs, sequence_length=seq, micro_batch_size=mbs, precision=precision,
                zero_stage=zero, pipelines=(Pipeline(micro_batches=gbs // mbs, stages=tuple(
                    Stage(layers=lay, devices=tuple(devs), tp=tp) for lay, devs, tp in stages)),))


# ---- network -------------------------------------------------------------------------------------
def test_link_is_alpha_beta():
    link = Link(bandwidth=10e9, latency=1e-5)
    assert link.time(0) == 0
    assert link.time(1e9) == pytest.approx(0.1 + 1e-5)
    small, big = link.time(1e3), link.time(1e9)
    assert 1e3 / small < 1e9 / big  # effective bandwidth grows with message size


def test_all_reduce_intra_vs_inter_and_scaling():
    cl = two_type_cluster()
    net = Network(cl, DEFAULT_CALIBRATION.network)
    intra = net.all_reduce_time(["f0:0", "f0:1"], 1e8)
    inter = net.all_reduce_time(["f0:0", "f1:0"], 1e8)
    assert 0 < intra < inter
    assert net.all_reduce_time(["f0:0"], 1e8) == 0
    # ring: 2(n-1)/n bytes per member; bottleneck member sets the pace
    mixed = net.all_reduce_time(["f0:0", "s0:0"], 1e8)
    assert mixed > inter
    assert net.all_to_all_time(["f0:0", "f0:1", "f0:2", "f0:3"], 1e8) > 0


def test_p2p_inside_node_is_faster_than_across():
    cl = two_type_cluster()
    net = Network(cl, DEFAULT_CALIBRATION.network)
    assert net.p2p_time(["f0:0"], ["f0:1"], 1e8) < net.p2p_time(["f0:0"], ["f1:0"], 1e8)


# ---- schedule ------------------------------------------------------------------------------------
def test_uniform_1f1b_matches_closed_form():
    S, m, f, b = 4, 8, 1.0, 2.0
    assert simulate((f,) * S, (b,) * S, (0,) * S, (0,) * S, m) == pytest.approx((m - 1 + S) * (f + b))


def test_gpipe_and_1f1b_equal_without_memory_limits_for_uniform_stages():
    args = ((1.0,) * 3, (2.0,) * 3, (0.0,) * 3, (0.0,) * 3, 6)
    assert simulate(*args, "gpipe") == pytest.approx(simulate(*args, "1f1b"))


def test_transfer_delays_add_to_the_timeline():
    base = simulate((1.0, 1.0), (2.0, 2.0), (0.0, 0.0), (0.0, 0.0), 4)
    slow = simulate((1.0, 1.0), (2.0, 2.0), (0.5, 0.0), (0.0, 0.5), 4)
    assert slow > base


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 10), st.integers(1, 400), st.randoms(use_true_random=False),
       st.sampled_from(["1f1b", "gpipe"]))
def test_long_runs_extrapolate_within_one_percent(S, m, rnd, schedule):
    f = tuple(rnd.uniform(0.5, 2) for _ in range(S))
    b = tuple(x * rnd.uniform(1.5, 2.5) for x in f)
    sf = tuple(rnd.uniform(0, 0.3) if s < S - 1 else 0.0 for s in range(S))
    sb = tuple(rnd.uniform(0, 0.3) if s > 0 else 0.0 for s in range(S))
    full = simulate(f, b, sf, sb, m, schedule)
    assert pipeline_time(f, b, sf, sb, m, schedule) == pytest.approx(full, rel=0.01)


def test_in_flight_micro_batches():
    assert [in_flight(s, 4, 10, "1f1b") for s in range(4)] == [4, 3, 2, 1]
    assert in_flight(0, 4, 2, "1f1b") == 2
    assert in_flight(3, 4, 10, "gpipe") == 10


# ---- compute -------------------------------------------------------------------------------------
def test_profiles_are_used_exactly_where_measured():
    raw = json.loads((SAILOR / "profiles_simulator.json").read_text())["data"]["OPT-350"]["Titan-RTX"]["2"]["4"]
    cl = cluster_from_dict({"nodes": [{"name": "n", "gpu": "Titan-RTX"}]})
    cm = CostModel(cl)
    model = model_catalog().get("OPT-350")
    lc = cm.layer_costs(model, cl.nodes[0].gpu, "fp32", 2048, 2, 4)
    assert lc.source == "profile" and lc.includes_tp_comm
    f, b = lc.blocks(0, 24)
    assert f == pytest.approx(sum(raw["fwd_s"][1:25]))
    assert b == pytest.approx(sum(raw["bwd_s"][1:25]))
    assert lc.emb_fwd == pytest.approx(raw["fwd_s"][0])
    assert lc.head_fwd == pytest.approx(raw["fwd_s"][25])


def test_profile_interpolates_between_micro_batch_sizes():
    cl = cluster_from_dict({"nodes": [{"name": "n", "gpu": "A100-80"}]})
    cm = CostModel(cl)
    model = model_catalog().get("OPT-350")
    g = cl.nodes[0].gpu
    t2 = sum(cm.layer_costs(model, g, "fp32", 2048, 2, 1).blocks(0, 24))
    t3 = sum(cm.layer_costs(model, g, "fp32", 2048, 3, 1).blocks(0, 24))
    t4 = sum(cm.layer_costs(model, g, "fp32", 2048, 4, 1).blocks(0, 24))
    assert t3 == pytest.approx((t2 + t4) / 2)
    # a tp without measurements is scaled from a measured one, not dropped to analytic
    pset = default_profile_db().get("OPT-350", "A100-80", "fp32")
    missing = [t for t in (1, 2, 4, 8) if not pset.has_tp(t)]
    if missing:
        assert "scaled" in cm.layer_costs(model, g, "fp32", 2048, 2, missing[0]).source


def test_analytic_compute_scales_with_gpu_speed_and_work():
    cl = two_type_cluster()
    cm = CostModel(cl)
    model = model_catalog().get("LLaMA-2-7B")
    fast, slow = cl.gpu_types["Fast"], cl.gpu_types["Slow"]
    lf = cm.layer_costs(model, fast, "bf16", 2048, 1, 1)
    ls = cm.layer_costs(model, slow, "bf16", 2048, 1, 1)
    assert lf.source == "analytic"
    assert sum(ls.blocks(0, 32)) > sum(lf.blocks(0, 32))
    assert sum(cm.layer_costs(model, fast, "bf16", 2048, 2, 1).blocks(0, 1)) > sum(lf.blocks(0, 1))
    assert sum(cm.layer_costs(model, fast, "bf16", 2048, 1, 2).blocks(0, 1)) < sum(lf.blocks(0, 1))


def test_analytic_model_tracks_profiles_across_gpus():
    """Analytic block time vs every tp=1 Sailor measurement (OPT-30 excluded: profiled without TF32)."""
    db = default_profile_db()
    errs = []
    for pset in db.sets.values():
        doc = pset.doc
        model = model_catalog().get(doc.model)
        cl = cluster_from_dict({"nodes": [{"name": "n", "gpu": doc.gpu}]})
        cm = CostModel(cl, profiles=None)
        gpu = cl.nodes[0].gpu
        if not pset.has_tp(1) or doc.model == "OPT-30":
            continue
        for mbs, e in pset.by_tp[1].items():
            lc = cm.layer_costs(model, gpu, "fp32", doc.sequence_length, mbs, 1)
            pred = sum(lc.blocks(2, 3))
            meas = e.blocks.fwd_s[2] + e.blocks.bwd_s[2]
            if meas > 2e-4:
                errs.append(abs(math.log(pred / meas)))
    assert errs and max(errs) < math.log(1.35)
    assert sum(errs) / len(errs) < math.log(1.15)


# ---- memory --------------------------------------------------------------------------------------
def test_state_bytes_per_parameter():
    cal = DEFAULT_CALIBRATION.memory
    assert sum(state_bytes_per_param("bf16", cal)) == 18  # Megatron: bf16 2 + fp32 main grads 4 + 12 (issue 26)
    assert sum(state_bytes_per_param("fp32", cal)) == 16  # + 8 B/param of DeepSpeed buffers, added per stage


def test_zero1_recompute_and_activations_move_memory_the_right_way():
    cl = two_type_cluster()
    cm = CostModel(cl)
    model = model_catalog().get("GPT-3-1.3B")
    kw = dict(model=model, layers=(0, 24), first=True, last=True, num_stages=1, tp=1, ep=1, b=2.0,
              in_flight_mbs=1, precision="bf16", seq=2048)
    base = cm.stage_memory(**kw).total
    assert cm.stage_memory(**{**kw, "zero_shards": 8}).total < base
    assert cm.stage_memory(**{**kw, "recompute": True}).total < base
    assert cm.stage_memory(**{**kw, "in_flight_mbs": 4}).total > base
    assert cm.stage_memory(**{**kw, "b": 4.0}).total > base


def test_activation_model_matches_sailor_measurement():
    """OPT-350 block activations at mbs 1 (fp32) vs layer_memory.json, for tp 1, 2, 4, 8."""
    from arachne.cost.memory import block_activation_bytes

    data = json.loads((SAILOR / "layer_memory.json").read_text())["data"]["OPT-350"]
    model = model_catalog().get("OPT-350")
    for tp, rec in data.items():
        measured = rec["act_mem_bytes"][1]
        pred = block_activation_bytes(model, 0, 2048, 1, int(tp), "fp32", DEFAULT_CALIBRATION.memory)
        assert pred == pytest.approx(measured, rel=0.05)


# ---- whole estimates -----------------------------------------------------------------------------
def test_single_stage_equals_sum_of_layers_plus_optimizer():
    cl = two_type_cluster()
    cm = CostModel(cl)
    model = model_catalog().get("GPT-3-1.3B")
    plan = one_pipeline_plan("GPT-3-1.3B", [((0, 24), ["f0:0"], 1)], gbs=8, mbs=2)
    est = cm.estimate(plan)
    lc = cm.layer_costs(model, cl.gpu_types["Fast"], "bf16", 1024, 2, 1)
    f, b = lc.blocks(0, 24)
    per_mb = f + b + lc.emb_fwd + lc.emb_bwd + lc.head_fwd + lc.head_bwd
    assert est.iteration_time_s == pytest.approx(4 * per_mb + est.breakdown["optimizer_s"])
    assert est.breakdown["dp_sync_s"] == 0 and est.breakdown["p2p_s"] == 0
    assert sum(est.breakdown.values()) == pytest.approx(est.iteration_time_s)


def test_measured_mixed_rtx_mape_within_target():
    """The visible measured set (9 plans): mean absolute error on iteration time <= 10%."""
    data = json.loads((SAILOR / "measured_mixed_rtx.json").read_text())
    errs = []
    for rec in data["records"]:
        cl = cluster_from_dict(rec["cluster"])
        plan = Plan(**rec["plan"])
        pred = CostModel(cl).estimate(plan).iteration_time_s
        errs.append(abs(pred - rec["measured_iteration_time_s"]) / rec["measured_iteration_time_s"])
    assert sum(errs) / len(errs) <= 0.10


def test_moe_plan_prices_expert_parallel_all_to_all():
    cl = cluster_from_dict({"nodes": [{"name": "h{i}", "count": 2, "gpu": "H100"}]})
    cm = CostModel(cl)
    devs = [f"h0:{i}" for i in range(8)]
    plan = Plan(model="Qwen1.5-MoE-A2.7B", global_batch_size=16, sequence_length=2048, micro_batch_size=8,
                pipelines=(Pipeline(micro_batches=2, stages=(Stage(layers=(0, 24), devices=tuple(devs), tp=1, ep=4),)),))
    est = cm.estimate(plan)
    assert est.breakdown["ep_comm_s"] > 0
    no_ep = plan.model_copy(update={"pipelines": (Pipeline(micro_batches=2, stages=(
        Stage(layers=(0, 24), devices=tuple(devs), tp=1, ep=1),)),)})
    assert cm.estimate(no_ep).max_memory_bytes > est.max_memory_bytes


# ---- invariants (hypothesis) ---------------------------------------------------------------------
stage_splits = st.lists(st.integers(1, 23), min_size=0, max_size=3, unique=True).map(lambda xs: sorted(xs))


def _plan_from(splits: list[int], tps: list[int], node_prefix: str, mbs: int, precision: str) -> Plan:
    bounds = [0, *splits, 24]
    stages = []
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        tp = tps[i % len(tps)]
        stages.append(((a, b), [f"{node_prefix}{i}:{j}" for j in range(tp)], tp))
    return one_pipeline_plan("GPT-3-1.3B", stages, gbs=8 * mbs, mbs=mbs, precision=precision)


@settings(max_examples=40, deadline=None)
@given(stage_splits, st.lists(st.sampled_from([1, 2, 4]), min_size=1, max_size=4), st.sampled_from([1, 2]),
       st.sampled_from(["bf16", "fp32"]))
def test_estimate_is_deterministic_positive_and_slower_gpus_never_help(splits, tps, mbs, precision):
    cl = two_type_cluster(per_node=4, nodes=4)
    fast = _plan_from(splits, tps, "f", mbs, precision)
    slow = _plan_from(splits, tps, "s", mbs, precision)
    e1, e2 = CostModel(cl).estimate(fast), CostModel(cl).estimate(fast)
    assert e1.to_doc() == e2.to_doc()
    assert e1.iteration_time_s > 0 and all(v >= 0 for v in e1.breakdown.values())
    assert all(v > 0 for v in e1.peak_memory_bytes.values())
    assert 0 < e1.mfu < 1
    assert CostModel(cl).estimate(slow).iteration_time_s >= e1.iteration_time_s


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([1, 2]), st.sampled_from(["bf16", "fp32"]), st.sampled_from(["GPT-3-1.3B", "LLaMA-2-7B"]))
def test_memory_falls_as_tp_or_stages_grow(mbs, precision, name):
    cl = two_type_cluster(per_node=8, nodes=2)
    model = model_catalog().get(name)
    L = model.num_layers
    cm = CostModel(cl)
    prev = None
    for tp in (1, 2, 4, 8):
        plan = one_pipeline_plan(name, [((0, L), [f"f0:{j}" for j in range(tp)], tp)], gbs=4 * mbs, mbs=mbs,
                                 precision=precision)
        mem = cm.estimate(plan).max_memory_bytes
        assert prev is None or mem < prev
        prev = mem
    prev = None
    for S in (1, 2, 4):
        per = L // S
        stages = [((i * per, L if i == S - 1 else (i + 1) * per), [f"f{i // 2}:{i % 2}"], 1) for i in range(S)]
        mem = cm.estimate(one_pipeline_plan(name, stages, gbs=8 * mbs, mbs=mbs, precision=precision)).max_memory_bytes
        assert prev is None or mem < prev
        prev = mem


# ---- caches: a warm model prices exactly like a cold one -----------------------------------------
@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 23), min_size=1, max_size=3, unique=True).map(sorted), st.sampled_from([1, 2]),
       st.sampled_from([(0, 1), (1, 0), (1, 1)]), st.integers(1, 6))
def test_warm_estimates_equal_cold_ones(splits, tp, kinds, m):
    """Pipelines priced once per shape must not leak results between shapes that differ in node class,
    in which stages share a node, in layers or in micro-batch counts."""
    cl = two_type_cluster(per_node=4, nodes=4)
    bounds = [0, *splits, 24]
    pipes = []
    for r, slow in enumerate(kinds):
        prefix = "s" if slow else "f"
        # two stages per node (they share it), pipeline r on nodes 2r and 2r+1 of its class
        stages = tuple(Stage(layers=(a, b), devices=tuple(f"{prefix}{2 * r + i // 2}:{(i % 2) * tp + j}"
                                                          for j in range(tp)), tp=tp)
                       for i, (a, b) in enumerate(zip(bounds, bounds[1:])))
        pipes.append(Pipeline(micro_batches=m + r, stages=stages))
    plan = Plan(model="GPT-3-1.3B", global_batch_size=sum(p.micro_batches for p in pipes), sequence_length=1024,
                micro_batch_size=1, zero_stage=1, pipelines=tuple(pipes))
    warm = CostModel(cl)
    for other in (_plan_from(splits, [tp], "f", 1, "bf16"), _plan_from(splits, [tp], "s", 1, "bf16")):
        warm.estimate(other)
    assert warm.estimate(plan).to_doc() == CostModel(cl).estimate(plan).to_doc()


def test_identical_pipelines_on_different_nodes_price_the_same_and_classes_matter():
    cl = two_type_cluster(per_node=4, nodes=2)
    cm = CostModel(cl)

    def pipe(node: str) -> Pipeline:
        return Pipeline(micro_batches=4, stages=(Stage(layers=(0, 12), devices=(f"{node}:0", f"{node}:1"), tp=2),
                                                 Stage(layers=(12, 24), devices=(f"{node}:2", f"{node}:3"), tp=2)))

    plan = Plan(model="GPT-3-1.3B", global_batch_size=8, sequence_length=1024, micro_batch_size=1, zero_stage=1,
                pipelines=(pipe("f0"), pipe("f1")))
    est = cm.estimate(plan)
    times = {(s.pipeline, s.stage): s.fwd_s + s.bwd_s for s in est.stages}
    assert times[(0, 0)] == times[(1, 0)] and times[(0, 1)] == times[(1, 1)]
    mixed = plan.model_copy(update={"pipelines": (pipe("f0"), pipe("s0"))})
    st_mixed = {(s.pipeline, s.stage): s.fwd_s + s.bwd_s for s in cm.estimate(mixed).stages}
    assert st_mixed[(1, 0)] > st_mixed[(0, 0)]  # the slow node's pipeline is not served from the fast one's cache


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(1, 23), min_size=1, max_size=3, unique=True).map(sorted), st.integers(1, 6),
       st.sampled_from([1, 2, 4]), st.sampled_from([0, 1]))
def test_reused_stage_objects_price_like_fresh_ones(splits, m, mbs, zero):
    """The caches keyed by stage identity (gradient sync, pipeline signature): the same Stage objects in
    plans of other micro-batch counts, sizes and ZeRO price exactly as a cold model prices them."""
    cl = two_type_cluster(per_node=4, nodes=4)
    bounds = [0, *splits, 24]
    stages = tuple(Stage(layers=(a, b), devices=(f"f{i}:0", f"f{i}:1"), tp=2) for i, (a, b) in enumerate(zip(bounds, bounds[1:])))
    other = tuple(Stage(layers=(a, b), devices=(f"s{i}:0",), tp=1) for i, (a, b) in enumerate(zip(bounds, bounds[1:])))
    warm = CostModel(cl)

    def plan(m1: int, size: int, z: int) -> Plan:
        pipes = (Pipeline(micro_batches=m1, stages=stages), Pipeline(micro_batches=m1 + 1, stages=other))
        return Plan(model="GPT-3-1.3B", global_batch_size=(2 * m1 + 1) * size, sequence_length=1024,
                    micro_batch_size=size, zero_stage=z, pipelines=pipes)

    for args in ((1, 1, 0), (3, 2, 1), (m, mbs, zero)):
        assert warm.estimate(plan(*args)).to_doc() == CostModel(cl).estimate(plan(*args)).to_doc()
