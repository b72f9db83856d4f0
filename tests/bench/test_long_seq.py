"""``python -m benchmarks long-seq``: the cases, the per-case summary, one real case and bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from arachne.planners.protocol import SearchBudget
from benchmarks.long_seq import (
    CP_PLANNERS,
    case_summary,
    cases,
    plan_row,
    short_case,
    summarize,
)

ROOT = Path(__file__).resolve().parents[2]


def test_cases_cover_every_cluster_model_and_length_and_filter():
    assert len(cases()) == 18
    assert cases("h100-32/Llama-3.1-8B/32k") == [("h100-32", "Llama-3.1-8B", 32768)]
    assert {s for _, _, s in cases("128k")} == {131072}
    assert short_case("h100-a100-32/Llama-3.1-70B/128k") == "h100-a100-32 70B 128k"


def _row(planner, tps, cp=1):
    return {"case": "c/m/32k", "planner": planner, "tokens_per_s": tps, "cp": cp if tps else None,
            "baseline_has_cp": planner in CP_PLANNERS, "error": None if tps else "no plan"}


def test_case_summary_sets_arachne_beside_the_best_and_the_best_without_cp():
    s = case_summary([_row("arachne", 120.0, 2), _row("megatron", 150.0, 8), _row("sailor", 100.0),
                      _row("metis", None), _row("amp", 60.0)])
    assert (s["best_baseline"], s["best_cp"], s["best_no_cp_baseline"]) == ("megatron", 8, "sailor")
    assert s["x_best"] == 120 / 150 and s["x_no_cp"] == 120 / 100
    none = case_summary([_row("arachne", 50.0, 2), _row("megatron", None), _row("sailor", None)])
    assert none["best_baseline"] is None and none["x_no_cp"] is None
    tot = summarize([s, none])
    assert tot["arachne_plan_where_no_cp_baselines_find_none"] == 1 and tot["arachne_uses_cp"] == 2
    assert tot["vs_no_cp_baselines"]["cases"] == 1


@pytest.mark.slow
def test_one_real_case_reports_cp_and_throughput():
    budget = SearchBudget(time_budget_s=10)
    a = plan_row("h100-32", "Llama-3.1-8B", 32768, 2**22, "arachne", budget)
    b = plan_row("h100-32", "Llama-3.1-8B", 32768, 2**22, "sailor", budget)
    assert a["error"] is None and b["error"] is None and a["global_batch_size"] == 128
    assert isinstance(a["cp"], int) and a["cp"] >= 1 and b["cp"] == 1  # sailor searches no context parallelism
    assert a["tokens_per_s"] > b["tokens_per_s"]


def test_no_matching_case_is_one_line_and_exit_2():
    res = subprocess.run([sys.executable, "-m", "benchmarks", "long-seq", "--cases", "nothing-like-this"],
                         capture_output=True, text=True, cwd=ROOT, env=dict(os.environ), timeout=120, check=False)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        "error: --cases 'nothing-like-this': no case matches"]
