"""The benchmark tool (``python -m benchmarks``): its command line, the append-only store, the report, and
(slow) each subcommand's own plumbing on tiny inputs."""

from __future__ import annotations

import gzip
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "bench" / "fixtures" / "tiny-sweep"
SUBCOMMANDS = ["grid", "sweep", "store", "replay", "arachne", "cost-model", "work-clock", "replan-trace", "runtime",
               "same-plans", "suite", "report", "objectives", "long-seq"]


def bench(*args: str, stored: Path | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, **({"BENCHMARKS_STORED": str(stored)} if stored else {})}
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=timeout)


# ---- fast ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sub", ["scale", "nic", "starved"])
def test_grid_unknown_planner_is_one_line_and_exit_2(sub):
    res = bench("grid", sub, "--planners", "arachne,nosuch", "--out", "unused")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert res.stderr.startswith("error: --planners: unknown planner 'nosuch'")


def test_help_lists_every_subcommand():
    res = bench("--help")
    assert res.returncode == 0, res.stderr
    assert all(name in res.stdout for name in SUBCOMMANDS)


def test_every_subcommand_parses_and_names_a_function_that_exists():
    import importlib

    from benchmarks.cli import build

    ap = build()
    seen = set()
    for action in ap._subparsers._group_actions:
        for name, sub in action.choices.items():
            leaves = [(name, sub)]
            if sub._subparsers is not None:
                leaves = [(f"{name} {n}", s) for a in sub._subparsers._group_actions
                          for n, s in a.choices.items()]
            for label, leaf in leaves:
                module, func = leaf.get_default("handler").split(":")
                assert callable(getattr(importlib.import_module(module), func)), label
                seen.add(label.split()[0])
    assert seen == set(SUBCOMMANDS)


@pytest.mark.slow
def test_the_suite_runs_only_subcommands_that_parse_and_every_reported_command():
    from benchmarks.cli import build
    from benchmarks.report import NEEDED

    res = bench("suite", "--dry-run", "--long-budget")
    assert res.returncode == 0, res.stderr
    lines = [ln.split("   #")[0].strip() for ln in res.stdout.splitlines() if ln.startswith("python -m benchmarks")]
    assert len(lines) > 10
    for line in lines:
        build().parse_args(shlex.split(line)[3:])  # exits on a bad one
    missing = [command for _, command in NEEDED if command not in lines]
    assert not missing, missing  # a full suite run regenerates every number the report asks for
    assert not (ROOT / "benchmarks" / "suite.sh").exists()


@pytest.mark.slow
def test_store_is_append_only_and_report_writes_results_and_headlines(tmp_path):
    stored = tmp_path / "stored"
    res = bench("store", "add", str(TINY), "--name", "tiny", stored=stored)
    assert res.returncode == 0, res.stderr
    manifest = json.loads((stored / "MANIFEST.json").read_text())
    (entry,) = manifest["sweeps"]
    assert entry["name"] == "tiny" and entry["cases"] == 2 and entry["command"] and len(entry["sha256"]) == 64
    again = bench("store", "add", str(TINY), "--name", "tiny", stored=stored)
    assert again.returncode == 2 and "append-only" in again.stderr and "Traceback" not in again.stderr
    assert bench("store", "verify", stored=stored).returncode == 0

    out, head = tmp_path / "results.md", tmp_path / "headline.json"
    res = bench("report", "--results", str(tmp_path / "none"), "--out", str(out), "--headline", str(head),
                stored=stored)
    assert res.returncode == 0, res.stderr
    text = out.read_text()
    assert "## Setup" in text and "cores" in text and "Not regenerated here" in text and "tiny" in text
    cells = [c for ln in text.splitlines() if ln.startswith("|") for c in ln.split("|")]
    assert cells and max(len(c) for c in cells) < 300
    heads = json.loads(head.read_text())
    assert 0 < len(heads) <= 8
    assert all({"name", "value", "unit", "command", "commit", "date"} <= set(h) for h in heads)

    blob = stored / entry["file"]  # a stored file rewritten in place is refused
    blob.write_bytes(blob.read_bytes() + b"\0")
    res = bench("store", "verify", stored=stored)
    assert res.returncode == 2 and "sha256" in res.stderr and "Traceback" not in res.stderr


def test_replay_grid_reads_the_newest_stored_grid_unless_told(monkeypatch, capsys):
    from benchmarks import common

    entries = [{"name": "grid", "kind": "grid"}, {"name": "seed1", "kind": "robustness"},
               {"name": "grid-b", "kind": "grid"}, {"name": "seed2", "kind": "robustness"}]
    monkeypatch.setattr(common, "read_manifest", lambda: {"sweeps": entries})
    assert common.newest_stored("grid") == "grid-b" and common.newest_stored("robustness") == "seed2"
    monkeypatch.setattr(common, "read_manifest", lambda: {"sweeps": entries[1:2]})
    with pytest.raises(SystemExit) as e:
        common.newest_stored("grid")
    assert e.value.code == 2 and capsys.readouterr().err.count("\n") == 1
    help_text = bench("replay", "grid", "--help").stdout
    assert "newest stored grid" in " ".join(help_text.split())


@pytest.mark.slow
def test_the_repository_stores_every_sweep_once_and_intact():
    res = bench("store", "verify")
    assert res.returncode == 0, res.stderr
    manifest = json.loads((ROOT / "benchmarks" / "stored" / "MANIFEST.json").read_text())
    names = [e["name"] for e in manifest["sweeps"]]
    assert len(names) == len(set(names)) and "grid" in names and "seed0" in names
    assert all(e["command"] and e["commit"] and e["date"] and e["cases"] > 0 for e in manifest["sweeps"])
    assert not list((ROOT / "benchmarks" / "stored").glob("*.tar.gz"))


def test_work_clock_install_writes_data_the_clock_reads(tmp_path):
    from arachne.planners.arachne.work_clock import RATES, WORK_FIELDS, load_rates
    from benchmarks import work_clock

    rates = {f: 1.23456e-6 * (i + 1) for i, f in enumerate(WORK_FIELDS)}
    path = tmp_path / "work_rates.json"
    work_clock.install({"rates": rates, "runs": 6, "r2": 0.9, "median_wall_over_fit": 1.0}, path)
    doc = json.loads(path.read_text())
    assert {"fitted_by", "command", "date", "rates"} <= set(doc)
    assert load_rates(path.read_text()) == {f: float(f"{rates[f]:.4g}") for f in WORK_FIELDS}
    shipped = json.loads((ROOT / "arachne" / "data" / "work_rates.json").read_text())
    assert shipped["rates"] == RATES and {"fitted_by", "command", "date"} <= set(shipped)


@pytest.mark.slow
def test_same_plans_compare_semantics(tmp_path):
    rows = [{"case": f"c{i}", "plan": f"{i:016x}", "tokens_per_s": 100.0 + i, "mfu": 0.5, "work_s": 0.3,
             "wall_s": 0.4} for i in range(3)]
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("".join(json.dumps(r) + "\n" for r in rows))
    b.write_text("".join(json.dumps({**r, "wall_s": 0.2}) + "\n" for r in rows))  # faster, same plans
    res = bench("same-plans", "compare", str(a), str(b))
    assert res.returncode == 0 and "differ in 0" in res.stdout
    b.write_text("".join(json.dumps({**r, "plan": "0" * 16} if r["case"] == "c1" else r) + "\n" for r in rows))
    res = bench("same-plans", "compare", str(a), str(b))
    assert res.returncode == 1 and "differ in 1" in res.stdout
    res = bench("same-plans", "compare", str(a), str(tmp_path / "nope.jsonl"))
    assert res.returncode == 2 and "nope.jsonl" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.slow
def test_bad_input_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "runs.json").write_text(json.dumps({"args": {"seed": 1, "n": 30, "planners": ["megatron"]},
                                                    "runs": [], "cases": []}))
    res = bench("sweep", "run", "--n", "2", "--seed", "4", "--planners", "arachne", "--reuse",
                str(tmp_path / "runs.json"), "--out", str(tmp_path / "x"))
    assert res.returncode == 2 and "seed 1 n 30" in res.stderr and "Traceback" not in res.stderr
    for args, needle in ((["sweep", "summarize", str(tmp_path / "missing.json")], "missing.json"),
                         (["replay", "sweeps", "no-such-sweep"], "no-such-sweep"),
                         (["replay", "sweeps", str(TINY / "runs.json"), "--options", "[1]"], "--options"),
                         (["replay", "sweeps", str(TINY / "runs.json"), "--cases", "rob-005,rob-999"], "rob-999"),
                         (["replay", "ceiling", str(tmp_path / "nope.json")], "nope.json"),
                         (["replay", "long-budget", str(tmp_path / "missing.json")], "missing.json"),
                         (["arachne", "latency", "--baselines", "sailor,nosuch"], "nosuch"),
                         (["replay", "sweeps", str(TINY / "runs.json"), "--against", str(TINY / "runs.json")],
                          "not a `replay sweeps` result")):
        res = bench(*args)
        assert res.returncode == 2 and needle in res.stderr and "Traceback" not in res.stderr, (args, res.stderr)


# ---- slow: each runs planners ------------------------------------------------------------------------------
@pytest.mark.slow
def test_sweep_reuses_stored_runs_and_summarizes(tmp_path):
    base = bench("sweep", "run", "--n", "1", "--seed", "4", "--budget", "3", "--planners", "megatron",
                 "--out", str(tmp_path / "b"))
    assert base.returncode == 0, base.stderr[-2000:]
    again = bench("sweep", "run", "--planners", "arachne", "--budget", "3", "--reuse", str(tmp_path / "b"),
                  "--out", str(tmp_path / "a"))
    assert again.returncode == 0, again.stderr[-2000:]
    doc = json.loads((tmp_path / "a" / "runs.json").read_text())
    assert sorted(r["planner"] for r in doc["runs"]) == ["arachne", "megatron"]
    old = json.loads((tmp_path / "b" / "runs.json").read_text())["runs"][0]
    assert next(r for r in doc["runs"] if r["planner"] == "megatron") == old  # taken as stored, not re-run
    case = doc["cases"][0]
    if case["arachne_vs_best_baseline"] is not None:
        a = next(r for r in doc["runs"] if r["planner"] == "arachne")["tokens_per_s"]
        assert abs(case["arachne_vs_best_baseline"] - a / old["tokens_per_s"]) < 1e-9
    summary = bench("sweep", "summarize", str(tmp_path / "a" / "runs.json"))
    assert summary.returncode == 0 and "arachne vs the best baseline" in summary.stdout + summary.stderr


@pytest.mark.slow
def test_replay_sweeps_replans_arachne_against_stored_baselines(tmp_path):
    res = bench("replay", "sweeps", str(TINY), "--options", '{"target_s": 0.2}', "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr[-2000:]
    doc = json.loads((tmp_path / "sweeps.json").read_text())
    assert doc["command"].startswith("python -m benchmarks replay sweeps") and doc["commit"] and doc["date"]
    assert len(doc["rows"]) == 2 and all(r["valid"] and r["ratio"] == r["arachne_tok_s"] / r["best_baseline_tok_s"]
                                         for r in doc["rows"])
    # against an earlier result (gzipped) where one case was 10% slower: the same plans now, so that case moved up
    doc["rows"][0]["arachne_tok_s"] *= 0.9
    (tmp_path / "before.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    res = bench("replay", "sweeps", str(TINY), "--options", '{"target_s": 0.2}', "--against",
                str(tmp_path / "before.json.gz"), "--out", str(tmp_path / "again"))
    assert res.returncode == 0, res.stderr[-2000:]
    again = json.loads((tmp_path / "again" / "sweeps.json").read_text())
    against = again["params"]["against"]
    assert again["summary"][-1]["sweeps"] == "all"  # (what the report reads)
    assert (against["cases"], against["up"], against["down"], against["missing"]) == (2, 1, 0, 0)
    assert abs(against["geomean_after"] / against["geomean_before"] - (1 / 0.9) ** 0.5) < 1e-9
    assert f"{doc['rows'][0]['sweep']}/{doc['rows'][0]['case']}" in res.stdout + res.stderr


@pytest.mark.slow
def test_replays_read_clusters_from_the_sweep_and_refuse_a_missing_one(tmp_path):
    moved = tmp_path / "moved"
    subprocess.run(["cp", "-r", str(TINY), str(moved)], check=True)
    for args in (["latency"], ["split-speed", "--repeat", "1"], ["ceiling"]):
        ok = bench("replay", args[0], str(moved / "runs.json"), *args[1:], "--out", str(tmp_path / args[0]))
        assert ok.returncode == 0, ok.stderr[-2000:]
        assert json.loads(next((tmp_path / args[0]).glob("*.json")).read_text())["rows"]
    rows = json.loads((tmp_path / "ceiling" / "ceiling.json").read_text())["rows"]
    assert rows and all(r["ceiling_over_baseline"] >= 1 and 0 < r["arachne_of_ceiling"] <= 1 for r in rows)
    for f in (moved / "clusters").iterdir():
        f.unlink()
    res = bench("replay", "latency", str(moved / "runs.json"), "--out", str(tmp_path / "x"))
    assert res.returncode == 2 and "Traceback" not in res.stderr and "cluster is missing" in res.stderr


@pytest.mark.slow
def test_long_budget_repeats_capped_baselines_that_came_close(tmp_path):
    cmd = ["arachne", "plan", "--cluster", str(ROOT / "examples" / "clusters" / "small-mixed.yaml"), "--model",
           "GPT-3-1.3B", "--global-batch-size", "32", "--sequence-length", "1024", "--planner", "megatron",
           "--time-budget", "5", "-o", "x.json"]
    runs = [{"case": "c", "planner": "arachne", "tokens_per_s": 100.0, "wall_s": 1.0, "command": cmd},
            {"case": "c", "planner": "metis", "tokens_per_s": 95.0, "wall_s": 5.3, "command": cmd},  # capped, close
            {"case": "c", "planner": "sailor", "tokens_per_s": 50.0, "wall_s": 5.3, "command": cmd},  # far behind
            {"case": "c", "planner": "flashflex", "tokens_per_s": 99.0, "wall_s": 1.0, "command": cmd}]  # not capped
    (tmp_path / "runs.json").write_text(json.dumps({"args": {"budget": 5.0}, "runs": runs}))
    res = bench("replay", "long-budget", str(tmp_path / "runs.json"), "--budget", "3", "--out", str(tmp_path / "o"))
    assert res.returncode == 0, res.stderr[-2000:]
    rows = json.loads((tmp_path / "o" / "long_budget.json").read_text())["rows"]
    assert [r["planner"] for r in rows] == ["metis"]
    assert rows[0]["long_tok_s"] > 0 and abs(rows[0]["arachne_vs_long"] - 100.0 / rows[0]["long_tok_s"]) < 1e-9


@pytest.mark.slow
def test_work_clock_fit_writes_nonnegative_rates_for_every_kind_of_work(tmp_path):
    res = bench("work-clock", "fit", "--seeds", "10", "--n", "3", "--targets", "0.2", "--out", str(tmp_path),
                "--install", "--rates-file", str(tmp_path / "rates.json"))
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads((tmp_path / "fit_summary.json").read_text())
    from arachne.planners.arachne.work_clock import WORK_FIELDS, load_rates

    assert set(summary["rates"]) == set(WORK_FIELDS) and all(v >= 0 for v in summary["rates"].values())
    assert summary["runs"] == 6  # 3 problems x 1 target x 2 clocks
    assert set(load_rates((tmp_path / "rates.json").read_text())) == set(WORK_FIELDS)


@pytest.mark.slow
def test_same_plans_runs_and_compares(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for out in (a, b):
        res = bench("same-plans", "run", "--limit", "2", "--out", str(out))
        assert res.returncode == 0, res.stderr[-2000:]
    res = bench("same-plans", "compare", str(a), str(b))
    assert res.returncode == 0 and "differ in 0" in res.stdout
    rows = [json.loads(line) for line in b.read_text().splitlines()]
    assert set(rows[0]) == {"case", "plan", "tokens_per_s", "mfu", "work_s", "wall_s"} and len(rows[0]["plan"]) == 16


def test_a_sweep_rerun_end_to_end_is_counted_apart_never_twice():
    """``NAME-rerun`` (NAME's clusters, every planner again on later code) gets its own row in the stored-sweeps
    table and is left out of every other row and of the headline numbers."""
    from benchmarks.common import Sweep
    from benchmarks.report import stored_robustness

    def sweep(name: str, arachne: float) -> Sweep:
        runs = [{"case": "rob-000", "planner": "arachne", "tokens_per_s": arachne, "status": "ok", "wall_s": 1.0},
                {"case": "rob-000", "planner": "megatron", "tokens_per_s": 100.0, "status": "ok", "wall_s": 1.0}]
        return Sweep(name, "robustness", {"cases": [{"name": "rob-000"}], "runs": runs}, {}, name)

    text, stats = stored_robustness([sweep("seed0", 90.0), sweep("seed0-rerun", 120.0)], {})
    rows = {ln.split("|")[1].strip(): ln for ln in text if ln.startswith("| ")}
    assert stats["cases"] == 1 and stats["min"] == pytest.approx(0.9)
    assert "| 1 | 1 | 0.9000 |" in rows["all stored"]
    assert "| 1 | 1 | 1.200 |" in rows["re-run end to end on a later commit"]
    assert "| 1 | 1 | 0.9000 |" in rows["seed 0-5"]


@pytest.mark.slow
def test_a_stored_recheck_raises_the_best_baseline_of_its_sweep(tmp_path, monkeypatch):
    """A baseline's miss run again (``sweep recheck``) and stored counts as that sweep's run: the best baseline of
    the case is the faster of the two, and the stored recheck is append-only and checked like a sweep."""
    from benchmarks import common

    stored = tmp_path / "stored"
    assert bench("store", "add", str(TINY), "--name", "tiny", stored=stored).returncode == 0
    recheck = tmp_path / "recheck.json"
    rows = [{"sweep": "tiny", "case": "rob-005", "planner": "megatron", "status": "ok", "tok_s": 500000.0},
            {"sweep": "tiny", "case": "rob-014", "planner": "megatron", "status": "no-plan", "tok_s": None}]
    recheck.write_text(json.dumps({"format": "arachne-bench-result/1", "benchmark": "sweep-recheck",
                                   "command": "python -m benchmarks sweep recheck tiny", "commit": "abc1234",
                                   "date": "2026-12-04", "rows": rows}))
    res = bench("store", "add", str(recheck), "--name", "fix", stored=stored)
    assert res.returncode == 0, res.stderr
    again = bench("store", "add", str(recheck), "--name", "fix", stored=stored)
    assert again.returncode == 2 and "append-only" in again.stderr
    monkeypatch.setattr(common, "STORED", stored)
    monkeypatch.setattr(common, "MANIFEST", stored / "MANIFEST.json")
    (sweep,) = common.load_sweeps(["tiny"])
    best = sweep.best_baselines()
    assert best["rob-005"] == (500000.0, "megatron")  # the recheck's plan is faster than sailor's as stored
    assert best["rob-014"][1] == "sailor"  # a recheck that found nothing changes nothing
    assert sweep.ratios()["rob-005"] == pytest.approx(373567.29115721735 / 500000.0)
    (stored / "rechecks" / "fix.json").write_text("{}")  # rewritten in place: refused
    res = bench("store", "verify", stored=stored)
    assert res.returncode == 2 and "sha256" in res.stderr and "Traceback" not in res.stderr


def test_recheck_refuses_arachne_in_one_line():
    res = bench("sweep", "recheck", "seed91", "--planners", "arachne")
    assert res.returncode == 2 and "--planners" in res.stderr and "Traceback" not in res.stderr


def test_a_result_names_repository_files_relative_to_it(tmp_path):
    """A stored result carried this machine's checkout folder in its params."""
    from benchmarks import common

    path = common.write_result(tmp_path, "r", [{"a": 1}], params={"data": common.ROOT / "data" / "x.yaml",
                                                                  "other": str(tmp_path / "y"), "n": 3})
    params = json.loads(path.read_text())["params"]
    assert params == {"data": "data/x.yaml", "other": str(tmp_path / "y"), "n": 3}


def test_the_scale_cases_load_and_feed_their_clusters():
    """``grid scale``: each large cluster loads with the catalog's NICs, its model exists and its job fits the
    model's sequence limit; sizes as the docs say (4,096 to 100,000 GPUs)."""
    from arachne.spec.model import load_model
    from benchmarks import common

    sizes = []
    for case in common.SCALE_CASES:
        cl = common.grid_cluster(case.cluster, list(case.groups))
        model = load_model(case.model)
        assert case.seq <= model.max_sequence_length and case.gbs >= 1
        assert all(n.inter_node_bw > 0 for n in cl.nodes)
        sizes.append(cl.num_gpus)
    assert min(sizes) == 4096 and max(sizes) == 100_000
