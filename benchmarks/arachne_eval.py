"""``arachne``: benchmarks of the arachne planner itself (``rule-order`` lives in its own module).

  optimality  arachne / the exhaustive oracle on small clusters (same template space, common cost model)
  ablation    learned top-K vs policy top-K vs K random vs the first K rules vs every rule (same completion)
  generalise  clusters outside training: held-out GPU types (features only), node size 16, 512-1024 GPUs
  latency     planning time vs cluster size (8-1024 GPUs), optionally beside search baselines
  target      throughput at several ``--target`` values on large random clusters (never lower than the default?)
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

from arachne.cost import CostModel
from arachne.errors import NoFeasiblePlanError
from arachne.planners.arachne.options import DEFAULT_TARGET_S
from arachne.planners.harness import run_planner
from arachne.planners.protocol import SearchBudget
from arachne.planners.registry import PLANNERS, planner_names
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.gpus import gpu_catalog
from arachne.spec.job import Job
from arachne.spec.model import model_catalog
from benchmarks import common


def run(name: str, cl, model: str, job: Job, budget_s: float, **kw) -> dict[str, Any]:
    """One planner on one problem: throughput, wall seconds and its CPU seconds (``cpu_s``: this process's and
    arachne's second search's in its forked process; the wall time less what other processes on a busy machine
    take, and like it subject to the host's own speed)."""
    cm = CostModel(cl)
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        _, est, res = run_planner(name, cl, model_catalog().get(model), job, cm, SearchBudget(time_budget_s=budget_s),
                                  **kw)
        second = res.stats.notes.get("second_look", {}).get("cpu_s", 0.0)  # (its forked process's)
        return {"tokens_per_s": est.tokens_per_s, "time_s": time.perf_counter() - t0,
                "cpu_s": time.process_time() - c0 + second, "priced": res.stats.plans_priced,
                "timed_out": res.stats.timed_out, "work_s": res.stats.notes.get("work_s"),
                "candidates": res.stats.candidates}
    except NoFeasiblePlanError:
        return {"tokens_per_s": 0.0, "time_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                "priced": 0, "timed_out": False}


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


MEDIUM = [
    ("H100 32 + A100-80 32", [("H100", 4, 8), ("A100-80", 4, 8)], ("LLaMA-2-7B", 256, 4096)),
    ("A100-40 32 + V100-16 32", [("A100-40", 4, 8), ("V100-16", 8, 4)], ("GPT-3-1.3B", 256, 2048)),
    ("H100 48 + L4 16", [("H100", 6, 8), ("L4", 2, 8)], ("LLaMA-2-13B", 256, 2048)),
    ("A10G 32 + T4 32", [("A10G", 4, 8), ("T4", 8, 4)], ("LLaMA-2-7B", 256, 2048)),
    ("A100-40 32 + V100-16 32", [("A100-40", 4, 8), ("V100-16", 8, 4)], ("Mixtral-8x7B", 256, 2048)),
    ("H100 64 + A100-80 64", [("H100", 8, 8), ("A100-80", 8, 8)], ("LLaMA-2-13B", 512, 4096)),
    ("A10G 64 + T4 64", [("A10G", 8, 8), ("T4", 16, 4)], ("GPT-3-1.3B", 512, 2048)),
    ("L4 96 + A10G 32", [("L4", 12, 8), ("A10G", 4, 8)], ("LLaMA-2-7B", 512, 2048)),
    ("H100 64 + A100-80 64", [("H100", 8, 8), ("A100-80", 8, 8)], ("Mixtral-8x7B", 512, 4096)),
    ("H100 128 + A100-40 128", [("H100", 16, 8), ("A100-40", 16, 8)], ("LLaMA-2-13B", 1024, 4096)),
]
"""Clusters of 64-256 GPUs of two types (65,000-1,600,000 templates; the oracle prices each distinct plan once)."""


def optimality(a) -> None:
    """arachne (its default target, on the work clock) over the exhaustive oracle (``--oracle-budget`` s of wall
    time; a row says when it ran out) on ``--set small`` (6 clusters of 6-8 GPUs x 4 models) or ``--set medium``
    (:data:`MEDIUM`); ``--only`` runs the cases whose ``cluster/model`` contains the text."""
    if a.set == "medium":
        cases = [(cname, spec, job) for cname, spec, job in MEDIUM]
    else:
        cases = [(cname, spec, job) for cname, spec in SMALL for job in SMALL_JOBS]
    cases = [c for c in cases if not a.only or a.only in f"{c[0]}/{c[2][0]}"]
    rows = []
    for cname, spec, (model, gbs, seq) in cases:
        cl = common.triples_cluster(spec, cname)
        job = Job(global_batch_size=gbs, sequence_length=seq)
        ar = run("arachne", cl, model, job, a.budget)
        o = run("exhaustive", cl, model, job, a.oracle_budget)
        if o["tokens_per_s"] <= 0:
            continue
        rows.append({"cluster": cname, "gpus": len(cl.devices), "model": model, "arachne_tok_s": ar["tokens_per_s"],
                     "oracle_tok_s": o["tokens_per_s"], "ratio": ar["tokens_per_s"] / o["tokens_per_s"],
                     "arachne_s": ar["time_s"], "oracle_s": o["time_s"], "oracle_timed_out": o["timed_out"],
                     "oracle_templates": o.get("candidates")})
        common.console.print(f"{cname}/{model}: {rows[-1]['ratio']:.4f} (oracle {o['time_s']:.0f} s"
                             f"{', timed out' if o['timed_out'] else ''})")
    common.print_table("arachne vs the exhaustive oracle", rows, ["cluster", "model", "ratio", "arachne_s", "oracle_s"])
    ratios = [r["ratio"] for r in rows]
    summary = {"cases": len(rows), "geomean": common.gmean(ratios), "min": min(ratios, default=None),
               "within_2pct": sum(r >= 0.98 for r in ratios), "within_3pct": sum(r >= 0.97 for r in ratios),
               "oracle_timed_out": sum(r["oracle_timed_out"] for r in rows)}
    if rows:
        common.console.print(f"arachne / oracle: geomean {summary['geomean']:.4f}, min {summary['min']:.4f}, within "
                             f"2%: {summary['within_2pct']}/{len(rows)}, 3%: {summary['within_3pct']}/{len(rows)}")
    name = "optimality" if a.set == "small" else f"optimality-{a.set}"
    common.write_result(a.out, name, rows, summary, {"budget": a.budget, "oracle_budget": a.oracle_budget,
                                                     "set": a.set, "only": a.only},
                        benchmark="arachne-optimality" if a.set == "small" else f"arachne-optimality-{a.set}")


MID = [
    ("A100-40 16 + V100-16 16", [("A100-40", 2, 8), ("V100-16", 4, 4)]),
    ("H100 16 + A100-80 16 + L4 8", [("H100", 2, 8), ("A100-80", 2, 8), ("L4", 8, 1)]),
    ("A10G 32 + T4 16", [("A10G", 4, 8), ("T4", 4, 4)]),
    ("H200 8 + H100 16 + A100-40 24 + V100-16 16",
     [("H200", 1, 8), ("H100", 2, 8), ("A100-40", 3, 8), ("V100-16", 4, 4)]),
    ("RTX-3090 16 + A100-80 8", [("RTX-3090", 4, 4), ("A100-80", 1, 8)]),
    ("L4 24 + A10G 8 + T4 8", [("L4", 24, 1), ("A10G", 1, 8), ("T4", 2, 4)]),
]
MID_JOBS = [("GPT-3-1.3B", 256, 2048), ("LLaMA-2-7B", 256, 4096), ("LLaMA-2-13B", 256, 2048),
            ("Mixtral-8x7B", 256, 2048), ("DeepSeek-MoE-16B", 256, 2048)]
ARMS = ("learned", "policy", "random", "floor_k", "floor")


def ablation(a) -> None:
    """Same completion and pricing, no refinement, no split polishing: the learned ranker's first K of the
    policy's proposals and the rules (learned) vs the policy's top-K alone vs K random valid templates vs the
    first K rule templates (floor_k) vs every rule template (floor)."""
    rows = []
    for cname, spec in MID:
        cl = common.triples_cluster(spec, cname)
        for model, gbs, seq in MID_JOBS:
            job = Job(global_batch_size=gbs, sequence_length=seq)
            r: dict[str, Any] = {"cluster": cname, "model": model}
            for arm, mode, extra in (("learned", "policy", {"use_floor": True, "rank_k": a.k, "target_s": 60}),
                                     ("policy", "policy", {"use_ranker": False}), ("random", "random", {}),
                                     ("floor_k", "floor", {"floor_k": a.k}), ("floor", "floor", {})):
                kw = {"use_floor": False, **extra}
                res = run("arachne", cl, model, job, 60, mode=mode, k=a.k, use_refine=False, use_polish=False, **kw)
                r[arm] = res["tokens_per_s"]
            best = max(r[arm] for arm in ARMS)
            if best <= 0:
                continue
            for arm in ARMS:
                r[f"{arm}_rel"] = r[arm] / best
            rows.append(r)
    summary = []
    for arm in ARMS:
        rel = [r[f"{arm}_rel"] for r in rows]
        summary.append({"arm": arm, "k": a.k, "geomean_vs_best_arm": common.gmean(rel),
                        "best_arm_in": sum(x >= 0.9999 for x in rel), "no_plan": sum(x == 0 for x in rel),
                        "cases": len(rel)})
    common.print_table(f"learning ablation, K = {a.k}: each arm relative to the best arm (geomean over solved cases)",
                       summary)
    common.write_result(a.out, "ablation", rows, summary, {"k": a.k}, benchmark="arachne-ablation")


def generalise(a) -> None:
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
    baselines = [b for b in a.baselines.split(",") if b] if a.baselines else \
        ["megatron", "megatron-oblivious", "amp", "metis", "flashflex", "sailor"]
    rows = []
    for cname, spec in cases:
        cl = common.triples_cluster(spec, cname, holdout)
        for model, gbs, seq in [("LLaMA-2-13B", 512, 4096), ("Mixtral-8x7B", 512, 4096)]:
            job = Job(global_batch_size=gbs, sequence_length=seq)
            p = run("arachne", cl, model, job, 60)
            t = run("arachne", cl, model, job, a.teacher_budget, mode="teacher", teacher_beam=3)
            if t["tokens_per_s"] <= 0 and p["tokens_per_s"] <= 0:
                continue
            base = {b: run(b, cl, model, job, a.budget) for b in baselines}
            best_b = max(base, key=lambda b: base[b]["tokens_per_s"])
            rows.append({"cluster": cname, "model": model, "arachne_tok_s": p["tokens_per_s"],
                         "arachne_s": p["time_s"], "teacher_tok_s": t["tokens_per_s"],
                         "arachne/teacher": p["tokens_per_s"] / max(t["tokens_per_s"], 1e-9),
                         "best_baseline": best_b, "baseline_tok_s": base[best_b]["tokens_per_s"],
                         "baseline_s": base[best_b]["time_s"],
                         "arachne/baseline": p["tokens_per_s"] / max(base[best_b]["tokens_per_s"], 1e-9)})
    common.print_table("generalisation: arachne vs its own priced teacher (longer budget) and the best baseline",
                       rows, ["cluster", "model", "arachne/teacher", "best_baseline", "arachne/baseline"])
    summary = [{"vs": col, "cases": len(rows), "geomean": common.gmean([r[col] for r in rows]),
                "min": min((r[col] for r in rows), default=None)} for col in ("arachne/teacher", "arachne/baseline")]
    common.print_table("generalisation summary", summary)
    common.write_result(a.out, "generalise", rows, summary, {"budget": a.budget, "teacher_budget": a.teacher_budget,
                                                             "baselines": baselines}, benchmark="arachne-generalise")


def latency(a) -> None:
    """Planning time vs cluster size, arachne and (``--baselines``) search baselines in the same run."""
    planners = ["arachne"] + [p for p in (a.baselines or "").split(",") if p]
    if unknown := [p for p in planners if p not in PLANNERS]:
        common.fail(f"--baselines: unknown planner {unknown[0]!r} (available: {', '.join(planner_names())})")
    rows = []
    for n_gpus, n_types, cl, job in common.latency_clusters():
        r: dict[str, Any] = {"gpus": cl.num_gpus, "types": n_types}
        for p in planners:
            kw = {"target_s": a.target} if p == "arachne" and a.target is not None else {}
            res = run(p, cl, "LLaMA-2-13B", job, a.budget, **kw)
            r[f"{p}_s"], r[f"{p}_tok_s"] = res["time_s"], res["tokens_per_s"]
            if p == "arachne":
                r["arachne_cpu_s"], r["arachne_work_s"] = res["cpu_s"], res.get("work_s")
        rows.append(r)
    for r in rows:  # the fastest search baseline reaching arachne's quality (within 1%), and the speed-up
        same = [(r[f"{p}_s"], p) for p in planners[1:] if r[f"{p}_tok_s"] >= 0.99 * r["arachne_tok_s"] > 0]
        r["fastest_same_quality"] = min(same)[1] if same else "none"
        r["speedup"] = min(same)[0] / r["arachne_s"] if same else float("nan")
    common.print_table("planning time vs cluster size (LLaMA-2-13B; arachne: two processes up to 768 GPUs)", rows,
                       ["gpus", "types", "arachne_s", "arachne_cpu_s", "arachne_work_s", "fastest_same_quality",
                        "speedup"])
    by: dict[int, list[dict]] = {}
    for r in rows:
        by.setdefault(min(common.TIERS, key=lambda t: abs(t - r["gpus"])), []).append(r)
    summary = [{"gpus": k, "cases": len(v), "arachne_median_s": statistics.median(r["arachne_s"] for r in v),
                "arachne_max_s": max(r["arachne_s"] for r in v),
                "arachne_median_cpu_s": statistics.median(r["arachne_cpu_s"] for r in v),
                "arachne_median_work_s": statistics.median(r["arachne_work_s"] or 0.0 for r in v)}
               for k, v in sorted(by.items())]
    reached = [r["speedup"] for r in rows if math.isfinite(r["speedup"])]
    common.print_table("arachne planning time by cluster size", summary)
    if len(planners) > 1:
        common.console.print(f"a search baseline reached arachne's throughput (within 1%) in {len(reached)}/{len(rows)} "
                             f"cases; there arachne was {min(reached, default=float('nan')):.1f}x to "
                             f"{max(reached, default=float('nan')):.1f}x faster")
    common.write_result(a.out, "latency", rows, summary, {"baselines": planners[1:], "budget": a.budget,
                                                          "target_s": a.target or DEFAULT_TARGET_S},
                        benchmark="arachne-latency")


def target(a) -> None:
    """arachne at several ``--target`` values on the large random clusters of the robustness generator."""
    try:
        targets = [float(t) for t in a.targets.split(",")]
    except ValueError:
        common.fail(f"--targets: {a.targets!r} is not a comma-separated list of seconds")
    cases = []
    for seed in (int(s) for s in a.seeds.split(",") if s):
        for rc in common.random_cases(seed):
            cl = cluster_from_dict(rc.doc)
            if cl.num_gpus >= a.min_gpus and rc.model_state_fits and len(cases) < a.n:
                cases.append((f"rob{seed}/{rc.name}", cl, rc))
    rows = []
    for name, cl, rc in cases:
        model, job = model_catalog().get(rc.model), Job(global_batch_size=rc.gbs, sequence_length=rc.seq)
        row: dict[str, Any] = {"case": name, "gpus": cl.num_gpus, "model": rc.model}
        for t in targets:
            t0 = time.perf_counter()
            _, est, _ = run_planner("arachne", cl, model, job, CostModel(cl), SearchBudget(time_budget_s=max(20, 2 * t)),
                                    target_s=t)
            row[f"tok_s@{t:g}"], row[f"s@{t:g}"] = est.tokens_per_s, time.perf_counter() - t0
        for t in targets[1:]:
            row[f"ratio@{t:g}"] = row[f"tok_s@{t:g}"] / row[f"tok_s@{targets[0]:g}"]
        rows.append(row)
        common.console.print(f"{name}: " + ", ".join(f"{t:g} s -> {row[f'tok_s@{t:g}']:,.0f} tok/s" for t in targets),
                             highlight=False)
    summary = []
    for t in targets[1:]:
        rs = [r[f"ratio@{t:g}"] for r in rows]
        summary.append({"target_s": t, "vs_target_s": targets[0], "cases": len(rs), "min": min(rs, default=None),
                        "max": max(rs, default=None), "lower": sum(x < 1 - 1e-9 for x in rs),
                        "higher": sum(x > 1 + 1e-9 for x in rs)})
    common.print_table(f"arachne at --target {', '.join(f'{t:g}' for t in targets)} s: throughput over the first",
                       summary)
    common.write_result(a.out, "target", rows, summary, {"targets": targets, "seeds": a.seeds, "n": a.n},
                        benchmark="arachne-target")
