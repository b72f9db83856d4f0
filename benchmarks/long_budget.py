"""``replay long-budget``: does arachne (at its default target) still hold when the search baselines get far longer?

The robustness sweeps give every planner 5 s. Metis, Sailor and FlashFlex often run into that cap, so a longer
budget can find them better plans. This re-runs, through the CLI, each search baseline of the given sweeps
that ran into the cap and came within ``--min-ratio`` of arachne, at ``--budget`` seconds, and reports
arachne's throughput (as stored in the sweep) over the longer run's. ``--reuse`` takes the longer runs of an
earlier pass instead of repeating them.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks import common


def selected(sweep: common.Sweep, planners: list[str], min_ratio: float) -> list[tuple[dict, dict]]:
    """(baseline run, arachne run) pairs: the baseline ran into the sweep's budget and came close."""
    budget = float(sweep.doc["args"]["budget"])
    by_case: dict[str, dict[str, dict]] = {}
    for r in sweep.runs:
        by_case.setdefault(r["case"], {})[r["planner"]] = r
    out = []
    for rs in by_case.values():
        a = rs.get("arachne")
        if not a or not a.get("tokens_per_s"):
            continue
        for p in planners:
            r = rs.get(p)
            if r and r.get("tokens_per_s") and r["wall_s"] >= 0.9 * budget \
                    and r["tokens_per_s"] >= min_ratio * a["tokens_per_s"]:
                out.append((r, a))
    return out


def arachne_exe() -> str:
    local = Path(sys.executable).parent / "arachne"
    return str(local) if local.exists() else (shutil.which("arachne") or "arachne")


def rerun(sweep: common.Sweep, run: dict, budget: float, tmp: Path) -> tuple[float | None, float, str]:
    """The stored command at ``budget`` seconds, on the sweep's own cluster (written to ``tmp``)."""
    cmd = list(run["command"])
    stamp = time.monotonic_ns()
    cmd[0] = arachne_exe()
    cmd[cmd.index("--time-budget") + 1] = str(budget)
    if run["case"] in sweep.clusters:
        cluster = tmp / f"{sweep.name}.{run['case']}.yaml"
        cluster.write_text(sweep.clusters[run["case"]])
        cmd[cmd.index("--cluster") + 1] = str(cluster)
    plan = tmp / f"{run['case']}.{run['planner']}.{stamp}.json"
    cmd[cmd.index("-o") + 1] = str(plan)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0 or not plan.exists():
        return None, wall, (p.stderr.strip().splitlines() or [""])[-1][:200]
    return json.loads(plan.read_text())["estimate"]["tokens_per_s"], wall, ""


def sweep_key(name: str) -> str:
    """A sweep's name (older results named it by its runs.json path)."""
    return Path(name).parent.name if name.endswith("runs.json") else name


def long_budget(a) -> None:
    stored: dict[tuple, dict] = {}
    if a.reuse is not None:
        try:
            stored = {(sweep_key(r["sweep"]), r["case"], r["planner"]): r for r in common.read_result(a.reuse)["rows"]
                      if r.get("budget") == a.budget}
        except (KeyError, TypeError) as e:
            common.fail(f"{a.reuse}: not a long-budget result ({type(e).__name__}: {e})")
    planners = [p for p in a.planners.split(",") if p]
    jobs = []
    for sweep in common.load_sweeps(a.sweeps, kind="robustness"):
        if "budget" not in sweep.doc.get("args", {}):
            common.fail(f"{sweep.source}: not a robustness runs.json (no args.budget)")
        jobs += [(sweep, r, ar) for r, ar in selected(sweep, planners, a.min_ratio)]
    common.console.print(f"{len(jobs)} baseline runs to repeat at {a.budget:g} s")
    rows = []
    with tempfile.TemporaryDirectory(prefix="arachne-long-") as tmp, ThreadPoolExecutor(a.workers) as pool:
        def one(job):
            old = stored.get((job[0].name, job[1]["case"], job[1]["planner"]))
            if old:
                return old["long_tok_s"], old["long_wall_s"], old["error"]
            return rerun(job[0], job[1], a.budget, Path(tmp))

        for (sweep, r, ar), (tok, wall, err) in zip(jobs, pool.map(one, jobs)):
            rows.append({"sweep": sweep.name, "case": r["case"], "planner": r["planner"], "budget": a.budget,
                         "short_tok_s": r["tokens_per_s"], "long_tok_s": tok, "long_wall_s": round(wall, 2),
                         "arachne_tok_s": ar["tokens_per_s"],
                         "arachne_vs_short": ar["tokens_per_s"] / r["tokens_per_s"],
                         "arachne_vs_long": ar["tokens_per_s"] / tok if tok else None, "error": err})
            common.console.print(f"{sweep.name}/{r['case']} {r['planner']}: {r['tokens_per_s']:.0f} -> {tok or 0:.0f} "
                                 f"tok/s in {wall:.0f} s; arachne {ar['tokens_per_s']:.0f}", highlight=False)
    common.print_table(f"arachne vs search baselines given {a.budget:g} s", rows,
                       ["sweep", "case", "planner", "long_wall_s", "arachne_vs_short", "arachne_vs_long"])
    ratios = [r["arachne_vs_long"] for r in rows if r["arachne_vs_long"]]
    raised = sum(bool(r["long_tok_s"] and r["long_tok_s"] > r["short_tok_s"] * 1.001) for r in rows)
    summary = {"runs": len(rows), "median": statistics.median(ratios) if ratios else None,
               "min": min(ratios, default=None), "below_0.99": sum(x < 0.99 for x in ratios), "raised": raised}
    if ratios:
        common.console.print(f"arachne / baseline at {a.budget:g} s: min {summary['min']:.3f}, median "
                             f"{summary['median']:.3f}; < 0.99 in {summary['below_0.99']}/{len(ratios)}; the "
                             f"longer budget raised the baseline in {raised}/{len(rows)}", highlight=False)
    if rows:
        common.write_result(a.out, "long_budget", rows, summary,
                            {"budget": a.budget, "min_ratio": a.min_ratio, "planners": planners},
                            benchmark="replay-long-budget")
