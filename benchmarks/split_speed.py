"""The layer split's speed: skipping ahead vs plain bisection, on the splits real planning asks for.

Usage:  python benchmarks/split_speed.py results/robustness/seed3/runs.json [--repeat 3] [--out results/split_speed]

Plans every case of the stored sweeps where arachne found a plan, recording each ``split_layers`` call
(profiles, layers, micro-batches, sends), then replays all of them with ``skip_ahead`` on and off: stage
fills (the work clock's unit), wall time, microseconds per stage fill, and the worst ratio of the two
bottlenecks. The ratio of the microseconds per fill is what the work clock's ``fill_stages`` rate was
scaled by (``arachne/planners/work.py``). Run it on an idle machine.
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import time
from pathlib import Path

from arachne_eval import table, write
from sweep_latency import arachne_cases

from arachne.cost import CostModel
from arachne.planners.arachne.completion import price, split
from arachne.planners.arachne.search import refine, rules
from arachne.planners.arachne.work_clock import Work
from arachne.planners.harness import run_planner
from arachne.planners.protocol import SearchBudget


def record(paths: list[Path]) -> list[tuple]:
    """Every ``split_layers`` call made while planning the sweeps' cases (arguments only)."""
    calls: list[tuple] = []
    original = split.split_layers
    users = (price, rules, refine)  # the modules that call split_layers

    def spy(profiles, L, m, work=None, sends=None, skip_ahead=True):
        calls.append((list(profiles), L, m, None if sends is None else list(sends)))
        return original(profiles, L, m, work, sends, skip_ahead)

    for mod in users:
        mod.split_layers = spy
    try:
        for _, _, cl, model, job in arachne_cases(paths):
            run_planner("arachne", cl, model, job, CostModel(cl), SearchBudget(time_budget_s=5.0))
    finally:
        for mod in users:
            mod.split_layers = original
    return calls


def replay(calls: list[tuple], skip_ahead: bool, repeat: int) -> tuple[Work, float, list]:
    work, results = Work(), []
    t0 = time.perf_counter()
    for i in range(repeat):
        for profiles, L, m, sends in calls:
            r = split.split_layers(profiles, L, m, work, sends, skip_ahead)
            if i == 0:
                results.append(None if r is None else r[1])
    return work, time.perf_counter() - t0, results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="runs.json of robustness sweeps")
    ap.add_argument("--repeat", type=int, default=3, help="replays of every recorded call per mode")
    ap.add_argument("--out", type=Path, default=Path("results/split_speed"))
    args = ap.parse_args()
    calls = record(args.runs)
    rows, bottlenecks = [], {}
    for mode, skip in (("plain bisection", False), ("skip ahead", True)):
        work, wall, bottlenecks[mode] = replay(calls, skip, args.repeat)
        rows.append({"mode": mode, "calls": len(calls) * args.repeat, "fill_stages": work.fill_stages,
                     "wall_s": round(wall, 3), "us_per_fill_stage": round(wall / work.fill_stages * 1e6, 3)})
    worst = max((b / a for a, b in zip(bottlenecks["plain bisection"], bottlenecks["skip ahead"]) if a and b),
                default=1.0)
    rows.append({"mode": "skip / plain", "calls": len(calls) * args.repeat,
                 "fill_stages": round(rows[1]["fill_stages"] / rows[0]["fill_stages"], 3),
                 "wall_s": round(rows[1]["wall_s"] / rows[0]["wall_s"], 3),
                 "us_per_fill_stage": round(rows[1]["us_per_fill_stage"] / rows[0]["us_per_fill_stage"], 3)})
    table(f"layer splits asked for while planning {len(calls)} times; worst bottleneck ratio (skip / plain) "
          f"{worst:.6f}", rows)
    write(args.out, "split_speed", rows)


if __name__ == "__main__":
    main()
