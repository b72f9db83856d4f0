"""Benchmarks of the arachne planner: optimality, learning ablation, generalisation, latency.

Usage:
  python benchmarks/arachne_eval.py optimality  [--out DIR]   # arachne / exhaustive oracle, small clusters
  python benchmarks/arachne_eval.py ablation    [--k 24]      # learned top-K vs policy top-K vs K random vs K rules
                                                              # vs all rules
  python benchmarks/arachne_eval.py generalise [--budget 20]  # held-out GPU types, node sizes, sizes
  python benchmarks/arachne_eval.py latency [--baselines a,b] # planning time vs cluster size
  python benchmarks/arachne_eval.py quality [--rows FILE]     # arachne / best baseline, from the rows that
                                                              # benchmarks/planners.py wrote (planners.json)
Each prints a table and writes CSV/JSON under --out (default results/arachne_eval).
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # as the CLI does: tiny matrices, threads only add contention

import argparse
import csv
import json
import math
import random
import statistics
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from arachne.cost import CostModel
from arachne.cost.ceiling import throughput_ceiling
from arachne.errors import NoFeasiblePlanError
from arachne.planners.harness import run_planner
from arachne.planners.protocol import SearchBudget
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.gpus import gpu_catalog
from arachne.spec.job import Job
from arachne.spec.model import model_catalog

console = Console(width=160)


def cluster(spec: list[tuple[str, int, int]], name: str = "bench", gpu_types: list[dict] | None = None,
            inter: float | None = None) -> Any:
    """Cluster from (gpu, nodes, gpus_per_node) triples."""
    nodes = []
    for i, (gpu, n, size) in enumerate(spec):
        e: dict[str, Any] = {"name": f"g{i}-{{i}}", "count": n, "gpu": gpu, "gpus_per_node": size}
        if inter:
            e["inter_node_gbps"] = inter
        nodes.append(e)
    return cluster_from_dict({"name": name, "nodes": nodes, **({"gpu_types": gpu_types} if gpu_types else {})})


def run(name: str, cl, model: str, job: Job, budget_s: float, **kw) -> dict[str, Any]:
    cm = CostModel(cl)
    t0 = time.perf_counter()
    try:
        plan, est, res = run_planner(name, cl, model_catalog().get(model), job, cm,
                                     SearchBudget(time_budget_s=budget_s), **kw)
        return {"tokens_per_s": est.tokens_per_s, "time_s": time.perf_counter() - t0,
                "priced": res.stats.plans_priced, "timed_out": res.stats.timed_out}
    except NoFeasiblePlanError:
        return {"tokens_per_s": 0.0, "time_s": time.perf_counter() - t0, "priced": 0, "timed_out": False}


def write(out: Path, name: str, rows: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{name}.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (out / f"{name}.json").write_text(json.dumps(rows, indent=1))


def table(title: str, rows: list[dict]) -> None:
    t = Table(title=title)
    for k in rows[0]:
        t.add_column(k, justify="left" if isinstance(rows[0][k], str) else "right")
    for r in rows:
        t.add_row(*[f"{v:.3g}" if isinstance(v, float) else str(v) for v in r.values()])
    console.print(t)


def gmean(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


SMALL = [
    ("A100-40 4 + V100-16 4", [("A100-40", 1, 4), ("V100-16", 1, 4)]),
    ("H100 2x2 + L4 4x1", [("H100", 2, 2), ("L4", 4, 1)]),
    ("A10G 4 + T4 4", [("A10G", 1, 4), ("T4", 1, 4)]),
    ("A100-80 2 + RTX-3090 4", [("A100-80", 1, 2), ("RTX-3090", 1, 4)]),
    ("V100-16 2x2 + T4 2x2", [("V100-16", 2, 2), ("T4", 2, 2)]),
    ("H100 4 + A100-40 2 + L4 2", [("H100", 1, 4), ("A100-40", 1, 2), ("L4", 2, 1)]),
]
SMALL_JOBS = [("OPT-350M", 64, 2048), ("GPT-3-1.3B", 64, 2048), ("LLaMA-2-7B", 32, 2048),
              ("Qwen1.5-MoE-A2.7B", 32, 2048)]


def optimality(args) -> None:
    rows = []
    for cname, spec in SMALL:
        cl = cluster(spec, cname)
        for model, gbs, seq in SMALL_JOBS:
            job = Job(global_batch_size=gbs, sequence_length=seq)
            a = run("arachne", cl, model, job, args.budget)
            o = run("exhaustive", cl, model, job, args.oracle_budget)
            if o["tokens_per_s"] <= 0:
                continue
            rows.append({"cluster": cname, "model": model, "arachne_tok_s": a["tokens_per_s"],
                         "oracle_tok_s": o["tokens_per_s"], "ratio": a["tokens_per_s"] / o["tokens_per_s"],
                         "arachne_s": a["time_s"], "oracle_s": o["time_s"], "oracle_timed_out": str(o["timed_out"])})
    table("arachne vs exhaustive oracle (same template space, common cost model)", rows)
    ratios = [r["ratio"] for r in rows]
    console.print(f"arachne / oracle: geomean {gmean(ratios):.4f}, min {min(ratios):.4f}, "
                  f"cases within 2%: {sum(r >= 0.98 for r in ratios)}/{len(ratios)}")
    write(args.out, "optimality", rows)


MID = [
    ("A100-40 16 + V100-16 16", [("A100-40", 2, 8), ("V100-16", 4, 4)]),
    ("H100 16 + A100-80 16 + L4 8", [("H100", 2, 8), ("A100-80", 2, 8), ("L4", 8, 1)]),
    ("A10G 32 + T4 16", [("A10G", 4, 8), ("T4", 4, 4)]),
    ("H200 8 + H100 16 + A100-40 24 + V100-16 16", [("H200", 1, 8), ("H100", 2, 8), ("A100-40", 3, 8), ("V100-16", 4, 4)]),
    ("RTX-3090 16 + A100-80 8", [("RTX-3090", 4, 4), ("A100-80", 1, 8)]),
    ("L4 24 + A10G 8 + T4 8", [("L4", 24, 1), ("A10G", 1, 8), ("T4", 2, 4)]),
]
MID_JOBS = [("GPT-3-1.3B", 256, 2048), ("LLaMA-2-7B", 256, 4096), ("LLaMA-2-13B", 256, 2048),
            ("Mixtral-8x7B", 256, 2048), ("DeepSeek-MoE-16B", 256, 2048)]


ARMS = ("learned", "policy", "random", "floor_k", "floor")


def ablation(args) -> None:
    rows = []
    for cname, spec in MID:
        cl = cluster(spec, cname)
        for model, gbs, seq in MID_JOBS:
            job = Job(global_batch_size=gbs, sequence_length=seq)
            r = {"cluster": cname, "model": model}
            for arm, mode, extra in (("learned", "policy", {"use_floor": True, "rank_k": args.k, "target_s": 60}),
                                     ("policy", "policy", {"use_ranker": False}), ("random", "random", {}),
                                     ("floor_k", "floor", {"floor_k": args.k}), ("floor", "floor", {})):
                kw = {"use_floor": False, **extra}
                res = run("arachne", cl, model, job, 60, mode=mode, k=args.k, use_refine=False, use_polish=False, **kw)
                r[arm] = res["tokens_per_s"]
            best = max(r[arm] for arm in ARMS)
            if best <= 0:
                continue
            for arm in ARMS:
                r[f"{arm}_rel"] = r[arm] / best
            rows.append(r)
    table(f"learning ablation: the learned ranker's first {args.k} of the policy's proposals and the rules "
          f"(learned) vs the policy's top-{args.k} alone vs {args.k} random valid templates vs the first {args.k} "
          "rule-based templates (floor_k) vs every rule-based template (floor); same completion and pricing; no "
          "refinement, no split polishing", rows)
    for mode in ARMS:
        rel = [r[f"{mode}_rel"] for r in rows]
        console.print(f"{mode:7s}: geomean relative to the best arm {gmean(rel):.3f} over solved cases; "
                      f"no fitting plan in {sum(x == 0 for x in rel)}/{len(rel)} cases; "
                      f"best arm in {sum(x >= 0.9999 for x in rel)}/{len(rel)}")
    write(args.out, "ablation", rows)


def generalise(args) -> None:
    """Clusters outside training: held-out GPU types given only by features, node size 16, 512-1024 GPUs."""
    holdout = []
    for name in ("H200-SXM-141GB", "L40S", "MI300X", "A10"):
        g = gpu_catalog().get(name)
        holdout.append({"name": f"Unknown-{name}", "memory_gb": g.memory_gb, "peak_tflops": g.peak_tflops,
                        "memory_bandwidth_gbps": g.memory_bandwidth_gbps, "intra_node_gbps": g.intra_node_gbps,
                        "inter_node_gbps": g.inter_node_gbps, "gpus_per_node": g.gpus_per_node})
    cases = [
        ("held-out H200 + L40S (features only)", [("Unknown-H200-SXM-141GB", 2, 8), ("Unknown-L40S", 4, 8)]),
        ("held-out MI300X + A100-80", [("Unknown-MI300X", 2, 8), ("A100-80", 2, 8)]),
        ("held-out A10 x1 nodes + V100-32", [("Unknown-A10", 16, 1), ("V100-32", 2, 8)]),
        ("node size 16: H100 + A100-40", [("H100", 2, 16), ("A100-40", 2, 16)]),
        ("512 GPUs: H100 + A100-80 + V100-16", [("H100", 24, 8), ("A100-80", 24, 8), ("V100-16", 32, 4)]),
        ("1024 GPUs, 5 types", [("H100", 32, 8), ("A100-80", 32, 8), ("A100-40", 16, 8), ("V100-16", 32, 4),
                                ("T4", 32, 4)]),
    ]
    rows = []
    baselines = [b for b in args.baselines.split(",") if b] if args.baselines else \
        ["megatron", "megatron-oblivious", "amp", "metis", "flashflex", "sailor"]
    for cname, spec in cases:
        cl = cluster(spec, cname, holdout)
        for model, gbs, seq in [("LLaMA-2-13B", 512, 4096), ("Mixtral-8x7B", 512, 4096)]:
            job = Job(global_batch_size=gbs, sequence_length=seq)
            p = run("arachne", cl, model, job, 60)
            t = run("arachne", cl, model, job, args.teacher_budget, mode="teacher", teacher_beam=3)
            if t["tokens_per_s"] <= 0 and p["tokens_per_s"] <= 0:
                continue
            base = {b: run(b, cl, model, job, args.budget) for b in baselines}
            best_b = max(base, key=lambda b: base[b]["tokens_per_s"])
            rows.append({"cluster": cname, "model": model, "arachne_tok_s": p["tokens_per_s"],
                         "arachne_s": p["time_s"], "teacher_tok_s": t["tokens_per_s"],
                         "arachne/teacher": p["tokens_per_s"] / max(t["tokens_per_s"], 1e-9),
                         "best_baseline": best_b, "baseline_tok_s": base[best_b]["tokens_per_s"],
                         "baseline_s": base[best_b]["time_s"],
                         "arachne/baseline": p["tokens_per_s"] / max(base[best_b]["tokens_per_s"], 1e-9)})
    table("generalisation: arachne on clusters outside its training distribution, vs its own priced teacher "
          "(longer budget) and the best baseline", rows)
    for col in ("arachne/teacher", "arachne/baseline"):
        console.print(f"{col}: geomean {gmean([r[col] for r in rows]):.3f}, min {min(r[col] for r in rows):.3f}")
    write(args.out, "generalise", rows)


TIERS = (8, 32, 64, 128, 256, 512, 1024)


def latency(args) -> None:
    """Planning time vs cluster size, arachne and (``--baselines``) search baselines in the same run."""
    rng = random.Random(0)
    types = ["H100", "A100-80", "A100-40", "V100-16", "L4", "T4", "A10G", "H200"]
    rows = []
    planners = ["arachne"] + [p for p in (args.baselines or "").split(",") if p]
    for n_gpus in TIERS:
        for n_types in (2, 4, 6):
            if n_types * 4 > n_gpus:
                continue
            chosen = rng.sample(types, n_types)
            per = n_gpus // n_types
            spec = []
            for g in chosen:
                size = 8 if per >= 8 else 4
                spec.append((g, max(1, per // size), size))
            cl = cluster(spec, f"{n_gpus}x{n_types}")
            job = Job(global_batch_size=max(64, n_gpus), sequence_length=2048)
            r: dict[str, Any] = {"gpus": cl.num_gpus, "types": n_types}
            for p in planners:
                res = run(p, cl, "LLaMA-2-13B", job, args.budget)
                r[f"{p}_s"] = res["time_s"]
                r[f"{p}_tok_s"] = res["tokens_per_s"]
            rows.append(r)
    for r in rows:  # the fastest search baseline reaching arachne's quality (within 1%), and the speed-up
        same = [(r[f"{p}_s"], p) for p in planners[1:] if r[f"{p}_tok_s"] >= 0.99 * r["arachne_tok_s"] > 0]
        r["fastest_same_quality"] = min(same)[1] if same else "none"
        r["speedup"] = min(same)[0] / r["arachne_s"] if same else float("nan")
    table("planning time vs cluster size (LLaMA-2-13B, one core)", rows)
    by: dict[int, list[float]] = {}
    for r in rows:
        by.setdefault(min(TIERS, key=lambda t: abs(t - r["gpus"])), []).append(r["arachne_s"])
    console.print("arachne median planning time by size: " +
                  ", ".join(f"{k}: {statistics.median(v):.2f}s" for k, v in sorted(by.items())))
    reached = [r["speedup"] for r in rows if math.isfinite(r["speedup"])]
    if len(planners) > 1:
        console.print(f"a search baseline reached arachne's throughput (within 1%) in {len(reached)}/{len(rows)} "
                      f"cases; there arachne was {min(reached, default=float('nan')):.1f}x to "
                      f"{max(reached, default=float('nan')):.1f}x faster (median "
                      f"{statistics.median(reached) if reached else float('nan'):.1f}x)")
    write(args.out, "latency", rows)


def _planners_bench():
    """The planners benchmark module (its suite of cases), loaded from beside this script."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("planners_bench", Path(__file__).with_name("planners.py"))
    bench = importlib.util.module_from_spec(spec)
    sys.modules["planners_bench"] = bench  # dataclasses look their module up
    spec.loader.exec_module(bench)
    return bench


def _grid_jobs() -> dict[str, tuple[Any, str, int, int]]:
    """Case name -> (cluster, model, global batch, sequence) for the planners benchmark's suite."""
    bench = _planners_bench()
    return {c.name: (bench.make_cluster(c.cluster, list(c.groups)), c.model, c.gbs, c.seq) for c in bench.CASES}


def quality(args) -> None:
    """arachne's throughput over the best baseline's, per case of the planners benchmark."""
    data = json.loads(Path(args.rows).read_text())
    rows = data["rows"] if isinstance(data, dict) else data
    if args.rerun_arachne:  # re-plan arachne's rows with the current code; baselines' rows stay as measured
        bench = _planners_bench()
        by_name = {c.name: c for c in bench.CASES}
        for r in rows:
            if r["planner"] == "arachne" and r["case"] in by_name:
                case = by_name[r["case"]]
                cl = bench.make_cluster(case.cluster, list(case.groups))
                res = run("arachne", cl, case.model, Job(global_batch_size=case.gbs, sequence_length=case.seq),
                          args.budget)
                r["tokens_per_s"], r["planning_time_s"] = res["tokens_per_s"], res["time_s"]
    cases: dict[str, dict[str, Any]] = {}
    for r in rows:
        c = cases.setdefault(r["case"], {"case": r["case"], "model": r["model"], "gpus": r["gpus"],
                                         "arachne": 0.0, "best_baseline": 0.0, "baseline": "-",
                                         "arachne_s": 0.0, "baseline_s": 0.0})
        tps = r["tokens_per_s"] or 0.0
        if r["planner"] == "arachne":
            c["arachne"], c["arachne_s"] = tps, r["planning_time_s"]
        elif r["planner"] != "exhaustive" and tps > c["best_baseline"]:
            c["best_baseline"], c["baseline"], c["baseline_s"] = tps, r["planner"], r["planning_time_s"]
    jobs = _grid_jobs()
    out = []
    for c in cases.values():
        if c["best_baseline"] <= 0 and c["arachne"] <= 0:
            continue
        c["ratio"] = c["arachne"] / c["best_baseline"] if c["best_baseline"] > 0 else float("inf")
        c["moe"] = str(model_catalog().get(c["model"]).is_moe)
        if c["case"] in jobs:  # the compute ceiling: what no plan can beat on this cost model
            cl, model, gbs, seq = jobs[c["case"]]
            ceil = throughput_ceiling(CostModel(cl), model_catalog().get(model), gbs, seq).tokens_per_s
            c["ceiling"] = ceil
            c["ceiling_over_baseline"] = ceil / c["best_baseline"] if c["best_baseline"] > 0 else float("inf")
            c["arachne_of_ceiling"] = c["arachne"] / ceil
        out.append(c)
    table("arachne vs the best baseline per case (common cost model)", out)
    for label, sel in (("all", out), ("dense", [c for c in out if c["moe"] == "False"]),
                       ("MoE", [c for c in out if c["moe"] == "True"])):
        finite = [c["ratio"] for c in sel if math.isfinite(c["ratio"])]
        if finite:
            console.print(f"{label:5s}: geomean {gmean(finite):.3f}, min {min(finite):.3f}, "
                          f"share >= 1.0: {sum(r >= 1.0 for r in finite)}/{len(finite)}, "
                          f">= 0.99: {sum(r >= 0.99 for r in finite)}/{len(finite)}")
        heads = [c["ceiling_over_baseline"] for c in sel if math.isfinite(c.get("ceiling_over_baseline", math.inf))]
        if heads:
            console.print(f"       the compute ceiling over the best baseline (what no planner can exceed): "
                          f"geomean {gmean(heads):.3f}, min {min(heads):.3f}, max {max(heads):.3f}, "
                          f"below 2x in {sum(h < 2 for h in heads)}/{len(heads)}; "
                          f"arachne reaches {gmean([c['arachne_of_ceiling'] for c in sel if 'ceiling' in c]):.3f} "
                          f"of it (geomean)")
    write(args.out, "quality", out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("which", choices=["optimality", "ablation", "generalise", "latency", "quality"])
    ap.add_argument("--rows", default="results/planners/planners.json")
    ap.add_argument("--rerun-arachne", action="store_true", help="quality: re-plan the arachne rows")
    ap.add_argument("--out", type=Path, default=Path("results/arachne_eval"))
    ap.add_argument("--k", type=int, default=24)
    ap.add_argument("--budget", type=float, default=20.0, help="planning budget of the baselines, s")
    ap.add_argument("--oracle-budget", type=float, default=300.0)
    ap.add_argument("--teacher-budget", type=float, default=30.0)
    ap.add_argument("--baselines", default="")
    args = ap.parse_args()
    {"optimality": optimality, "ablation": ablation, "generalise": generalise, "latency": latency,
     "quality": quality}[args.which](args)


if __name__ == "__main__":
    main()
