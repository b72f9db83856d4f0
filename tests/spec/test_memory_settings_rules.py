"""Rules of the optional memory settings of an ``arachne-plan/2`` plan: validator messages naming pipeline, stage
and field, the version-1 refusal, which runtime preset executes which setting, and the Megatron-LM flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from arachne.errors import InputError
from arachne.plan import plan_errors, plan_from_dict
from arachne.plan_rules import MEMORY_SETTINGS, same_math_plan, uses_v2, v2_fields_used
from arachne.runtime.export import megatron_export
from arachne.spec.cluster import load_cluster
from arachne.spec.model import load_model
from arachne.spec.runtimes import Legality

ROOT = Path(__file__).resolve().parents[2]
V2 = ROOT / "examples" / "v2"
MODULES = ["core_attn", "layernorm", "mla_up_proj", "mlp", "moe", "moe_act", "shared_experts"]
CLUSTER = load_cluster(V2 / "h100-2x8.yaml")


def _doc(name: str = "interleaved-sp-selective.json") -> dict:
    return json.loads((V2 / name).read_text())


def _errors(doc: dict, model=None) -> list[tuple[str, str]]:
    plan = plan_from_dict(doc)
    return plan_errors(plan, CLUSTER, model or plan.resolve_model())


def _with_modules(doc: dict, mods, stage: int = 0) -> dict:
    doc = json.loads(json.dumps(doc))
    doc["pipelines"][0]["stages"][stage]["recompute_modules"] = mods
    return doc


def test_unknown_or_repeated_module_names_the_field():
    with pytest.raises(InputError) as e:
        plan_from_dict(_with_modules(_doc(), ["core_attn", "mlpp"]))
    assert "pipelines[0].stages[0].recompute_modules" in str(e.value)
    with pytest.raises(InputError) as e:
        plan_from_dict(_with_modules(_doc(), ["mlp", "mlp"]))
    assert "recompute_modules" in str(e.value) and "twice" in str(e.value)


_MODELS = {"dense": ("llama-3-8b", False, False, False),
           "moe": ("mixtral-8x7b", True, False, False),
           "mla": (yaml.safe_load((V2 / "mla-moe-model.yaml").read_text()), True, True, True)}


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(sorted(_MODELS)), mods=st.lists(st.sampled_from(MODULES), unique=True, max_size=4),
       recompute=st.sampled_from(["selective", "full", "none"]))
def test_recompute_modules_rule(kind, mods, recompute):
    """An error (naming ``pipelines[0].stages[1].recompute_modules``) exactly when recomputation is not selective or
    a module is missing from the model (MLA's up projection, routed or shared experts)."""
    ref, moe, mla, shared = _MODELS[kind]
    model = load_model(ref, "", "model")
    doc = _with_modules(_doc(), mods, stage=1)
    doc["pipelines"][0]["stages"][1]["recompute"] = recompute
    errs = [e for e in _errors(doc, model) if e[0].endswith("recompute_modules")]
    missing = any((m == "mla_up_proj" and not mla) or (m in ("moe", "moe_act") and not moe)
                  or (m == "shared_experts" and not shared) for m in mods)
    assert bool(errs) == (recompute != "selective" or missing)
    assert all(e[0] == "pipelines[0].stages[1].recompute_modules" for e in errs)


def test_recompute_modules_need_the_megatron_convention():
    doc = _with_modules(dict(_doc(), framework="torch"), ["core_attn"])
    assert ("pipelines[0].stages[0].recompute_modules",) == tuple(e[0] for e in _errors(doc)
                                                                   if e[0].endswith("recompute_modules"))


def test_plan_level_rules_name_their_field():
    doc = _doc()
    assert any(f == "fp8_params" and "precision fp8" in why for f, why in _errors(dict(doc, fp8_params=True)))
    fp8 = _doc("moe-ep-etp-fp8.json")
    assert not [e for e in _errors(dict(fp8, fp8_params=True)) if e[0] == "fp8_params"]
    assert any(f == "fp8_params" and "megatron" in why
               for f, why in _errors(dict(fp8, fp8_params=True, framework="torch")))
    for key, value in (("master_weights", "none"), ("optimizer_state_dtype", "bf16")):
        assert not [e for e in _errors(dict(doc, **{key: value})) if e[0] == key]
        assert any(f == key and "fp32" in why for f, why in _errors(dict(doc, precision="fp32", **{key: value})))
    with pytest.raises(InputError) as e:
        plan_from_dict(dict(doc, loss="chunked"))
    assert "loss" in str(e.value)
    assert not [e for e in _errors(dict(doc, attention_kernel="flash2")) if e[0] == "attention_kernel"]
    assert any(f == "attention_kernel" and "fp32" in why
               for f, why in _errors(dict(doc, precision="fp32", attention_kernel="cudnn")))
    with pytest.raises(InputError) as e:
        plan_from_dict(dict(doc, attention_kernel="flash9"))
    assert "attention_kernel" in str(e.value)


def test_version_1_document_refuses_them():
    v1 = json.loads((ROOT / "examples" / "v2" / "interleaved-sp-selective.json").read_text())
    v1 = {k: v for k, v in v1.items() if k not in ("overlap_grad_reduce", "overlap_param_gather")}
    v1.update(format="arachne-plan/1", zero_stage=1)
    p = v1["pipelines"][0]
    p.pop("virtual_stages")
    for s in p["stages"]:
        s["layers"] = s["layers"][0]
        s.pop("sequence_parallel", None)
        s.pop("recompute", None)
    for key, value in (("loss", "fused"), ("master_weights", "none"), ("fp8_params", True)):
        with pytest.raises(InputError) as e:
            plan_from_dict(dict(v1, **{key: value}))
        assert key in str(e.value) and "version-2" in str(e.value)


def test_written_only_when_set_and_read_back():
    doc = _with_modules(dict(_doc("moe-ep-etp-fp8.json"), fp8_params=True, master_weights="none",
                             optimizer_state_dtype="bf16", loss="fused"), ["layernorm", "moe_act"])
    doc["pipelines"][0]["stages"][0]["recompute"] = "selective"
    plan = plan_from_dict(doc)
    out = plan.to_doc()
    assert out["fp8_params"] is True and out["loss"] == "fused" and out["master_weights"] == "none"
    assert out["pipelines"][0]["stages"][0]["recompute_modules"] == ["layernorm", "moe_act"]
    assert plan_from_dict(out) == plan and uses_v2(plan)
    used = {f for _, f in v2_fields_used(plan)}
    assert set(MEMORY_SETTINGS) <= used
    plain = plan_from_dict(_doc("moe-ep-etp-fp8.json"))
    assert not {f for _, f in v2_fields_used(plain)} & set(MEMORY_SETTINGS)


def test_runtimes_say_which_settings_they_execute():
    doc = _with_modules(_doc(), ["core_attn", "layernorm"])
    for p in doc["pipelines"]:
        for s in p["stages"]:
            s["recompute_modules"] = ["core_attn"]
    arachne, megatron, titan = (Legality.of(r) for r in ("arachne", "megatron", "torchtitan"))

    def fields(leg, d):
        return [f for f, _ in leg.errors(plan_from_dict(d), CLUSTER)]

    assert "pipelines[0].stages[0].recompute_modules" in fields(arachne, doc)
    assert not [f for f in fields(megatron, doc) if "recompute_modules" in f]
    plain = _doc()
    assert "loss" in fields(arachne, dict(plain, loss="fused"))
    assert "loss" not in fields(titan, dict(plain, loss="fused"))
    assert "loss" not in fields(megatron, dict(plain, loss="fused"))
    assert "master_weights" in fields(megatron, dict(plain, master_weights="none"))
    uneven = _with_modules(doc, ["layernorm"], stage=1)
    assert "pipelines[0].stages" in fields(megatron, uneven)


def test_same_math_plan_runs_modules_as_full_recomputation():
    doc = _with_modules(_doc(), ["core_attn"])
    plan, notes = same_math_plan(plan_from_dict(doc))
    assert all(s.recompute is True and s.recompute_modules is None for p in plan.pipelines for s in p.stages)
    assert notes


def test_megatron_flags():
    doc = _doc()
    for p in doc["pipelines"]:
        for s in p["stages"]:
            s["recompute_modules"] = ["core_attn", "layernorm"]
    plan = plan_from_dict(dict(doc, loss="fused", optimizer_state_dtype="bf16"))
    out = megatron_export(plan, plan.resolve_model())
    assert out.ok, out.reasons
    args = " ".join(out.args)
    for flag in ("--recompute-granularity selective", "--recompute-modules core_attn layernorm",
                 "--cross-entropy-loss-fusion", "--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16"):
        assert flag in args, flag
    fp8 = plan_from_dict(dict(_doc("moe-ep-etp-fp8.json"), fp8_params=True))
    assert "--fp8-param-gather" in megatron_export(fp8, fp8.resolve_model()).args
    assert "--fp8-param-gather" not in " ".join(megatron_export(plan, plan.resolve_model()).args)
