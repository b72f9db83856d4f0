"""``report``: ``docs/results.md`` and ``results/headline.json``, generated from the JSON the benchmarks write.

Inputs: every stored sweep (``benchmarks/stored/``: the planners grid and the robustness sweeps, as measured
when they were drawn) and every result under ``--results`` (``results/**/*.json`` written by a subcommand: its
command, commit, date and machine are in the file). A benchmark with no result is listed under "Not
regenerated here" with the command that would regenerate it; no number is copied in as text.
"""

from __future__ import annotations

import gzip
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks import common

# benchmark key -> (section title, what it measures, the command that regenerates it)
FAMILIES: dict[str, tuple[str, str, str]] = {
    "cost-model-validate": ("Cost model vs measured iteration time",
                            "Sailor's 9 measured mixed Titan-RTX/RTX-2080 plans, priced by the cost model",
                            "python -m benchmarks cost-model validate"),
    "cost-model-calibrate": ("Analytic compute vs measured blocks",
                             "the roofline compute model's fit to Sailor's per-block times (tp=1 fitted, tp>1 a check)",
                             "python -m benchmarks cost-model calibrate"),
    "cost-model-collectives": ("Collectives vs NCCL measurements",
                               "bus bandwidth of the network model and of a flat ring vs nccl-tests outputs, sizes >= 1 MB",
                               "python -m benchmarks cost-model collectives"),
    "cost-model-attention": ("Attention kernels",
                             "the attention core vs published kernel measurements; check rows are those not read "
                             "into the constants",
                             "python -m benchmarks cost-model attention"),
    "cost-model-elementwise": ("Eager element-wise ops",
                               "the eager norms and rotary embedding term vs eager and compiled kernel measurements; "
                               "check rows are those not read into the constants",
                               "python -m benchmarks cost-model elementwise"),
    "cost-model-moe-layer": ("MoE layer implementations",
                             "one MoE layer (router, permutation, expert GEMMs, aggregation) vs SonicMoE's H100 "
                             "measurements of Megatron-Core (class grouped) and SonicMoE (class fused); anchors: the "
                             "7B and 30B panels, checks: the 1.4B and 120B panels",
                             "python -m benchmarks cost-model moe-layer"),
    "sweep-recheck": ("Baselines' misses run again",
                      "stored runs where a baseline found no plan but another planner did, run again on a later "
                      "commit: what it finds now, and arachne's ratio over the best baseline before and with it "
                      "(stored under benchmarks/stored/rechecks/, counted in every stored sweep row above)",
                      "python -m benchmarks sweep recheck SWEEP..."),
    "cost-model-device": ("Measured on a GPU",
                          "arachne's own runtime on one GPU (benchmarks/device/device_check.sh, data/device): the "
                          "analytic model per block, head and GEMM (errors in % of the measurement, negative: "
                          "optimistic), CUDA vs CPU losses, and a measured run vs its estimate",
                          "python -m benchmarks cost-model device"),
    "cost-model-published": ("Published end-to-end runs",
                             "iteration time and memory vs published runs, each priced as its formats-v2 plan; runs "
                             "using a feature the model does not price reported apart; half held out",
                             "python -m benchmarks cost-model published"),
    "cost-model-speed": ("Pricing speed", "CostModel.estimate, warm, one core (median ms per plan)",
                         "python -m benchmarks cost-model speed"),
    "replay-grid": ("The planners grid, arachne re-planned on the current code",
                    "arachne over the best stored baseline per grid case, and the compute ceiling",
                    "python -m benchmarks replay grid --rerun-arachne"),
    "replay-sweeps": ("Stored sweeps, arachne re-planned on the current code",
                      "arachne over the best stored baseline, every comparable case, each plan validated; the "
                      "baselines as stored, priced by the cost model of the sweep's date (a regression check, "
                      "not a measure: a sweep re-run end to end, `sweep run --reuse`, is)",
                      "python -m benchmarks replay sweeps 'seed*' 'odd*'"),
    "replay-ceiling": ("The compute ceiling on the stored sweeps",
                       "the ceiling over the best stored baseline, and the share of it stored arachne plans reach",
                       "python -m benchmarks replay ceiling 'seed*' 'odd*'"),
    "replay-latency": ("Planning time on stored sweeps' clusters", "arachne in process, wall clock, by cluster size",
                       "python -m benchmarks replay latency odd103 odd104"),
    "replay-split-speed": ("The layer split: skip ahead vs plain bisection",
                           "every split planning seed 3 asks for, replayed both ways",
                           "python -m benchmarks replay split-speed seed3"),
    "replay-long-budget": ("Search baselines given 60 s instead of 5",
                           "arachne over capped Metis/Sailor/FlashFlex runs that came within 15%, re-run at 60 s",
                           "python -m benchmarks replay long-budget 'seed*' --budget 60 --workers 2"),
    "arachne-optimality": ("arachne vs the exhaustive oracle", "small cases (6-8 GPUs), same space: every "
                           "template, then the knobs on the oracle's best",
                           "python -m benchmarks arachne optimality --oracle-budget 60"),
    "arachne-optimality-medium": ("arachne vs the exhaustive oracle, 64-256 GPUs",
                                  "clusters of 64-256 GPUs of two types, the oracle given an hour of wall time each",
                                  "python -m benchmarks arachne optimality --set medium --oracle-budget 3600"),
    "arachne-ablation": ("Learning ablation", "learned / policy top-K / K random / first K rules / every rule",
                         "python -m benchmarks arachne ablation --k 8 --out results/arachne/k8; "
                         "python -m benchmarks arachne ablation"),
    "arachne-rule-order": ("Screening order", "best of the first K screened / best of the pool, over the grid's cases "
                           "and the random clusters of `--seeds` (default 0,1: 83 clusters)",
                           "python -m benchmarks arachne rule-order"),
    "arachne-generalise": ("Unseen clusters", "held-out GPU types, node size 16, 512-1024 GPUs",
                           "python -m benchmarks arachne generalise --budget 10 --teacher-budget 30"),
    "arachne-latency": ("Planning time vs cluster size", "19 clusters of 8-1024 GPUs, beside the search baselines",
                        "python -m benchmarks arachne latency --baselines sailor,flashflex,metis,amp,megatron "
                        "--budget 30"),
    "arachne-target": ("A longer --target", "12 random clusters of 200+ GPUs at --target 0.8, 2 and 4 s",
                       "python -m benchmarks arachne target"),
    "work-clock-check": ("The work clock", "30 held-out problems, each planned idle and with every core busy",
                         "python -m benchmarks work-clock check"),
    "work-clock-fit": ("Work clock fit", "the rates' fit (R^2, wall / fit)",
                       "python -m benchmarks work-clock fit --seeds 10,11,13"),
    "replan-trace-spot": ("Re-planning over Sailor's spot trace", "tokens trained, relative to arachne",
                          "python -m benchmarks replan-trace --trace spot"),
    "replan-trace-grow": ("Re-planning over Sailor's growing cluster", "tokens trained, relative to arachne",
                          "python -m benchmarks replan-trace --trace grow"),
    "runtime": ("Measured vs estimated on CPU processes", "plans run with torch.distributed (gloo), one core each",
                "python -m benchmarks runtime"),
    "replan-trace-spot-churn": ("Re-planning over a synthetic spot-churn trace", "tokens trained, relative to "
                                "arachne", "python -m benchmarks replan-trace --trace spot-churn"),
    "replan-trace-steady-growth": ("Re-planning over a synthetic steady-growth trace", "tokens trained, relative "
                                   "to arachne", "python -m benchmarks replan-trace --trace steady-growth"),
    "replan-trace-rack-failure": ("Re-planning over a synthetic rack-failure trace", "tokens trained, relative "
                                  "to arachne", "python -m benchmarks replan-trace --trace rack-failure"),
    "grid": ("The planners grid, every planner re-run on the current code", "its cases (all 25, or those `--cases` "
             "names), each planner in a forked child, all plans priced by the current cost model",
             "python -m benchmarks grid run"),
    "grid-scale": ("Large clusters", "every planner on six clusters of 4,096-100,000 GPUs in 8-GPU nodes (dense "
                   "and MoE), each in a forked child at a 30 s budget; throughput relative to the best of the case",
                   "python -m benchmarks grid scale"),
    "grid-nic": ("Node NICs at 4k-16k tokens", "every planner on 12 clusters of 64-2,048 GPUs in 8-GPU nodes whose "
                 "GPUs share one or two NICs (12.5-100 GB/s) or have one each, at 4,096-16,384 tokens, each in a forked "
                 "child at a 30 s budget; throughput relative to the best of the case",
                 "python -m benchmarks grid nic"),
    "grid-starved": ("Clusters past their batch", "every planner on 15 clusters of 1,024-100,000 GPUs whose GPUs "
                     "of a type outnumber the batch's sequences times the node size (dense and MoE, 4k-16k tokens), "
                     "each in a forked child at a 30 s budget; throughput relative to the best of the case",
                     "python -m benchmarks grid starved"),
    "objectives": ("Objectives and runtime presets", "USD per token under --objective cost vs the baselines' plans; "
                   "--runtime megatron vs the Megatron grid", "python -m benchmarks objectives"),
    "cost-model-activations": ("Activation memory vs autograd's saved tensors", "bytes a real bf16 forward on CPU "
                               "saves for backward, per block, against the memory model",
                               "python -m benchmarks cost-model activations"),
}
SEVEN_TWENTY_EIGHT = "'seed[0-5]' 'seed3[1-6]' 'odd10[0-6]' 'odd11[0-5]'"
# what the README's "Measured" section reported, and the exact command that regenerates each; an item counts as
# regenerated when a result under results/ was written by exactly that command
NEEDED: list[tuple[str, str]] = [
    ("cost model vs Sailor's 9 measured plans: MAPE", "python -m benchmarks cost-model validate"),
    ("analytic compute vs 50 measured tp=1 block times: mean abs error", "python -m benchmarks cost-model calibrate"),
    ("pricing a plan, warm, one core", "python -m benchmarks cost-model speed"),
    ("the layer split, skipping ahead vs plain bisection, on seed 3's splits",
     "python -m benchmarks replay split-speed seed3"),
    ("grid: arachne re-planned vs the best baseline; the compute ceiling", "python -m benchmarks replay grid "
                                                                           "--rerun-arachne"),
    ("the compute ceiling over the best baseline on 722 stored cases",
     f"python -m benchmarks replay ceiling {SEVEN_TWENTY_EIGHT}"),
    ("arachne re-planned on the current code against the 728 stored cases",
     f"python -m benchmarks replay sweeps {SEVEN_TWENTY_EIGHT}"),
    ("a default target of 0.7 s of work instead of 0.8, on the 728 stored cases",
     f"python -m benchmarks replay sweeps {SEVEN_TWENTY_EIGHT} --options '{{\"target_s\": 0.7}}' --name target-0.7"),
    ("planning time on odd-node clusters, in process (seeds 103-104)",
     "python -m benchmarks replay latency odd103 odd104"),
    ("arachne vs the exhaustive oracle, 19 small cases", "python -m benchmarks arachne optimality --oracle-budget 60"),
    ("arachne vs the exhaustive oracle, 64-256 GPUs",
     "python -m benchmarks arachne optimality --set medium --oracle-budget 3600"),
    ("learning ablation, K = 8", "python -m benchmarks arachne ablation --k 8 --out results/arachne/k8"),
    ("learning ablation, K = 24", "python -m benchmarks arachne ablation"),
    ("screening order, 83 clusters outside training", "python -m benchmarks arachne rule-order"),
    ("unseen clusters vs the teacher and the best baseline",
     "python -m benchmarks arachne generalise --budget 10 --teacher-budget 30"),
    ("planning time vs cluster size, beside the search baselines",
     "python -m benchmarks arachne latency --baselines sailor,flashflex,metis,amp,megatron --budget 30"),
    ("planning time vs cluster size, alone with the Megatron grid",
     "python -m benchmarks arachne latency --baselines megatron --out results/arachne/latency_alone"),
    ("a longer --target (0.8, 2, 4 s) on 12 large clusters", "python -m benchmarks arachne target"),
    ("the work clock: the same plan idle and under load; wall / work", "python -m benchmarks work-clock check"),
    ("re-planning over Sailor's spot trace", "python -m benchmarks replan-trace --trace spot"),
    ("re-planning over Sailor's growing cluster", "python -m benchmarks replan-trace --trace grow"),
    ("search baselines given 60 s instead of 5 (the README's pass covered seeds 0-12 and 14-21, of which only "
     "0-5 are stored)", "python -m benchmarks replay long-budget 'seed[0-5]' --budget 60 --workers 2"),
]
NOT_STORED = [  # README numbers whose inputs are not in benchmarks/stored/
    "robustness seeds 6-25 (the README's rows for seeds 5-8 ... 24-25): their runs were not stored; draw them again "
    "with `python -m benchmarks sweep run --seed S` (seeds 22-25: `--budget 20`), then `store add`",
    "the cost model's identity caches, old vs new code (`same-plans run` on both commits, then `same-plans "
    "compare`): a comparison of two commits, not a stored result",
]
# stored robustness sweeps, grouped by name patterns; a sweep re-run end to end on later code (every planner on
# the same clusters, `sweep run --reuse NAME`) is stored as NAME-rerun and counted apart, never twice
RERUN = "*-rerun"
GROUPS = [("seed 0-5", ["seed[0-5]"]), ("seed 26-36", ["seed2[6-9]", "seed3[0-6]"]),
          ("odd 100-106", ["odd10[0-6]"]), ("odd 107-115", ["odd10[7-9]", "odd11[0-5]"]),
          ("seed 0-5, 31-36, odd 100-106, 110-115", ["seed[0-5]", "seed3[1-6]", "odd10[0-6]", "odd11[0-5]"]),
          ("all stored", ["*"]), ("re-run end to end on a later commit", [RERUN])]
CAVEATS = [
    "One process per core, one thread each (OPENBLAS/OMP/MKL_NUM_THREADS=1), as the CLI runs.",
    "This machine's speed drifts: by up to 20% between runs within a session, more between sessions. Wall "
    "times are what was measured then; compare wall times only within one result.",
    "arachne counts its latency target in work done (the work clock), so the same input gets the same plan on any "
    "load: throughput ratios are exact replays, wall times are not.",
    "A commit written `abc1234+` means the checkout had uncommitted changes when the result was measured.",
    "The stored sweeps' wall times include the CLI's start-up and were measured on the machine of their date, "
    "often beside another benchmark on the second core.",
    "The stored grid and sweeps were priced by the cost model of their date. The cost model changed on "
    "2026-12-02 (afternoon: measured matmul efficiency, memory per framework, NCCL-checked collectives; "
    "CHANGELOG.md), so their ratios are history; the re-measured grid below uses the current one.",
]


def md_cell(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return "-" if v is None else ("yes" if v else "no")
    if isinstance(v, float):
        if not math.isfinite(v):
            return "-"
        if abs(v) >= 100:
            return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.1f}"
        return f"{v:#.4g}" if abs(v) >= 0.1 else f"{v:.4g}"  # 1.000, not 1: a ratio keeps its digits
    if isinstance(v, (list, dict)):
        v = json.dumps(v)
    text = str(v).replace("|", "/").replace("\n", " ")
    return text if len(text) < 290 else text[:286] + " ..."  # a table cell, with its padding, under 300


def md_table(rows: list[dict[str, Any]], columns: list[str] | None = None) -> list[str]:
    if not rows:
        return ["(no rows)", ""]
    columns = columns or list(dict.fromkeys(k for r in rows for k in r))
    out = ["| " + " | ".join(common.LABELS.get(c, c) for c in columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(md_cell(r.get(c)) for c in columns) + " |" for r in rows]
    return out + [""]


def md_summary(summary: Any) -> list[str]:
    """A result's summary: a dict of numbers (one table), a list of rows, or a dict of those."""
    def scalars(v: Any) -> bool:
        return isinstance(v, list) and not any(isinstance(x, (list, dict)) for x in v)

    if isinstance(summary, list):
        return [", ".join(map(str, summary)), ""] if scalars(summary) else md_table(summary)
    if isinstance(summary, dict) and summary:
        flat = {k: (", ".join(map(str, v)) if scalars(v) else v) for k, v in summary.items()
                if not isinstance(v, (list, dict)) or scalars(v)}
        out = md_table([{"measure": k, "value": v} for k, v in flat.items()]) if flat else []
        for k, v in summary.items():
            if isinstance(v, (list, dict)) and v and not scalars(v):
                out += [f"*{k}*", ""] + md_summary(v)
        return out
    return ["(no summary)", ""]


def provenance(command: str, commit: str, date: str) -> list[str]:
    return [f"Command: `{command}`  ", f"Commit: `{commit or 'unknown'}`, date: {date or 'unknown'}", ""]


# ---- stored sweeps ----------------------------------------------------------------------------------------
def sweep_stats(sweeps: list[common.Sweep]) -> dict[str, Any]:
    ratios = [v for s in sweeps for v in s.ratios().values()]
    walls = [r["wall_s"] for s in sweeps for r in s.runs if r["planner"] == "arachne" and r.get("status") == "ok"]
    return {**common.ratio_stats(ratios), "arachne_median_wall_s": statistics.median(walls) if walls else None}


def stored_robustness(sweeps: list[common.Sweep], entries: dict[str, dict]) -> tuple[list[str], dict]:
    from fnmatch import fnmatchcase

    out = ["## Stored: robustness sweeps, arachne as run at each draw", "",
           "Random production-like clusters (4-1024 GPUs, 2-6 GPU types, node sizes 1, 2, 4, 8; the `odd` sweeps "
           "also 3, 5, 6, 7), every planner through the CLI with a 5 s budget. arachne's plans are the ones of the "
           "code at each draw, not the current code (re-planned: the `replay sweeps` section, if present). "
           "Ratios: arachne's tokens/s over the best baseline's, over the cases where both found a plan. A sweep "
           "named `NAME-rerun` is NAME's clusters with every planner run again on a later commit (`sweep run "
           "--reuse NAME`; its commit below), counted in its own row, not in the others. The best baseline "
           "also counts the baselines' misses run again on a later commit (`sweep recheck`, stored under "
           f"`rechecks/`: {', '.join(e['name'] for e in common.read_manifest().get('rechecks', [])) or 'none'}).",
           ""]
    rows = []
    for label, patterns in GROUPS:
        sel = [s for s in sweeps if any(fnmatchcase(s.name, p) for p in patterns)
               and (patterns == [RERUN]) == fnmatchcase(s.name, RERUN)]
        if sel and (label == "all stored" or len(sel) < len(sweeps)):
            rows.append({"sweeps": label, "n": len(sel), **sweep_stats(sel)})
    out += md_table(rows, ["sweeps", "n", "cases", "geomean", "min", "at_least_0.99", "at_least_1.0",
                           "arachne_median_wall_s"])
    per, low = [], []
    for s in sweeps:
        st = sweep_stats([s])
        worst = min(((v, c) for c, v in s.ratios().items() if v is not None), default=(None, "-"))
        per.append({"sweep": s.name, "cases": st["cases"], "geomean": st["geomean"], "min": st["min"],
                    "at_least_0.99": st["at_least_0.99"], "worst case": worst[1],
                    "arachne_median_wall_s": st["arachne_median_wall_s"]})
        best = s.best_baselines()
        low += [{"case": f"{s.name}/{c}", "ratio": v, "best baseline": best[c][1]}
                for c, v in s.ratios().items() if v is not None and v < 0.99]
    out += ["Per sweep:", ""] + md_table(per)
    out += ["Cases below 0.99x at the draw:", ""] + md_table(sorted(low, key=lambda r: r["ratio"]))
    out += ["Where each sweep came from (`benchmarks/stored/MANIFEST.json`; the commit first stored it):", ""]
    out += md_table([{"sweep": s.name, "command": entries.get(s.name, {}).get("command", s.source),
                      "commit": entries.get(s.name, {}).get("commit"), "date": entries.get(s.name, {}).get("date")}
                     for s in sweeps])
    return out, sweep_stats([s for s in sweeps if not fnmatchcase(s.name, RERUN)])


def stored_grid(grid: common.Sweep, entry: dict) -> tuple[list[str], dict]:
    from arachne.spec.model import model_catalog

    out = ["## Stored: the planners grid", "",
           "25 cases a platform engineer meets (8-512 GPUs, 2-4 types, 15 dense + 10 MoE), every planner on the "
           "common cost model; arachne as run then (re-planned: the `replay grid` section, if present).", ""]
    out += provenance(entry.get("command", grid.source), entry.get("commit", ""), entry.get("date", ""))
    summary = grid.doc.get("summary") or []
    out += md_table([{"planner": s["planner"], "cases": s["cases"], "vs best (geomean)": s["geomean_ratio_to_best"],
                      "median s": s["median_planning_time_s"], "max s": s["max_planning_time_s"],
                      "no fit": s["no_fit_share"], "timed out": s["timed_out_share"]} for s in summary])
    best = grid.best_baselines()
    ratios = grid.ratios()
    moe = {r["case"]: model_catalog().get(r["model"]).is_moe for r in grid.runs}
    rows = [{"models": label, **common.ratio_stats([v for c, v in ratios.items() if sel(moe[c])])}
            for label, sel in (("dense", lambda m: not m), ("MoE", lambda m: m), ("all", lambda m: True))]
    out += ["arachne over the best baseline (including the `+ep` variants on MoE):", ""] + md_table(rows)
    return out, {"rows": rows, "best": best}


# ---- results under results/ -------------------------------------------------------------------------------
STORED_RESULTS = Path(__file__).resolve().parent / "stored" / "results"
"""Result files kept in the repository, one dated folder per snapshot (append-only: a new date, never a
rewrite), so that the report regenerates on a fresh clone."""


def result_folders(local: Path) -> list[Path]:
    """Where results are read, first match wins: the local ``results/`` folder, then the stored snapshots,
    newest first."""
    dated = sorted((d for d in STORED_RESULTS.iterdir() if d.is_dir()), reverse=True) \
        if STORED_RESULTS.is_dir() else []
    return [local, *dated]


def find_results(folders: Path | list[Path]) -> list[tuple[Path, dict]]:
    """Every result JSON (``*.json`` or ``*.json.gz``) under ``folders``; of two with the same path inside
    their folders, the first folder's."""
    found: dict[str, tuple[Path, dict]] = {}
    for folder in [folders] if isinstance(folders, Path) else folders:
        paths = sorted([*folder.rglob("*.json"), *folder.rglob("*.json.gz")]) if folder.is_dir() else []
        for path in paths:
            rel = str(path.relative_to(folder)).removesuffix(".gz")
            if rel in found:
                continue
            try:
                raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
                doc = json.loads(raw)
            except (OSError, ValueError):
                continue
            if isinstance(doc, dict) and doc.get("format") == common.RESULT_FORMAT:
                found[rel] = (path, doc)
    return list(found.values())


def _repo_relative(path: Path) -> str:
    """``path`` as the docs name it: relative to the repository, never a path of this machine."""
    root = Path(__file__).resolve().parents[1]
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return path.name


def result_section(path: Path, doc: dict) -> list[str]:
    key = doc.get("benchmark", "")
    title, what, _ = FAMILIES.get(key, (key, "", ""))
    shown = _repo_relative(path)
    out = [f"### {title}", "", f"{what} (`{shown}`)." if what else f"`{shown}`", ""]
    out += provenance(doc.get("command", ""), doc.get("commit", ""), doc.get("date", ""))
    if key == "sweep":
        (sw,) = common.load_sweeps([str(path)])
        out += md_table([{"sweep": sw.name, **sweep_stats([sw])}])
    elif key in ("grid-scale", "grid-nic", "grid-starved"):  # few rows: each case's planners, then the summary
        out += md_table(doc.get("rows", []), ["case", "planner", "gpus_used", "tokens_per_s", "ratio_to_best",
                                              "planning_time_s", "timed_out"])
        out += [""] + md_summary(doc.get("summary"))
    else:
        out += md_summary(doc.get("summary"))
    return out


def sweep_refs(sweeps: list[common.Sweep]) -> str:
    """Patterns naming exactly these stored sweeps (``'seed*' 'odd*'``), else their names."""
    import re
    import shlex
    from fnmatch import fnmatchcase

    names = [s.name for s in sweeps]
    patterns = sorted({(re.match(r"[a-z]*", n).group(0) or n) + "*" for n in names})
    every = [n for n in common.stored_names() if any(fnmatchcase(n, p) for p in patterns)]
    return " ".join(shlex.quote(p) for p in patterns) if sorted(every) == sorted(names) else " ".join(names)


def commit_span(commits: list[str]) -> str:
    """The oldest and newest of several commits (by ancestry in this checkout) as ``a..b``."""
    import subprocess

    def depth(c: str) -> int:
        try:
            out = subprocess.run(["git", "-C", str(common.ROOT), "rev-list", "--count", c], capture_output=True,
                                 text=True, timeout=10).stdout.strip()
            return int(out)
        except (OSError, ValueError, subprocess.SubprocessError):
            return 0

    known = sorted({c for c in commits if c}, key=depth)
    return "" if not known else known[0] if len(known) == 1 else f"{known[0]}..{known[-1]}"


def headline(rank: float, name: str, value: Any, unit: str, command: str, commit: str, date: str) -> dict[str, Any]:
    """One headline number; ``rank`` orders them (the first 8 are kept)."""
    value = round(value, 4) if isinstance(value, float) else value
    return {"rank": rank, "name": name, "value": value, "unit": unit, "command": command, "commit": commit,
            "date": date}


def report(a) -> None:
    t0 = time.perf_counter()
    manifest = {e["name"]: e for e in common.read_manifest()["sweeps"]}
    stored = common.load_sweeps(a.stored if a.stored is not None else list(manifest))
    order = list(FAMILIES)
    results = sorted(find_results(result_folders(a.results)), key=lambda pd: (order.index(pd[1].get("benchmark"))
                                                              if pd[1].get("benchmark") in order else len(order),
                                                              str(pd[0])))
    commit, today, m = common.git_commit(), common.today(), common.machine()
    lines = ["# Results", "",
             f"Generated by `python -m benchmarks report` at commit `{commit}` on {today} from "
             f"{len(stored)} stored sweeps (`benchmarks/stored/`) and {len(results)} result files (under "
             f"`{a.results}/`, else the newest snapshot in `benchmarks/stored/results/`). Do not edit by hand: re-run the benchmarks, then the report.", "",
             "## Setup", "",
             f"- Machine: {m['cores']} cores ({m['cpu']}); Python {m['python']}, numpy {m['numpy']}, "
             f"scipy {m['scipy']}, torch {m['torch']} (read when this report was generated; each result file "
             "records its own).", *[f"- {c}" for c in CAVEATS]]
    try:
        rates = json.loads((common.ROOT / "arachne" / "data" / "work_rates.json").read_text())
        lines.append(f"- The work clock's rates: `arachne/data/work_rates.json`, fitted by `{rates['fitted_by']}` "
                     f"({rates['date']}).")
    except (OSError, ValueError, KeyError):
        pass
    lines.append("")
    heads: list[dict[str, Any]] = []
    grid = next((s for s in stored if s.kind == "grid"), None)
    if grid is not None:
        text, g = stored_grid(grid, manifest.get(grid.name, {}))
        lines += text
        e = manifest.get(grid.name, {})
        for rank, row in zip((1, 2), g["rows"]):
            heads.append(headline(rank, f"grid (stored): arachne / best baseline, {row['models']}, geomean", row["geomean"],
                                  "x", e.get("command", ""), e.get("commit", ""), e.get("date", "")))
    robust = [s for s in stored if s.kind == "robustness"]
    if robust:
        text, st = stored_robustness(robust, manifest)
        lines += text
        src = (f"python -m benchmarks sweep summarize {sweep_refs(robust)}", commit_span(
            [manifest.get(r.name, {}).get("commit", "") for r in robust]),
               max(manifest.get(r.name, {}).get("date", "") for r in robust))
        heads += [headline(3, "stored sweeps: arachne / best baseline, geomean", st["geomean"], "x", *src),
                  headline(4, "stored sweeps: cases at >= 0.99x the best baseline", st["at_least_0.99"],
                           f"of {st['cases']} cases", *src),
                  headline(5, "stored sweeps: worst case", st["min"], "x the best baseline", *src),
                  headline(9, "stored sweeps: arachne planning wall time (CLI, median)", st["arachne_median_wall_s"],
                           "s", *src)]
    lines += ["## Re-measured (results under `results/`, else the newest stored snapshot)", ""]
    if not results:
        lines += ["None on this machine.", ""]
    for path, doc in results:
        lines += result_section(path, doc)
        s, src = doc.get("summary"), (doc.get("command", ""), doc.get("commit", ""), doc.get("date", ""))
        key = doc.get("benchmark")
        if key == "replay-sweeps" and isinstance(s, list) and s and not doc.get("params", {}).get("options"):
            best = max((h for h in heads if h["rank"] == 6), key=lambda h: h["cases"], default=None)
            if best is None or s[-1]["cases"] > best["cases"]:
                heads = [h for h in heads if h["rank"] != 6]
                heads.append({**headline(6, f"stored sweeps, arachne re-planned ({s[-1]['cases']} cases): geomean vs "
                                            "the best baseline", s[-1]["geomean"], "x", *src), "cases": s[-1]["cases"]})
        elif key == "replay-grid" and isinstance(s, list) and len(s) > 2:
            heads = [h for h in heads if h["rank"] > 2]  # re-planned on the current code: instead of the stored
            heads.append(headline(1, "grid, arachne re-planned: dense geomean vs the best baseline", s[1]["geomean"],
                                  "x", *src))
            heads.append(headline(2, "grid, arachne re-planned: MoE geomean vs the best baseline", s[2]["geomean"],
                                  "x", *src))
            heads.append(headline(8, "grid: compute ceiling / best baseline, MoE, geomean",
                                  s[2]["ceiling/baseline"], "x", *src))
        elif key == "cost-model-validate" and isinstance(s, dict):
            heads.append(headline(7, "cost model vs Sailor's measured plans: MAPE", s.get("mape_pct"), "%", *src))
    ran = {" ".join(doc.get("command", "").split()) for _, doc in results}
    lines += ["## Not regenerated here", "",
              "What the README reported that no result on this machine regenerates; each command would (run times: "
              "`benchmarks/README.md`):", ""]
    lines += [f"- {what}: `{command}`" for what, command in NEEDED if " ".join(command.split()) not in ran]
    lines += [f"- {item}" for item in NOT_STORED]
    lines.append("")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text("\n".join(lines).rstrip() + "\n")
    heads = [{k: v for k, v in h.items() if k not in ("rank", "cases")}
             for h in sorted(heads, key=lambda h: h["rank"])[:8]]
    a.headline.parent.mkdir(parents=True, exist_ok=True)
    a.headline.write_text(json.dumps(heads, indent=1) + "\n")
    common.print_table("headline numbers", [{"name": h["name"], "value": h["value"], "unit": h["unit"]} for h in heads])
    common.console.print(f"wrote {a.out} and {a.headline} in {time.perf_counter() - t0:.1f} s", highlight=False)
