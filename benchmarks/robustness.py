"""Robustness sweep of ``arachne plan`` over random production-like heterogeneous clusters.

Usage:
    python benchmarks/robustness.py [--n 30] [--seed 0] [--budget 5] [--out results/robustness]
                                    [--planners arachne,megatron,...] [--reuse OLD/runs.json]
    python benchmarks/robustness.py --summarize DIR1/runs.json DIR2/runs.json ...   # several sweeps in one line

Draws ``--n`` clusters with a seeded RNG, shaped like published production GPU inventories: 2-6 GPU
generations from the catalog (Pascal/Volta/Turing leftovers, consumer RTX, A10/A10G/L4/L40S,
A100-40/80, H100/H200, ...), node sizes 1/2/4/8 mixed within a cluster (a type may come in nodes of
2 and of 8), 4 to 1024 GPUs in all, and in about a third of the clusters one or two GPU types that
are known only by their features (declared in ``gpu_types``). Each cluster gets a catalog model
(dense or MoE, 350M to 140B), a global batch size and a sequence length.

Every planner is run as a subprocess, one at a time (``arachne plan --planner P --time-budget S -o
plan.json``), then the plan it wrote is checked with ``arachne validate-plan``. Per run it records
the exit code, wall time, whether stderr holds a Python traceback, tokens/s from the plan's
``estimate`` and whether the plan validates. Flags:

* crash: a traceback, a timeout, or an exit code other than 0 (plan) and 3 (no feasible plan);
* invalid: exit 0 but the written plan is missing or does not validate;
* over-time: wall time above budget + 3 s;
* miss: exit 3 while another planner found a plan (for arachne this is a bug worth a look);
* exit 3 on a cluster whose total memory cannot hold the model state is "infeasible" (expected);
* arachne-worse: arachne's tokens/s more than 1% below the best baseline's.

Writes ``runs.csv``, ``runs.json`` and ``clusters/*.yaml`` (every cluster, so any case can be re-run
with the command stored in ``runs.json``) under ``--out``, plus the plans of flagged runs in
``plans/``, and prints rich tables on stderr.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from arachne.cost.calibration import DEFAULT_CALIBRATION
from arachne.cost.memory import state_bytes_per_param
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.gpus import gpu_catalog
from arachne.spec.model import ModelSpec, model_catalog

console = Console(stderr=True, width=None if sys.stderr.isatty() else 220)

PLANNERS = ["arachne", "megatron", "megatron-oblivious", "amp", "metis", "flashflex", "sailor"]
NODE_SIZES = (1, 2, 4, 8)
MAX_GPUS = 1024

# Catalog GPUs by era, with the weight of being drawn (old/cheap ones are common in real fleets).
GPU_POOL: dict[str, float] = {
    "P100": 1.0, "V100-16": 1.5, "V100-32": 1.0, "T4": 1.5, "RTX-2080-Ti": 0.5, "Titan-RTX": 0.4,
    "RTX-3090": 0.8, "RTX-4090": 0.8, "A10": 1.0, "A10G": 1.0, "L4": 1.0, "L40S": 0.8,
    "A100-40": 1.5, "A100-80": 1.5, "A100-PCIE-40": 0.5, "A800": 0.5, "H100": 1.5, "H100-PCIe": 0.5,
    "H800": 0.5, "H20": 0.4, "H200": 0.8, "GH200": 0.4, "B200": 0.3, "MI250X": 0.3, "MI300X": 0.3,
}
# GPUs usually sold in 8-GPU boards (their nodes are mostly 8; smaller ones are cloud slices).
BOARD_GPUS = {"V100-16", "V100-32", "A100-40", "A100-80", "A800", "H100", "H800", "H20", "H200", "B200",
              "MI300X"}

# Real products missing from the catalog, described by their features only (figures approximate).
CUSTOM_PRODUCTS: list[dict[str, Any]] = [
    {"name": "K80-die", "memory_gb": 12, "peak_tflops": 4.4, "memory_bandwidth_gbps": 240,
     "intra_node_gbps": 16, "inter_node_gbps": 1.25, "bf16": False, "intra_node_link": "pcie"},
    {"name": "A30-24GB", "memory_gb": 24, "peak_tflops": 165, "memory_bandwidth_gbps": 933,
     "intra_node_gbps": 64, "inter_node_gbps": 12.5, "intra_node_link": "pcie"},
    {"name": "A40-48GB", "memory_gb": 48, "peak_tflops": 149.7, "memory_bandwidth_gbps": 696,
     "intra_node_gbps": 64, "inter_node_gbps": 12.5, "intra_node_link": "pcie"},
    {"name": "RTX-A6000", "memory_gb": 48, "peak_tflops": 154.8, "memory_bandwidth_gbps": 768,
     "intra_node_gbps": 64, "inter_node_gbps": 3.125, "intra_node_link": "pcie"},
    {"name": "MI210", "memory_gb": 64, "peak_tflops": 181, "memory_bandwidth_gbps": 1638,
     "intra_node_gbps": 300, "inter_node_gbps": 25, "intra_node_link": "xgmi"},
    {"name": "Gaudi2-HL225", "memory_gb": 96, "peak_tflops": 432, "memory_bandwidth_gbps": 2450,
     "intra_node_gbps": 600, "inter_node_gbps": 300, "intra_node_link": "other"},
    {"name": "L20-48GB", "memory_gb": 48, "peak_tflops": 119.5, "memory_bandwidth_gbps": 864,
     "intra_node_gbps": 64, "inter_node_gbps": 25, "intra_node_link": "pcie"},
    {"name": "Quadro-RTX-8000", "memory_gb": 48, "peak_tflops": 130, "memory_bandwidth_gbps": 672,
     "intra_node_gbps": 32, "inter_node_gbps": 3.125, "bf16": False, "intra_node_link": "pcie"},
]


# --------------------------------------------------------------------------------------------
# case generation
# --------------------------------------------------------------------------------------------

@dataclass
class Case:
    name: str
    doc: dict[str, Any]
    model: str
    gbs: int
    seq: int
    num_gpus: int
    types: list[str]
    custom_types: list[str]
    node_sizes: dict[str, list[int]]
    model_state_fits: bool   # the cluster's total memory can hold weights + grads + optimizer state


def random_custom_type(rng: random.Random, k: int, node_sizes: tuple[int, ...] = NODE_SIZES) -> dict[str, Any]:
    """A GPU type known by its features only: a real product missing from the catalog, or a synthetic one."""
    if rng.random() < 0.6:
        t = dict(rng.choice(CUSTOM_PRODUCTS))
    else:
        mem = rng.choice([16, 24, 32, 40, 48, 64, 96, 128])
        link = rng.choice(["pcie", "pcie", "nvlink", "xgmi", "other"])
        t = {"name": f"Accel-{rng.randrange(16 ** 4):04x}-{mem}G", "memory_gb": mem,
             "peak_tflops": round(math.exp(rng.uniform(math.log(20), math.log(1500))), 1),
             "memory_bandwidth_gbps": round(math.exp(rng.uniform(math.log(250), math.log(5000)))),
             "intra_node_gbps": rng.choice([16, 32, 64, 128] if link == "pcie" else [200, 300, 600, 900]),
             "inter_node_gbps": rng.choice([1.25, 3.125, 6.25, 12.5, 25, 50, 100, 200]),
             "intra_node_link": link}
        if rng.random() < 0.3:
            t["bf16"] = False
    if rng.random() < 0.5:
        t["gpus_per_node"] = rng.choice(node_sizes)
    if rng.random() < 0.2:
        t["nics_per_node"] = rng.choice([1, 2, 4])
    t["name"] = f"{t['name']}-c{k}"   # unique per cluster, never a catalog name
    return t


def model_state_bytes(model: ModelSpec, num_gpus: int, precision: str = "bf16") -> float:
    """The lower bound ``run_planner`` reports: one copy of the model state plus per-GPU overhead."""
    cal = DEFAULT_CALIBRATION.memory
    w, g, o = state_bytes_per_param(precision, cal)
    extra = cal.fp32_grad_buffer if precision == "fp32" else 0.0
    overhead = (cal.fp32_overhead_bytes if precision == "fp32" else cal.mixed_overhead_bytes) * num_gpus
    return model.num_params * (w + g + o + extra) + overhead


def random_case(rng: random.Random, index: int, node_sizes: tuple[int, ...] = NODE_SIZES) -> Case:
    """One cluster document with a model and a job (node sizes drawn from ``node_sizes``)."""
    catalog = gpu_catalog()
    n_types = rng.randint(2, 6)
    names = list(GPU_POOL)
    chosen: list[str] = []
    while len(chosen) < n_types:
        g = rng.choices(names, weights=[GPU_POOL[n] for n in names])[0]
        if g not in chosen:
            chosen.append(g)
    customs: list[dict[str, Any]] = []
    if rng.random() < 1 / 3:
        for k in range(min(rng.choice([1, 1, 2]), n_types)):
            customs.append(random_custom_type(rng, k, node_sizes))
            chosen[k] = customs[-1]["name"]
    custom_by_name = {c["name"]: c for c in customs}

    def default_size_of(gpu: str) -> int:
        return custom_by_name[gpu].get("gpus_per_node", 8) if gpu in custom_by_name else catalog.get(gpu).gpus_per_node

    def gpus(group: dict[str, Any]) -> int:
        return group["count"] * group.get("gpus_per_node", default_size_of(group["gpu"]))

    target = round(math.exp(rng.uniform(math.log(4), math.log(MAX_GPUS))))
    weights = [rng.uniform(0.2, 1.0) for _ in chosen]
    groups: list[dict[str, Any]] = []
    sizes_of: dict[str, list[int]] = {}
    for t, (gpu, w) in enumerate(zip(chosen, weights)):
        share = target * w / sum(weights)
        if gpu in BOARD_GPUS and rng.random() < 0.7:
            sizes = [8] if rng.random() < 0.6 else [8, rng.choice([n for n in node_sizes if n != 8] or [8])]
        else:
            sizes = rng.sample(node_sizes, rng.choice([1, 1, 2]))
        sizes = sorted(set(sizes))
        sizes_of[gpu] = sizes
        for size in sizes:
            count = max(1, round(share / len(sizes) / size))
            entry: dict[str, Any] = {"name": f"{gpu.lower()}-x{size}-{{i}}", "count": count, "gpu": gpu}
            if size != default_size_of(gpu) or rng.random() < 0.7:   # sometimes rely on the type's default
                entry["gpus_per_node"] = size
            if rng.random() < 0.35:
                entry["inter_node_gbps"] = rng.choice([1.25, 3.125, 6.25, 12.5, 25, 50, 100])
            if rng.random() < 0.1:
                entry["intra_node_gbps"] = rng.choice([32, 64, 300])
            if rng.random() < 0.3:
                entry["zone"] = f"row-{t}"
            if count == 1 and rng.random() < 0.3:            # a lone node named without {i}
                entry["name"] = f"{gpu.lower()}-x{size}-solo"
            groups.append(entry)

    while sum(map(gpus, groups)) > MAX_GPUS:   # trim the biggest group
        max((g for g in groups if g["count"] > 1), key=gpus)["count"] -= 1
    while sum(map(gpus, groups)) < 4:
        g = rng.choice(groups)
        g["count"] += 1
        if "{i}" not in g["name"]:
            g["name"] = g["name"].replace("-solo", "-{i}")
    doc: dict[str, Any] = {"name": f"rob-{index:03d}", "nodes": groups}
    if customs:
        doc["gpu_types"] = customs
    if rng.random() < 0.4:
        rng.shuffle(doc["nodes"])

    cluster = cluster_from_dict(doc, doc["name"])  # fail here, not in the CLI, if the generator is wrong
    have = cluster.total_memory_bytes
    models = model_catalog().models
    roomy = [m for m in models if model_state_bytes(m, cluster.num_gpus) <= 0.6 * have]
    model = rng.choice(roomy if roomy and rng.random() < 0.85 else models)
    seqs = [s for s in (512, 1024, 2048, 3072, 4096, 8192) if s <= model.max_sequence_length]
    seq = rng.choice(seqs)
    gbs = rng.choice([16, 32, 64, 96, 128, 256, 384, 512, 1000, 1024, 2048])
    if gbs < cluster.num_gpus // 8 and rng.random() < 0.7:   # large clusters usually train big batches
        gbs = 2 ** math.ceil(math.log2(cluster.num_gpus))
    full = {g: (g if g in custom_by_name else catalog.get(g).name) for g in chosen}
    types = [f"{g}x{cluster.gpu_counts[full[g]]}" for g in chosen]   # short name x GPU count
    return Case(name=doc["name"], doc=doc, model=model.name, gbs=gbs, seq=seq, num_gpus=cluster.num_gpus,
                types=types, custom_types=[c["name"] for c in customs],
                node_sizes=sizes_of,
                model_state_fits=model_state_bytes(model, cluster.num_gpus) <= have)


# --------------------------------------------------------------------------------------------
# running
# --------------------------------------------------------------------------------------------

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


def run_one(case: Case, planner: str, cluster_path: Path, work: Path, budget: float) -> Run:
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
    # keep the display command free of the temp dir: it is re-run against the kept cluster copy
    shown = [Path(cmd[0]).name, *cmd[1:]]
    return Run(case=case.name, planner=planner, rc=rc, wall_s=round(wall, 3), traceback=tb, timed_out=timed_out,
               tokens_per_s=tokens, valid=valid, status=status, over_time=wall > budget + 3,
               stderr_tail=last_line(stderr) if status != "ok" else "", command=shown)


# --------------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------------

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


def fmt_tok(run: Run | None) -> str:
    if run is None:
        return "-"
    mark = {"ok": "", "no-plan": "no plan", "crash": "[red]CRASH[/red]", "invalid": "[red]INVALID[/red]"}[run.status]
    text = f"{run.tokens_per_s / 1e3:,.1f}k" if run.status == "ok" and run.tokens_per_s else mark
    if run.miss:
        text = "[yellow]no plan*[/yellow]"
    if run.over_time:
        text += " [magenta]slow[/magenta]"
    return text


def ratio_summary(ratios: list[float | None]) -> str:
    """One line: arachne over the best baseline, over the cases where both found a plan."""
    xs = [r for r in ratios if r is not None and r > 0]
    if not xs:
        return "arachne vs the best baseline: no case where both found a plan"
    g = math.exp(sum(math.log(x) for x in xs) / len(xs))
    return (f"arachne vs the best baseline over {len(xs)} cases: geomean {g:.3f}, min {min(xs):.3f}, "
            f">= 0.99x on {sum(x >= 0.99 for x in xs)}/{len(xs)}, >= 1.0x on {sum(x >= 1.0 for x in xs)}/{len(xs)}")


def fail(message: str) -> None:
    """Bad input: one line on stderr, exit code 2."""
    print(message, file=sys.stderr)
    raise SystemExit(2)


def read_runs(path: Path) -> dict:
    """A sweep's runs.json; a missing or foreign file ends the script with one line."""
    try:
        doc = json.loads(path.read_text())
        doc["args"], doc["runs"]  # noqa: B018 -- the keys every use needs
        return doc
    except (OSError, ValueError, KeyError, TypeError) as e:
        fail(f"{path}: not a runs.json written by this script ({e})")


def summarize(paths: list[Path]) -> None:
    """The summary line over several sweeps' runs.json (e.g. one per seed), plus their worst cases."""
    ratios, worst = [], []
    for path in paths:
        doc = read_runs(path)
        for c in doc["cases"]:
            ratios.append(c["arachne_vs_best_baseline"])
            if c["arachne_vs_best_baseline"] is not None:
                worst.append((c["arachne_vs_best_baseline"], f"{path.parent.name}/{c['name']}", c["best_baseline"]))
        walls = [r["wall_s"] for r in doc["runs"] if r["planner"] == "arachne"]
        if walls:
            console.print(f"{path}: arachne wall time median {statistics.median(walls):.2f} s, "
                          f"max {max(walls):.2f} s", highlight=False)
    console.print(ratio_summary(ratios), highlight=False)
    for v, name, base in sorted(worst)[:3]:
        console.print(f"  {name}: {v:.3f}x {base}", highlight=False)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--summarize":
        summarize([Path(a) for a in sys.argv[2:]])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=30, help="number of random clusters (default 30)")
    ap.add_argument("--seed", type=int, default=0, help="RNG seed (default 0)")
    ap.add_argument("--budget", type=float, default=5.0, help="--time-budget per planner run, seconds (default 5)")
    ap.add_argument("--out", type=Path, default=Path("results/robustness"), help="output directory")
    ap.add_argument("--planners", default=",".join(PLANNERS), help="comma-separated planners")
    ap.add_argument("--reuse", type=Path, default=None,
                    help="runs.json of an earlier sweep with the same --seed and --n: the runs of planners not in "
                         "--planners are taken from it (e.g. re-run arachne only, against stored baselines)")
    ap.add_argument("--node-sizes", default=",".join(map(str, NODE_SIZES)),
                    help="GPUs per node to draw from, comma-separated (default 1,2,4,8; 1,2,3,4,5,6,7,8 adds odd sizes)")
    args = ap.parse_args()
    try:
        node_sizes = tuple(sorted({int(x) for x in args.node_sizes.split(",")}))
    except ValueError:
        fail(f"--node-sizes: not a comma-separated list of integers: {args.node_sizes!r}")
    if not node_sizes or min(node_sizes) < 1:
        fail(f"--node-sizes: sizes must be >= 1: {args.node_sizes!r}")
    planners = [p.strip() for p in args.planners.split(",") if p.strip()]
    reused: dict[str, list[Run]] = {}
    if args.reuse is not None:
        old = read_runs(args.reuse)
        if (old["args"]["seed"], old["args"]["n"]) != (args.seed, args.n):
            fail(f"{args.reuse}: args.seed/args.n: the sweep was seed {old['args']['seed']} n "
                 f"{old['args']['n']}, not seed {args.seed} n {args.n}")
        old_sizes = tuple(old["args"].get("node_sizes", NODE_SIZES))
        if old_sizes != node_sizes:
            fail(f"{args.reuse}: args.node_sizes: the sweep drew node sizes {','.join(map(str, old_sizes))}, "
                 f"pass --node-sizes {','.join(map(str, old_sizes))}")
        for r in old["runs"]:
            if r["planner"] not in planners:
                reused.setdefault(r["case"], []).append(Run(**r))
        planners += [p for p in old["args"]["planners"] if p not in planners]

    rng = random.Random(args.seed)
    cases = [random_case(rng, i, node_sizes) for i in range(args.n)]
    out = args.out
    (out / "clusters").mkdir(parents=True, exist_ok=True)
    (out / "plans").mkdir(parents=True, exist_ok=True)
    runs: list[Run] = []
    ratios: dict[str, float | None] = {}   # arachne tokens/s over the best baseline's, per case
    best_of: dict[str, str | None] = {}     # the best baseline, per case
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="arachne-robustness-") as tmp:
        work = Path(tmp)
        for ci, case in enumerate(cases):
            cpath = work / f"{case.name}.yaml"
            cpath.write_text(yaml.safe_dump(case.doc, sort_keys=False))
            shutil.copy(cpath, out / "clusters" / cpath.name)
            console.print(f"[{ci + 1}/{len(cases)}] {case.name}: {case.num_gpus} GPUs, {', '.join(case.types)}; "
                          f"{case.model} gbs {case.gbs} seq {case.seq}", highlight=False)
            case_runs = list(reused.get(case.name, []))
            for planner in planners:
                if any(r.planner == planner for r in case_runs):
                    continue
                r = run_one(case, planner, cpath, work, args.budget)
                r.command[r.command.index("--cluster") + 1] = str(out / "clusters" / cpath.name)
                r.command[r.command.index("-o") + 1] = str(out / "plans" / f"{case.name}.{planner}.json")
                case_runs.append(r)
                if r.status != "ok" or r.over_time:
                    console.print(f"    {planner}: {r.status} rc={r.rc} {r.wall_s:.1f}s {r.stderr_tail}",
                                  highlight=False, markup=False)
            found = any(r.status == "ok" for r in case_runs)
            ratios[case.name], best = arachne_vs_best(case_runs)
            best_of[case.name] = best
            for r in case_runs:
                r.miss = r.status == "no-plan" and found
                plan_file = work / f"{case.name}.{r.planner}.json"
                keep = r.status != "ok" or r.miss or r.over_time or r.planner == "arachne" or r.planner == best
                if keep and plan_file.exists():
                    shutil.copy(plan_file, out / "plans" / plan_file.name)
            runs.extend(case_runs)
    elapsed = time.perf_counter() - t_start
    by_case: dict[str, dict[str, Run]] = {}
    for r in runs:
        by_case.setdefault(r.case, {})[r.planner] = r

    # per-case table
    t = Table(title=f"Robustness sweep: {len(cases)} clusters x {len(planners)} planners, budget {args.budget:g} s "
                    f"(tokens/s; * = no plan though another planner found one; cyan = gpu_types)")
    for col in ("case", "GPUs", "types", "model", "gbs x seq", *planners, "arachne/best"):
        t.add_column(col, overflow="fold")
    for case in cases:
        rs = by_case[case.name]
        ratio = ratios[case.name]
        rtxt = "-" if ratio is None else (f"[red]{ratio:.3f}[/red]" if ratio < 0.99 else f"{ratio:.3f}")
        types = ", ".join(f"[cyan]{g}[/cyan]" if g.rsplit("x", 1)[0] in case.custom_types else g for g in case.types)
        t.add_row(case.name, str(case.num_gpus), types, case.model + ("" if case.model_state_fits else " (too big)"),
                  f"{case.gbs}x{case.seq}", *(fmt_tok(rs.get(p)) for p in planners), rtxt)
    console.print(t)

    # per-planner summary
    s = Table(title=f"Per planner (total {elapsed / 60:.1f} min)")
    for col in ("planner", "runs", "ok", "no-plan", "(miss)", "crashes", "invalid", "over-time", "median s", "max s"):
        s.add_column(col, justify="right" if col != "planner" else "left")
    summary = {}
    for p in planners:
        rs = [r for r in runs if r.planner == p]
        walls = [r.wall_s for r in rs]
        row = {"runs": len(rs), "ok": sum(r.status == "ok" for r in rs),
               "no_plan": sum(r.status == "no-plan" for r in rs), "miss": sum(r.miss for r in rs),
               "crashes": sum(r.status == "crash" for r in rs), "invalid": sum(r.status == "invalid" for r in rs),
               "over_time": sum(r.over_time for r in rs),
               "median_s": round(statistics.median(walls), 2) if walls else None,
               "max_s": round(max(walls), 2) if walls else None}
        summary[p] = row
        s.add_row(p, *(str(v) for v in row.values()))
    console.print(s)

    flagged = [r for r in runs if r.status in ("crash", "invalid") or r.over_time or r.miss]
    for r in flagged:
        console.print(f"FLAG {r.case} {r.planner}: {r.status}{' over-time' if r.over_time else ''}"
                      f"{' miss' if r.miss else ''} rc={r.rc} {r.wall_s:.1f}s: {r.stderr_tail}",
                      highlight=False, markup=False)
    console.print(ratio_summary(list(ratios.values())), highlight=False)
    worse = {c: v for c, v in ratios.items() if v is not None and v < 0.99}
    for c, v in worse.items():
        console.print(f"ARACHNE WORSE {c}: {v:.3f}x {best_of[c]} ({out / 'clusters' / (c + '.yaml')})",
                      highlight=False)

    fields = [f for f in Run.__dataclass_fields__ if f != "command"]
    with open(out / "runs.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        for r in runs:
            w.writerow({k: v for k, v in asdict(r).items() if k in fields})
    doc = {"args": {"n": args.n, "seed": args.seed, "budget": args.budget, "planners": planners,
                    "node_sizes": list(node_sizes),
                    "reused_from": str(args.reuse) if args.reuse else None},
           "elapsed_s": round(elapsed, 1), "summary": summary,
           "cases": [{**{k: v for k, v in asdict(c).items() if k != "doc"},
                      "cluster_file": str(out / "clusters" / f"{c.name}.yaml"),
                      "arachne_vs_best_baseline": ratios[c.name], "best_baseline": best_of[c.name]}
                     for c in cases],
           "runs": [asdict(r) for r in runs],
           "arachne_worse_than_best_baseline": worse}
    (out / "runs.json").write_text(json.dumps(doc, indent=2))
    console.print(f"wrote {out / 'runs.csv'}, {out / 'runs.json'} and {len(cases)} clusters in {out / 'clusters'}")


if __name__ == "__main__":
    main()
