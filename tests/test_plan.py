"""Plan validation (formats v1 section 4): every rule, precise error fields, JSON round trip, properties."""

from __future__ import annotations

import copy
import json
import math
from functools import reduce

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from arachne.cost.model import CostModel
from arachne.errors import InputError
from arachne.plan import (
    PLAN_FORMAT,
    load_plan,
    plan_errors,
    plan_from_dict,
    validate_plan,
)
from arachne.spec.cluster import Cluster, cluster_from_dict
from arachne.spec.model import ModelSpec, load_model

CLUSTER = cluster_from_dict({"name": "test", "nodes": [
    {"name": "a", "gpu": "A100-40", "gpus_per_node": 4},
    {"name": "b", "gpu": "A100-40", "gpus_per_node": 4},
    {"name": "v", "gpu": "V100-16", "gpus_per_node": 8},
]})


def devs(node: str, *idx: int) -> list[str]:
    return [f"{node}:{i}" for i in idx]


def plan_doc(model: str = "OPT-350M", pipelines: list | None = None, gbs: int = 32, mbs: int = 4, **extra) -> dict:
    """A valid two-stage OPT-350M plan unless ``pipelines`` says otherwise."""
    if pipelines is None:
        pipelines = [{"micro_batches": gbs // mbs, "stages": [
            {"layers": [0, 10], "devices": devs("a", 0, 1, 2, 3), "tp": 2},
            {"layers": [10, 24], "devices": devs("b", 0, 1), "tp": 2},
        ]}]
    doc = {"format": PLAN_FORMAT, "model": model, "global_batch_size": gbs, "sequence_length": 512,
           "micro_batch_size": mbs, "precision": "bf16", "zero_stage": 0, "schedule": "1f1b",
           "pipelines": pipelines}
    doc.update(extra)
    return doc


def check(doc: dict, cluster: Cluster = CLUSTER, source: str = "plan.json") -> ModelSpec:
    """Parse and validate as the CLI does."""
    return validate_plan(plan_from_dict(doc, source), cluster, source=source)


def rejected(doc: dict, field: str, *words: str, cluster: Cluster = CLUSTER) -> InputError:
    with pytest.raises(InputError) as info:
        check(doc, cluster)
    err = info.value
    assert err.field == field, str(err)
    msg = str(err)
    assert msg.startswith(f"plan.json: {field}: "), msg
    for w in words:
        assert w in msg, msg
    assert "\n" not in msg
    return err


def test_base_plan_is_valid():
    model = check(plan_doc())
    assert model.name == "OPT-350M"
    assert plan_errors(plan_from_dict(plan_doc()), CLUSTER, model) == []


# ---- devices --------------------------------------------------------------------------------------

def test_unknown_device():
    doc = plan_doc()
    doc["pipelines"][0]["stages"][1]["devices"] = ["b:0", "b:9"]
    rejected(doc, "pipelines[0].stages[1].devices", "'b:9'", "not in the cluster")
    doc["pipelines"][0]["stages"][1]["devices"] = ["c:0", "c:1"]
    rejected(doc, "pipelines[0].stages[1].devices", "'c:0'")


def test_device_used_twice_across_stages_pipelines_and_within_a_stage():
    doc = plan_doc()
    doc["pipelines"][0]["stages"][1]["devices"] = ["b:0", "a:3"]
    rejected(doc, "pipelines[0].stages[1].devices", "'a:3'", "pipelines[0].stages[0]")

    two = plan_doc(gbs=32, mbs=4, pipelines=[
        {"micro_batches": 4, "stages": [{"layers": [0, 24], "devices": devs("a", 0, 1), "tp": 2}]},
        {"micro_batches": 4, "stages": [{"layers": [0, 24], "devices": devs("a", 1, 2), "tp": 2}]},
    ])
    rejected(two, "pipelines[1].stages[0].devices", "'a:1'", "pipelines[0].stages[0]")

    doc = plan_doc()
    doc["pipelines"][0]["stages"][1]["devices"] = ["b:0", "b:0"]
    rejected(doc, "pipelines[0].stages[1].devices", "'b:0'")


# ---- layers -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("ranges,field,words", [
    ([[0, 10], [12, 24]], "pipelines[0].stages[1].layers", ("starts at 12", "expected 10")),     # gap
    ([[0, 12], [10, 24]], "pipelines[0].stages[1].layers", ("starts at 10", "expected 12")),     # overlap
    ([[10, 24], [0, 10]], "pipelines[0].stages[0].layers", ("starts at 10", "expected 0")),      # out of order
    ([[1, 10], [10, 24]], "pipelines[0].stages[0].layers", ("starts at 1",)),                    # not from 0
    ([[0, 10], [10, 20]], "pipelines[0].stages", ("end at 20", "24 blocks")),                    # short
    ([[0, 10], [10, 30]], "pipelines[0].stages", ("end at 30", "24 blocks")),                    # too long
    ([[0, 0], [0, 24]], "pipelines[0].stages[0].layers", ("empty",)),                            # empty
    ([[0, 10], [10, 5]], "pipelines[0].stages[1].layers", ("reversed",)),                        # reversed
])
def test_layer_ranges_contiguous_and_covering(ranges, field, words):
    doc = plan_doc()
    for stage, rng in zip(doc["pipelines"][0]["stages"], ranges):
        stage["layers"] = rng
    rejected(doc, field, *words)


def test_layer_error_names_the_right_pipeline():
    doc = plan_doc(gbs=16, mbs=4, pipelines=[
        {"micro_batches": 2, "stages": [{"layers": [0, 24], "devices": devs("a", 0, 1), "tp": 2}]},
        {"micro_batches": 2, "stages": [{"layers": [0, 12], "devices": devs("b", 0, 1), "tp": 2},
                                        {"layers": [12, 23], "devices": devs("b", 2, 3), "tp": 2}]},
    ])
    rejected(doc, "pipelines[1].stages", "end at 23")


@pytest.mark.parametrize("layers", [[0], [0, 1, 2], "0-24", None])
def test_malformed_layers_are_rejected_by_parsing(layers):
    doc = plan_doc()
    doc["pipelines"][0]["stages"][0]["layers"] = layers
    with pytest.raises(InputError) as info:
        plan_from_dict(doc, "plan.json")
    assert info.value.field.startswith("pipelines[0].stages[0].layers")


# ---- tensor parallelism -------------------------------------------------------------------------------

def test_tp_must_divide_attention_heads():
    doc = plan_doc()      # OPT-350M: 16 heads
    doc["pipelines"][0]["stages"][1].update(devices=devs("b", 0, 1, 2), tp=3)
    rejected(doc, "pipelines[0].stages[1].tp", "num_attention_heads 16")
    doc = plan_doc("GPT-Neo-2.7B")  # 20 heads: tp 4 fine, tp 8 not
    doc["pipelines"][0]["stages"][0].update(layers=[0, 10], devices=devs("v", *range(8)), tp=8)
    doc["pipelines"][0]["stages"][1].update(layers=[10, 32], devices=devs("a", 0, 1, 2, 3), tp=4)
    rejected(doc, "pipelines[0].stages[0].tp", "20")
    doc["pipelines"][0]["stages"][0].update(devices=devs("v", 0, 1, 2, 3), tp=4)
    check(doc)


def test_tp_must_divide_the_stage_devices():
    doc = plan_doc()
    doc["pipelines"][0]["stages"][0]["devices"] = devs("a", 0, 1, 2)
    rejected(doc, "pipelines[0].stages[0].tp", "does not divide the stage's 3 devices")


@pytest.mark.parametrize("bad", [0, -2, "two", 1.5])
def test_tp_out_of_range_is_rejected_by_parsing(bad):
    doc = plan_doc()
    doc["pipelines"][0]["stages"][1]["tp"] = bad
    with pytest.raises(InputError) as info:
        plan_from_dict(doc, "plan.json")
    assert info.value.field == "pipelines[0].stages[1].tp"


def test_tp_group_across_nodes_needs_allow_cross_node_tp():
    doc = plan_doc()
    doc["pipelines"][0]["stages"][1]["devices"] = ["a:3", "b:0"]
    doc["pipelines"][0]["stages"][0]["devices"] = devs("a", 0, 1)
    rejected(doc, "pipelines[0].stages[1].devices", "TP group 0", "'a'", "'b'", "allow_cross_node_tp")
    doc["pipelines"][0]["stages"][1]["allow_cross_node_tp"] = True
    check(doc)


def test_dp_groups_may_sit_on_different_nodes():
    doc = plan_doc()
    doc["pipelines"][0]["stages"][1]["devices"] = ["a:2", "a:3", "b:0", "b:1"]   # two TP groups, one per node
    doc["pipelines"][0]["stages"][0]["devices"] = devs("a", 0, 1)
    check(doc)
    doc["pipelines"][0]["stages"][1]["devices"] = ["a:2", "b:0", "a:3", "b:1"]   # each group spans both
    rejected(doc, "pipelines[0].stages[1].devices", "TP group 0")


def test_mixed_gpu_types_in_a_stage_are_allowed():
    doc = plan_doc()
    doc["pipelines"][0]["stages"][1].update(devices=["b:0", "v:0"], tp=1)
    check(doc)


# ---- stage data parallelism ----------------------------------------------------------------------------

def test_dp_times_tp_must_equal_devices():
    doc = plan_doc()
    doc["pipelines"][0]["stages"][0]["dp"] = 3            # 4 devices, tp 2
    rejected(doc, "pipelines[0].stages[0].dp", "dp*tp = 3*2 != 4")
    doc["pipelines"][0]["stages"][0]["dp"] = 2
    check(doc)


def test_stage_dp_must_divide_the_micro_batch_size():
    doc = plan_doc(gbs=30, mbs=6)                 # stage 0: dp 2 (4 devices, tp 2): fine
    doc["pipelines"][0]["micro_batches"] = 5
    check(doc)
    doc["pipelines"][0]["stages"][0]["tp"] = 1     # now dp 4, 6 % 4 != 0
    rejected(doc, "pipelines[0].stages[0].dp", "stage dp 4", "micro-batch size 6")


def test_pipeline_micro_batch_size_override_is_used_for_dp():
    doc = plan_doc(gbs=32, mbs=4)
    doc["pipelines"][0].update(micro_batch_size=2, micro_batches=16)
    doc["pipelines"][0]["stages"][0]["tp"] = 1     # dp 4 does not divide the override 2
    rejected(doc, "pipelines[0].stages[0].dp", "micro-batch size 2")


# ---- expert parallelism --------------------------------------------------------------------------------

def moe_doc(model: str, ep: int, dp: int = 4, tp: int = 1) -> dict:
    L = load_model(model).num_layers
    devices = devs("v", *range(dp * tp))
    return plan_doc(model, gbs=8 * dp, mbs=dp, pipelines=[
        {"micro_batches": 8, "stages": [{"layers": [0, L], "devices": devices, "tp": tp, "ep": ep}]}])


def test_ep_valid_cases():
    check(moe_doc("Mixtral-8x7B", ep=4))
    check(moe_doc("Mixtral-8x7B", ep=2, dp=4, tp=2))
    check(moe_doc("Qwen1.5-MoE-A2.7B", ep=4))            # 60 experts


def test_ep_must_divide_the_experts():
    rejected(moe_doc("Qwen1.5-MoE-A2.7B", ep=8, dp=8), "pipelines[0].stages[0].ep", "num_experts 60")


def test_ep_must_divide_the_stage_dp():
    rejected(moe_doc("Mixtral-8x7B", ep=4, dp=2, tp=2), "pipelines[0].stages[0].ep", "dp 2")


def test_ep_on_a_dense_model():
    rejected(moe_doc("OPT-350M", ep=2), "pipelines[0].stages[0].ep", "dense")


# ---- batch arithmetic and top-level fields --------------------------------------------------------------

def test_micro_batches_must_add_up_to_the_global_batch():
    doc = plan_doc(gbs=32, mbs=4)
    doc["pipelines"][0]["micro_batches"] = 7
    rejected(doc, "pipelines", "= 28 != global_batch_size 32")
    two = plan_doc(gbs=40, mbs=4, pipelines=[
        {"micro_batches": 6, "stages": [{"layers": [0, 24], "devices": devs("a", 0, 1), "tp": 2}]},
        {"micro_batches": 8, "micro_batch_size": 2,
         "stages": [{"layers": [0, 24], "devices": devs("b", 0, 1), "tp": 2}]},
    ])
    check(two)                                   # 6*4 + 8*2 = 40
    two["global_batch_size"] = 56                # as if the override were ignored: 6*4 + 8*4
    rejected(two, "pipelines", "= 40 != global_batch_size 56")


@pytest.mark.parametrize("fmt", ["arachne-plan/3", "arachne-plan/1.0", "", "ARACHNE-PLAN/1", None, 1])
def test_bad_format_string(fmt):
    doc = plan_doc(format=fmt)
    with pytest.raises(InputError) as info:
        plan_from_dict(doc, "plan.json")
    assert info.value.field == "format"
    assert str(info.value).startswith("plan.json: format: ")


def test_format_defaults_to_v1_when_absent():
    doc = plan_doc()
    del doc["format"]
    assert plan_from_dict(doc).format == PLAN_FORMAT


@pytest.mark.parametrize("field,value", [
    ("precision", "int8"), ("zero_stage", 4), ("schedule", "zero-bubble"), ("global_batch_size", 0),
    ("micro_batch_size", -1), ("sequence_length", "long"), ("pipelines", []),
])
def test_bad_top_level_values_name_the_field(field, value):
    with pytest.raises(InputError) as info:
        plan_from_dict(plan_doc(**{field: value}), "plan.json")
    assert info.value.field == field


def test_missing_fields_name_the_path():
    doc = plan_doc()
    del doc["pipelines"][0]["micro_batches"]
    with pytest.raises(InputError) as info:
        plan_from_dict(doc, "plan.json")
    assert info.value.field == "pipelines[0].micro_batches"
    assert "required field is missing" in str(info.value)


def test_unknown_model_and_inline_model():
    rejected(plan_doc(model="no-such-model"), "model", "unknown model")
    inline = {"name": "tiny", "num_layers": 24, "hidden_size": 512, "ffn_hidden_size": 2048,
              "num_attention_heads": 8, "vocab_size": 1000}
    assert check(plan_doc(model=inline)).name == "tiny"
    rejected(plan_doc(model={**inline, "num_attention_heads": 7}), "model", "divisible")


def test_readers_ignore_unknown_fields():
    doc = plan_doc(comment="hand-written", planner="me", planning_time_s=1.5)
    doc["pipelines"][0]["note"] = "x"
    doc["pipelines"][0]["stages"][0]["gpu"] = "A100"
    check(doc)


def test_all_problems_are_listed_and_the_first_is_raised():
    doc = plan_doc()
    doc["pipelines"][0]["stages"][0]["tp"] = 3
    doc["pipelines"][0]["stages"][1]["devices"] = ["b:0", "b:9"]
    doc["pipelines"][0]["micro_batches"] = 1
    plan = plan_from_dict(doc)
    errs = plan_errors(plan, CLUSTER, load_model("OPT-350M"))
    fields = [f for f, _ in errs]
    assert fields[0] == "pipelines[0].stages[0].tp"
    assert "pipelines[0].stages[1].devices" in fields and fields[-1] == "pipelines"
    with pytest.raises(InputError, match=r"more problems"):
        validate_plan(plan, CLUSTER)


# ---- round trip ----------------------------------------------------------------------------------------

FULL = plan_doc("Mixtral-8x7B", gbs=48, mbs=4, zero_stage=1, schedule="gpipe", precision="fp16",
                planner="hand", planning_time_s=0.25, estimate={"iteration_time_s": 1.0, "fits": True},
                pipelines=[
                    {"micro_batches": 8, "stages": [
                        {"layers": [0, 20], "devices": devs("v", *range(8)), "tp": 2, "dp": 4, "ep": 2,
                         "recompute": True},
                        {"layers": [20, 32], "devices": ["a:3", "b:0"], "tp": 2, "allow_cross_node_tp": True}]},
                    {"micro_batches": 8, "micro_batch_size": 2, "stages": [
                        {"layers": [0, 32], "devices": devs("a", 0, 1), "tp": 1, "ep": 2}]},
                ])


def test_full_plan_round_trips_through_json(tmp_path):
    plan = plan_from_dict(FULL)
    check(FULL)
    again = plan_from_dict(json.loads(plan.to_json()))
    assert again == plan and hash(again) == hash(plan)
    assert again.to_doc() == plan.to_doc()
    path = tmp_path / "p.json"
    plan.save(path)
    assert load_plan(path) == plan
    assert not path.with_name("p.json.tmp").exists()


def test_inline_model_round_trips():
    inline = {"name": "tiny", "num_layers": 24, "hidden_size": 512, "ffn_hidden_size": 2048,
              "num_attention_heads": 8, "vocab_size": 1000}
    plan = plan_from_dict(plan_doc(model=inline))
    assert plan_from_dict(json.loads(plan.to_json())) == plan


def test_explicit_dp_one_round_trips():
    doc = plan_doc()
    doc["pipelines"][0]["stages"][1]["dp"] = 1
    plan = plan_from_dict(doc)
    assert plan_from_dict(plan.to_doc()) == plan


# ---- property tests --------------------------------------------------------------------------------------

MODELS = ["OPT-350M", "GPT-Neo-2.7B", "Mixtral-8x7B", "Qwen1.5-MoE-A2.7B", "DeepSeek-MoE-16B", "Qwen2-57B-A14B"]
GPUS = ["A100-40", "V100-16", "H100", "T4", "RTX-3090", "GH-96", "L4"]


def lcm(values) -> int:
    return reduce(lambda a, b: a * b // math.gcd(a, b), values, 1)


def divisors(n: int, upto: int = 64) -> list[int]:
    return [d for d in range(1, min(n, upto) + 1) if n % d == 0]


@st.composite
def valid_setups(draw):
    """(cluster, plan document) pairs that keep every rule of formats v1."""
    model = load_model(draw(st.sampled_from(MODELS)))
    L = model.num_layers
    groups = [{"name": f"n{g}-{{i}}", "count": draw(st.integers(1, 3)), "gpu": draw(st.sampled_from(GPUS)),
               "gpus_per_node": draw(st.sampled_from([1, 2, 4, 8]))} for g in range(draw(st.integers(1, 4)))]
    cluster = cluster_from_dict({"name": "random", "nodes": groups})
    free = {n.name: draw(st.permutations([f"{n.name}:{i}" for i in range(n.num_gpus)])) for n in cluster.nodes}
    tps = [t for t in (1, 2, 4, 8) if model.num_attention_heads % t == 0]

    def take_group(tp: int, cross: bool, prefer: str | None = None) -> list[str] | None:
        if cross and sum(len(f) for f in free.values()) >= tp:
            out: list[str] = []                        # round-robin over nodes: the group spans nodes
            while len(out) < tp:
                for f in free.values():
                    if f and len(out) < tp:
                        out.append(f.pop())
            return out
        if prefer is not None and len(free[prefer]) >= tp:   # keep a stage's groups together
            return [free[prefer].pop() for _ in range(tp)]
        nodes = [n for n, f in free.items() if len(f) >= tp]
        if nodes:
            node = draw(st.sampled_from(sorted(nodes)))
            return [free[node].pop() for _ in range(tp)]
        return None

    pipelines = []
    for _ in range(draw(st.integers(1, 3))):
        S = draw(st.integers(1, min(4, L)))
        cuts = sorted(draw(st.sets(st.integers(1, L - 1), min_size=S - 1, max_size=S - 1)))
        bounds = [0, *cuts, L]
        stages, ok = [], True
        for si in range(S):
            tp = draw(st.sampled_from(tps))
            dp = draw(st.sampled_from([1, 1, 2, 3, 4]))
            cross = draw(st.integers(0, 9)) == 0
            devices: list[str] = []
            prefer = None if draw(st.integers(0, 3)) == 0 else draw(st.sampled_from(sorted(free)))
            for _g in range(dp):
                grp = take_group(tp, cross, prefer)
                if grp is None:
                    break
                devices += grp
            if len(devices) < tp:                      # not even one group: fall back to one GPU
                grp = take_group(1, False)
                if grp is None:
                    ok = False
                    break
                tp, devices = 1, grp
            dp = len(devices) // tp
            stage = {"layers": [bounds[si], bounds[si + 1]], "devices": devices, "tp": tp}
            if dp > 1 and draw(st.booleans()):
                stage["dp"] = dp
            if model.is_moe:
                ep = draw(st.sampled_from(divisors(math.gcd(dp, model.num_experts))))
                if ep > 1:
                    stage["ep"] = ep
            if cross:
                stage["allow_cross_node_tp"] = True
            if draw(st.integers(0, 4)) == 0:
                stage["recompute"] = True
            stages.append(stage)
        if not ok:
            for s in stages:                           # give the devices back, stop adding pipelines
                for d in s["devices"]:
                    free[d.split(":")[0]].append(d)
            break
        pipelines.append({"micro_batches": draw(st.integers(1, 8)), "stages": stages})
    assume(pipelines)

    def stage_dp(s):
        return len(s["devices"]) // s["tp"]

    for p in pipelines:
        if draw(st.integers(0, 3)) == 0:
            p["micro_batch_size"] = lcm(stage_dp(s) for s in p["stages"]) * draw(st.integers(1, 3))
    base_mbs = lcm(stage_dp(s) for p in pipelines for s in p["stages"] if "micro_batch_size" not in p)
    mbs = base_mbs * draw(st.integers(1, 2))
    gbs = sum(p["micro_batches"] * p.get("micro_batch_size", mbs) for p in pipelines)
    doc = {"format": PLAN_FORMAT, "model": model.name, "global_batch_size": gbs,
           "sequence_length": draw(st.sampled_from([128, 512, 2048])), "micro_batch_size": mbs,
           "precision": draw(st.sampled_from(["bf16", "fp16", "fp32"])), "zero_stage": draw(st.sampled_from([0, 1])),
           "schedule": draw(st.sampled_from(["1f1b", "gpipe"])), "pipelines": pipelines}
    return cluster, doc


def oracle_valid(doc: dict, cluster: Cluster) -> bool:
    """formats v1 section 4, written out independently of arachne.plan."""
    try:
        model = load_model(doc["model"])
    except InputError:
        return False
    if doc.get("format", PLAN_FORMAT) != PLAN_FORMAT or doc["global_batch_size"] < 1 or doc["micro_batch_size"] < 1:
        return False
    used: set[str] = set()
    total = 0
    for p in doc["pipelines"]:
        if p["micro_batches"] < 1 or not p["stages"] or p.get("micro_batch_size", 1) < 1:
            return False
        mbs = p.get("micro_batch_size") or doc["micro_batch_size"]
        total += p["micro_batches"] * mbs
        pos = 0
        for s in p["stages"]:
            start, end = s["layers"]
            devices, tp, dp, ep = s["devices"], s.get("tp", 1), s.get("dp"), s.get("ep", 1)
            if start != pos or end <= start or not devices or tp < 1 or ep < 1 or (dp is not None and dp < 1):
                return False
            pos = end
            for d in devices:
                if d not in cluster.devices or d in used:
                    return False
                used.add(d)
            if len(devices) % tp or model.num_attention_heads % tp:
                return False
            groups = len(devices) // tp
            if dp is not None and dp != groups:
                return False
            if groups > 1 and mbs % groups:
                return False
            if ep > 1 and (not model.is_moe or model.num_experts % ep or groups % ep):
                return False
            if not s.get("allow_cross_node_tp", False):
                for g in range(groups):
                    if len({cluster.devices[d].node.name for d in devices[g * tp:(g + 1) * tp]}) > 1:
                        return False
        if pos != model.num_layers:
            return False
    return total == doc["global_batch_size"]


@pytest.mark.slow
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(valid_setups())
def test_random_valid_plans_pass_validation_and_round_trip(setup):
    cluster, doc = setup
    assert oracle_valid(doc, cluster)
    plan = plan_from_dict(copy.deepcopy(doc))
    model = validate_plan(plan, cluster)
    assert plan_errors(plan, cluster, model) == []
    assert plan_from_dict(json.loads(plan.to_json())) == plan


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(valid_setups())
def test_random_valid_plans_can_be_priced(setup):
    cluster, doc = setup
    est = CostModel(cluster).estimate(plan_from_dict(doc))
    assert math.isfinite(est.iteration_time_s) and est.iteration_time_s > 0
    assert set(est.peak_memory_bytes) == {d for p in doc["pipelines"] for s in p["stages"] for d in s["devices"]}


MUTATIONS = ["tp", "regroup", "dp", "drop_dp", "ep", "cross_node", "swap_device", "unknown_device", "drop_device",
             "add_device", "layer_start", "layer_end", "micro_batches", "mbs", "pipeline_mbs", "gbs", "drop_stage",
             "model", "heads"]
STAGE_LOCAL = {"tp", "regroup", "dp", "drop_dp", "ep", "cross_node"}


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(valid_setups(), st.sampled_from(MUTATIONS), st.data())
def test_single_mutations_are_rejected_unless_every_rule_still_holds(setup, kind, data):
    cluster, doc = setup
    doc = copy.deepcopy(doc)
    pi = data.draw(st.integers(0, len(doc["pipelines"]) - 1))
    pipe = doc["pipelines"][pi]
    si = data.draw(st.integers(0, len(pipe["stages"]) - 1))
    stage = pipe["stages"][si]
    all_devices = list(cluster.devices)
    delta = data.draw(st.integers(-3, 3).filter(bool))
    if kind == "tp":
        stage["tp"] = data.draw(st.integers(0, 16))
    elif kind == "regroup":                            # same devices, another split into TP groups
        stage["tp"] = data.draw(st.sampled_from(divisors(len(stage["devices"]))))
        stage.pop("dp", None)
    elif kind == "dp":
        stage["dp"] = data.draw(st.integers(0, 16))
    elif kind == "drop_dp":
        stage.pop("dp", None)
    elif kind == "ep":
        stage["ep"] = data.draw(st.integers(1, 16))
    elif kind == "cross_node":
        stage["allow_cross_node_tp"] = not stage.get("allow_cross_node_tp", False)
    elif kind == "swap_device":
        j = data.draw(st.integers(0, len(stage["devices"]) - 1))
        stage["devices"][j] = data.draw(st.sampled_from(all_devices))
    elif kind == "unknown_device":
        j = data.draw(st.integers(0, len(stage["devices"]) - 1))
        stage["devices"][j] = data.draw(st.sampled_from(["x:0", stage["devices"][j] + "0", "n0-0", ""]))
    elif kind == "drop_device":
        stage["devices"].pop(data.draw(st.integers(0, len(stage["devices"]) - 1)))
    elif kind == "add_device":
        stage["devices"].append(data.draw(st.sampled_from(all_devices)))
    elif kind == "layer_start":
        stage["layers"][0] += delta
    elif kind == "layer_end":
        stage["layers"][1] += delta
    elif kind == "micro_batches":
        pipe["micro_batches"] += delta
    elif kind == "mbs":
        doc["micro_batch_size"] = data.draw(st.integers(0, 33))
    elif kind == "pipeline_mbs":
        if "micro_batch_size" in pipe and data.draw(st.booleans()):
            del pipe["micro_batch_size"]
        else:
            pipe["micro_batch_size"] = data.draw(st.integers(1, 33))
    elif kind == "gbs":
        doc["global_batch_size"] += delta
    elif kind == "drop_stage":
        assume(len(pipe["stages"]) > 1)
        pipe["stages"].pop(si)
    elif kind == "model":
        doc["model"] = data.draw(st.sampled_from(MODELS + ["LLaMA-2-7B", "LLaMA-2-13B"]))
    elif kind == "heads":                              # the same model, inline, with another head count
        heads = data.draw(st.sampled_from([3, 5, 6, 7, 12, 20, 28, 40]))
        inline = load_model(doc["model"]).model_dump(exclude={"aliases", "source"})
        inline.update(name="reheaded", num_attention_heads=heads, num_kv_heads=None, hidden_size=64 * heads)
        doc["model"] = inline

    expected = oracle_valid(doc, cluster)
    try:
        check(doc, cluster)
    except InputError as err:
        assert not expected, f"valid plan rejected: {err}"
        msg = str(err)
        assert msg.startswith("plan.json: ") and "\n" not in msg
        if kind in STAGE_LOCAL:
            assert err.field.startswith(f"pipelines[{pi}].stages[{si}]."), msg
        elif kind in ("layer_start", "layer_end", "drop_stage", "micro_batches", "pipeline_mbs"):
            assert err.field.startswith(f"pipelines[{pi}]") or err.field == "pipelines", msg
    else:
        assert expected, f"invalid plan accepted after mutation {kind}"
