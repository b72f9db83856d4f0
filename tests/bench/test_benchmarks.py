"""The benchmark scripts' own plumbing: re-running one planner against stored runs, summaries."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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


def test_work_clock_fit_writes_nonnegative_rates_for_every_kind_of_work(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "work_clock.py"), "fit", "--seeds", "10", "--n", "3",
                        "--targets", "0.2", "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "fit_summary.json").read_text())
    from arachne.planners.arachne.work_clock import WORK_FIELDS

    assert set(summary["rates"]) == set(WORK_FIELDS) and all(v >= 0 for v in summary["rates"].values())
    assert summary["runs"] == 6  # 3 problems x 1 target x 2 clocks


def long_budget(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "long_budget.py"), *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_long_budget_repeats_capped_baselines_that_came_close(tmp_path):
    cmd = ["arachne", "plan", "--cluster", str(ROOT / "examples" / "clusters" / "small-mixed.yaml"), "--model",
           "GPT-3-1.3B", "--global-batch-size", "32", "--sequence-length", "1024", "--planner", "megatron",
           "--time-budget", "5", "-o", "x.json"]
    runs = [{"case": "c", "planner": "arachne", "tokens_per_s": 100.0, "wall_s": 1.0, "command": cmd},
            {"case": "c", "planner": "metis", "tokens_per_s": 95.0, "wall_s": 5.3, "command": cmd},  # capped, close
            {"case": "c", "planner": "sailor", "tokens_per_s": 50.0, "wall_s": 5.3, "command": cmd},  # far behind
            {"case": "c", "planner": "flashflex", "tokens_per_s": 99.0, "wall_s": 1.0, "command": cmd}]  # not capped
    (tmp_path / "runs.json").write_text(json.dumps({"args": {"budget": 5.0}, "runs": runs}))
    res = long_budget(str(tmp_path / "runs.json"), "--budget", "3", "--out", str(tmp_path / "o"))
    assert res.returncode == 0, res.stderr[-2000:]
    rows = json.loads((tmp_path / "o" / "long_budget.json").read_text())
    assert [r["planner"] for r in rows] == ["metis"]
    assert rows[0]["long_tok_s"] > 0 and abs(rows[0]["arachne_vs_long"] - 100.0 / rows[0]["long_tok_s"]) < 1e-9
    res = long_budget(str(tmp_path / "missing.json"))
    assert res.returncode == 2 and "missing.json" in res.stderr and "Traceback" not in res.stderr


def test_planner_options_replans_stored_sweeps_with_other_options(tmp_path):
    base = robustness("--n", "1", "--seed", "4", "--budget", "3", "--planners", "megatron", "--out", str(tmp_path / "b"))
    assert base.returncode == 0, base.stderr[-2000:]
    script = str(ROOT / "benchmarks" / "planner_options.py")
    res = subprocess.run([sys.executable, script, str(tmp_path / "b" / "runs.json"), "--options", '{"target_s": 0.2}',
                          "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = json.loads((tmp_path / "o" / "planner_options.json").read_text())
    assert len(rows) == 1 and rows[0]["ratio"] == rows[0]["arachne_tok_s"] / rows[0]["best_baseline_tok_s"] > 0
    bad = subprocess.run([sys.executable, script, str(tmp_path / "b" / "runs.json"), "--options", "[1]"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--options" in bad.stderr and "Traceback" not in bad.stderr
    bad = subprocess.run([sys.executable, script, str(tmp_path / "b" / "runs.json"), "--cases", "rob-000,rob-999"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "rob-999" in bad.stderr and "rob-000" not in bad.stderr


def test_the_suite_script_parses_and_names_only_existing_benchmarks():
    text = (ROOT / "benchmarks" / "suite.sh").read_text()
    assert subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "suite.sh")]).returncode == 0
    import re

    for script in set(re.findall(r"benchmarks/(\w+\.py)", text)):
        assert (ROOT / "benchmarks" / script).exists(), script


def test_sweep_benchmarks_read_clusters_beside_runs_json_and_refuse_a_missing_one(tmp_path):
    # a sweep moved elsewhere: its clusters come from the folder beside runs.json (not the stored command's
    # path); without them, one line and exit 2
    base = robustness("--n", "1", "--seed", "4", "--budget", "3", "--planners", "arachne",
                      "--out", str(tmp_path / "b"))
    assert base.returncode == 0, base.stderr[-2000:]
    moved = tmp_path / "moved"
    (tmp_path / "b").rename(moved)
    for script in ("sweep_latency.py", "split_speed.py"):
        args = [sys.executable, str(ROOT / "benchmarks" / script), str(moved / "runs.json"), "--out",
                str(tmp_path / script)] + (["--repeat", "1"] if script == "split_speed.py" else [])
        ok = subprocess.run(args, capture_output=True, text=True, timeout=300)
        assert ok.returncode == 0, ok.stderr[-2000:]
        assert json.loads(next((tmp_path / script).glob("*.json")).read_text())
    for f in (moved / "clusters").iterdir():
        f.unlink()
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sweep_latency.py"), str(moved / "runs.json"),
                          "--out", str(tmp_path / "x")], capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "Traceback" not in res.stderr and "cluster is missing" in res.stderr


def test_ceiling_bounds_every_stored_plan_of_a_sweep(tmp_path):
    base = robustness("--n", "2", "--seed", "4", "--budget", "3", "--planners", "arachne,megatron",
                      "--out", str(tmp_path / "b"))
    assert base.returncode == 0, base.stderr[-2000:]
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ceiling.py"), str(tmp_path / "b" / "runs.json"),
                          "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    rows = json.loads((tmp_path / "o" / "ceiling.json").read_text())
    assert rows and all(r["ceiling_over_baseline"] >= 1 and 0 < r["arachne_of_ceiling"] <= 1 for r in rows)
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ceiling.py"), str(tmp_path / "nope.json")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "nope.json" in bad.stderr and "Traceback" not in bad.stderr


def test_same_plans_runs_and_compares(tmp_path):
    script = str(ROOT / "benchmarks" / "same_plans.py")
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for out in (a, b):
        res = subprocess.run([sys.executable, script, "run", "--limit", "2", "--out", str(out)],
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-2000:]
    res = subprocess.run([sys.executable, script, "compare", str(a), str(b)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "differ in 0" in res.stdout
    rows = [json.loads(line) for line in b.read_text().splitlines()]
    rows[1]["tokens_per_s"] *= 1.01
    b.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = subprocess.run([sys.executable, script, "compare", str(a), str(b)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "differ in 1" in res.stdout
    res = subprocess.run([sys.executable, script, "compare", str(a), str(tmp_path / "nope.jsonl")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "nope.jsonl" in res.stderr and "Traceback" not in res.stderr
