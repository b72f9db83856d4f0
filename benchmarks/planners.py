"""Planners side by side over a grid of clusters a platform engineer meets, on the common cost model.

Usage:
    python benchmarks/planners.py [--planners a,b,c] [--time-budget S] [--quick] [--out DIR]
    python benchmarks/planners.py --timing [--time-budget S] [--out DIR]

The grid mixes 2-4 GPU types (V100, T4, A10G, L4, A100-40/80, H100, H200, RTX-3090) in nodes of
1/2/4/8 GPUs with uneven counts per type and several network tiers, from 8 to 512 GPUs: 15 cases with
dense models from 350M to 70B parameters and 10 with five MoE models. Writes ``planners.csv`` and
``planners.json`` and prints, per planner: the geometric mean of throughput relative to the best
planner of each case (over the cases it solved), the median planning time and the share of cases
where it found no fitting plan. ``--timing`` measures planning time of the search baselines at
64, 256 and 512 GPUs instead (``timing.csv``/``timing.json``).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import multiprocessing
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from queue import Empty
from typing import Any

from rich.console import Console
from rich.table import Table

from arachne.cost import CostModel
from arachne.planners.harness import CompareRow, default_planners, run_compare
from arachne.planners.protocol import SearchBudget
from arachne.planners.registry import planner_factory
from arachne.spec.cluster import Cluster, cluster_from_dict
from arachne.spec.job import Job
from arachne.spec.model import load_model

console = Console(stderr=True)

Group = tuple[str, int, int, float | None]   # GPU, nodes, GPUs per node, NIC GB/s (None: the GPU's default)


def make_cluster(name: str, groups: list[Group]) -> Cluster:
    """A cluster document built from (gpu, nodes, gpus_per_node, inter_node_gbps) groups."""
    nodes = []
    for i, (gpu, count, per_node, gbps) in enumerate(groups):
        entry: dict[str, Any] = {"name": f"g{i}-{gpu.lower()}-{{i}}", "count": count, "gpu": gpu,
                                 "gpus_per_node": per_node}
        if gbps is not None:
            entry["inter_node_gbps"] = gbps
        nodes.append(entry)
    return cluster_from_dict({"name": name, "nodes": nodes}, name)


@dataclass(frozen=True)
class Case:
    cluster: str
    groups: tuple[Group, ...]
    model: str
    gbs: int
    seq: int

    @property
    def name(self) -> str:
        return f"{self.cluster}/{self.model}"


# (cluster name, groups) — network tiers: 1.25 (10 GbE), 3.125 (25 GbE), 12.5 (100 Gb), 25-50 (IB)
CLUSTERS: dict[str, tuple[Group, ...]] = {
    "lab-8": (("A100-40", 1, 4, 3.125), ("RTX-3090", 2, 2, 1.25)),
    "cloud-16": (("A10G", 2, 4, 6.25), ("L4", 2, 4, 6.25)),
    "a100-v100-24": (("A100-40", 1, 8, 12.5), ("V100-16", 4, 4, 12.5)),
    "edge-20": (("L4", 4, 2, 3.125), ("T4", 8, 1, 3.125), ("A10G", 1, 4, 3.125)),
    "h100-a100-l4-48": (("H100", 2, 8, 50.0), ("A100-80", 2, 8, 25.0), ("L4", 4, 4, 12.5)),
    "t4-a10g-64": (("T4", 10, 4, 3.125), ("A10G", 6, 4, 6.25)),
    "4type-80": (("H100", 2, 8, 50.0), ("A100-40", 4, 8, 25.0), ("L4", 3, 4, 12.5), ("T4", 4, 2, 6.25)),
    "h200-h100-128": (("H200", 6, 8, 50.0), ("H100", 10, 8, 50.0)),
    "a100-v100-256": (("A100-40", 12, 8, 25.0), ("V100-16", 40, 4, 12.5)),
    "hopper-ampere-512": (("H100", 24, 8, 50.0), ("A100-80", 40, 8, 25.0)),
}

CASES: list[Case] = [
    Case("lab-8", CLUSTERS["lab-8"], "OPT-350M", 64, 2048),
    Case("lab-8", CLUSTERS["lab-8"], "GPT-3-1.3B", 64, 2048),
    Case("cloud-16", CLUSTERS["cloud-16"], "GPT-3-1.3B", 128, 2048),
    Case("cloud-16", CLUSTERS["cloud-16"], "Qwen1.5-MoE-A2.7B", 128, 2048),
    Case("a100-v100-24", CLUSTERS["a100-v100-24"], "OPT-350M", 256, 2048),
    Case("a100-v100-24", CLUSTERS["a100-v100-24"], "LLaMA-2-7B", 128, 4096),
    Case("edge-20", CLUSTERS["edge-20"], "GPT-3-1.3B", 128, 2048),
    Case("h100-a100-l4-48", CLUSTERS["h100-a100-l4-48"], "LLaMA-2-13B", 256, 4096),
    Case("h100-a100-l4-48", CLUSTERS["h100-a100-l4-48"], "Mixtral-8x7B", 256, 4096),
    Case("t4-a10g-64", CLUSTERS["t4-a10g-64"], "GPT-3-1.3B", 256, 2048),
    Case("t4-a10g-64", CLUSTERS["t4-a10g-64"], "LLaMA-2-7B", 256, 2048),
    Case("4type-80", CLUSTERS["4type-80"], "LLaMA-2-13B", 512, 4096),
    Case("4type-80", CLUSTERS["4type-80"], "DeepSeek-MoE-16B", 512, 4096),
    Case("h200-h100-128", CLUSTERS["h200-h100-128"], "LLaMA-2-70B", 512, 4096),
    Case("h200-h100-128", CLUSTERS["h200-h100-128"], "Mixtral-8x7B", 512, 4096),
    Case("a100-v100-256", CLUSTERS["a100-v100-256"], "LLaMA-2-7B", 1024, 4096),
    Case("a100-v100-256", CLUSTERS["a100-v100-256"], "OPT-350M", 1024, 2048),
    Case("hopper-ampere-512", CLUSTERS["hopper-ampere-512"], "LLaMA-2-70B", 1024, 4096),
    Case("hopper-ampere-512", CLUSTERS["hopper-ampere-512"], "GPT-3-1.3B", 2048, 2048),
    # more MoE: memory-tight small GPUs on slow links, and large fast clusters
    Case("a100-v100-24", CLUSTERS["a100-v100-24"], "Qwen1.5-MoE-A2.7B", 256, 2048),
    Case("t4-a10g-64", CLUSTERS["t4-a10g-64"], "DeepSeek-MoE-16B", 256, 2048),
    Case("a100-v100-256", CLUSTERS["a100-v100-256"], "Mixtral-8x7B", 1024, 4096),
    Case("hopper-ampere-512", CLUSTERS["hopper-ampere-512"], "DeepSeek-MoE-16B", 2048, 4096),
    # the catalog's fine-grained MoE (64 experts, top-8) and its largest (141B parameters)
    Case("h200-h100-128", CLUSTERS["h200-h100-128"], "Qwen2-57B-A14B", 512, 4096),
    Case("hopper-ampere-512", CLUSTERS["hopper-ampere-512"], "Mixtral-8x22B", 1024, 4096),
]

QUICK = [CASES[1], CASES[3], CASES[4], CASES[6]]

# search baselines timed at growing scale (--timing): 2 GPU types, 8-GPU nodes, uneven counts
TIMING_SIZES = {
    64: (("A100-80", 5, 8, 25.0), ("V100-16", 3, 8, 12.5)),
    256: (("A100-80", 20, 8, 25.0), ("V100-16", 12, 8, 12.5)),
    512: (("A100-80", 40, 8, 25.0), ("V100-16", 24, 8, 12.5)),
}
TIMING_PLANNERS = ["megatron", "amp", "metis", "flashflex", "sailor"]


# ---- running ---------------------------------------------------------------------------------------------
def planners_for(case: Case, chosen: list[str] | None) -> list[str]:
    model = load_model(case.model)
    names = chosen or default_planners(model)
    for n in names:
        planner_factory(n)
    return names


def run_case(case: Case, planners: list[str], budget: SearchBudget, hard_limit_s: float) -> list[dict[str, Any]]:
    """Each planner in a forked child (cold caches, and a planner that overruns its budget by far is
    stopped after ``hard_limit_s`` and recorded as an error)."""
    return [run_one(case, name, budget, hard_limit_s) for name in planners]


def run_one(case: Case, planner: str, budget: SearchBudget, hard_limit_s: float) -> dict[str, Any]:
    console.print(f"  {case.name}: {planner} ...", highlight=False)
    mp = multiprocessing.get_context("fork")
    queue = mp.Queue()
    child = mp.Process(target=_child, args=(case, planner, budget, queue))
    t0 = time.perf_counter()
    child.start()
    try:
        rec = queue.get(timeout=hard_limit_s)
    except Empty:
        child.terminate()
        child.join(5)
        if child.is_alive():
            child.kill()
        cluster = make_cluster(case.cluster, list(case.groups))
        row = CompareRow(planner, None, None, time.perf_counter() - t0, 0,
                         f"stopped after {hard_limit_s:.0f} s (budget {budget.time_budget_s:g} s not honoured)", True)
        return record(case, cluster, row)
    child.join()
    return rec


def _child(case: Case, planner: str, budget: SearchBudget, queue: Any) -> None:
    cluster = make_cluster(case.cluster, list(case.groups))
    model = load_model(case.model)
    job = Job(global_batch_size=case.gbs, sequence_length=case.seq)
    try:
        (row,) = run_compare(cluster, model, job, [planner], budget, lambda: CostModel(cluster))
    except Exception as exc:  # a crashing planner is a result of the benchmark, not its end
        row = CompareRow(planner, None, None, 0.0, 0, f"crashed: {type(exc).__name__}: {exc}")
    queue.put(record(case, cluster, row))


def record(case: Case, cluster: Cluster, r: CompareRow) -> dict[str, Any]:
    e = r.estimate
    return {"case": case.name, "cluster": case.cluster, "gpus": cluster.num_gpus,
            "gpu_types": "+".join(f"{n}x{g[0]}" for g in case.groups for n in [g[1] * g[2]]),
            "model": case.model, "global_batch_size": case.gbs, "sequence_length": case.seq,
            "planner": r.planner, "tokens_per_s": e.tokens_per_s if e else None,
            "samples_per_s": e.samples_per_s if e else None, "mfu": e.mfu if e else None,
            "iteration_time_s": e.iteration_time_s if e else None,
            "gpus_used": len(r.plan.devices) if r.plan else None,
            "planning_time_s": round(r.planning_time_s, 4), "candidates": r.candidates,
            "plans_priced": r.plans_priced, "timed_out": r.timed_out, "error": r.error,
            "notes": "; ".join(f"{k}: {v}" for k, v in r.notes.items())}


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Throughput relative to the best planner of the same case."""
    best: dict[str, float] = {}
    for r in rows:
        if r["tokens_per_s"]:
            best[r["case"]] = max(best.get(r["case"], 0.0), r["tokens_per_s"])
    for r in rows:
        r["ratio_to_best"] = r["tokens_per_s"] / best[r["case"]] if r["tokens_per_s"] else None


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per planner: geomean ratio to the best (solved cases), median planning time, failure share."""
    out = []
    for name in dict.fromkeys(r["planner"] for r in rows):
        mine = [r for r in rows if r["planner"] == name]
        ratios = [r["ratio_to_best"] for r in mine if r["ratio_to_best"]]
        out.append({
            "planner": name, "cases": len(mine),
            "geomean_ratio_to_best": math.exp(statistics.fmean(math.log(x) for x in ratios)) if ratios else None,
            "median_planning_time_s": statistics.median(r["planning_time_s"] for r in mine),
            "max_planning_time_s": max(r["planning_time_s"] for r in mine),
            "no_fit_share": sum(1 for r in mine if (r["error"] or "").startswith("no plan")) / len(mine),
            "failed_share": sum(1 for r in mine if r["error"] and not r["error"].startswith("no plan")) / len(mine),
            "timed_out_share": sum(1 for r in mine if r["timed_out"]) / len(mine),
        })
    return out


# ---- output ------------------------------------------------------------------------------------------------
def write(out: Path, stem: str, rows: list[dict[str, Any]], summary: list[dict[str, Any]], meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{stem}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "summary": summary, "rows": rows}, indent=2) + "\n")


def print_summary(summary: list[dict[str, Any]], title: str) -> None:
    t = Table(title=title, title_justify="left")
    for col in ("planner", "cases", "geomean vs best", "median planning", "max planning", "no fit", "stopped/crashed",
                "timed out"):
        t.add_column(col, justify="left" if col == "planner" else "right", no_wrap=col == "planner")
    for s in summary:
        g = s["geomean_ratio_to_best"]
        t.add_row(s["planner"], str(s["cases"]), f"{g:.3f}" if g else "-", f"{s['median_planning_time_s']:.2f} s",
                  f"{s['max_planning_time_s']:.2f} s", f"{s['no_fit_share']:.0%}", f"{s['failed_share']:.0%}",
                  f"{s['timed_out_share']:.0%}")
    Console(width=150).print(t)


def print_timing(rows: list[dict[str, Any]]) -> None:
    t = Table(title="Planning time of the search baselines", title_justify="left")
    for col in ("planner", "GPUs", "planning", "candidates", "plans priced", "timed out", "tokens/s", "vs best"):
        t.add_column(col, justify="left" if col == "planner" else "right", no_wrap=col == "planner")
    for r in rows:
        tok = f"{r['tokens_per_s']:,.0f}" if r["tokens_per_s"] else (r["error"] or "")[:30]
        ratio = f"{r['ratio_to_best']:.2f}" if r["ratio_to_best"] else "-"
        t.add_row(r["planner"], str(r["gpus"]), f"{r['planning_time_s']:.2f} s", str(r["candidates"]),
                  str(r["plans_priced"]), "yes" if r["timed_out"] else "no", tok, ratio)
    Console(width=150).print(t)


# ---- entry points ------------------------------------------------------------------------------------------
def hard_limit(args: argparse.Namespace) -> float:
    return args.hard_limit if args.hard_limit is not None else 3 * args.time_budget + 60


def grid(args: argparse.Namespace) -> None:
    cases = QUICK if args.quick else CASES
    if args.cases:
        cases = [c for c in cases if any(k in c.name for k in args.cases.split(","))]
    if args.time_budget is None:
        args.time_budget = 10.0 if args.quick else 30.0
    budget = SearchBudget(time_budget_s=args.time_budget, seed=args.seed)
    chosen = [p.strip() for p in args.planners.split(",")] if args.planners else None
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for case in cases:
        rows += run_case(case, planners_for(case, chosen), budget, hard_limit(args))
    add_ratios(rows)
    summary = summarise(rows)
    meta = {"time_budget_s": args.time_budget, "seed": args.seed, "quick": args.quick,
            "cases": len(cases), "wall_s": round(time.perf_counter() - t0, 1)}
    write(args.out, "planners", rows, summary, meta)
    print_summary(summary, f"{len(cases)} cases, budget {args.time_budget:g} s per planner "
                           f"(geomean over solved cases of throughput / best of the case)")


def timing(args: argparse.Namespace) -> None:
    if args.time_budget is None:
        args.time_budget = 60.0
    budget = SearchBudget(time_budget_s=args.time_budget, seed=args.seed)
    planners = [p.strip() for p in args.planners.split(",")] if args.planners else TIMING_PLANNERS
    rows = []
    for n, groups in TIMING_SIZES.items():
        case = Case(f"timing-{n}", groups, args.timing_model, 4 * n, 2048)
        rows += run_case(case, planners_for(case, planners), budget, hard_limit(args))
    add_ratios(rows)
    write(args.out, "timing", rows, summarise(rows), {"time_budget_s": args.time_budget, "model": args.timing_model})
    print_timing(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--planners", help="comma-separated planner names (default: all installed, +ep for MoE)")
    ap.add_argument("--time-budget", type=float, default=None,
                    help="planning budget per planner and case, s (default 30; 10 with --quick; 60 with --timing)")
    ap.add_argument("--quick", action="store_true", help="4 small cases (a couple of minutes)")
    ap.add_argument("--cases", default="", help="only cases whose name contains one of these comma-separated strings")
    ap.add_argument("--timing", action="store_true", help="planning time of the search baselines at 64/256/512 GPUs")
    ap.add_argument("--timing-model", default="GPT-3-1.3B", help="model for --timing")
    ap.add_argument("--hard-limit", type=float, default=None,
                    help="stop a planner that has not returned after this many seconds (default 3 x budget + 60)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("results/planners"))
    args = ap.parse_args()
    (timing if args.timing else grid)(args)


if __name__ == "__main__":
    main()
