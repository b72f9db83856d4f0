"""``sweep``: every planner through the CLI over random production-like heterogeneous clusters.

``sweep run`` draws ``--n`` clusters with a seeded RNG (``benchmarks/problems.py``), shaped like published
production GPU inventories: 2-6 GPU generations, node sizes 1/2/4/8 mixed within a cluster (``--node-sizes
1,2,3,4,5,6,7,8`` adds odd sizes), 4 to 1024 GPUs, and in about a third of the clusters one or two GPU types
known only by their features (``gpu_types``). Each cluster gets a catalog model, a batch and a sequence length.

Every planner runs as a subprocess, one at a time (``arachne plan --planner P --time-budget S -o plan.json``),
and the plan it wrote is checked with ``arachne validate-plan``. Flags per run: crash (a traceback, a timeout,
an exit code other than 0 and 3), invalid (exit 0 but no valid plan), over-time (wall > budget + 3 s), miss
(exit 3 while another planner found a plan). ``--reuse SWEEP`` (a stored sweep's name or a runs.json) takes
the clusters and the runs of the planners not in ``--planners`` from that sweep, e.g. arachne re-run against
stored baselines. Writes ``runs.json``/``runs.csv``, ``clusters/*.yaml`` and the plans of flagged runs;
``sweep summarize`` prints the summary line over several sweeps.
"""

from __future__ import annotations

import csv
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from arachne.errors import load_yaml
from benchmarks import common
from benchmarks.common import RandomCase


@dataclass
class Run:
    case: str
    planner: str
    rc: int | None
    wall_s: float
    traceback: bool
    timed_out: bool
    tokens_per_s: float | None
    valid: bool | None
    status: str = ""            # ok / no-plan / crash / invalid
    over_time: bool = False
    miss: bool = False          # no plan, yet another planner found one
    stderr_tail: str = ""
    command: list[str] = field(default_factory=list)


def arachne_exe() -> str:
    local = Path(sys.executable).parent / "arachne"
    return str(local) if local.exists() else (shutil.which("arachne") or "arachne")


def last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def run_one(case: RandomCase, planner: str, cluster_path: Path, work: Path, budget: float) -> Run:
    out = work / f"{case.name}.{planner}.json"
    out.unlink(missing_ok=True)
    cmd = [arachne_exe(), "plan", "--cluster", str(cluster_path), "--model", case.model,
           "--global-batch-size", str(case.gbs), "--sequence-length", str(case.seq),
           "--planner", planner, "--time-budget", str(budget), "-o", str(out)]
    t0 = time.perf_counter()
    timed_out = False
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=budget + 120)
        rc, stderr = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as exc:
        timed_out, rc = True, None
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
    wall = time.perf_counter() - t0
    tb = "Traceback (most recent call last)" in stderr
    tokens, valid = None, None
    if rc == 0:
        valid = False
        if out.exists():
            try:
                tokens = float(json.loads(out.read_text())["estimate"]["tokens_per_s"])
            except (ValueError, KeyError, TypeError):
                tokens = None
            v = subprocess.run([arachne_exe(), "validate-plan", "--cluster", str(cluster_path), "--plan", str(out)],
                               capture_output=True, text=True, timeout=120)
            valid = v.returncode == 0 and tokens is not None
            if v.returncode != 0:
                stderr += "\nvalidate-plan: " + (last_line(v.stderr) or last_line(v.stdout))
                tb = tb or "Traceback (most recent call last)" in v.stderr
    if tb or timed_out or rc not in (0, 3):
        status = "crash"
    elif rc == 3:
        status = "no-plan"
    else:
        status = "ok" if valid else "invalid"
    shown = [Path(cmd[0]).name, *cmd[1:]]  # free of the temp dir: re-run against the kept cluster copy
    return Run(case=case.name, planner=planner, rc=rc, wall_s=round(wall, 3), traceback=tb, timed_out=timed_out,
               tokens_per_s=tokens, valid=valid, status=status, over_time=wall > budget + 3,
               stderr_tail=last_line(stderr) if status != "ok" else "", command=shown)


def arachne_vs_best(case_runs: list[Run]) -> tuple[float | None, str | None]:
    """arachne's tokens/s over the best baseline's (None when either has no plan), and that baseline."""
    base = {r.planner: r.tokens_per_s for r in case_runs
            if r.planner != "arachne" and r.status == "ok" and r.tokens_per_s}
    a = next((r for r in case_runs if r.planner == "arachne"), None)
    if not base:
        return None, None
    best = max(base, key=base.__getitem__)
    if a is None or a.status != "ok" or not a.tokens_per_s:
        return None, best
    return a.tokens_per_s / base[best], best


def node_sizes_of(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(sorted({int(x) for x in text.split(",")}))
    except ValueError:
        common.fail(f"--node-sizes: not a comma-separated list of integers: {text!r}")
    if not sizes or min(sizes) < 1:
        common.fail(f"--node-sizes: sizes must be >= 1: {text!r}")
    return sizes


def stored_cases(sweep: common.Sweep) -> list[tuple[RandomCase, str]]:
    """The cases of an earlier sweep with the cluster YAML it planned (not drawn again)."""
    out = []
    for c in sweep.cases:
        text = sweep.clusters.get(c["name"])
        if text is None:
            common.fail(f"{sweep.source}: the sweep's cluster is missing ({c['name']})")
        fields = {k: c[k] for k in RandomCase.__dataclass_fields__ if k != "doc"}
        out.append((RandomCase(doc=load_yaml(text), **fields), text))
    return out


def run(a) -> None:
    planners = [p.strip() for p in a.planners.split(",") if p.strip()]
    reused: dict[str, list[Run]] = {}
    if a.reuse is not None:
        (old,) = common.load_sweeps([a.reuse], kind="robustness")
        args = old.doc["args"]
        if (a.seed is not None and a.seed != args["seed"]) or (a.n is not None and a.n != args["n"]):
            common.fail(f"{a.reuse}: args.seed/args.n: the sweep was seed {args['seed']} n {args['n']}, not seed "
                        f"{a.seed} n {a.n}")
        seed, n, node_sizes = args["seed"], args["n"], tuple(args.get("node_sizes", common.NODE_SIZES))
        if a.node_sizes and node_sizes_of(a.node_sizes) != node_sizes:
            common.fail(f"{a.reuse}: args.node_sizes: the sweep drew node sizes {','.join(map(str, node_sizes))}")
        cases = stored_cases(old)
        for r in old.runs:
            if r["planner"] not in planners:
                reused.setdefault(r["case"], []).append(Run(**r))
        planners += [p for p in args["planners"] if p not in planners]
        name = f"{old.name}-rerun"  # stored under this name, the report counts it apart (report.RERUN)
    else:
        seed, n = a.seed or 0, a.n or 30
        node_sizes = node_sizes_of(a.node_sizes) if a.node_sizes else common.NODE_SIZES
        drawn = common.random_cases(seed, n, node_sizes)
        cases = [(c, yaml.safe_dump(c.doc, sort_keys=False)) for c in drawn]
        name = f"{'seed' if node_sizes == common.NODE_SIZES else 'odd'}{seed}"
    out = a.out or common.RESULTS / "sweeps" / name
    (out / "clusters").mkdir(parents=True, exist_ok=True)
    (out / "plans").mkdir(parents=True, exist_ok=True)
    runs: list[Run] = []
    ratios: dict[str, float | None] = {}
    best_of: dict[str, str | None] = {}
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="arachne-sweep-") as tmp:
        work = Path(tmp)
        for ci, (case, text) in enumerate(cases):
            cpath = work / f"{case.name}.yaml"
            cpath.write_text(text)
            shutil.copy(cpath, out / "clusters" / cpath.name)
            common.console.print(f"[{ci + 1}/{len(cases)}] {case.name}: {case.num_gpus} GPUs, {', '.join(case.types)};"
                                 f" {case.model} gbs {case.gbs} seq {case.seq}", highlight=False)
            case_runs = list(reused.get(case.name, []))
            for planner in planners:
                if any(r.planner == planner for r in case_runs):
                    continue
                r = run_one(case, planner, cpath, work, a.budget)
                r.command[r.command.index("--cluster") + 1] = str(out / "clusters" / cpath.name)
                r.command[r.command.index("-o") + 1] = str(out / "plans" / f"{case.name}.{planner}.json")
                case_runs.append(r)
                if r.status != "ok" or r.over_time:
                    common.console.print(f"    {planner}: {r.status} rc={r.rc} {r.wall_s:.1f}s {r.stderr_tail}",
                                         highlight=False, markup=False)
            found = any(r.status == "ok" for r in case_runs)
            ratios[case.name], best_of[case.name] = arachne_vs_best(case_runs)
            for r in case_runs:
                r.miss = r.status == "no-plan" and found
                plan_file = work / f"{case.name}.{r.planner}.json"
                keep = r.status != "ok" or r.miss or r.over_time or r.planner in ("arachne", best_of[case.name])
                if keep and plan_file.exists():
                    shutil.copy(plan_file, out / "plans" / plan_file.name)
            runs.extend(case_runs)
    elapsed = time.perf_counter() - t_start
    by_case: dict[str, dict[str, Run]] = {}
    for r in runs:
        by_case.setdefault(r.case, {})[r.planner] = r

    rows = []
    for case, _ in cases:
        a_run = by_case[case.name].get("arachne")
        best = best_of[case.name]
        rows.append({"case": case.name, "gpus": case.num_gpus, "model": case.model,
                     "arachne": a_run.status if a_run else "-", "best baseline": best or "-",
                     "arachne/best": ratios[case.name]})
    common.print_table(f"sweep seed {seed}: {len(cases)} clusters x {len(planners)} planners, budget {a.budget:g} s",
                       rows)
    summary = {}
    for p in planners:
        rs = [r for r in runs if r.planner == p]
        walls = [r.wall_s for r in rs]
        summary[p] = {"runs": len(rs), "ok": sum(r.status == "ok" for r in rs),
                      "no_plan": sum(r.status == "no-plan" for r in rs), "miss": sum(r.miss for r in rs),
                      "crashes": sum(r.status == "crash" for r in rs),
                      "invalid": sum(r.status == "invalid" for r in rs), "over_time": sum(r.over_time for r in rs),
                      "median_s": round(statistics.median(walls), 2) if walls else None,
                      "max_s": round(max(walls), 2) if walls else None}
    common.print_table(f"per planner (total {elapsed / 60:.1f} min)", [{"planner": p, **s} for p, s in summary.items()])
    for r in runs:
        if r.status in ("crash", "invalid") or r.over_time or r.miss:
            common.console.print(f"FLAG {r.case} {r.planner}: {r.status}{' over-time' if r.over_time else ''}"
                                 f"{' miss' if r.miss else ''} rc={r.rc} {r.wall_s:.1f}s: {r.stderr_tail}",
                                 highlight=False, markup=False)
    common.console.print(common.ratio_line(common.ratio_stats(list(ratios.values()))), highlight=False)
    worse = {c: v for c, v in ratios.items() if v is not None and v < 0.99}
    for c, v in worse.items():
        common.console.print(f"ARACHNE WORSE {c}: {v:.3f}x {best_of[c]} ({out / 'clusters' / (c + '.yaml')})",
                             highlight=False)

    fields = [f for f in Run.__dataclass_fields__ if f != "command"]
    with open(out / "runs.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        for r in runs:
            w.writerow({k: v for k, v in asdict(r).items() if k in fields})
    doc = {"format": common.RESULT_FORMAT, "benchmark": "sweep", "command": common.command_line(),
           "commit": common.git_commit(), "date": common.today(), "machine": common.machine(),
           "args": {"n": n, "seed": seed, "budget": a.budget, "planners": planners, "node_sizes": list(node_sizes),
                    "reused_from": str(a.reuse) if a.reuse else None},
           "elapsed_s": round(elapsed, 1), "summary": summary,
           "cases": [{**{k: v for k, v in asdict(c).items() if k != "doc"},
                      "cluster_file": str(out / "clusters" / f"{c.name}.yaml"),
                      "arachne_vs_best_baseline": ratios[c.name], "best_baseline": best_of[c.name]}
                     for c, _ in cases],
           "runs": [asdict(r) for r in runs],
           "arachne_worse_than_best_baseline": worse}
    (out / "runs.json").write_text(json.dumps(doc, indent=2))
    common.console.print(f"wrote {out / 'runs.json'}, runs.csv and {len(cases)} clusters in {out / 'clusters'}; "
                         f"keep it with `python -m benchmarks store add {out} --name NAME`", highlight=False)


def summarize(a) -> None:
    """The summary line over several sweeps (e.g. one per seed), plus their worst cases."""
    ratios, worst = [], []
    for sweep in common.load_sweeps(a.sweeps, kind="robustness"):
        for case, v in sweep.ratios().items():
            ratios.append(v)
            if v is not None:
                worst.append((v, f"{sweep.name}/{case}", sweep.best_baselines()[case][1]))
        walls = [r["wall_s"] for r in sweep.runs if r["planner"] == "arachne"]
        if walls:
            common.console.print(f"{sweep.source}: arachne wall time median {statistics.median(walls):.2f} s, "
                                 f"max {max(walls):.2f} s", highlight=False)
    common.console.print(common.ratio_line(common.ratio_stats(ratios)), highlight=False)
    for v, name, base in sorted(worst)[:3]:
        common.console.print(f"  {name}: {v:.3f}x {base}", highlight=False)
