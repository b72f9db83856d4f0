"""The arachne planner's work clock: fit its rates, and check that it keeps to wall time and makes
plans reproducible.

``fit``: runs the planner on the wall clock, and on the work clock with the current rates, over random production-like problems (robustness.py's
generator, seeds not used by its evaluation) at several targets, in one process with a fresh cost
model per problem (as the CLI has), records the work each run requested and the wall time it took,
and fits non-negative seconds-per-unit rates (``arachne.planners.arachne.work_clock.RATES``) by relative error.
Prints the rates and the fit's error. Runs on the work clock show where the current rates undercharge,
so a second fit after installing the first converges.

``check``: runs the planner on the shipped work clock over other problems: per problem the work
seconds, the wall seconds and their ratio (median near 1 means the latency target still holds), and
whether a second run, with both cores busy with other work, returned the same plan.

Usage:  python benchmarks/work_clock.py fit [--seeds 10,11] [--targets 0.4,0.8,1.6] [--install] [--out results/work_clock]
        python benchmarks/work_clock.py check [--seeds 12] [--n 30] [--out results/work_clock]
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import json
import multiprocessing
import random
import statistics
import time
from pathlib import Path

import numpy as np
import robustness  # the sibling benchmark scripts (run as a script, this folder is on the path)
from arachne_eval import write
from rich.console import Console
from rich.table import Table

from arachne.cost import CostModel
from arachne.planners.arachne.planner import ArachnePlanner
from arachne.planners.arachne.work_clock import RATES, WORK_FIELDS, Work
from arachne.planners.protocol import SearchBudget
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.job import Job
from arachne.spec.model import model_catalog

console = Console(width=160)


def problems(seeds: list[int], n: int = 30) -> list:
    out = []
    for seed in seeds:
        rng = random.Random(seed)
        for i in range(n):
            rc = robustness.random_case(rng, i)
            if rc.model_state_fits:
                out.append((f"rob{seed}/{rc.name}", cluster_from_dict(rc.doc), rc))
    return out


def plan_once(cl, rc, target: float, clock: str):
    """One planning run with a fresh cost model: (work tally, wall seconds, work seconds, best plan JSON)."""
    model, job = model_catalog().get(rc.model), Job(global_batch_size=rc.gbs, sequence_length=rc.seq)
    cm = CostModel(cl)
    t0 = time.perf_counter()
    res = ArachnePlanner(target_s=target, clock=clock).plan(cl, model, job, cm, SearchBudget(time_budget_s=60))
    wall = time.perf_counter() - t0
    tally = Work(**res.stats.notes["work"])
    best = res.plans[0].model_dump_json() if res.plans else ""
    return tally, wall, float(res.stats.notes["work_s"]), best


def fit(a) -> None:
    from scipy.optimize import nnls

    probs = problems([int(s) for s in a.seeds.split(",")])[: a.n]
    targets = [float(t) for t in a.targets.split(",")]
    plan_once(*probs[0][1:], 0.3, "wall")  # warm-up: imports and the shipped weights
    X, y, rows = [], [], []
    for name, cl, rc in probs:
        for t in targets:
            for clock in a.clocks.split(","):
                tally, wall, _, _ = plan_once(cl, rc, t, clock)
                X.append(tally.vector())
                y.append(wall)
                rows.append({"case": name, "gpus": cl.num_gpus, "target": t, "clock": clock, "wall_s": round(wall, 4),
                             **{f: getattr(tally, f) for f in WORK_FIELDS}})
                console.print(f"{name} {cl.num_gpus} GPUs target {t} ({clock} clock): {wall:.3f} s", highlight=False)
    X, y = np.array(X), np.array(y)
    X1 = np.hstack([X, np.ones((len(X), 1))])  # a fixed start-up cost per run (a clock offset: not charged)
    scale = X1.max(axis=0)
    scale[scale == 0] = 1.0
    # relative error: a short run's time matters as much as a long one's
    coef, _ = nnls(X1 / scale / y[:, None], np.ones(len(y)))
    coef = coef / scale
    rates, offset = coef[:-1], coef[-1]
    pred = X1 @ coef
    ratio = y / np.maximum(pred, 1e-9)
    for r, p in zip(rows, pred):
        r["fit_s"] = round(float(p), 4)
    tab = Table(title="work clock rates (s per unit)")
    tab.add_column("work")
    tab.add_column("rate", justify="right")
    tab.add_column("share of time", justify="right")
    for f, r, col in zip(WORK_FIELDS, rates, X.T):
        tab.add_row(f, f"{r:.3e}", f"{float(r * col.sum() / pred.sum()):.1%}")
    console.print(tab)
    summary = {"runs": len(y), "median_wall_over_fit": float(np.median(ratio)),
               "p10": float(np.percentile(ratio, 10)), "p90": float(np.percentile(ratio, 90)),
               "r2": float(1 - ((y - pred) ** 2).sum() / ((y - y.mean()) ** 2).sum()), "offset_s": float(offset),
               "rates": {f: float(r) for f, r in zip(WORK_FIELDS, rates)}}
    console.print(f"fixed start-up per run: {offset * 1e3:.1f} ms")
    console.print(f"wall / fit: median {summary['median_wall_over_fit']:.3f}, p10 {summary['p10']:.3f}, "
                  f"p90 {summary['p90']:.3f}; R^2 {summary['r2']:.3f}")
    console.print("RATES = " + json.dumps({f: float(f"{r:.4g}") for f, r in zip(WORK_FIELDS, rates)}))
    write(a.out, "fit", rows)
    (a.out / "fit_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if a.install:
        install(summary["rates"])


def install(rates: dict[str, float]) -> None:
    """Write ``rates`` into the RATES table of arachne/planners/work.py."""
    import textwrap

    import arachne.planners.arachne.work_clock as work

    path = Path(work.__file__)
    text = path.read_text()
    a = text.index("RATES = {")
    b = text.index("}\n", a) + 2
    body = ", ".join(f'"{k}": {float(f"{rates.get(k, 0.0):.4g}")!r}' for k in WORK_FIELDS)
    table = "RATES = {\n" + "".join(f"    {line}\n" for line in textwrap.wrap(body, 100)) + "}\n"
    path.write_text(text[:a] + table + text[b:])
    console.print(f"installed the rates in {path}")


def _busy(stop) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10000))


def check(a) -> None:
    probs = problems([int(s) for s in a.seeds.split(",")])[: a.n]
    plan_once(*probs[0][1:], 0.3, "work")
    rows = []
    for name, cl, rc in probs:
        _, wall, work, best = plan_once(cl, rc, a.target, "work")
        stop = multiprocessing.Event()
        hogs = [multiprocessing.Process(target=_busy, args=(stop,)) for _ in range(os.cpu_count() or 2)]
        for h in hogs:
            h.start()
        try:
            _, wall2, work2, best2 = plan_once(cl, rc, a.target, "work")
        finally:
            stop.set()
            for h in hogs:
                h.join()
        rows.append({"case": name, "gpus": cl.num_gpus, "work_s": work, "wall_s": round(wall, 4),
                     "wall_over_work": round(wall / max(work, 1e-9), 3), "loaded_wall_s": round(wall2, 4),
                     "same_plan_loaded": best == best2 and work == work2})
    tab = Table(title=f"work clock check (target {a.target} s of work)")
    for col in ("case", "gpus", "work_s", "wall_s", "wall_over_work", "loaded_wall_s", "same_plan_loaded"):
        tab.add_column(col)
    for r in rows:
        tab.add_row(*(str(r[c]) for c in ("case", "gpus", "work_s", "wall_s", "wall_over_work", "loaded_wall_s",
                                          "same_plan_loaded")))
    console.print(tab)
    ratios = [r["wall_over_work"] for r in rows]
    same = sum(r["same_plan_loaded"] for r in rows)
    console.print(f"wall / work: median {statistics.median(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f};"
                  f" wall median {statistics.median(r['wall_s'] for r in rows):.3f} s; same plan under load "
                  f"{same}/{len(rows)}")
    write(a.out, "check", rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fit")
    f.add_argument("--seeds", default="10,11")
    f.add_argument("--targets", default="0.4,0.8,1.6")
    f.add_argument("--n", type=int, default=1000, help="at most this many problems")
    f.add_argument("--clocks", default="wall,work", help="run on each clock (the work clock with the current rates)")
    f.add_argument("--install", action="store_true", help="write the fitted rates into arachne/planners/work.py")
    c = sub.add_parser("check")
    c.add_argument("--seeds", default="12")
    c.add_argument("--n", type=int, default=30)
    c.add_argument("--target", type=float, default=0.8)
    for p in (f, c):
        p.add_argument("--out", type=Path, default=Path("results/work_clock"))
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if not any(RATES.values()) and a.cmd == "check":
        ap.error("the work clock has no rates yet: run `fit` first")
    (fit if a.cmd == "fit" else check)(a)


if __name__ == "__main__":
    main()
