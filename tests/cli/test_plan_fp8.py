"""`arachne plan --precision fp8` (issue 27): fp8 where the runtime runs it and every GPU of the plan has an FP8
rate, bf16 elsewhere; a runtime or constraints file that rules fp8 out is bad input (one line, exit 2)."""

from __future__ import annotations

import json

import pytest
from cli_checks import invoke, one_error_line

JOB = ["--model", "Llama-3.1-8B", "-b", "64", "-s", "4096", "--time-budget", "10"]


def cluster(write_doc, gpu: str):
    return write_doc(f"{gpu}.yaml", {"name": gpu, "nodes": [{"name": "n{i}", "count": 2, "gpu": gpu,
                                                           "gpus_per_node": 8}]})


def test_precision_fp8_is_refused_where_fp8_cannot_run(write_doc):
    h100 = cluster(write_doc, "H100")
    line = one_error_line(invoke("plan", "--cluster", h100, *JOB, "--precision", "fp8"))
    assert line.startswith("error: --precision: fp8 is not allowed: the arachne runtime runs no fp8 plan")
    no = write_doc("no-fp8.yaml", {"fp8": False})
    line = one_error_line(invoke("plan", "--cluster", h100, *JOB, "--precision", "fp8", "--runtime", "megatron",
                                 "--constraints", no))
    assert "--precision" in line and "no-fp8.yaml says fp8: false" in line
    line = one_error_line(invoke("plan", "--cluster", h100, *JOB, "--precision", "fp9"))
    assert "expected bf16, fp16, fp32 or fp8, got 'fp9'" in line


@pytest.mark.slow
@pytest.mark.parametrize(("gpu", "expected"), [("H100", "fp8"), ("A100-80", "bf16")])
def test_precision_fp8_where_the_gpus_have_it(write_doc, gpu, expected):
    res = invoke("plan", "--cluster", cluster(write_doc, gpu), *JOB, "--precision", "fp8", "--runtime",
                 "torchtitan", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["precision"] == expected
    if expected == "fp8":
        assert doc["format"] == "arachne-plan/2"


def test_an_fp8_plan_on_a_cluster_with_non_fp8_gpus_is_planned_and_estimated(write_doc, tmp_path):
    mixed = write_doc("mixed.yaml", {"name": "mixed", "nodes": [{"name": "h", "gpu": "H100", "gpus_per_node": 8},
                                                                {"name": "a", "gpu": "A100-80", "gpus_per_node": 8}]})
    out = tmp_path / "p.json"
    res = invoke("plan", "--cluster", mixed, *JOB, "--precision", "fp8", "--runtime", "torchtitan",
                 "--planner", "megatron", "-o", out)
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    devices = {d for p in doc["pipelines"] for st in p["stages"] for d in st["devices"]}
    assert doc["precision"] == "fp8" and devices and all(d.startswith("h:") for d in devices)
    res = invoke("estimate", "--cluster", mixed, "--plan", out)
    assert res.exit_code == 0, res.output
    assert "compute ceiling" in res.stdout
