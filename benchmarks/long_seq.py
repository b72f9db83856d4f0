"""``long-seq``: long sequences (32k-128k tokens), arachne against every baseline (issue 27, target "Long
sequences").

Per case (a cluster, a model with a 128k context, a sequence length) every planner plans the same job through
the one harness (``run_planner``: the same budget, every plan re-priced by the common cost model, no runtime
restriction, as on the grid). A row per planner says its tokens/s, the context-parallel degree its plan uses
(largest ``cp`` of any stage) and the recomputation; the case table sets arachne beside the best baseline and
beside the best baseline whose search has no context parallelism (:data:`CP_PLANNERS` are the ones that
have it, docs/baselines.md §2.7). The job keeps the tokens per iteration fixed (``--tokens``), so the global
batch is ``tokens / sequence length``. Nothing here feeds the planner: the cases are only measured.
"""

from __future__ import annotations

import time
from typing import Any

from rich import box
from rich.table import Table

from arachne.cost import CostModel
from arachne.errors import InputError, NoFeasiblePlanError
from arachne.planners.harness import default_planners, run_planner
from arachne.planners.protocol import SearchBudget
from arachne.spec.job import Job
from arachne.spec.model import load_model
from benchmarks import common

CLUSTERS: dict[str, tuple[tuple[str, int, int, float | None], ...]] = {
    "h100-32": (("H100", 4, 8, 50.0),),
    "h100-a100-32": (("H100", 2, 8, 50.0), ("A100-80", 2, 8, 25.0)),
    "h200-h100-64": (("H200", 4, 8, 50.0), ("H100", 4, 8, 50.0)),
}
"""(GPU, nodes, GPUs per node, NIC GB/s) groups, as the planners grid writes them."""
MODELS = ("Llama-3.1-8B", "Llama-3.1-70B")
"""Catalog models with a 131,072-token context."""
SEQUENCES = (32768, 65536, 131072)
CP_PLANNERS = frozenset({"megatron", "megatron-oblivious"})
"""The baselines whose search has context parallelism (``--context-parallel-size``); the others' has none."""
SHORT = {"megatron-oblivious": "meg-obl", "flashflex": "flashfl"}
"""Planner names as the case table prints them (8 characters at most)."""


def cases(select: str = "") -> list[tuple[str, str, int]]:
    """(cluster, model, sequence length) of every case whose name contains one of ``select``'s
    comma-separated parts (all without)."""
    out = [(c, m, s) for m in MODELS for c in CLUSTERS for s in SEQUENCES]
    keys = [k for k in select.split(",") if k]
    return [x for x in out if not keys or any(k in case_name(*x) for k in keys)]


def case_name(cluster: str, model: str, seq: int) -> str:
    return f"{cluster}/{model}/{seq // 1024}k"


def short_case(name: str) -> str:
    """``h100-32/Llama-3.1-8B/32k`` as ``h100-32 8B 32k`` (the case table's first column)."""
    cluster, model, seq = name.split("/")
    return f"{cluster} {model.rsplit('-', 1)[-1]} {seq}"


def plan_row(cluster: str, model: str, seq: int, tokens: int, planner: str, budget: SearchBudget) -> dict[str, Any]:
    """One planner on one case: its plan's throughput, cp and recomputation, or why it has none."""
    cl = common.grid_cluster(cluster, list(CLUSTERS[cluster]))
    job = Job(global_batch_size=max(1, tokens // seq), sequence_length=seq)
    row: dict[str, Any] = {"case": case_name(cluster, model, seq), "cluster": cluster, "model": model,
                           "sequence_length": seq, "global_batch_size": job.global_batch_size, "planner": planner,
                           "baseline_has_cp": planner in CP_PLANNERS}
    t0 = time.perf_counter()
    try:
        plan, est, _ = run_planner(planner, cl, load_model(model), job, CostModel(cl), budget)
    except (NoFeasiblePlanError, InputError) as exc:
        return {**row, "tokens_per_s": None, "cp": None, "error": str(exc), "wall_s": round(time.perf_counter() - t0, 2)}
    stages = [st for p in plan.pipelines for st in p.stages]
    kinds = sorted({"selective" if st.recompute == "selective" else "full" if st.recompute else "none"
                    for st in stages})
    return {**row, "tokens_per_s": est.tokens_per_s, "cp": max(st.cp for st in stages), "recompute": ",".join(kinds),
            "gpus_used": len(plan.devices), "gpus": cl.num_gpus, "precision": plan.precision, "error": None,
            "wall_s": round(time.perf_counter() - t0, 2)}


def case_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """arachne beside the best baseline and the best baseline without cp, for one case's rows."""
    a = next(r for r in rows if r["planner"] == "arachne")
    base = [r for r in rows if r["planner"] != "arachne" and r["tokens_per_s"]]
    best = max(base, key=lambda r: r["tokens_per_s"], default=None)
    nocp = max((r for r in base if not r["baseline_has_cp"]), key=lambda r: r["tokens_per_s"], default=None)
    at = a["tokens_per_s"]
    return {"case": a["case"], "arachne_tokens_per_s": at, "arachne_cp": a["cp"],
            "best_baseline": best["planner"] if best else None,
            "best_tokens_per_s": best["tokens_per_s"] if best else None, "best_cp": best["cp"] if best else None,
            "x_best": at / best["tokens_per_s"] if at and best else None,
            "best_no_cp_baseline": nocp["planner"] if nocp else None,
            "no_cp_tokens_per_s": nocp["tokens_per_s"] if nocp else None,
            "x_no_cp": at / nocp["tokens_per_s"] if at and nocp else None,
            "arachne_error": a["error"]}


def _num(v: Any, ratio: bool = False) -> str:
    """At most 7 characters: 344.6k, 9.43M; ratios as 1.015; '-' for none."""
    if v is None:
        return "-"
    if isinstance(v, str):
        return SHORT.get(v, v)
    if ratio:
        return f"{v:.3f}"
    if v >= 1e6:
        return f"{v / 1e6:.2f}M"
    return f"{v / 1e3:.1f}k" if v >= 1e4 else f"{v:,.0f}"


def print_cases(summaries: list[dict[str, Any]]) -> None:
    t = Table(title="tokens/s at long sequences: arachne vs the best baseline and the best baseline without cp "
                    "(x: arachne over it; -: no plan)", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
              padding=(0, 1), collapse_padding=True)
    heads = ["case", "arachne", "cp", "best", "tok/s", "cp", "x", "no-cp", "x"]
    for i, h in enumerate(heads):
        if i == 0:
            t.add_column(h, justify="left", overflow="fold", max_width=22)
        else:
            t.add_column(h, justify="right", no_wrap=True)
    for s in summaries:
        t.add_row(short_case(s["case"]), _num(s["arachne_tokens_per_s"]), _num(s["arachne_cp"]), _num(s["best_baseline"]),
                  _num(s["best_tokens_per_s"]), _num(s["best_cp"]), _num(s["x_best"], True),
                  _num(s["no_cp_tokens_per_s"]), _num(s["x_no_cp"], True))
    common.console.print(t)


def summarize(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(summaries)
    return {
        "cases": n,
        "arachne_plans": sum(bool(s["arachne_tokens_per_s"]) for s in summaries),
        "arachne_uses_cp": sum((s["arachne_cp"] or 1) > 1 for s in summaries),
        "no_cp_baselines_find_none": sum(s["no_cp_tokens_per_s"] is None for s in summaries),
        "arachne_plan_where_no_cp_baselines_find_none": sum(s["no_cp_tokens_per_s"] is None
                                                            and bool(s["arachne_tokens_per_s"]) for s in summaries),
        "baseline_plan_where_arachne_finds_none": sum(s["best_tokens_per_s"] is not None
                                                      and not s["arachne_tokens_per_s"] for s in summaries),
        "vs_no_cp_baselines": common.ratio_stats([s["x_no_cp"] for s in summaries]),
        "vs_best_baseline": common.ratio_stats([s["x_best"] for s in summaries]),
    }


def ratio_line(s: dict[str, Any], who: str) -> str:
    n = s["cases"]
    if not n:
        return f"arachne / {who}: no case where both found a plan"
    return (f"arachne / {who}, {n} cases with both: geomean {s['geomean']:.3f}, min {s['min']:.3f}, "
            f">= 0.99x on {s['at_least_0.99']}/{n}")


def run(a) -> None:
    chosen = cases(a.cases)
    if not chosen:
        common.fail(f"--cases {a.cases!r}: no case matches")
    budget = SearchBudget(time_budget_s=a.time_budget)
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    summaries = []
    for cluster, model, seq in chosen:
        planners = [p for p in default_planners(load_model(model)) if p != "exhaustive"]
        case_rows = []
        for p in planners:
            common.console.print(f"  {case_name(cluster, model, seq)}: {p}", highlight=False)
            case_rows.append(plan_row(cluster, model, seq, a.tokens, p, budget))
        rows += case_rows
        summaries.append(case_summary(case_rows))
    summary = {**summarize(summaries), "wall_s": round(time.perf_counter() - t0, 1)}
    print_cases(summaries)
    for key, who in (("vs_no_cp_baselines", "the best baseline without cp"), ("vs_best_baseline", "the best baseline")):
        common.console.print(ratio_line(summary[key], who), highlight=False)
    common.console.print({k: v for k, v in summary.items() if not isinstance(v, dict)}, highlight=False)
    common.write_result(a.out, "long_seq", rows, {**summary, "case_table": summaries},
                        {"time_budget_s": a.time_budget, "tokens_per_iteration": a.tokens,
                         "cases": [case_name(*c) for c in chosen]})
