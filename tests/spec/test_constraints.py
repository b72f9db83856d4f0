"""The --constraints file (formats v2 section 10): reading it and checking plans against it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arachne.errors import InputError
from arachne.plan import load_plan, plan_from_dict
from arachne.spec.cluster import load_cluster
from arachne.spec.constraints import (
    Constraints,
    constraint_errors,
    constraints_from_dict,
    load_constraints,
)

ROOT = Path(__file__).resolve().parents[2]
V2 = ROOT / "examples" / "v2"
H100 = load_cluster(V2 / "h100-2x8.yaml")
INTERLEAVED = load_plan(V2 / "interleaved-sp-selective.json")
MOE = load_plan(V2 / "moe-ep-etp-fp8.json")
CP = load_plan(V2 / "cp-zero3.json")


def test_reads_yaml_and_json(write_doc):
    doc = {"max_tp": 8, "max_pp": 4, "max_cp": 2, "max_ep": 8, "zero_stages": [0, 1], "recompute": ["none", "full"],
           "virtual_stages": False, "uniform_pipelines": True, "one_micro_batch_size": True,
           "allow_cross_node_tp": False, "fp8": False}
    for name in ("c.yaml", "c.json"):
        c = load_constraints(write_doc(name, doc))
        assert c.max_tp == 8 and c.zero_stages == (0, 1) and c.recompute == ("none", "full") and c.fp8 is False
    assert load_constraints(write_doc("empty.yaml", {})) == Constraints()


@pytest.mark.parametrize("doc,field,words", [
    ({"max_tpp": 2}, "max_tpp", "unknown field"),
    ({"max_tp": 0}, "max_tp", "greater than or equal to 1"),
    ({"max_tp": 2.0}, "max_tp", "integer"),
    ({"zero_stages": [4]}, "zero_stages[0]", ""),
    ({"zero_stages": []}, "zero_stages", ""),
    ({"recompute": ["partial"]}, "recompute[0]", ""),
    ({"fp8": "maybe"}, "fp8", ""),
])
def test_bad_constraints_name_the_key(doc, field, words, write_doc):
    with pytest.raises(InputError) as info:
        load_constraints(write_doc("c.yaml", doc))
    assert info.value.field == field and words in info.value.reason
    assert str(info.value).startswith(str(write_doc("c.yaml", doc)))


def test_not_a_mapping():
    with pytest.raises(InputError):
        constraints_from_dict([1, 2], "c.yaml")


def test_no_constraints_pass_every_example():
    for plan in (INTERLEAVED, MOE, CP):
        assert constraint_errors(plan, Constraints(), H100) == []


@pytest.mark.parametrize("plan,c,field", [
    (INTERLEAVED, {"max_tp": 1}, "pipelines[0].stages[0].tp"),
    (INTERLEAVED, {"max_pp": 3}, "pipelines[0].stages"),
    (INTERLEAVED, {"virtual_stages": False}, "pipelines[0].virtual_stages"),
    (INTERLEAVED, {"recompute": ["none", "full"]}, "pipelines[0].stages[0].recompute"),
    (INTERLEAVED, {"zero_stages": [0]}, "zero_stage"),
    (CP, {"max_cp": 2}, "pipelines[0].stages[0].cp"),
    (MOE, {"max_ep": 2}, "pipelines[0].stages[0].ep"),
    (MOE, {"fp8": False}, "precision"),
])
def test_each_constraint_names_the_plan_field(plan, c, field):
    errs = constraint_errors(plan, Constraints(**c), H100)
    assert errs and errs[0][0] == field


def _two_pipelines(**second) -> dict:
    d = json.loads((V2 / "interleaved-sp-selective.json").read_text())
    d["pipelines"][1].update(second)
    return d


def test_uniform_pipelines_and_one_micro_batch_size():
    c = Constraints(uniform_pipelines=True, one_micro_batch_size=True)
    assert constraint_errors(INTERLEAVED, c, H100) == []
    d = _two_pipelines(micro_batch_size=1, micro_batches=32)
    assert [f for f, _ in constraint_errors(plan_from_dict(d), c, H100)] == ["pipelines"]
    d = json.loads((V2 / "interleaved-sp-selective.json").read_text())
    stages = d["pipelines"][1]["stages"]
    stages[0]["layers"], stages[1]["layers"] = [[0, 5], [16, 20]], [[5, 8], [20, 24]]
    assert [f for f, _ in constraint_errors(plan_from_dict(d), c, H100)] == ["pipelines[1].stages"]


def test_cross_node_tp_is_checked_on_the_devices():
    d = json.loads((V2 / "cp-zero3.json").read_text())
    devs = d["pipelines"][0]["stages"][0]["devices"]
    devs[7], devs[8] = devs[8], devs[7]  # group 3 now holds h100-0:6 and h100-1:0
    d["pipelines"][0]["stages"][0]["allow_cross_node_tp"] = True
    plan = plan_from_dict(d)
    errs = constraint_errors(plan, Constraints(allow_cross_node_tp=False), H100)
    assert errs[0][0] == "pipelines[0].stages[0].devices" and "TP group 3" in errs[0][1]
    assert constraint_errors(plan, Constraints(allow_cross_node_tp=False))[0][0] == \
        "pipelines[0].stages[0].allow_cross_node_tp"
    assert constraint_errors(CP, Constraints(allow_cross_node_tp=False), H100) == []


@settings(max_examples=80, deadline=None)
@given(max_tp=st.integers(1, 4), max_pp=st.integers(1, 5), max_ep=st.integers(1, 8),
       zero=st.lists(st.integers(0, 3), min_size=1, max_size=4, unique=True),
       rec=st.lists(st.sampled_from(["none", "selective", "full"]), min_size=1, max_size=3, unique=True),
       fp8=st.booleans(), vs=st.booleans())
def test_constraint_errors_match_an_independent_oracle(max_tp, max_pp, max_ep, zero, rec, fp8, vs):
    c = Constraints(max_tp=max_tp, max_pp=max_pp, max_ep=max_ep, zero_stages=zero, recompute=rec, fp8=fp8,
                    virtual_stages=vs)
    for plan in (INTERLEAVED, MOE, CP):
        kinds = {"selective" if s.recompute == "selective" else "full" if s.recompute else "none"
                 for p in plan.pipelines for s in p.stages}
        ok = (all(s.tp <= max_tp and (s.etp or 0) <= max_tp and s.ep <= max_ep
                  for p in plan.pipelines for s in p.stages)
              and all(len(p.stages) <= max_pp and (vs or p.virtual_stages == 1) for p in plan.pipelines)
              and plan.zero_stage in zero and kinds <= set(rec) and (fp8 or plan.precision != "fp8"))
        assert (constraint_errors(plan, c, H100) == []) == ok


# ---- intersecting constraints, runtime presets -------------------------------------------------------------
from arachne.cost import CostModel  # noqa: E402
from arachne.errors import NoFeasiblePlanError  # noqa: E402
from arachne.planners.harness import run_planner  # noqa: E402
from arachne.planners.protocol import SearchBudget  # noqa: E402
from arachne.spec.constraints import intersect  # noqa: E402
from arachne.spec.job import Job  # noqa: E402
from arachne.spec.model import load_model  # noqa: E402
from arachne.spec.runtimes import RUNTIMES, Legality, legality_errors  # noqa: E402

SMALL = load_cluster(ROOT / "examples" / "clusters" / "small-mixed.yaml")


def test_intersect_takes_the_tighter_of_each_key():
    a = Constraints(max_tp=4, zero_stages=[0, 1, 3], uniform_pipelines=True, fp8=True)
    b = Constraints(max_tp=2, max_pp=3, zero_stages=[1, 3], virtual_stages=False, fp8=False)
    c = intersect(a, b)
    assert (c.max_tp, c.max_pp, c.zero_stages, c.uniform_pipelines, c.virtual_stages, c.fp8) == \
        (2, 3, (1, 3), True, False, False)
    assert intersect(Constraints(), b) == b and intersect(a, Constraints()) == a
    with pytest.raises(InputError) as info:
        intersect(Constraints(zero_stages=[0]), Constraints(zero_stages=[3]))
    assert info.value.field == "zero_stages"


def test_presets_name_a_release_and_arachne_restricts_what_its_runtime_cannot_run():
    for name, preset in RUNTIMES.items():
        assert preset.name == name and preset.framework and preset.checked
    assert not Legality.of("arachne").free and not Legality.of("megatron").free
    assert Legality(RUNTIMES["arachne"], Constraints()).constraints == Constraints()
    with pytest.raises(InputError) as info:
        Legality.of("jax")
    assert info.value.field == "--runtime"


def test_runtime_rules_beyond_the_constraints_file():
    d = json.loads((V2 / "interleaved-sp-selective.json").read_text())
    d["pipelines"][1]["micro_batches"] += 1
    d["global_batch_size"] += d["pipelines"][1].get("micro_batch_size") or d["micro_batch_size"]
    fields = [f for f, _ in legality_errors(plan_from_dict(d), Legality.of("megatron"), H100)]
    assert "pipelines" in fields  # replicas run unequal micro-batch counts
    # arachne's runtime: interleaving is the only rule this plan breaks (sp, selective and overlap run as their
    # same-math equivalents: plan_rules.same_math_plan)
    assert {f.split(".")[-1] for f, _ in legality_errors(plan_from_dict(d), Legality.of("arachne"), H100)} == \
        {"virtual_stages"}
    ds = Legality.of("deepspeed")
    errs = dict(legality_errors(CP, ds, H100))
    assert "pipelines[0].stages[0].cp" in errs  # no context parallelism in DeepSpeed's engine


@pytest.mark.slow
@settings(max_examples=12, deadline=None)
@given(runtime=st.sampled_from(sorted(RUNTIMES)), max_tp=st.sampled_from([None, 1, 2]),
       max_pp=st.sampled_from([None, 1, 2, 4]),
       zero=st.sampled_from([None, [0], [1], [0, 1], [0, 3], [3]]),
       uniform=st.sampled_from([None, True]), one_mbs=st.sampled_from([None, True]),
       planner=st.sampled_from(["arachne", "arachne", "megatron", "amp"]))
def test_every_returned_plan_satisfies_the_rules(runtime, max_tp, max_pp, zero, uniform, one_mbs, planner):
    """The property of issue 27 item 3: whatever the runtime and constraints, a plan comes back only if it
    satisfies them (else NoFeasiblePlanError, or InputError when the file contradicts the preset)."""
    extra = Constraints(max_tp=max_tp, max_pp=max_pp, zero_stages=zero, uniform_pipelines=uniform,
                        one_micro_batch_size=one_mbs)
    try:
        legality = Legality.of(runtime, extra)
    except InputError:
        return
    job = Job(global_batch_size=32, sequence_length=1024)
    try:
        plan, est, _ = run_planner(planner, SMALL, load_model("OPT-350M"), job, CostModel(SMALL),
                                   SearchBudget(time_budget_s=3.0), legality=legality)
    except NoFeasiblePlanError:
        return
    assert est.fits and legality.errors(plan, SMALL) == []


def test_under_megatron_rules_arachne_is_no_worse_than_the_megatron_grids():
    job = Job(global_batch_size=32, sequence_length=1024)
    model = load_model("OPT-350M")
    grids = []
    for name in ("megatron", "megatron-oblivious"):
        plan, est, _ = run_planner(name, SMALL, model, job, CostModel(SMALL), SearchBudget(time_budget_s=5.0))
        assert Legality.of("megatron").errors(plan, SMALL) == []  # the preset is no stricter than Megatron
        grids.append(est.tokens_per_s)
    _, est, _ = run_planner("arachne", SMALL, model, job, CostModel(SMALL), SearchBudget(time_budget_s=5.0),
                            legality=Legality.of("megatron"))
    assert est.tokens_per_s >= max(grids) * (1 - 1e-9)
