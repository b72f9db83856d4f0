"""Does arachne (0.8 s of work) still hold when the search baselines get a much longer budget?

The robustness sweeps give every planner 5 s. Metis, Sailor and FlashFlex often run into that cap, so
a longer budget can find them better plans. This re-runs, through the CLI, each search baseline that
ran into the cap and came within ``--min-ratio`` of arachne, at ``--budget`` seconds, and reports
arachne's throughput over the longer run's.

Usage:  python benchmarks/long_budget.py results/robustness-r3/seed{0,1,2,3,4}/runs.json
            [--budget 60] [--min-ratio 0.85] [--planners metis,sailor,flashflex] [--workers 2]
            [--reuse results/long_budget/long_budget.json] [--out results/long_budget]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from arachne_eval import write
from rich.console import Console
from rich.table import Table

console = Console(width=160)


def fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def load(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
        doc["runs"], doc["args"]["budget"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        fail(f"{path}: not a robustness runs.json ({type(e).__name__}: {e})")
    return doc


def selected(doc: dict, planners: list[str], min_ratio: float) -> list[tuple[dict, dict]]:
    """(baseline run, arachne run) pairs: the baseline ran into the sweep's budget and came close."""
    budget = float(doc["args"]["budget"])
    by_case: dict[str, dict[str, dict]] = {}
    for r in doc["runs"]:
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


def rerun(run: dict, budget: float, tmp: Path) -> tuple[float | None, float, str]:
    cmd = list(run["command"])
    cmd[cmd.index("--time-budget") + 1] = str(budget)
    plan = tmp / f"{run['case']}.{run['planner']}.{time.monotonic_ns()}.json"
    cmd[cmd.index("-o") + 1] = str(plan)
    local = Path(sys.executable).parent / "arachne"
    if local.exists():
        cmd[0] = str(local)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0 or not plan.exists():
        return None, wall, (p.stderr.strip().splitlines() or [""])[-1][:200]
    return json.loads(plan.read_text())["estimate"]["tokens_per_s"], wall, ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweeps", nargs="+", type=Path, help="robustness runs.json files (with arachne runs)")
    ap.add_argument("--budget", type=float, default=60.0)
    ap.add_argument("--min-ratio", type=float, default=0.85, help="baseline / arachne at the sweep's budget")
    ap.add_argument("--planners", default="metis,sailor,flashflex")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("results/long_budget"))
    ap.add_argument("--reuse", type=Path, default=None,
                    help="a previous long_budget.json: its longer runs are taken as stored (arachne re-read)")
    a = ap.parse_args()
    stored: dict[tuple, dict] = {}
    if a.reuse is not None:
        try:
            stored = {(r["sweep"], r["case"], r["planner"]): r for r in json.loads(a.reuse.read_text())
                      if r.get("budget") == a.budget}
        except (OSError, ValueError, KeyError, TypeError) as e:
            fail(f"{a.reuse}: not a long_budget.json ({type(e).__name__}: {e})")
    planners = [p for p in a.planners.split(",") if p]
    jobs = []
    for path in a.sweeps:
        doc = load(path)
        jobs += [(path, r, ar) for r, ar in selected(doc, planners, a.min_ratio)]
    console.print(f"{len(jobs)} baseline runs to repeat at {a.budget:g} s")
    rows = []
    with tempfile.TemporaryDirectory(prefix="arachne-long-") as tmp, ThreadPoolExecutor(a.workers) as pool:
        def one(job):
            old = stored.get((str(job[0]), job[1]["case"], job[1]["planner"]))
            return (old["long_tok_s"], old["long_wall_s"], old["error"]) if old else rerun(job[1], a.budget, Path(tmp))

        results = pool.map(one, jobs)
        for (path, r, ar), (tok, wall, err) in zip(jobs, results):
            rows.append({"sweep": str(path), "case": r["case"], "planner": r["planner"], "budget": a.budget,
                         "short_tok_s": r["tokens_per_s"], "long_tok_s": tok, "long_wall_s": round(wall, 2),
                         "arachne_tok_s": ar["tokens_per_s"],
                         "arachne_vs_short": ar["tokens_per_s"] / r["tokens_per_s"],
                         "arachne_vs_long": ar["tokens_per_s"] / tok if tok else None, "error": err})
            console.print(f"{path.parent.name}/{r['case']} {r['planner']}: {r['tokens_per_s']:.0f} -> "
                          f"{tok or 0:.0f} tok/s in {wall:.0f} s; arachne {ar['tokens_per_s']:.0f}", highlight=False)
    t = Table(title=f"arachne vs search baselines given {a.budget:g} s")
    for col in ("sweep", "case", "planner", "short_tok_s", "long_tok_s", "long_wall_s", "arachne_vs_short",
                "arachne_vs_long"):
        t.add_column(col)
    for r in rows:
        t.add_row(Path(r["sweep"]).parent.name, r["case"], r["planner"], f"{r['short_tok_s']:.0f}",
                  f"{r['long_tok_s'] or 0:.0f}", f"{r['long_wall_s']:.0f}", f"{r['arachne_vs_short']:.3f}",
                  "-" if r["arachne_vs_long"] is None else f"{r['arachne_vs_long']:.3f}")
    console.print(t)
    ratios = [r["arachne_vs_long"] for r in rows if r["arachne_vs_long"]]
    if ratios:
        console.print(f"arachne / baseline at {a.budget:g} s: min {min(ratios):.3f}, median "
                      f"{statistics.median(ratios):.3f}; < 0.99 in {sum(x < 0.99 for x in ratios)}/{len(ratios)}; "
                      f"the longer budget raised the baseline in {sum(r['long_tok_s'] and r['long_tok_s'] > r['short_tok_s'] * 1.001 for r in rows)}/{len(rows)}")
    if rows:
        write(a.out, "long_budget", rows)


if __name__ == "__main__":
    main()
