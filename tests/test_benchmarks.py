"""The benchmark scripts' own plumbing: re-running one planner against stored runs, summaries."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def robustness(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "robustness.py"), *args],
                          capture_output=True, text=True, timeout=300)


def test_robustness_reuses_stored_runs_and_summarizes(tmp_path):
    base = robustness("--n", "1", "--seed", "4", "--budget", "3", "--planners", "megatron",
                      "--out", str(tmp_path / "b"))
    assert base.returncode == 0, base.stderr[-2000:]
    again = robustness("--n", "1", "--seed", "4", "--budget", "3", "--planners", "arachne",
                       "--reuse", str(tmp_path / "b" / "runs.json"), "--out", str(tmp_path / "a"))
    assert again.returncode == 0, again.stderr[-2000:]
    doc = json.loads((tmp_path / "a" / "runs.json").read_text())
    assert sorted(r["planner"] for r in doc["runs"]) == ["arachne", "megatron"]
    old = json.loads((tmp_path / "b" / "runs.json").read_text())["runs"][0]
    assert next(r for r in doc["runs"] if r["planner"] == "megatron") == old  # taken as stored, not re-run
    case = doc["cases"][0]
    if case["arachne_vs_best_baseline"] is not None:
        a = next(r for r in doc["runs"] if r["planner"] == "arachne")["tokens_per_s"]
        assert abs(case["arachne_vs_best_baseline"] - a / old["tokens_per_s"]) < 1e-9
    summary = robustness("--summarize", str(tmp_path / "a" / "runs.json"))
    assert summary.returncode == 0 and "arachne vs the best baseline" in summary.stdout + summary.stderr


def test_robustness_refuses_stored_runs_of_another_sweep(tmp_path):
    (tmp_path / "runs.json").write_text(json.dumps({"args": {"seed": 1, "n": 30, "planners": ["megatron"]},
                                                    "runs": []}))
    res = robustness("--n", "2", "--seed", "4", "--planners", "arachne", "--reuse", str(tmp_path / "runs.json"),
                     "--out", str(tmp_path / "x"))
    assert res.returncode == 2 and "seed 1 n 30" in res.stderr and "Traceback" not in res.stderr
    res = robustness("--summarize", str(tmp_path / "missing.json"))
    assert res.returncode == 2 and "missing.json" in res.stderr and "Traceback" not in res.stderr
