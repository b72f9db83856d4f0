"""FP8 where the job allows it and the GPUs have it (issue 27): ``Job(precision="fp8")`` lets the arachne planner's
modern knobs and the Megatron grid give a plan ``precision: fp8`` only where every GPU of the plan has an FP8
rate, never for a bf16 job, never under a runtime that runs no fp8; and where they do, it is faster."""

from __future__ import annotations

import dataclasses
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst
from pydantic import ValidationError

from arachne.cost import CostModel
from arachne.errors import InputError
from arachne.plan import validate_plan
from arachne.planners.harness import run_planner
from arachne.planners.protocol import SearchBudget
from arachne.planners.registry import get_planner
from arachne.spec.cluster import Cluster, cluster_from_dict
from arachne.spec.job import Job, check_precision
from arachne.spec.model import load_model
from arachne.spec.runtimes import Legality

CLUSTERS = {
    "h100": [("H100", 2, 8)],
    "a100": [("A100-80", 2, 8)],
    "mixed": [("H100", 1, 8), ("A100-80", 1, 8)],
    "l40s-v100": [("L40S", 1, 4), ("V100-32", 1, 4)],
}
PLANNERS = ("arachne", "megatron")
POSTPASS = ("amp", pytest.param("metis", marks=pytest.mark.slow), "flashflex", "sailor")
"""Baselines given fp8 by the shared baseline driver's post-pass (metis searches ~20 s here: slow tier)."""


@cache
def cluster(name: str) -> Cluster:
    return cluster_from_dict({"name": name, "nodes": [{"name": f"g{i}-{{i}}", "count": n, "gpu": g,
                                                       "gpus_per_node": k}
                                                      for i, (g, n, k) in enumerate(CLUSTERS[name])]})


@cache
def planned(planner: str, cl: str, model: str, gbs: int, seq: int, precision: str, runtime: str | None = None):
    c = cluster(cl)
    legality = Legality.of(runtime) if runtime is not None else None
    options = {"target_s": 0.2} if planner == "arachne" else {}
    plan, est, _ = run_planner(planner, c, load_model(model), Job(global_batch_size=gbs, sequence_length=seq,
                                                                  precision=precision),
                               CostModel(c), SearchBudget(time_budget_s=30), legality, **options)
    return plan, est


def fp8_capable(plan, cl: str) -> bool:
    devs = cluster(cl).devices
    return all(devs[d].gpu.fp8_tflops is not None for d in plan.devices)


# ---- the job -------------------------------------------------------------------------------------------
def test_an_fp8_job_is_bf16_with_fp8_allowed():
    job = Job(global_batch_size=8, sequence_length=1024, precision="fp8")
    assert (job.precision, job.fp8, job.requested_precision) == ("bf16", True, "fp8")
    assert Job.model_validate(job.model_dump()) == job
    plain = Job(global_batch_size=8, sequence_length=1024)
    assert (plain.fp8, plain.requested_precision) == (False, "bf16")
    for bad in ({"precision": "fp16", "fp8": True}, {"precision": "fp8", "fp8": False}):
        with pytest.raises(ValidationError):
            Job(global_batch_size=8, sequence_length=1024, **bad)


def test_check_precision_takes_fp8_only_where_asked():
    assert check_precision("fp8", fp8=True) == "fp8"
    with pytest.raises(InputError, match="expected bf16, fp16 or fp32, got 'fp8'"):
        check_precision("fp8")  # profiles and the others: a measured precision, not an option


# ---- the planners -------------------------------------------------------------------------------------
@pytest.mark.parametrize("planner", PLANNERS + POSTPASS)
def test_fp8_on_h100_is_used_and_faster(planner):
    bf16, e16 = planned(planner, "h100", "Llama-3.1-8B", 64, 4096, "bf16")
    fp8, e8 = planned(planner, "h100", "Llama-3.1-8B", 64, 4096, "fp8")
    assert bf16.precision == "bf16" and fp8.precision == "fp8"
    assert e8.tokens_per_s > 1.1 * e16.tokens_per_s
    validate_plan(fp8, cluster("h100"), load_model("Llama-3.1-8B"))


@pytest.mark.slow
@pytest.mark.parametrize("planner", PLANNERS + POSTPASS)
def test_no_fp8_on_a100(planner):
    _, e16 = planned(planner, "a100", "Llama-3.1-8B", 64, 4096, "bf16")
    fp8, e8 = planned(planner, "a100", "Llama-3.1-8B", 64, 4096, "fp8")
    assert fp8.precision == "bf16"
    assert e8.tokens_per_s == pytest.approx(e16.tokens_per_s, rel=1e-9)


@pytest.mark.parametrize("runtime", ["arachne", "deepspeed"])
def test_runtimes_without_fp8_get_none(runtime):
    plan, _ = planned("arachne", "h100", "Llama-3.1-8B", 64, 4096, "fp8", runtime)
    assert plan.precision == "bf16"


def test_megatron_runtime_keeps_fp8():
    plan, _ = planned("arachne", "h100", "Llama-3.1-8B", 64, 4096, "fp8", "megatron")
    assert plan.precision == "fp8" and not Legality.of("megatron").errors(plan, cluster("h100"))


@pytest.mark.parametrize("v1", [True, False])
def test_megatron_grid_v1_and_the_knob_off_stay_bf16(v1):
    c = cluster("h100")
    planner = get_planner("megatron", v1=v1)
    if not v1:
        planner.knobs = dataclasses.replace(planner.knobs, fp8=False)
    job = Job(global_batch_size=64, sequence_length=4096, precision="fp8")
    res = planner.plan(c, load_model("Llama-3.1-8B"), job, CostModel(c), SearchBudget(time_budget_s=30))
    assert res.plans and all(q.precision == "bf16" for q in res.plans)


@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(planner=hst.sampled_from(PLANNERS), cl=hst.sampled_from(sorted(CLUSTERS)),
       model=hst.sampled_from(["GPT-3-1.3B", "LLaMA-2-7B"]), gbs=hst.sampled_from([16, 64]),
       precision=hst.sampled_from(["bf16", "fp8"]))
def test_fp8_only_when_allowed_and_on_fp8_gpus(planner, cl, model, gbs, precision):
    plan, _ = planned(planner, cl, model, gbs, 2048, precision)
    if plan.precision == "fp8":
        assert precision == "fp8" and fp8_capable(plan, cl)
    else:
        assert plan.precision == "bf16"
    validate_plan(plan, cluster(cl), load_model(model))
