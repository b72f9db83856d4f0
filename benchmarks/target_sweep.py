"""Does more planning time pay, and never cost? arachne at several ``--target`` values on the large
random production-like clusters of ``benchmarks/robustness.py``.

A target beyond the default (0.8 s) runs the default search first and spends the rest improving on
it, so throughput should not fall as the target grows. Prints per case the tokens/s and wall time at
each target, and the ratio of each target's throughput to the default's.

Usage:  python benchmarks/target_sweep.py [--targets 0.8,2,4] [--seeds 0,1,2] [--min-gpus 200] [--n 12]
                                          [--out results/target_sweep]
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import random
import time
from pathlib import Path

import robustness  # the sibling benchmark scripts (run as a script, this folder is on the path)
from arachne_eval import write
from rich.console import Console
from rich.table import Table

from arachne.cost import CostModel
from arachne.planners.harness import run_planner
from arachne.planners.protocol import SearchBudget
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.job import Job
from arachne.spec.model import model_catalog

console = Console(width=160)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default="0.8,2,4")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--min-gpus", type=int, default=200)
    ap.add_argument("--n", type=int, default=12, help="cases (the first n large enough)")
    ap.add_argument("--out", type=Path, default=Path("results/target_sweep"))
    a = ap.parse_args()
    try:
        targets = [float(t) for t in a.targets.split(",")]
    except ValueError:
        ap.error(f"--targets: {a.targets!r} is not a comma-separated list of seconds")
    cases = []
    for seed in (int(s) for s in a.seeds.split(",") if s):
        rng = random.Random(seed)
        for i in range(30):
            rc = robustness.random_case(rng, i)
            cl = cluster_from_dict(rc.doc)
            if cl.num_gpus >= a.min_gpus and rc.model_state_fits and len(cases) < a.n:
                cases.append((f"rob{seed}/{rc.name}", cl, rc))
    rows = []
    for name, cl, rc in cases:
        model, job = model_catalog().get(rc.model), Job(global_batch_size=rc.gbs, sequence_length=rc.seq)
        row = {"case": name, "gpus": cl.num_gpus, "model": rc.model}
        for t in targets:
            t0 = time.perf_counter()
            _, est, _ = run_planner("arachne", cl, model, job, CostModel(cl),
                                    SearchBudget(time_budget_s=max(20, 2 * t)), target_s=t)
            row[f"tok_s@{t:g}"], row[f"s@{t:g}"] = est.tokens_per_s, time.perf_counter() - t0
        for t in targets[1:]:
            row[f"ratio@{t:g}"] = row[f"tok_s@{t:g}"] / row[f"tok_s@{targets[0]:g}"]
        rows.append(row)
        console.print(f"{name}: " + ", ".join(f"{t:g} s -> {row[f'tok_s@{t:g}']:,.0f} tok/s" for t in targets),
                      highlight=False)
    table = Table(title=f"arachne at --target {', '.join(f'{t:g}' for t in targets)} s (one core)")
    for k in rows[0]:
        table.add_column(k, justify="left" if isinstance(rows[0][k], str) else "right")
    for r in rows:
        table.add_row(*[f"{v:,.3f}" if isinstance(v, float) and v < 100 else
                        (f"{v:,.0f}" if isinstance(v, float) else str(v)) for v in r.values()])
    console.print(table)
    for t in targets[1:]:
        rs = [r[f"ratio@{t:g}"] for r in rows]
        console.print(f"target {t:g} s vs {targets[0]:g} s: min {min(rs):.4f}, max {max(rs):.4f}, "
                      f"lower in {sum(x < 1 - 1e-9 for x in rs)}/{len(rs)} cases")
    write(a.out, "target_sweep", rows)


if __name__ == "__main__":
    main()
