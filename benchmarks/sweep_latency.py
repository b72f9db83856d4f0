"""arachne's planning time, in this process, on the clusters of stored robustness sweeps.

Usage:  python benchmarks/sweep_latency.py results/robustness/odd10{3,4}/runs.json [--out results/sweep_latency]

Re-plans every case where arachne found a plan (the sweep's own command line: cluster, model, batch,
sequence) and times ``run_planner`` on the wall clock, without the CLI's start-up; the work clock's
reading is shown beside it. Run it on an idle machine. Prints the median and maximum by cluster size
and writes ``sweep_latency.csv``/``.json``.
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

from arachne_eval import table, write
from robustness import fail, read_runs

from arachne.cost import CostModel
from arachne.errors import InputError
from arachne.planners.harness import run_planner
from arachne.planners.protocol import SearchBudget
from arachne.spec.cluster import Cluster, load_cluster
from arachne.spec.job import Job
from arachne.spec.model import ModelSpec, model_catalog

BANDS = ((1, 63), (64, 255), (256, 1024))


def arachne_cases(paths: list[Path]) -> Iterator[tuple[Path, str, Cluster, ModelSpec, Job]]:
    """The cases of stored sweeps where arachne found a plan, each once: the cluster saved beside runs.json,
    the model and job from the sweep's command line."""
    for path in paths:
        seen = set()
        for r in read_runs(path)["runs"]:
            if r["planner"] != "arachne" or r["case"] in seen or not r["tokens_per_s"]:
                continue
            seen.add(r["case"])
            opts = dict(zip(r["command"][2::2], r["command"][3::2]))
            job = Job(global_batch_size=int(opts["--global-batch-size"]), sequence_length=int(opts["--sequence-length"]))
            try:  # the clusters a sweep saved beside its runs.json, wherever the folder moved
                cluster = load_cluster(path.parent / "clusters" / f"{r['case']}.yaml")
            except InputError as e:
                fail(f"{path}: the sweep's cluster is missing or bad ({e})")
            yield path, r["case"], cluster, model_catalog().get(opts["--model"]), job


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="runs.json of robustness sweeps")
    ap.add_argument("--out", type=Path, default=Path("results/sweep_latency"))
    args = ap.parse_args()
    rows = []
    for path, case, cl, model, job in arachne_cases(args.runs):
        t0 = time.perf_counter()
        _, est, res = run_planner("arachne", cl, model, job, CostModel(cl), SearchBudget(time_budget_s=5.0))
        rows.append({"sweep": path.parent.name, "case": case, "gpus": len(cl.devices),
                     "wall_s": round(time.perf_counter() - t0, 3), "work_s": res.stats.notes.get("work_s"),
                     "tokens_per_s": round(est.tokens_per_s)})
    bands = []
    for lo, hi in BANDS:
        sel = [r["wall_s"] for r in rows if lo <= r["gpus"] <= hi]
        if sel:
            bands.append({"gpus": f"{lo}-{hi}", "cases": len(sel), "median_s": round(statistics.median(sel), 3),
                          "max_s": max(sel)})
    bands.append({"gpus": "all", "cases": len(rows), "median_s": round(statistics.median(r["wall_s"] for r in rows), 3),
                  "max_s": max(r["wall_s"] for r in rows)})
    table("arachne planning time on the sweeps' clusters (wall, in process)", bands)
    write(args.out, "sweep_latency", rows)


if __name__ == "__main__":
    main()
