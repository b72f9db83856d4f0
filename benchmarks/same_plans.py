"""``same-plans``: same plans, less time? For refactors that must not change what arachne plans.

``run`` plans a fixed set of problems in one process (the latency benchmark's 19 clusters, then the first 12
fitting cases of each sweep given: a stored name such as ``seed31`` or a runs.json) and writes per problem the
plan's digest, tokens/s, MFU, work and wall time as JSON lines. ``compare`` reads two such files (e.g. old code
and new, run alternately on an idle machine): it lists the problems whose plan, MFU or work differ (exit 1 if
any) and prints the total wall time of each.

Old code: run it from a checkout of that commit (``git worktree add /tmp/old COMMIT``, then
``cd /tmp/old && python -m benchmarks same-plans run ...``, or the old ``benchmarks/same_plans.py``: both write
the same lines).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

from arachne.cost import CostModel
from arachne.planners.harness import run_planner
from arachne.planners.protocol import SearchBudget
from arachne.spec.job import Job
from arachne.spec.model import model_catalog
from benchmarks import common


def problems(sweeps: list[str]) -> list[tuple]:
    """(name, cluster, model, job): the latency suite's clusters (LLaMA-2-13B), then 12 cases per sweep."""
    out = [(f"latency-{n_gpus}x{n_types}", cl, "LLaMA-2-13B", job)
           for n_gpus, n_types, cl, job in common.latency_clusters()]
    for sweep in common.load_sweeps(sweeps, kind="robustness"):
        for c in [c for c in sweep.cases if c["model_state_fits"]][:12]:
            out.append((f"{sweep.name}/{c['name']}", sweep.cluster(c["name"]), c["model"],
                        Job(global_batch_size=c["gbs"], sequence_length=c["seq"])))
    return out


def digest(plan) -> str:
    """The plan as written (its document, so optional fields added later with their defaults do not count)
    without who planned it, how long it took and its price: what a refactor must not change."""
    doc = {k: v for k, v in plan.to_doc().items() if k not in ("planner", "planning_time_s", "estimate")}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def run(a) -> None:
    opts = json.loads(a.options)
    rows, total = [], 0.0
    with open(a.out, "w") as fh:
        for name, cl, model, job in problems(a.sweeps)[: a.limit or None]:
            t0 = time.perf_counter()
            plan, est, res = run_planner("arachne", cl, model_catalog().get(model), job, CostModel(cl),
                                         SearchBudget(time_budget_s=60), **opts)
            wall = time.perf_counter() - t0
            total += wall
            rows.append({"case": name, "plan": digest(plan), "tokens_per_s": est.tokens_per_s, "mfu": est.mfu,
                         "work_s": res.stats.notes.get("work_s"), "wall_s": round(wall, 4)})
            fh.write(json.dumps(rows[-1]) + "\n")
    common.print_table(f"{len(rows)} problems planned", rows, ["case", "plan", "tokens_per_s", "work_s", "wall_s"])
    print(f"wrote {a.out}: total wall {total:.2f} s")


def compare(a) -> None:
    def read(path: str) -> list[dict]:
        try:
            return [json.loads(line) for line in Path(path).read_text().splitlines()]
        except (OSError, ValueError) as e:
            print(f"error: {path}: not a same-plans run output ({type(e).__name__}: {e})", file=sys.stderr)
            sys.exit(2)

    x, y = read(a.a), read(a.b)
    if [r["case"] for r in x] != [r["case"] for r in y]:
        print("error: the two files plan different problems", file=sys.stderr)
        sys.exit(2)
    keys = ("plan", "tokens_per_s", "mfu", "work_s")
    differ = [(p["case"], p["tokens_per_s"], q["tokens_per_s"]) for p, q in zip(x, y)
              if tuple(p.get(k) for k in keys) != tuple(q.get(k) for k in keys)]
    wa, wb = sum(r["wall_s"] for r in x), sum(r["wall_s"] for r in y)
    common.print_table("problems whose plan, MFU or work differ",
                       [{"case": c, "tokens_per_s A": ta, "tokens_per_s B": tb} for c, ta, tb in differ[:20]])
    print(f"{len(x)} problems; plan, MFU or work differ in {len(differ)}: {differ[:10]}")
    print(f"total wall: {wa:.2f} s ({a.a}) vs {wb:.2f} s ({a.b}), ratio {wb / wa:.3f}")
    if differ:
        sys.exit(1)
