"""``replay``: arachne re-planned, in this process, against the baselines of stored sweeps.

``replay sweeps SWEEP...``: every comparable case of robustness sweeps (a stored name, a pattern such as
``'seed3[1-6]'``, or a runs.json) re-planned with ``ArachnePlanner`` options (``--options '{"target_s": 0.7}'``),
each plan validated, against the best stored baseline: geometric mean, minimum, cases below 0.99, per sweep
and over all. The baselines are as stored, priced by the cost model of the sweep's commit: on a sweep drawn
before a cost-model change the ratios compare two models (a regression check between two arachne commits, not
a measure; ``sweep run --reuse NAME`` re-runs every planner on the sweep's clusters). The work clock makes every
run reproducible, so another benchmark may share the machine. Also a tool for tuning the planner's defaults;
confirm a change on sweeps it was not chosen on.

``replay grid``: arachne over the best baseline per case of the planners grid (stored ``grid``, or a grid
result), optionally re-planning arachne's rows on the current code, with the compute ceiling per case.

``replay ceiling SWEEP...``: the compute ceiling (``arachne.cost.ceiling``: every GPU busy at its best rate,
no communication, bubble or memory limit) over the best stored baseline, and the share of it the stored
arachne plans reach, by dense and MoE. A stored plan above the ceiling means the ceiling is not a bound: exit 1.
"""

from __future__ import annotations

import gzip
import json
import math
import time
from pathlib import Path
from typing import Any

from arachne.cost import CostModel
from arachne.cost.ceiling import throughput_ceiling
from arachne.errors import InputError, NoFeasiblePlanError
from arachne.plan import validate_plan
from arachne.planners.harness import run_planner
from arachne.planners.protocol import SearchBudget
from arachne.spec.job import Job
from arachne.spec.model import model_catalog
from benchmarks import common


def plan_arachne(cl, model: str, job: Job, budget_s: float, runtime: str | None = None,
                 **options: Any) -> dict[str, Any]:
    """One in-process arachne run: tokens/s (0 without a plan), wall and work seconds, whether its CPU guard
    expired (the plan then depends on the machine's speed), whether the plan validates.
    ``runtime``: the runtime preset whose rules the plan keeps (None: no rules)."""
    from arachne.spec.runtimes import Legality

    spec = model_catalog().get(model)
    legality = Legality.of(runtime) if runtime is not None else None
    t0 = time.perf_counter()
    try:
        plan, est, res = run_planner("arachne", cl, spec, job, CostModel(cl), SearchBudget(time_budget_s=budget_s),
                                     legality, **options)
    except NoFeasiblePlanError:
        return {"tokens_per_s": 0.0, "wall_s": round(time.perf_counter() - t0, 3), "work_s": None, "valid": None}
    wall = time.perf_counter() - t0
    try:
        validate_plan(plan, cl, spec)
        valid = True
    except InputError:
        valid = False
    return {"tokens_per_s": est.tokens_per_s, "wall_s": round(wall, 3), "work_s": res.stats.notes.get("work_s"),
            "guard_expired": bool(res.stats.notes.get("guard_expired")), "valid": valid}


MOVED = 1e-3  # a case moved when its throughput changed by more than this share


def read_against(paths: list[Path]) -> dict[tuple[str, str], float]:
    """Arachne's tokens/s per (sweep, case) in earlier ``replay sweeps`` results (``.json`` or ``.json.gz``; a case
    in several files: the last). A file that is not one: one line naming it and the field, exit 2."""
    out: dict[tuple[str, str], float] = {}
    for path in paths:
        try:
            raw = path.read_bytes()
            doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        except (OSError, ValueError, EOFError) as e:
            common.fail(f"--against: {path}: not a replay result ({type(e).__name__})")
        if not isinstance(doc, dict) or doc.get("benchmark") != "replay-sweeps" or \
                not isinstance(doc.get("rows"), list):
            common.fail(f"--against: {path}: not a `replay sweeps` result (field 'benchmark' or 'rows')")
        for i, r in enumerate(doc["rows"]):
            ok = isinstance(r, dict) and isinstance(r.get("sweep"), str) and isinstance(r.get("case"), str) and \
                isinstance(r.get("arachne_tok_s"), (int, float)) and not isinstance(r.get("arachne_tok_s"), bool)
            if not ok:
                common.fail(f"--against: {path}: rows[{i}]: needs 'sweep', 'case' and a number 'arachne_tok_s'")
            out[r["sweep"], r["case"]] = float(r["arachne_tok_s"])
    return out


def moved_cases(rows: list[dict[str, Any]], before: dict[tuple[str, str], float]) -> dict[str, Any]:
    """The replayed cases whose throughput moved from ``before`` (:data:`MOVED`), the worst first, with counts and
    the geomean ratio over the cases both have."""
    both = [(r, before[r["sweep"], r["case"]]) for r in rows if (r["sweep"], r["case"]) in before]
    moved = []
    for r, old in both:
        new = r["arachne_tok_s"]
        if abs(new - old) > MOVED * max(old, new, 1e-12):
            base = r["best_baseline_tok_s"]
            moved.append({"case": f"{r['sweep']}/{r['case']}", "before": old / base, "after": new / base,
                          "change": new / old if old > 0 else math.inf})
    moved.sort(key=lambda m: m["change"])
    ratio = lambda v, r: v / r["best_baseline_tok_s"]  # noqa: E731
    pos = [(ratio(old, r), r["ratio"]) for r, old in both if old > 0 and r["ratio"] > 0]
    return {"cases": len(both), "missing": len(rows) - len(both), "up": sum(m["change"] > 1 for m in moved),
            "down": sum(m["change"] < 1 for m in moved),
            "geomean_before": common.gmean([b for b, _ in pos]) if pos else None,
            "geomean_after": common.gmean([a for _, a in pos]) if pos else None,
            "new_below_0.99": [m["case"] for m in moved if m["after"] < 0.99 <= m["before"]],
            "moved": moved}


def sweeps(a) -> None:
    before = read_against(getattr(a, "against", None) or [])
    try:
        options = json.loads(a.options)
        assert isinstance(options, dict)
    except (ValueError, AssertionError):
        common.fail(f"--options: {a.options!r} is not a JSON object")
    if getattr(a, "runtime", None) is not None:
        from arachne.errors import InputError
        from arachne.spec.runtimes import runtime_preset

        try:
            runtime_preset(a.runtime)
        except InputError as exc:
            common.fail(str(exc))
    loaded = common.load_sweeps(a.sweeps, kind="robustness")
    only = {c for c in a.cases.split(",") if c}
    unknown = sorted(only - {c["name"] for s in loaded for c in s.cases})
    if unknown:
        common.fail(f"--cases: {', '.join(unknown)} not in the given sweeps")
    rows = []
    for sweep in loaded:
        best, stored = sweep.best_baselines(), sweep.ratios()
        for case in sweep.cases:
            name = case["name"]
            if name not in best or not case["model_state_fits"] or (only and name not in only):
                continue
            cl = sweep.cluster(name)
            r = plan_arachne(cl, case["model"], Job(global_batch_size=case["gbs"], sequence_length=case["seq"]),
                             a.budget, getattr(a, "runtime", None), **options)
            rows.append({"sweep": sweep.name, "case": name, "gpus": cl.num_gpus, "model": case["model"],
                         "arachne_tok_s": r["tokens_per_s"], "best_baseline": best[name][1],
                         "best_baseline_tok_s": best[name][0], "ratio": r["tokens_per_s"] / best[name][0],
                         "stored_ratio": stored.get(name), "wall_s": r["wall_s"], "work_s": r["work_s"],
                         "guard_expired": r.get("guard_expired"), "valid": r["valid"]})
            common.console.print(f"{sweep.name}/{name}: {rows[-1]['ratio']:.3f}", highlight=False)
    summary = [{"sweeps": s.name, **common.ratio_stats([r["ratio"] for r in rows if r["sweep"] == s.name])}
               for s in loaded]
    total = {"sweeps": "all", **common.ratio_stats([r["ratio"] for r in rows])}
    summary.append(total)
    invalid = [f"{r['sweep']}/{r['case']}" for r in rows if r["valid"] is False]
    low = [(f"{r['sweep']}/{r['case']}", round(r["ratio"], 3)) for r in rows if r["ratio"] < 0.99]
    common.print_table(f"arachne re-planned vs the best stored baseline, options {json.dumps(options)}", summary)
    common.console.print(f"{common.ratio_line(total)}; below 0.99: {low}; invalid plans: {invalid or 'none'}",
                         highlight=False)
    common.console.print("the baselines are as stored, priced by the cost model of each sweep's commit: a check "
                         "against regressions, not a measure (`sweep run --reuse NAME` re-runs every planner)",
                         highlight=False)
    if before:
        against = moved_cases(rows, before)
        if against["moved"]:
            common.print_table("cases that moved from --against (ratio to the best stored baseline)",
                               against["moved"], ["case", "before", "after", "change"])
        common.console.print(f"against {', '.join(map(str, a.against))}: {against['cases']} cases in both "
                             f"({against['missing']} new), {against['up']} up, {against['down']} down; geomean "
                             f"{against['geomean_before'] or 0:.4f} -> {against['geomean_after'] or 0:.4f}; "
                             f"newly below 0.99: {against['new_below_0.99'] or 'none'}", highlight=False)
        rows = [{**r, "before_tok_s": before.get((r["sweep"], r["case"]))} for r in rows]
    if rows:  # (what moved goes with the parameters: the summary's last row is "all", as the report reads it)
        moved = {"files": [str(f) for f in a.against], **{k: v for k, v in against.items() if k != "moved"}} \
            if before else None
        common.write_result(a.out, a.name, rows, summary, {"options": options, "budget": a.budget, "against": moved,
                                                           "runtime": getattr(a, "runtime", None),
                                                           "sweeps": [s.name for s in loaded]},
                            benchmark="replay-sweeps")


def grid(a) -> None:
    """arachne's throughput over the best baseline's, per case of the planners grid, with the ceiling."""
    (sweep,) = common.load_sweeps([a.grid or common.newest_stored("grid")], kind="grid")
    rows = [dict(r) for r in sweep.runs]
    by_name = {c.name: c for c in common.GRID_CASES}
    if a.rerun_arachne:  # re-plan arachne's rows with the current code; baselines' rows stay as measured
        for r in rows:
            if r["planner"] == "arachne" and r["case"] in by_name:
                c = by_name[r["case"]]
                res = plan_arachne(common.grid_cluster(c.cluster, list(c.groups)), c.model,
                                   Job(global_batch_size=c.gbs, sequence_length=c.seq), a.budget)
                r["tokens_per_s"], r["planning_time_s"] = res["tokens_per_s"], res["wall_s"]
    cases: dict[str, dict[str, Any]] = {}
    for r in rows:
        c = cases.setdefault(r["case"], {"case": r["case"], "model": r["model"], "gpus": r["gpus"], "arachne": 0.0,
                                         "best_baseline": 0.0, "baseline": "-", "arachne_s": 0.0, "baseline_s": 0.0})
        tps = r["tokens_per_s"] or 0.0
        if r["planner"] == "arachne":
            c["arachne"], c["arachne_s"] = tps, r["planning_time_s"]
        elif r["planner"] != "exhaustive" and tps > c["best_baseline"]:
            c["best_baseline"], c["baseline"], c["baseline_s"] = tps, r["planner"], r["planning_time_s"]
    out = []
    for c in cases.values():
        if c["best_baseline"] <= 0 and c["arachne"] <= 0:
            continue
        c["ratio"] = c["arachne"] / c["best_baseline"] if c["best_baseline"] > 0 else float("inf")
        c["moe"] = model_catalog().get(c["model"]).is_moe
        if c["case"] in by_name:  # the compute ceiling: what no plan can beat on this cost model
            g = by_name[c["case"]]
            cl = common.grid_cluster(g.cluster, list(g.groups))
            ceil = throughput_ceiling(CostModel(cl), model_catalog().get(g.model), g.gbs, g.seq).tokens_per_s
            c["ceiling"] = ceil
            c["ceiling_over_baseline"] = ceil / c["best_baseline"] if c["best_baseline"] > 0 else float("inf")
            c["arachne_of_ceiling"] = c["arachne"] / ceil
        out.append(c)
    common.print_table("arachne vs the best baseline per grid case (common cost model)", out,
                       ["case", "gpus", "baseline", "ratio", "ceiling_over_baseline", "arachne_of_ceiling"])
    summary = []
    for label, sel in (("all", out), ("dense", [c for c in out if not c["moe"]]), ("MoE", [c for c in out if c["moe"]])):
        finite = [c["ratio"] for c in sel if math.isfinite(c["ratio"])]
        heads = [c["ceiling_over_baseline"] for c in sel if math.isfinite(c.get("ceiling_over_baseline", math.inf))]
        s = {"models": label, **common.ratio_stats(finite),
             "ceiling/baseline": common.gmean(heads), "below 2x": sum(h < 2 for h in heads),
             "arachne/ceiling": common.gmean([c["arachne_of_ceiling"] for c in sel if "ceiling" in c])}
        summary.append(s)
    common.print_table("arachne / best baseline (geomean, min, counts) and the compute ceiling", summary)
    common.write_result(a.out, "grid", out, summary, {"grid": sweep.source, "rerun_arachne": a.rerun_arachne,
                                                      "budget": a.budget}, benchmark="replay-grid")


def ceiling(a) -> None:
    rows = []
    for sweep in common.load_sweeps(a.sweeps, kind="robustness"):
        best, mine = sweep.best_baselines(), sweep.arachne_runs()
        for case in sweep.cases:
            name = case["name"]
            tok = (mine.get(name) or {}).get("tokens_per_s")
            if name not in best or not tok:
                continue
            cl = sweep.cluster(name)
            model = model_catalog().get(case["model"])
            ceil = throughput_ceiling(CostModel(cl), model, case["gbs"], case["seq"]).tokens_per_s
            rows.append({"case": f"{sweep.name}/{name}", "model": model.name, "moe": model.is_moe, "gpus": cl.num_gpus,
                         "arachne_tok_s": tok, "best_baseline_tok_s": best[name][0], "ceiling_tok_s": ceil,
                         "ceiling_over_baseline": ceil / best[name][0], "arachne_of_ceiling": tok / ceil})
    if not rows:
        common.fail("no case with both an arachne run and a baseline run")
    summary = []
    for label, sel in (("dense", [r for r in rows if not r["moe"]]), ("MoE", [r for r in rows if r["moe"]]),
                       ("all", rows)):
        if sel:
            head = [r["ceiling_over_baseline"] for r in sel]
            share = [r["arachne_of_ceiling"] for r in sel]
            summary.append({"models": label, "cases": len(sel), "ceiling/baseline": common.gmean(head),
                            "min": min(head), "max": max(head), "below 2x": sum(h < 2 for h in head),
                            "arachne/ceiling": common.gmean(share), "arachne/ceiling min": min(share)})
    common.print_table("the compute ceiling against the stored plans (geomean, range)", summary)
    bad = [r for r in rows if r["arachne_of_ceiling"] > 1 + 1e-9 or r["ceiling_over_baseline"] < 1 - 1e-9]
    if bad:  # a stored plan (arachne's or a baseline's) above the ceiling would mean it is not a bound: a bug
        common.console.print(f"[red]{len(bad)} stored plans above the ceiling: {[r['case'] for r in bad][:10]}[/red]")
    common.write_result(a.out, "ceiling", rows, summary, {"sweeps": a.sweeps}, benchmark="replay-ceiling")
    if bad:
        raise SystemExit(1)
