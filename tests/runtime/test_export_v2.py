"""Megatron-LM export of version-2 plans: the flags for what Megatron can say, a reason for what it cannot."""

from __future__ import annotations

import json
from pathlib import Path

from arachne.plan import load_plan, plan_from_dict
from arachne.runtime.export import megatron_export

V2 = Path(__file__).resolve().parents[2] / "examples" / "v2"


def test_interleaved_sp_selective_overlap_become_megatron_flags():
    plan = load_plan(V2 / "interleaved-sp-selective.json")
    out = megatron_export(plan, plan.resolve_model())
    assert out.ok, out.reasons
    args = " ".join(out.args)
    for flag in ("--sequence-parallel", "--recompute-granularity selective", "--use-distributed-optimizer",
                 "--num-layers-per-virtual-pipeline-stage 4", "--overlap-grad-reduce", "--overlap-param-gather"):
        assert flag in args, flag


def test_what_megatron_cannot_say_is_named():
    doc = json.loads((V2 / "interleaved-sp-selective.json").read_text())
    for p in doc["pipelines"]:
        p["stages"][1]["sequence_parallel"] = False
    out = megatron_export(plan_from_dict(dict(doc, zero_stage=3, overlap_param_gather=False)),
                          load_plan(V2 / "interleaved-sp-selective.json").resolve_model())
    assert not out.ok
    assert any("zero_stage 3" in r for r in out.reasons) and any("sequence_parallel" in r for r in out.reasons)
