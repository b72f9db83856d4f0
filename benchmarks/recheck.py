"""``sweep recheck``: a baseline's misses in stored sweeps, run again on the current code.

For each stored sweep, every run of a ``--planners`` baseline that found no plan where another planner found one
(a miss) is run again through the CLI exactly as the sweep ran it (``sweep.run_one``: the stored cluster, model,
batch, sequence and budget). Prints, per re-run case, what the planner finds now, the best baseline and arachne
as stored, and arachne's ratio over the best baseline before and with the new run; writes ``recheck.json``.

After a fix to a baseline that made it miss: what the fix changes in the stored ratios, without running every
planner again. Stored sweeps are never changed (append-only); this result says by how much their
ratios move.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.sweep import run_one, stored_cases


def recheck(a) -> None:
    planners = [p.strip() for p in a.planners.split(",") if p.strip()]
    if not planners or "arachne" in planners:
        common.fail("--planners: name the baselines to re-run (not arachne: `replay sweeps` re-plans it)")
    sweeps = common.load_sweeps(a.sweeps, kind="robustness")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="arachne-recheck-") as tmp:
        work = Path(tmp)
        for sw in sweeps:
            budget = float(sw.doc["args"].get("budget", 5.0))
            misses = {(r["case"], r["planner"]) for r in sw.runs if r["planner"] in planners and r.get("miss")}
            if not misses:
                continue
            best, arachne = sw.best_baselines(), sw.arachne_runs()
            for case, text in stored_cases(sw):
                for planner in planners:
                    if (case.name, planner) not in misses:
                        continue
                    cpath = work / f"{sw.name}.{case.name}.yaml"
                    cpath.write_text(text)
                    r = run_one(case, planner, cpath, work, budget)
                    old_best = best.get(case.name, (None, "-"))
                    mine = (arachne.get(case.name) or {}).get("tokens_per_s")
                    new = r.tokens_per_s if r.status == "ok" else None
                    new_best = max(x for x in (old_best[0], new) if x is not None) if (old_best[0] or new) else None
                    rows.append({"sweep": sw.name, "case": case.name, "planner": planner, "status": r.status,
                                 "tok_s": new, "best_baseline": old_best[1], "best_baseline_tok_s": old_best[0],
                                 "arachne_tok_s": mine,
                                 "ratio_stored": mine / old_best[0] if mine and old_best[0] else None,
                                 "ratio_now": mine / new_best if mine and new_best else None,
                                 "note": r.stderr_tail})
                    common.console.print(f"{sw.name}/{case.name} {planner}: {r.status} "
                                         f"{'' if new is None else f'{new:,.0f} tokens/s'}", highlight=False,
                                         markup=False)
    common.print_table(f"misses of {', '.join(planners)} run again", rows,
                       ["sweep", "case", "planner", "status", "tok_s", "best_baseline_tok_s", "arachne_tok_s",
                        "ratio_stored", "ratio_now"])
    moved = [r for r in rows if r["ratio_stored"] and r["ratio_now"] and r["ratio_now"] < r["ratio_stored"] - 1e-12]
    summary = {"reruns": len(rows), "now_ok": sum(r["status"] == "ok" for r in rows),
               "ratios_lowered": len(moved),
               "now_below_0.99": [f"{r['sweep']}/{r['case']}" for r in rows
                                  if r["ratio_now"] and r["ratio_now"] < 0.99],
               "lowest_ratio_now": min((r["ratio_now"] for r in rows if r["ratio_now"]), default=None),
               "new_over_best_stored": max((r["tok_s"] / r["best_baseline_tok_s"] for r in rows
                                            if r["tok_s"] and r["best_baseline_tok_s"]), default=None)}
    common.console.print(f"{summary['reruns']} misses run again, {summary['now_ok']} now find a plan; arachne's "
                         f"stored ratio lowered on {len(moved)} case(s)", highlight=False)
    common.write_result(a.out, "recheck", rows, summary, {"sweeps": list(a.sweeps), "planners": planners},
                        benchmark="sweep-recheck")
