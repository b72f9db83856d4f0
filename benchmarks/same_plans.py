"""Same plans, less time? For refactors that must not change what arachne plans.

``run`` plans a fixed set of problems in one process (the latency benchmark's 19 clusters, and the first
12 fitting cases of each robustness sweep given) and writes per problem the tokens/s, MFU, work and wall
time as JSON lines. ``compare`` reads two such files (e.g. old code and new, run alternately on an idle
machine): it lists the problems whose plan or work differ and prints the total wall time of each.

Usage:  python benchmarks/same_plans.py run [--sweeps results/robustness/seed31/runs.json ...] --out A.jsonl
        python benchmarks/same_plans.py compare A.jsonl B.jsonl
Old code: run it from a checkout of that commit (``git worktree add /tmp/old COMMIT``, then
``PYTHONPATH=/tmp/old python benchmarks/same_plans.py run ...``).
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import hashlib
import json
import random
import sys
import time
from pathlib import Path

from arachne_eval import TIERS, cluster

from arachne.cost import CostModel
from arachne.planners.harness import run_planner
from arachne.planners.protocol import SearchBudget
from arachne.spec.cluster import load_cluster
from arachne.spec.job import Job
from arachne.spec.model import model_catalog


def problems(sweeps: list[Path]) -> list[tuple]:
    """(name, cluster, model, job): the latency suite's clusters (LLaMA-2-13B), then 12 cases per sweep."""
    rng = random.Random(0)
    types = ["H100", "A100-80", "A100-40", "V100-16", "L4", "T4", "A10G", "H200"]
    out = []
    for n_gpus in TIERS:  # as arachne_eval.py latency draws them
        for n_types in (2, 4, 6):
            if n_types * 4 > n_gpus:
                continue
            chosen, per = rng.sample(types, n_types), n_gpus // n_types
            spec = [(g, max(1, per // (8 if per >= 8 else 4)), 8 if per >= 8 else 4) for g in chosen]
            out.append((f"latency-{n_gpus}x{n_types}", cluster(spec, f"{n_gpus}x{n_types}"), "LLaMA-2-13B",
                        Job(global_batch_size=max(64, n_gpus), sequence_length=2048)))
    for path in sweeps:
        cases = [c for c in json.loads(path.read_text())["cases"] if c["model_state_fits"]][:12]
        for c in cases:
            out.append((f"{path.parent.name}/{c['name']}", load_cluster(path.parent / "clusters" / f"{c['name']}.yaml"),
                        c["model"], Job(global_batch_size=c["gbs"], sequence_length=c["seq"])))
    return out


def run(args) -> None:
    opts = json.loads(args.options)
    with open(args.out, "w") as fh:
        total = 0.0
        for name, cl, model, job in problems(args.sweeps)[: args.limit or None]:
            t0 = time.perf_counter()
            plan, est, res = run_planner("arachne", cl, model_catalog().get(model), job, CostModel(cl),
                                      SearchBudget(time_budget_s=60), **opts)
            wall = time.perf_counter() - t0
            total += wall
            digest = hashlib.sha256(plan.model_dump_json(exclude={"planner", "planning_time_s", "estimate"})
                                    .encode()).hexdigest()[:16]
            fh.write(json.dumps({"case": name, "plan": digest, "tokens_per_s": est.tokens_per_s, "mfu": est.mfu,
                                 "work_s": res.stats.notes.get("work_s"), "wall_s": round(wall, 4)}) + "\n")
    print(f"wrote {args.out}: total wall {total:.2f} s")


def compare(args) -> None:
    def read(path: str) -> list[dict]:
        try:
            return [json.loads(line) for line in Path(path).read_text().splitlines()]
        except (OSError, ValueError) as e:
            print(f"error: {path}: not a same_plans.py run output ({type(e).__name__}: {e})", file=sys.stderr)
            sys.exit(2)

    a, b = read(args.a), read(args.b)
    if [r["case"] for r in a] != [r["case"] for r in b]:
        print("error: the two files plan different problems", file=sys.stderr)
        sys.exit(2)
    keys = ("plan", "tokens_per_s", "mfu", "work_s")
    differ = [(x["case"], x["tokens_per_s"], y["tokens_per_s"]) for x, y in zip(a, b)
              if tuple(x.get(k) for k in keys) != tuple(y.get(k) for k in keys)]
    wa, wb = sum(r["wall_s"] for r in a), sum(r["wall_s"] for r in b)
    print(f"{len(a)} problems; plan, MFU or work differ in {len(differ)}: {differ[:10]}")
    print(f"total wall: {wa:.2f} s ({args.a}) vs {wb:.2f} s ({args.b}), ratio {wb / wa:.3f}")
    if differ:
        sys.exit(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--sweeps", nargs="*", type=Path, default=[])
    r.add_argument("--options", default="{}", help="ArachnePlanner options as a JSON object")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--limit", type=int, default=0, help="only the first N problems")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    args = ap.parse_args()
    run(args) if args.cmd == "run" else compare(args)


if __name__ == "__main__":
    main()
