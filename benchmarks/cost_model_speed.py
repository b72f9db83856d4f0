"""How fast CostModel.estimate prices plans (cold and warm), for the targets of the foundation issue.

Usage: python benchmarks/cost_model_speed.py [--repeats N] [--out DIR]
Plans: 64 GPUs in 8 stages (tp 8, one pipeline; and tp 2 x 4 pipelines), 256 GPUs in 8 stages x 4
pipelines, on an 8-GPU-node H100 + A100 cluster; LLaMA-2-13B, batch 512 x 2048.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from arachne.cost import CostModel
from arachne.plan import Pipeline, Plan, Stage
from arachne.spec.cluster import cluster_from_dict


def make_plan(num_stages: int, tp: int, pipelines: int, gbs: int = 512, mbs: int = 2) -> Plan:
    L = 40
    per = L // num_stages
    pipes = []
    dev = 0
    for p in range(pipelines):
        stages = []
        for s in range(num_stages):
            devices = tuple(f"n{(dev + j) // 8}:{(dev + j) % 8}" for j in range(tp))
            dev += tp
            stages.append(Stage(layers=(s * per, L if s == num_stages - 1 else (s + 1) * per), devices=devices, tp=tp))
        pipes.append(Pipeline(micro_batches=gbs // (mbs * pipelines), stages=tuple(stages)))
    return Plan(model="LLaMA-2-13B", global_batch_size=gbs, sequence_length=2048, micro_batch_size=mbs,
                pipelines=tuple(pipes))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--out", type=Path, default=Path("results/cost_model_speed"))
    args = ap.parse_args()
    cluster = cluster_from_dict({"name": "h100-a100", "nodes": [
        {"name": "n{i}", "count": 16, "gpu": "H100"}, {"name": "m{i}", "count": 16, "gpu": "A100-80"}]})
    cases = {"64 GPUs: 8 stages x tp8 x 1 pipeline": make_plan(8, 8, 1),
             "64 GPUs: 8 stages x tp2 x 4 pipelines": make_plan(8, 2, 4),
             "128 GPUs: 8 stages x tp4 x 4 pipelines": make_plan(8, 4, 4)}
    rows = []
    for name, plan in cases.items():
        cm = CostModel(cluster)
        t0 = time.perf_counter()
        cm.estimate(plan)
        cold = time.perf_counter() - t0
        warm = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            cm.estimate(plan)
            warm.append(time.perf_counter() - t0)
        novalid = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            cm.estimate(plan, validate=False)
            novalid.append(time.perf_counter() - t0)
        rows.append({"case": name, "cold_ms": cold * 1e3, "warm_median_ms": statistics.median(warm) * 1e3,
                     "warm_no_validation_median_ms": statistics.median(novalid) * 1e3})
    t = Table(title="CostModel.estimate speed (one core)")
    for c in ("case", "cold ms", "warm median ms", "warm, validate=False, ms"):
        t.add_column(c, justify="left" if c == "case" else "right")
    for r in rows:
        t.add_row(r["case"], f"{r['cold_ms']:.2f}", f"{r['warm_median_ms']:.3f}", f"{r['warm_no_validation_median_ms']:.3f}")
    Console().print(t)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cost_model_speed.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
