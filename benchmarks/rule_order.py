"""How well the mixed-pipeline rules are ordered: at large scale only the first few get screened.

For every case, every mixed-rule template (``mixed_floor_states``) is screened once (the cost model's
price at the most promising micro-batch size). An ordering then scores, for K = 2, 4, 8, the best
screened throughput among its first K templates divided by the best of all of them. Orderings:
  shipped  the planner's order (the throughput proxy interleaved with the plain order)
  proxy    the throughput proxy alone (``_mix_proxy``)
  plain    all classes at one tp level, more replicas first (the rule before the proxy existed)
Cases: the planners grid (``benchmarks/planners.py``) and the random clusters of
``benchmarks/robustness.py`` for each ``--seeds`` value.

Usage:  python benchmarks/rule_order.py [--seeds 0,1] [--out results/rule_order]
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import csv
import importlib.util
import json
import random
import statistics
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from arachne.cost import CostModel
from arachne.planners.arachne.actions import mix_replica_options
from arachne.planners.arachne.search import Pricer, _mix_proxy, mixed_floor_states, mixed_rule_state
from arachne.planners.arachne.template import tp_options
from arachne.planners.completion import PlanningContext
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.job import Job
from arachne.spec.model import model_catalog

console = Console(width=140)
KS = (2, 4, 8)


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def cases(seeds: list[int]):
    grid = _load("planners")
    for c in grid.CASES:
        yield c.name, grid.make_cluster(c.cluster, list(c.groups)), c.model, c.gbs, c.seq
    rob = _load("robustness")
    for seed in seeds:
        rng = random.Random(seed)
        for i in range(30):
            rc = rob.random_case(rng, i)
            yield f"rob{seed}/{rc.name}", cluster_from_dict(rc.doc), rc.model, rc.gbs, rc.seq


def plain_order(ctx: PlanningContext) -> list:
    levels = sorted({t for c in ctx.classes for t in tp_options(ctx.model, c.node_size)})
    out = []
    for R in sorted((r for r in mix_replica_options(ctx.classes) if r), reverse=True):
        for tp in levels:
            st = mixed_rule_state(ctx, R, tp)
            if st is not None and st.template() not in out:
                out.append(st.template())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--out", type=Path, default=Path("results/rule_order"))
    a = ap.parse_args()
    rows = []
    for name, cl, model, gbs, seq in cases([int(s) for s in a.seeds.split(",") if s]):
        ctx = PlanningContext(cl, model_catalog().get(model), Job(global_batch_size=gbs, sequence_length=seq),
                              CostModel(cl))
        states = mixed_floor_states(ctx)
        pricer = Pricer(ctx)
        value = {st.template(): pricer.screen_state(st) for st in states}
        best = max(value.values(), default=0.0)
        if best <= 0:
            continue
        orders = {"shipped": [st.template() for st in states],
                  "proxy": [st.template() for st in sorted(states, key=lambda s: -_mix_proxy(ctx, s))],
                  "plain": plain_order(ctx)}
        row = {"case": name, "templates": len(states)}
        for o, seq_ in orders.items():
            for k in KS:
                row[f"{o}@{k}"] = max((value.get(t, 0.0) for t in seq_[:k]), default=0.0) / best
        rows.append(row)
    t = Table(title=f"mixed-rule orderings over {len(rows)} cases: best of the first K screened / best of all "
                    "(mean; cases below 0.95)")
    t.add_column("ordering")
    for k in KS:
        t.add_column(f"K={k}", justify="right")
    for o in ("shipped", "proxy", "plain"):
        t.add_row(o, *[f"{statistics.mean(r[f'{o}@{k}'] for r in rows):.3f} "
                       f"({sum(r[f'{o}@{k}'] < 0.95 for r in rows)})" for k in KS])
    console.print(t)
    a.out.mkdir(parents=True, exist_ok=True)
    with open(a.out / "rule_order.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (a.out / "rule_order.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
