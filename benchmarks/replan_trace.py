"""``replan-trace``: re-planning while GPUs come and go: every planner follows a GPU availability trace.

Traces (Sailor's, shipped in ``arachne/data/sailor_gpu_traces.json``):
  spot  A100 spot VMs of one GPU each, their count following the change points of Sailor's 16-GPU
        A100 availability trace (16 -> 10 -> 9 -> 8 -> ... over 98 minutes; which VMs leave is drawn
        with ``--seed``), beside four on-demand 4-GPU V100 nodes that stay.
  grow  Sailor's heterogeneous trace: A100-40 in 8-GPU nodes 32 -> 80 -> 128 GPUs and V100-16 in
        4-GPU nodes 96 -> 240 -> 384, about two minutes apart.

At each change every planner re-plans from its own running plan with ``arachne.dynamic.replan``
(the same protocol for all: keep the running plan when it still runs and nothing planned is faster;
else move, paying the migration time). A segment trains for its duration minus the downtime:
planning time when the running plan cannot continue, plus the migration time of a move. The table
gives per change the GPUs and per planner tokens/s, planning time and migration seconds; the summary
gives tokens trained over the whole trace per planner, relative to arachne.

Usage:  python -m benchmarks replan-trace [--trace spot|grow] [--model M --gbs N --seq S]
                                         [--baselines sailor,metis,megatron] [--budget 10] [--out DIR]
Writes ``<trace>.json``/``.csv`` under --out (default results/replan_trace).
"""

from __future__ import annotations

import json
import random
from importlib.resources import files
from typing import Any

from rich.table import Table

from arachne.cost import CostModel
from arachne.dynamic import replan
from arachne.errors import NoFeasiblePlanError
from arachne.plan import Plan
from arachne.planners.harness import run_planner
from arachne.planners.protocol import SearchBudget
from arachne.spec.cluster import Cluster, cluster_from_dict
from arachne.spec.job import Job
from arachne.spec.model import model_catalog
from benchmarks import common


def load_traces() -> dict[str, Any]:
    return json.loads(files("arachne.data").joinpath("sailor_gpu_traces.json").read_text())


def spot_segments(seed: int) -> list[tuple[float, list[dict]]]:
    """(duration s, node entries) per change point: named A100 spot VMs (survivors keep their names)
    plus four V100 nodes."""
    points = load_traces()["a100_trace_original"]["points"]
    rng = random.Random(seed)
    alive: list[str] = []
    fresh = 0
    out = []
    for i, (t, n) in enumerate(points):
        while len(alive) > n:
            alive.remove(rng.choice(alive))
        while len(alive) < n:
            alive.append(f"a100-spot-{fresh}")
            fresh += 1
        end = points[i + 1][0] if i + 1 < len(points) else t + 630.0
        nodes = [{"name": name, "gpu": "A100-40", "gpus_per_node": 1, "inter_node_gbps": 3.0} for name in alive]
        nodes.append({"name": "v100-{i}", "count": 4, "gpu": "V100-16", "gpus_per_node": 4, "inter_node_gbps": 6.25})
        out.append((end - t, nodes))
    return out


def grow_segments() -> list[tuple[float, list[dict]]]:
    rows = load_traces()["gpu_trace_heterogeneous_imbalanced"]["rows"]
    out = []
    for i, row in enumerate(rows):
        gaps = [rows[k + 1]["timestamp"] - rows[k]["timestamp"] for k in range(len(rows) - 1)]
        dur = rows[i + 1]["timestamp"] - row["timestamp"] if i + 1 < len(rows) else gaps[-1]
        nodes = []
        for key, count in row["gpus"].items():
            gpu = key.split("_")[0]
            size = 8 if gpu.startswith("A100") else 4
            nodes.append({"name": f"{gpu.lower()}-{{i}}", "count": count // size, "gpu": gpu,
                          "gpus_per_node": size, "inter_node_gbps": 12.5 if size == 8 else 6.25})
        out.append((dur, nodes))
    return out


def step(planner: str, old: Plan | None, cl: Cluster, model, job: Job, budget: float) -> dict[str, Any]:
    """One planner at one change: plan (first segment) or re-plan from its running plan."""
    cm = CostModel(cl)
    b = SearchBudget(time_budget_s=budget)
    try:
        if old is None:
            plan, est, res = run_planner(planner, cl, model, job, cm, b)
            return {"plan": plan, "tokens_per_s": est.tokens_per_s, "planning_s": res.stats.wall_time_s,
                    "migration_s": 0.0, "downtime_s": res.stats.wall_time_s, "kept": False}
        r = replan(old, cl, b, planner, cm, model)
    except NoFeasiblePlanError:
        return {"plan": None, "tokens_per_s": 0.0, "planning_s": budget, "migration_s": 0.0,
                "downtime_s": float("inf"), "kept": False}
    down = (0.0 if r.old_problem is None else r.planning_time_s) + (0.0 if r.kept_old else r.migration.seconds)
    return {"plan": r.plan, "tokens_per_s": r.estimate.tokens_per_s, "planning_s": r.planning_time_s,
            "migration_s": 0.0 if r.kept_old else r.migration.seconds, "downtime_s": down, "kept": r.kept_old}


def replan_trace(a) -> None:
    spot = a.trace == "spot"
    model = model_catalog().get(a.model or ("GPT-3-2.7B" if spot else "LLaMA-2-13B"))
    job = Job(global_batch_size=a.gbs or (256 if spot else 1024), sequence_length=a.seq)
    segments = spot_segments(a.seed) if spot else grow_segments()
    planners = ["arachne"] + [b for b in a.baselines.split(",") if b]
    running: dict[str, Plan | None] = {p: None for p in planners}
    trained = {p: 0.0 for p in planners}
    rows = []
    for i, (dur, nodes) in enumerate(segments):
        cl = cluster_from_dict({"name": f"{a.trace}-{i}", "nodes": nodes})
        row: dict[str, Any] = {"change": i, "duration_s": dur, "gpus": cl.num_gpus}
        for p in planners:
            r = step(p, running[p], cl, model, job, a.budget)
            running[p] = r["plan"]
            trained[p] += max(0.0, dur - r["downtime_s"]) * r["tokens_per_s"]
            row.update({f"{p}_tok_s": r["tokens_per_s"], f"{p}_plan_s": r["planning_s"],
                        f"{p}_migrate_s": r["migration_s"], f"{p}_kept": r["kept"]})
        rows.append(row)
        common.console.print(f"change {i}: {cl.num_gpus} GPUs, " + ", ".join(
            f"{p} {row[f'{p}_tok_s']:,.0f} tok/s" for p in planners))
    t = Table(title=f"re-planning over the {a.trace} trace: {model.name}, batch {job.global_batch_size} x "
                    f"{job.sequence_length}; tokens/s, planning s, migration s per planner")
    for k in ("change", "duration_s", "gpus"):
        t.add_column(k, justify="right")
    for p in planners:
        t.add_column(p, justify="right")
    for r in rows:
        t.add_row(str(r["change"]), f"{r['duration_s']:.0f}", str(r["gpus"]),
                  *[f"{r[f'{p}_tok_s']:,.0f} / {r[f'{p}_plan_s']:.2f} / "
                    f"{'kept' if r[f'{p}_kept'] else format(r[f'{p}_migrate_s'], '.1f')}" for p in planners])
    common.console.print(t)
    summary = [{"planner": p, "tokens_trained": trained[p],
                "vs_arachne": trained[p] / trained["arachne"] if trained["arachne"] else float("nan")}
               for p in planners]
    common.print_table("tokens trained over the trace", summary)
    common.write_result(a.out, a.trace, rows, summary, {"trace": a.trace, "model": model.name,
                                                        "global_batch_size": job.global_batch_size,
                                                        "sequence_length": job.sequence_length, "budget": a.budget,
                                                        "seed": a.seed}, benchmark=f"replan-trace-{a.trace}")
