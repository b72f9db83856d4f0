"""Formats v2 plans (contract section 7), cluster prices (8) and estimate cost keys (9)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arachne.cost.model import CostModel
from arachne.errors import InputError
from arachne.plan import (
    PLAN_FORMAT,
    PLAN_FORMAT_V2,
    load_plan,
    plan_errors,
    plan_from_dict,
    validate_plan,
)
from arachne.plan_rules import unpriced_features, uses_v2, v2_fields_used
from arachne.spec.cluster import cluster_from_dict, load_cluster

ROOT = Path(__file__).resolve().parents[1]
V2 = ROOT / "examples" / "v2"
H100 = load_cluster(V2 / "h100-2x8.yaml")
EXAMPLES = ["cp-zero3.json", "interleaved-sp-selective.json", "moe-ep-etp-fp8.json"]
GOLDEN = json.loads((ROOT / "tests" / "data" / "plan_v1_written.json").read_text())


def doc(name: str) -> dict:
    return json.loads((V2 / name).read_text())


def errors_of(d: dict, cluster=H100) -> list[tuple[str, str]]:
    plan = plan_from_dict(d, "plan.json")
    return plan_errors(plan, cluster, plan.resolve_model())


# ---- the examples ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", EXAMPLES)
def test_v2_examples_load_validate_and_round_trip(name):
    plan = load_plan(V2 / name)
    assert validate_plan(plan, H100)
    assert uses_v2(plan) and v2_fields_used(plan)
    out = plan.to_doc()
    assert out["format"] == PLAN_FORMAT_V2
    again = plan_from_dict(json.loads(json.dumps(out)))
    assert again == plan and again.to_doc() == out
    for key, value in doc(name).items():  # everything the example says is written back as it said it
        if key != "pipelines":
            assert out[key] == value, key
    assert out["pipelines"] == doc(name)["pipelines"]


def test_example_cluster_has_prices():
    assert {n.price_per_gpu_hour for n in H100.nodes} == {2.5}
    assert H100.to_spec()["nodes"][0]["price_per_gpu_hour"] == 2.5


# ---- version 1 unchanged --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_v1_plans_are_written_back_byte_identical(name):
    """The shipped v1 plans, written by this version, are exactly what the version-1 code wrote."""
    plan = load_plan(ROOT / "examples" / "plans" / name)
    assert plan.to_json() == GOLDEN[name]["written"]
    assert plan.model_dump_json(exclude={"planner", "planning_time_s", "estimate"}) == GOLDEN[name]["dump"]
    assert not uses_v2(plan) and plan.written_format == PLAN_FORMAT


def test_v2_labelled_plan_without_v2_fields_is_written_as_v1():
    d = doc("interleaved-sp-selective.json")
    d = {**d, "overlap_grad_reduce": False, "overlap_param_gather": False, "zero_stage": 1}
    for p in d["pipelines"]:
        del p["virtual_stages"]
        for s in p["stages"]:
            s["layers"] = [0, 0]
            for k in ("sequence_parallel", "recompute"):
                s.pop(k)
    assert plan_from_dict(d).to_doc()["format"] == PLAN_FORMAT


@pytest.mark.parametrize("path,value,field", [
    ((), ("overlap_grad_reduce", True), "overlap_grad_reduce"),
    ((), ("overlap_param_gather", False), "overlap_param_gather"),
    ((), ("precision", "fp8"), "precision"),
    ((), ("zero_stage", 2), "zero_stage"),
    ((0,), ("virtual_stages", 1), "pipelines[0].virtual_stages"),
    ((0, 1), ("cp", 1), "pipelines[0].stages[1].cp"),
    ((0, 0), ("sequence_parallel", True), "pipelines[0].stages[0].sequence_parallel"),
    ((0, 0), ("etp", 2), "pipelines[0].stages[0].etp"),
    ((0, 0), ("recompute_layers", 1), "pipelines[0].stages[0].recompute_layers"),
    ((0, 0), ("recompute", "selective"), "pipelines[0].stages[0].recompute"),
    ((0, 0), ("recompute", "full"), "pipelines[0].stages[0].recompute"),
    ((0, 0), ("layers", [[0, 8]]), "pipelines[0].stages[0].layers"),
])
@pytest.mark.parametrize("label", ["arachne-plan/1", None])
def test_v1_labelled_plan_with_v2_key_is_refused(path, value, field, label):
    d = json.loads((ROOT / "examples" / "plans" / "small-mixed__gpt3-1.3b-2stage.json").read_text())
    if label is None:
        d.pop("format", None)
    else:
        d["format"] = label
    target = d if not path else d["pipelines"][path[0]] if len(path) == 1 else d["pipelines"][path[0]]["stages"][path[1]]
    target[value[0]] = value[1]
    with pytest.raises(InputError) as info:
        plan_from_dict(d, "plan.json")
    assert info.value.field == field
    assert '"arachne-plan/2"' in info.value.reason and "\n" not in str(info.value)


# ---- every v2 rule names its field -------------------------------------------------------------------------------

def _stage(d, p=0, s=0):
    return d["pipelines"][p]["stages"][s]


def m_interleave_order(d):
    _stage(d, 0, 0)["layers"], _stage(d, 0, 1)["layers"] = _stage(d, 0, 1)["layers"], _stage(d, 0, 0)["layers"]


MUTATIONS = [
    # (example, mutation, field, words)
    ("interleaved-sp-selective.json", m_interleave_order, "pipelines[0].stages[0].layers", "chunk 0 starts at 4"),
    ("interleaved-sp-selective.json", lambda d: _stage(d)["layers"].pop(), "pipelines[0].stages[0].layers",
     "list of 2"),
    ("interleaved-sp-selective.json", lambda d: _stage(d)["layers"][1].__setitem__(1, 16),
     "pipelines[0].stages[0].layers", "chunk 1 is an empty"),
    ("interleaved-sp-selective.json", lambda d: d.__setitem__("schedule", "gpipe"), "pipelines[0].virtual_stages",
     "1f1b"),
    ("interleaved-sp-selective.json", lambda d: [p.__setitem__("micro_batches", p["micro_batches"] + 2)
                                                 for p in d["pipelines"]] and d.__setitem__("global_batch_size", 72),
     "pipelines[0].micro_batches", "multiple of the 4 stages"),
    ("interleaved-sp-selective.json", lambda d: d["pipelines"][0].__setitem__("virtual_stages", 1),
     "pipelines[0].stages[0].layers", "one [start, end] range"),
    ("interleaved-sp-selective.json", lambda d: _stage(d).__setitem__("tp", 1) or _stage(d).__setitem__("dp", 2),
     "pipelines[0].stages[0].sequence_parallel", "needs tp > 1"),
    ("interleaved-sp-selective.json", lambda d: _stage(d).__setitem__("recompute_layers", 2),
     "pipelines[0].stages[0].recompute_layers", 'only with recompute "full"'),
    ("interleaved-sp-selective.json", lambda d: _stage(d).update(recompute="full", recompute_layers=9),
     "pipelines[0].stages[0].recompute_layers", "exceeds the stage's 8 blocks"),
    ("interleaved-sp-selective.json", lambda d: d.__setitem__("zero_stage", 0), "overlap_param_gather",
     "zero_stage >= 1"),
    ("interleaved-sp-selective.json", lambda d: _stage(d).__setitem__("etp", 1), "pipelines[0].stages[0].etp",
     "dense model"),
    ("cp-zero3.json", lambda d: d.__setitem__("sequence_length", 32764), "pipelines[0].stages[0].cp",
     "multiple of 2*cp = 8"),
    ("cp-zero3.json", lambda d: _stage(d).__setitem__("cp", 3), "pipelines[0].stages[0].cp", "does not divide"),
    ("cp-zero3.json", lambda d: _stage(d).__setitem__("cp", 2), "pipelines[0].stages[0].dp", "dp*cp*tp = 2*2*2"),
    ("cp-zero3.json", lambda d: _stage(d).__setitem__("dp", 3), "pipelines[0].stages[0].dp", "dp*cp*tp = 3*4*2"),
    ("moe-ep-etp-fp8.json", lambda d: _stage(d).__setitem__("etp", 3), "pipelines[0].stages[0].etp",
     "etp 3 does not divide"),
    ("moe-ep-etp-fp8.json", lambda d: _stage(d).__setitem__("ep", 8) or _stage(d).__setitem__("etp", 2),
     "pipelines[0].stages[0].ep", "ep*etp = 8*2 does not divide"),
    ("moe-ep-etp-fp8.json", lambda d: _stage(d).__setitem__("ep", 16), "pipelines[0].stages[0].ep",
     "does not divide num_experts"),
]


@pytest.mark.parametrize("name,mutate,field,words", MUTATIONS)
def test_each_v2_rule_names_its_field(name, mutate, field, words):
    d = doc(name)
    assert not errors_of(copy.deepcopy(d))
    mutate(d)
    errs = errors_of(d)
    assert any(f == field and words in why for f, why in errs), errs


def test_fp8_needs_an_fp8_rate_naming_the_device():
    cluster = cluster_from_dict({"name": "c", "nodes": [
        {"name": "h100-{i}", "count": 2, "gpu": "H100-SXM5-80GB", "gpus_per_node": 8},
    ], "gpu_types": [{"name": "H100-SXM5-80GB", "memory_gb": 80, "peak_tflops": 989, "memory_bandwidth_gbps": 3350,
                      "intra_node_gbps": 900, "inter_node_gbps": 400, "price_per_gpu_hour": 1.0}]})
    errs = errors_of(doc("moe-ep-etp-fp8.json"), cluster)
    assert errs[0][0] == "pipelines[0].stages[0].devices" and "'h100-0:0'" in errs[0][1] and "FP8" in errs[0][1]
    assert {n.price_per_gpu_hour for n in cluster.nodes} == {1.0}  # the gpu_types entry's price


@pytest.mark.parametrize("price", [-1, float("nan"), "cheap"])
def test_bad_prices_are_refused_naming_the_field(price):
    with pytest.raises(InputError) as info:
        cluster_from_dict({"nodes": [{"name": "a", "gpu": "A100-40", "price_per_gpu_hour": price}]}, "c.yaml")
    assert info.value.field == "nodes[0].price_per_gpu_hour"


# ---- the cost model: v2 plan features refused until priced; cost keys -------------------------------------------
# (interleaving, sequence parallelism, selective/partial recomputation, overlap, ZeRO-2/3, fp8, etp and cp are priced now:
# tests/cost/test_v2_pricing.py)

@pytest.mark.parametrize("name", ["cp-zero3.json", "moe-ep-etp-fp8.json"])
def test_cost_model_prices_every_v2_example(name):  # fp8, etp and cp are priced now (issue 26)
    assert CostModel(H100, profiles=None).estimate(load_plan(V2 / name)).iteration_time_s > 0


def _v1_on_h100(**stage) -> dict:
    d = {"format": "arachne-plan/2", "model": "mixtral-8x7b", "global_batch_size": 16, "sequence_length": 4096,
         "micro_batch_size": 8, "pipelines": [{"micro_batches": 2, "stages": [
             {"layers": [0, 16], "devices": [f"h100-0:{i}" for i in range(8)], "tp": 2, "dp": 4, "ep": 4},
             {"layers": [16, 32], "devices": [f"h100-1:{i}" for i in range(8)], "tp": 2, "dp": 4, "ep": 4}]}]}
    d["pipelines"][0]["stages"][1].update(stage)
    return d


@pytest.mark.parametrize("stage", [{"cp": 2, "dp": 2}, {"etp": 1}])
def test_cost_model_prices_stage_cp_and_etp(stage):  # priced now (tests/cost/test_v2_pricing_more.py)
    plan = plan_from_dict(_v1_on_h100(**stage))
    validate_plan(plan, H100)
    assert CostModel(H100, profiles=None).estimate(plan).iteration_time_s > 0


@pytest.mark.parametrize("stage", [{"etp": 2}, {"recompute": "full", "recompute_layers": 16}, {"recompute": "full"}])
def test_v2_spellings_of_v1_behaviour_are_priced_as_v1(stage):
    cm = CostModel(H100, profiles=None)
    base = cm.estimate(plan_from_dict(_v1_on_h100(recompute=bool(stage.get("recompute")))))
    assert not unpriced_features(plan_from_dict(_v1_on_h100(**stage)))
    assert cm.estimate(plan_from_dict(_v1_on_h100(**stage))).iteration_time_s == base.iteration_time_s


def test_estimate_carries_cost_keys_only_with_every_price():
    est = CostModel(H100, profiles=None).estimate(plan_from_dict(_v1_on_h100()))
    out = est.to_doc()
    assert out["cost_per_hour"] == pytest.approx(16 * 2.5)
    assert out["cost_per_million_tokens"] == pytest.approx(16 * 2.5 / 3600 / est.tokens_per_s * 1e6)
    spec = H100.to_spec()
    del spec["nodes"][1]["price_per_gpu_hour"]  # the node takes the GPU catalog's default (formats v2 section 8)
    est = CostModel(cluster_from_dict(spec), profiles=None).estimate(plan_from_dict(_v1_on_h100()))
    default = H100.nodes[1].gpu.price_per_gpu_hour
    assert est.to_doc()["cost_per_hour"] == pytest.approx(8 * 2.5 + 8 * default)
    est.device_prices = {**est.device_prices, next(iter(est.peak_memory_bytes)): None}  # one device unpriced
    out = est.to_doc()
    assert "cost_per_hour" not in out and "cost_per_million_tokens" not in out


# ---- properties -------------------------------------------------------------------------------------------------

@settings(max_examples=80, deadline=None)
@given(data=st.data(), S=st.integers(1, 4), v=st.integers(2, 3))
def test_interleaved_layers_valid_exactly_when_chunks_follow_model_order(data, S, v):
    """A random split of the 32 blocks into S*v non-empty ranges, given to stage s as ranges j*S+s, is valid;
    swapping two stages' chunks (when they differ) is refused naming a stage's layers."""
    cuts = sorted(data.draw(st.sets(st.integers(1, 31), min_size=S * v - 1, max_size=S * v - 1)))
    bounds = [0, *cuts, 32]
    ranges = [[bounds[k], bounds[k + 1]] for k in range(S * v)]
    stages = [{"layers": [ranges[j * S + s] for j in range(v)], "devices": [f"h100-0:{s}"], "tp": 1}
              for s in range(S)]
    d = {"format": "arachne-plan/2", "model": "llama-3-8b", "global_batch_size": 2 * S, "sequence_length": 2048,
         "micro_batch_size": 2, "pipelines": [{"micro_batches": S, "virtual_stages": v, "stages": stages}]}
    assert errors_of(d) == []
    if S > 1:
        a, b = data.draw(st.lists(st.integers(0, S - 1), min_size=2, max_size=2, unique=True))
        j = data.draw(st.integers(0, v - 1))
        stages[a]["layers"][j], stages[b]["layers"][j] = stages[b]["layers"][j], stages[a]["layers"][j]
        errs = errors_of(d)
        assert errs and all(f.endswith(".layers") or f == "pipelines[0].stages" for f, _ in errs)


@settings(max_examples=120, deadline=None)
@given(tp=st.sampled_from([1, 2, 4]), cp=st.sampled_from([1, 2, 4, 3]), dp=st.sampled_from([1, 2, 3]),
       n=st.integers(1, 16), seq=st.sampled_from([4096, 4092, 6144, 8190]), give_dp=st.booleans())
def test_cp_rules_match_an_independent_oracle(tp, cp, dp, n, seq, give_dp):
    """A cp stage is valid exactly when devices = dp*cp*tp, 2*cp divides the sequence, tp and mbs rules hold."""
    devices = [f"h100-{i // 8}:{i % 8}" for i in range(n)]
    stage = {"layers": [0, 32], "devices": devices, "tp": tp, "cp": cp, "allow_cross_node_tp": True}
    if give_dp:
        stage["dp"] = dp
    d = {"format": "arachne-plan/2", "model": "llama-3-8b", "global_batch_size": 12, "sequence_length": seq,
         "micro_batch_size": 12, "pipelines": [{"micro_batches": 1, "stages": [stage]}]}
    eff_dp = dp if give_dp else max(1, n // (cp * tp))
    ok = (n % (cp * tp) == 0 and (not give_dp or dp * cp * tp == n) and seq % (2 * cp) == 0
          and 12 % eff_dp == 0 and 32 % tp == 0)
    errs = errors_of(d)
    assert (errs == []) == ok, errs
    for f, _ in errs:
        assert f.startswith("pipelines[0].stages[0].")


# ---- the CLI: one line naming file and field, exit 2 ------------------------------------------------------------

@pytest.mark.parametrize("args,words", [
    (["export", "-f", "torchrun", "-p", str(V2 / "interleaved-sp-selective.json")],
     "interleaved-sp-selective.json: pipelines[0].virtual_stages: not supported by export yet"),
    (["validate-plan", "-p", str(V2 / "moe-ep-etp-fp8.json")], "valid (Mixtral-8x7B"),
])
def test_cli_on_v2_plans(args, words):
    from typer.testing import CliRunner

    from arachne.cli.app import app

    result = CliRunner().invoke(app, [*args, "-c", str(V2 / "h100-2x8.yaml")])
    out = " ".join(result.output.split())
    assert words in out
    assert result.exit_code == (0 if args[0] == "validate-plan" else 2)
    if result.exit_code == 2:  # the refusal alone: no notes on what an export that does not happen would change
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("top", [{"framework": "torch"}, {"framework": "megatron"}, {"grad_reduce_in_fp32": False},
                                 {"grad_reduce_in_fp32": True}])
def test_framework_and_gradient_type_are_version_2_fields(top):
    """arachne's optional additions round-trip, make a plan version 2, are refused in a version-1 document,
    and change only memory (framework) or memory and the gradient sync (grad_reduce_in_fp32)."""
    doc = dict(_v1_on_h100(), **top)
    plan = plan_from_dict(doc)
    assert uses_v2(plan) and plan.written_format == "arachne-plan/2"
    assert plan_from_dict(plan.to_doc()) == plan
    with pytest.raises(InputError, match=next(iter(top))):
        plan_from_dict(dict(doc, format="arachne-plan/1"))
    base = CostModel(H100, profiles=None).estimate(plan_from_dict(_v1_on_h100()))
    est = CostModel(H100, profiles=None).estimate(plan)
    if "framework" in top:
        assert est.iteration_time_s == base.iteration_time_s
    if top == {"grad_reduce_in_fp32": False}:  # 16-bit gradients: less memory, a faster sync
        assert est.max_memory_bytes < base.max_memory_bytes
        assert est.breakdown["dp_sync_s"] < base.breakdown["dp_sync_s"]
    if top == {"grad_reduce_in_fp32": True}:  # the default, said out loud
        assert est.iteration_time_s == base.iteration_time_s and est.max_memory_bytes == base.max_memory_bytes


def test_same_math_plan_keeps_structure_and_drops_only_what_leaves_the_values_alone():
    from arachne.plan_rules import refuse_v2, same_math_plan

    doc = dict(_v1_on_h100(sequence_parallel=True, recompute="selective"), zero_stage=3, overlap_grad_reduce=True,
               framework="torch", grad_reduce_in_fp32=False)
    plan = plan_from_dict(doc)
    run, notes = same_math_plan(plan)
    assert not uses_v2(run) and len(notes) == 5
    st = run.pipelines[0].stages[1]
    assert (st.sequence_parallel, st.recompute, run.zero_stage) == (False, True, 1)
    assert [s.devices for p in run.pipelines for s in p.stages] == [s.devices for p in plan.pipelines for s in p.stages]
    refuse_v2(run, plan.resolve_model(), "p", "arachne run")  # nothing left to refuse
    inter = load_plan(V2 / "interleaved-sp-selective.json")
    with pytest.raises(InputError, match="virtual_stages"):
        refuse_v2(same_math_plan(inter)[0], inter.resolve_model(), "p", "arachne run")


@pytest.mark.parametrize("top", [{"overlap_grad_reduce": True}, {"framework": "torch"}, {"grad_reduce_in_fp32": True},
                                 {"fp8_params": True}, {"master_weights": "fp32"}, {"optimizer_state_dtype": "bf16"},
                                 {"loss": "fused"}, {"attention_kernel": "cudnn"}, {"elementwise_kernels": "eager"},
                                 {"overlap_moe_comm": True}, {"moe_kernels": "grouped"}])
def test_the_fast_version_2_test_agrees_with_the_fields_it_names(top):
    """``uses_v2`` (the cost model's and the planners' fast test) is true exactly when ``v2_fields_used`` names
    a field: every optional plan key of version 2 makes a plan version 2."""
    from arachne.plan_rules import V2_PLAN_KEYS

    assert set(top) <= set(V2_PLAN_KEYS)
    plan = plan_from_dict(dict(_v1_on_h100(), **top))
    assert uses_v2(plan) and v2_fields_used(plan) and plan.written_format == "arachne-plan/2"
    assert not uses_v2(plan_from_dict(_v1_on_h100()))
