"""`arachne plan` flags of formats v2 section 10 and the export refusal: exit codes and one-line messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_checks import invoke, one_error_line

from arachne.plan import load_plan
from arachne.runtime.export import runtime_refusal
from arachne.spec.cluster import load_cluster

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "examples" / "clusters" / "small-mixed.yaml"
RTX = ROOT / "examples" / "clusters" / "rtx-lab.yaml"
JOB = ["--model", "OPT-350M", "-b", "32", "-s", "1024", "--time-budget", "5"]




@pytest.mark.slow
def test_cost_objective_prints_usd_and_writes_the_cost_keys(tmp_path):
    out = tmp_path / "p.json"
    res = invoke("plan", "--cluster", CLUSTER, *JOB, "--objective", "cost", "-o", out)
    assert res.exit_code == 0, res.output
    assert "per million tokens" in res.stdout and "per hour" in res.stdout
    assert "guard" not in res.stderr  # (a run within its budget says nothing about it)
    est = json.loads(out.read_text())["estimate"]
    assert est["cost_per_hour"] > 0 and est["cost_per_million_tokens"] > 0


def test_a_budget_spent_before_the_work_target_still_gives_a_plan_and_says_so():
    """The budget counts the planner's CPU seconds; where it ends the search early, the plan depends on the
    machine's speed, and a note on stderr says so."""
    res = invoke("plan", "--cluster", CLUSTER, "--model", "OPT-350M", "-b", "32", "-s", "1024", "--time-budget", "0.01")
    assert res.exit_code == 0, res.output
    assert "tokens/s" in res.stdout and "note: planning stopped at its CPU-time guard" in res.stderr


@pytest.mark.slow
def test_the_second_search_is_reported_and_one_process_turns_it_off():
    res = invoke("plan", "--cluster", CLUSTER, *JOB)
    assert res.exit_code == 0, res.output
    assert "second search, another process:" in res.stdout
    alone = invoke("plan", "--cluster", CLUSTER, *JOB, "--one-process")
    assert alone.exit_code == 0, alone.output
    assert "tokens/s" in alone.stdout and "second search" not in alone.stdout
    line = one_error_line(invoke("plan", "--cluster", CLUSTER, *JOB, "--planner", "megatron", "--one-process"), 2)
    assert "--one-process" in line


def test_bad_flags_exit_2_with_one_line(write_doc):
    assert "--runtime" in one_error_line(invoke("plan", "--cluster", CLUSTER, *JOB, "--runtime", "jax"), 2)
    assert "--objective" in one_error_line(invoke("plan", "--cluster", CLUSTER, *JOB, "--objective", "x"), 2)
    line = one_error_line(invoke("plan", "--cluster", RTX, *JOB, "--objective", "cost"), 2)
    assert "no price for GPU type RTX" in line
    bad = write_doc("c.yaml", {"max_tpp": 2})
    assert "max_tpp" in one_error_line(invoke("plan", "--cluster", CLUSTER, *JOB, "--constraints", bad), 2)
    clash = write_doc("z.json", {"zero_stages": [3]})
    line = one_error_line(invoke("plan", "--cluster", CLUSTER, *JOB, "--runtime", "megatron",
                                 "--constraints", clash), 2)
    assert str(clash) in line and "zero_stages" in line


@pytest.mark.slow
def test_unmet_limits_exit_3_naming_the_limit():
    line = one_error_line(invoke("plan", "--cluster", CLUSTER, *JOB, "--min-tokens-per-s", "1e12"), 3)
    assert "--min-tokens-per-s" in line
    line = one_error_line(invoke("plan", "--cluster", CLUSTER, *JOB, "--max-cost-per-hour", "0.01"), 3)
    assert "--max-cost-per-hour" in line


def test_runtime_plans_export_and_others_are_refused(tmp_path, write_doc):
    meg = tmp_path / "meg.json"
    res = invoke("plan", "--cluster", CLUSTER, *JOB, "--runtime", "megatron", "-o", meg)
    assert res.exit_code == 0, res.output
    # the plan satisfies the rules the Megatron export checks (the export itself may still refuse the formats-v2
    # fields it does not write yet, e.g. overlap_grad_reduce)
    assert runtime_refusal(load_plan(meg), load_cluster(CLUSTER), "megatron") is None
    # replicas that split the batch unevenly: refused with one line
    stage = lambda a, b, d: {"layers": [a, b], "devices": [d], "tp": 1}  # noqa: E731
    d = {"format": "arachne-plan/1", "model": "OPT-350M", "global_batch_size": 32, "sequence_length": 1024,
         "micro_batch_size": 2, "precision": "bf16", "zero_stage": 1, "schedule": "1f1b",
         "pipelines": [{"micro_batches": 9, "stages": [stage(0, 12, "a100:0"), stage(12, 24, "a100:1")]},
                       {"micro_batches": 7, "stages": [stage(0, 12, "a100:2"), stage(12, 24, "a100:3")]}]}
    bad = write_doc("bad.json", d)
    line = one_error_line(invoke("export", "--plan", bad, "--cluster", CLUSTER, "-f", "megatron"), 2)
    assert str(bad) in line and ("megatron runtime cannot run this plan" in line or "cannot express" in line)


def test_compare_takes_the_same_rules_and_objective():
    res = invoke("compare", "--cluster", CLUSTER, *JOB, "--planners", "megatron,amp", "--objective", "cost",
                 "--runtime", "megatron")
    assert res.exit_code == 0, res.output
    assert "USD per million tokens: megatron" in res.stdout
    line = one_error_line(invoke("compare", "--cluster", RTX, *JOB, "--planners", "megatron", "--objective",
                                 "cost"), 2)
    assert "no price for GPU type RTX" in line


def test_the_target_help_names_the_planners_own_defaults():
    """The CLI does not import the planner to stay quick to start, so its help states the targets as text."""
    import typer.main

    from arachne.cli.app import app
    from arachne.planners.arachne.options import (
        BASE_TARGET_S,
        DEFAULT_TARGET_S,
        LARGE_CLUSTER_GPUS,
        MAX_DEFAULT_TARGET_S,
    )

    plan = typer.main.get_command(app).commands["plan"]
    text = next(p.help for p in plan.params if p.name == "target")
    assert f"(default {DEFAULT_TARGET_S:g}," in text and f"a target above {BASE_TARGET_S:g} runs" in text
    assert f"past {LARGE_CLUSTER_GPUS:,} GPUs, at most {MAX_DEFAULT_TARGET_S:g};" in text


def test_the_default_target_grows_with_the_cluster_past_1024_gpus():
    from arachne.planners.arachne.options import DEFAULT_TARGET_S, MAX_DEFAULT_TARGET_S, default_target

    assert default_target(8) == default_target(1024) == DEFAULT_TARGET_S
    assert default_target(4096) == 4 * DEFAULT_TARGET_S
    assert default_target(10_240) == default_target(100_000) == MAX_DEFAULT_TARGET_S
