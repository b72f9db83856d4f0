"""Price every plan of Sailor's measured mixed-RTX set and report measured vs predicted time.

Usage: python benchmarks/validate_cost_model.py [--data PATH] [--out DIR]
Data: data/sailor/measured_mixed_rtx.json (eth-easl/sailor, MIT licence).
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from arachne.cost import CostModel
from arachne.plan import plan_from_dict
from arachne.spec.cluster import cluster_from_dict

DEFAULT_DATA = Path(__file__).resolve().parents[1] / "data" / "sailor" / "measured_mixed_rtx.json"


def run(data_path: Path) -> list[dict]:
    data = json.loads(data_path.read_text())
    rows = []
    for rec in data["records"]:
        cluster = cluster_from_dict(rec["cluster"], rec["id"])
        plan = plan_from_dict(rec["plan"], rec["id"])
        est = CostModel(cluster).estimate(plan)
        measured = rec["measured_iteration_time_s"]
        rows.append({
            "id": rec["id"], "measured_s": measured, "predicted_s": est.iteration_time_s,
            "error_pct": 100 * (est.iteration_time_s - measured) / measured,
            "stages": len(plan.pipelines[0].stages), "pipelines": len(plan.pipelines),
            "mbs": plan.micro_batch_size, "gbs": plan.global_batch_size,
            "sources": ",".join(sorted({s.source for s in est.stages})),
            **{k: round(v, 4) for k, v in est.breakdown.items()},
        })
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--out", type=Path, default=Path("results/validate_cost_model"))
    args = ap.parse_args()
    rows = run(args.data)
    t = Table(title=f"Cost model vs measured iteration time ({args.data.name})")
    for col in ("plan", "stages x pipes", "mbs", "measured s", "predicted s", "error %", "compute source"):
        t.add_column(col, justify="left" if col in ("plan", "compute source") else "right")
    for r in rows:
        t.add_row(r["id"], f"{r['stages']} x {r['pipelines']}", str(r["mbs"]), f"{r['measured_s']:.2f}",
                  f"{r['predicted_s']:.2f}", f"{r['error_pct']:+.1f}", r["sources"])
    mape = sum(abs(r["error_pct"]) for r in rows) / len(rows)
    console = Console()
    console.print(t)
    console.print(f"MAPE (iteration time) over {len(rows)} plans: {mape:.1f}%")
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "validate_cost_model.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (args.out / "validate_cost_model.json").write_text(json.dumps({"mape_pct": mape, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
