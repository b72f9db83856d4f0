"""How far any planner could still go: the compute ceiling against the stored runs of robustness sweeps.

For every case of the given sweeps, the compute ceiling (``arachne.cost.ceiling``: every GPU busy
with the model's compute at its best rate, no communication, bubble or memory limit) over the best
stored baseline's tokens/s is the most any planner could gain over the baselines on that case under
the cost model. Printed by dense and MoE: its geometric mean and range, how many cases cannot reach
2x even at the ceiling, and the share of the ceiling that the stored arachne plans reach.

Usage:  python benchmarks/ceiling.py results/robustness/seed{0,1,2}/runs.json [--out results/ceiling]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from arachne_eval import gmean, write
from rich.console import Console
from rich.table import Table

from arachne.cost import CostModel
from arachne.cost.ceiling import throughput_ceiling
from arachne.spec.cluster import load_cluster
from arachne.spec.model import model_catalog

console = Console(width=160)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweeps", nargs="+", type=Path, help="robustness runs.json files (runs stored)")
    ap.add_argument("--out", type=Path, default=Path("results/ceiling"))
    a = ap.parse_args()
    rows = []
    for path in a.sweeps:
        try:
            doc = json.loads(path.read_text())
            cases, runs = doc["cases"], doc["runs"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"error: {path}: not a robustness runs.json ({type(e).__name__}: {e})", file=sys.stderr)
            sys.exit(2)
        best: dict[str, float] = {}
        mine: dict[str, float] = {}
        for r in runs:
            tok = r.get("tokens_per_s") or 0.0
            if r["planner"] == "arachne":
                mine[r["case"]] = tok
            elif tok > best.get(r["case"], 0.0):
                best[r["case"]] = tok
        for case in cases:
            name = case["name"]
            if not best.get(name) or not mine.get(name):
                continue
            cl = load_cluster(path.parent / "clusters" / f"{name}.yaml")
            model = model_catalog().get(case["model"])
            ceil = throughput_ceiling(CostModel(cl), model, case["gbs"], case["seq"]).tokens_per_s
            rows.append({"case": f"{path.parent.name}/{name}", "model": model.name, "moe": model.is_moe,
                         "gpus": cl.num_gpus, "arachne_tok_s": mine[name], "best_baseline_tok_s": best[name],
                         "ceiling_tok_s": ceil, "ceiling_over_baseline": ceil / best[name],
                         "arachne_of_ceiling": mine[name] / ceil})
    if not rows:
        print("error: no case with both an arachne run and a baseline run", file=sys.stderr)
        sys.exit(2)
    t = Table(title="the compute ceiling against the stored plans")
    for col in ("models", "cases", "ceiling / best baseline: geomean", "min", "max", "cases < 2x at the ceiling",
                "arachne / ceiling: geomean", "min", "max"):
        t.add_column(col, justify="right")
    for label, sel in (("dense", [r for r in rows if not r["moe"]]), ("MoE", [r for r in rows if r["moe"]]),
                       ("all", rows)):
        if not sel:
            continue
        head = [r["ceiling_over_baseline"] for r in sel]
        share = [r["arachne_of_ceiling"] for r in sel]
        t.add_row(label, str(len(sel)), f"{gmean(head):.3f}", f"{min(head):.3f}", f"{max(head):.3f}",
                  f"{sum(h < 2 for h in head)}/{len(sel)}", f"{gmean(share):.3f}", f"{min(share):.3f}",
                  f"{max(share):.3f}")
    console.print(t)
    bad = [r for r in rows if r["arachne_of_ceiling"] > 1 + 1e-9 or r["ceiling_over_baseline"] < 1 - 1e-9]
    if bad:  # a stored plan (arachne's or a baseline's) above the ceiling would mean it is not a bound: a bug
        console.print(f"[red]{len(bad)} stored plans above the ceiling: {[r['case'] for r in bad][:10]}[/red]")
    write(a.out, "ceiling", rows)
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
