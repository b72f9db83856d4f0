"""arachne with other planner options, against the baselines stored by robustness sweeps.

Re-plans every comparable case of the given sweeps in this process (the work clock makes each run
reproducible, so another benchmark may share the machine) with ``ArachnePlanner`` options, e.g.
``{"teacher_share": 0.8}``, and reports arachne over the best stored baseline: geometric mean,
minimum, and the cases below 0.99. A tool for tuning the planner's defaults; the robustness seeds
are also the evaluation, so confirm a change on seeds it was not chosen on.

Usage:  python benchmarks/planner_options.py results/robustness-r3/seed{0,1,2,3,4}/runs.json
            [--options '{"teacher_share": 0.8}'] [--cases rob-012,rob-018] [--out results/planner_options]
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import json
import math
import sys
from pathlib import Path

from arachne_eval import write
from rich.console import Console

from arachne.cost import CostModel
from arachne.errors import NoFeasiblePlanError
from arachne.planners.harness import run_planner
from arachne.planners.protocol import SearchBudget
from arachne.spec.cluster import load_cluster
from arachne.spec.job import Job
from arachne.spec.model import model_catalog

console = Console(width=160)


def fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweeps", nargs="+", type=Path, help="robustness runs.json files (baselines stored)")
    ap.add_argument("--options", default="{}", help="ArachnePlanner options as a JSON object")
    ap.add_argument("--out", type=Path, default=Path("results/planner_options"))
    ap.add_argument("--cases", default="", help="comma-separated case names (default: every case)")
    ap.add_argument("--budget", type=float, default=5.0, help="the wall-clock budget of each run, s (as in the sweeps)")
    a = ap.parse_args()
    try:
        options = json.loads(a.options)
        assert isinstance(options, dict)
    except (ValueError, AssertionError):
        fail(f"--options: {a.options!r} is not a JSON object")
    only = {c for c in a.cases.split(",") if c}
    sweeps = []
    for path in a.sweeps:
        try:
            doc = json.loads(path.read_text())
            sweeps.append((path, doc["cases"], doc["runs"]))
        except (OSError, ValueError, KeyError, TypeError) as e:
            fail(f"{path}: not a robustness runs.json ({type(e).__name__}: {e})")
    unknown = sorted(only - {c["name"] for _, cases, _ in sweeps for c in cases})
    if unknown:
        fail(f"--cases: {', '.join(unknown)} not in the given sweeps")
    rows = []
    for path, cases, runs in sweeps:
        best: dict[str, float] = {}
        for r in runs:
            if r["planner"] != "arachne" and r.get("tokens_per_s"):
                best[r["case"]] = max(best.get(r["case"], 0.0), r["tokens_per_s"])
        for case in cases:
            if case["name"] not in best or not case["model_state_fits"] or (only and case["name"] not in only):
                continue
            cl = load_cluster(path.parent / "clusters" / f"{case['name']}.yaml")
            job = Job(global_batch_size=case["gbs"], sequence_length=case["seq"])
            try:
                _, est, _ = run_planner("arachne", cl, model_catalog().get(case["model"]), job, CostModel(cl),
                                        SearchBudget(time_budget_s=a.budget), **options)
                tok = est.tokens_per_s
            except NoFeasiblePlanError:
                tok = 0.0
            rows.append({"sweep": str(path), "case": case["name"], "gpus": cl.num_gpus, "arachne_tok_s": tok,
                         "best_baseline_tok_s": best[case["name"]], "ratio": tok / best[case["name"]]})
            console.print(f"{path.parent.name}/{case['name']}: {rows[-1]['ratio']:.3f}", highlight=False)
    ratios = [r["ratio"] for r in rows]
    ok = [x for x in ratios if x > 0]
    low = [(Path(r["sweep"]).parent.name + "/" + r["case"], round(r["ratio"], 3)) for r in rows if r["ratio"] < 0.99]
    console.print(f"options {json.dumps(options)}: {len(ratios)} cases; geomean "
                  f"{math.exp(sum(map(math.log, ok)) / max(1, len(ok))):.4f}, min {min(ratios, default=0):.3f}, "
                  f">= 0.99 on {len(ratios) - len(low)}/{len(ratios)}; below: {low}", highlight=False)
    if rows:
        write(a.out, "planner_options", rows)


if __name__ == "__main__":
    main()
