"""The command line of ``python -m benchmarks``: every subcommand, its options, and the function that runs it
(imported only when chosen, so ``--help`` stays fast)."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

R = Path("results")



def _seconds(text: str) -> float:
    """A positive number of seconds (an argparse type: anything else is one usage error, exit 2)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be more than 0 s")
    return value

def _add(sub, name: str, target: str, help_: str, **kw) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_, description=help_, **kw)
    p.set_defaults(handler=target)
    return p


def _out(p: argparse.ArgumentParser, default: Path) -> None:
    p.add_argument("--out", type=Path, default=default, help=f"output folder (default {default})")


def _group(sub, name: str, help_: str):
    p = sub.add_parser(name, help=help_, description=help_)
    return p.add_subparsers(dest=f"{name}_cmd", required=True, metavar="SUBCOMMAND")


def build() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description="arachne's benchmarks, one tool. What "
                                 "each subcommand measures, its inputs, outputs and run time: benchmarks/README.md.")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="SUBCOMMAND")

    g = _group(sub, "grid", "planners side by side over a grid of 25 clusters (8-512 GPUs, dense and MoE)")
    p = _add(g, "run", "benchmarks.grid:run", "every planner on every grid case, each in a forked child")
    p.add_argument("--planners", help="comma-separated planner names (default: all installed, +ep for MoE)")
    p.add_argument("--time-budget", type=float, default=None, help="per planner and case, s (default 30; 10 --quick)")
    p.add_argument("--quick", action="store_true", help="4 small cases (a couple of minutes)")
    p.add_argument("--cases", default="", help="only cases whose name contains one of these (comma-separated)")
    t = _add(g, "timing", "benchmarks.grid:timing", "planning time of the search baselines at 64, 256, 512 GPUs")
    for q in (p, t):
        q.add_argument("--hard-limit", type=float, default=None, help="stop a planner after this many s "
                                                                       "(default 3 x budget + 60)")
        q.add_argument("--seed", type=int, default=0)
    t.add_argument("--planners", help="comma-separated (default: the search baselines)")
    t.add_argument("--time-budget", type=float, default=None, help="s (default 60)")
    t.add_argument("--model", default="GPT-3-1.3B")
    c = _add(g, "scale", "benchmarks.grid:scale", "every planner on six clusters of 4,096-100,000 GPUs")
    n = _add(g, "nic", "benchmarks.grid:nic", "every planner on 12 clusters of 64-2,048 GPUs with one or two "
             "NICs per node or one per GPU, at 4k-16k tokens")
    st = _add(g, "starved", "benchmarks.grid:starved", "every planner on 15 clusters of 1,024-100,000 GPUs whose "
              "batch leaves GPUs idle at one stage of node-wide tp")
    for q in (c, n, st):
        q.add_argument("--planners", help="comma-separated planner names (default: all installed, +ep for MoE)")
        q.add_argument("--time-budget", type=float, default=30.0, help="per planner and case, s (default 30)")
        q.add_argument("--cases", default="", help="only cases whose name contains one of these (comma-separated)")
        q.add_argument("--hard-limit", type=float, default=None, help="stop a planner after this many s "
                                                                       "(default 3 x budget + 60)")
        q.add_argument("--seed", type=int, default=0)
    _out(p, R / "grid")
    _out(t, R / "grid")
    _out(c, R / "grid")
    _out(n, R / "grid")
    _out(st, R / "grid")

    g = _group(sub, "sweep", "every planner through the CLI over random production-like clusters")
    p = _add(g, "run", "benchmarks.sweep:run", "draw --n clusters with --seed and run every planner on each")
    p.add_argument("--n", type=int, default=None, help="number of random clusters (default 30)")
    p.add_argument("--seed", type=int, default=None, help="RNG seed (default 0)")
    p.add_argument("--budget", type=float, default=5.0, help="--time-budget per planner run, s (default 5)")
    p.add_argument("--planners", default="arachne,megatron,megatron-oblivious,amp,metis,flashflex,sailor")
    p.add_argument("--node-sizes", default=None, help="GPUs per node to draw from (default 1,2,4,8)")
    p.add_argument("--reuse", default=None, help="a stored sweep (name) or runs.json: its clusters, and the runs of "
                                                 "planners not in --planners, are taken from it")
    p.add_argument("--out", type=Path, default=None, help="output folder (default results/sweeps/<name>)")
    p = _add(g, "recheck", "benchmarks.recheck:recheck",
             "run a baseline's misses in stored sweeps again on the current code")
    p.add_argument("sweeps", nargs="+", help="stored names or patterns ('seed8*', '*-rerun')")
    p.add_argument("--planners", default="megatron,megatron-oblivious", help="the baselines whose misses to re-run")
    _out(p, R / "sweeps")
    p = _add(g, "summarize", "benchmarks.sweep:summarize", "the summary line over several sweeps")
    p.add_argument("sweeps", nargs="+", help="stored names, patterns ('odd*') or runs.json files")

    g = _group(sub, "store", "add a sweep to benchmarks/stored/ (append-only), list or verify what is stored")
    p = _add(g, "add", "benchmarks.store:add", "store a sweep's folder (runs.json + clusters/) or a grid result")
    p.add_argument("path")
    p.add_argument("--name", required=True, help="the stored name (never reused)")
    p.add_argument("--command", default="", help="the command that produced it (default: as the result says)")
    p.add_argument("--commit", default="")
    p.add_argument("--date", default="")
    p.add_argument("--note", default="")
    _add(g, "list", "benchmarks.store:list_", "the stored sweeps")
    _add(g, "verify", "benchmarks.store:verify", "read every stored sweep, checking each file's sha256")

    g = _group(sub, "replay", "arachne against stored sweeps, in this process")
    p = _add(g, "sweeps", "benchmarks.replay:sweeps", "arachne re-planned (with --options) vs the stored baselines")
    p.add_argument("sweeps", nargs="+", help="stored names, patterns ('seed3[1-6]', 'odd*') or runs.json files")
    p.add_argument("--options", default="{}", help="ArachnePlanner options as a JSON object")
    p.add_argument("--runtime", default=None,
                   help="plan under this runtime preset's rules, as the sweep's CLI runs did (arachne plan's default "
                        "since the presets exist: arachne); default: none, as the older sweeps ran")
    p.add_argument("--cases", default="", help="comma-separated case names (default: every case)")
    p.add_argument("--budget", type=float, default=5.0, help="the wall-clock cap of each run, s (as in the sweeps)")
    p.add_argument("--name", default="sweeps", help="output file stem (default sweeps)")
    p.add_argument("--against", nargs="*", default=[], type=Path,
                   help="replay results of an earlier commit (.json or .json.gz): the cases that moved, up and down")
    _out(p, R / "replay")
    p = _add(g, "grid", "benchmarks.replay:grid", "arachne vs the best baseline per grid case, and the ceiling")
    p.add_argument("--grid", default=None,
                   help="a stored grid (name) or a grid result JSON (default: the newest stored grid)")
    p.add_argument("--rerun-arachne", action="store_true", help="re-plan arachne's rows with the current code")
    p.add_argument("--budget", type=float, default=20.0, help="arachne's wall-clock cap when re-planning, s")
    _out(p, R / "replay")
    p = _add(g, "ceiling", "benchmarks.replay:ceiling", "the compute ceiling vs the stored plans")
    p.add_argument("sweeps", nargs="+")
    _out(p, R / "replay")
    p = _add(g, "latency", "benchmarks.replay_time:latency", "arachne's wall time on the sweeps' clusters")
    p.add_argument("sweeps", nargs="+")
    _out(p, R / "replay")
    p = _add(g, "split-speed", "benchmarks.replay_time:split_speed", "the layer split: skip ahead vs bisection")
    p.add_argument("sweeps", nargs="+")
    p.add_argument("--repeat", type=int, default=3, help="replays of every recorded call per mode")
    _out(p, R / "replay")
    p = _add(g, "long-budget", "benchmarks.long_budget:long_budget", "capped search baselines given --budget s")
    p.add_argument("sweeps", nargs="+")
    p.add_argument("--budget", type=float, default=60.0)
    p.add_argument("--min-ratio", type=float, default=0.85, help="baseline / arachne at the sweep's budget")
    p.add_argument("--planners", default="metis,sailor,flashflex")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--reuse", type=Path, default=None, help="an earlier long_budget.json: its runs are reused")
    _out(p, R / "replay")

    g = _group(sub, "arachne", "benchmarks of the arachne planner itself")
    p = _add(g, "optimality", "benchmarks.arachne_eval:optimality", "arachne / the exhaustive oracle, small clusters")
    p.add_argument("--budget", type=float, default=20.0)
    p.add_argument("--oracle-budget", type=float, default=300.0)
    p.add_argument("--set", choices=("small", "medium"), default="small",
                   help="small: 6-8 GPUs x 4 models; medium: 64-256 GPUs of two types (give the oracle an hour)")
    p.add_argument("--only", default="", help="only the cases whose cluster/model contains this text")
    _out(p, R / "arachne")
    p = _add(g, "ablation", "benchmarks.arachne_eval:ablation", "learned vs policy vs random vs rule templates")
    p.add_argument("--k", type=int, default=24)
    _out(p, R / "arachne")
    p = _add(g, "generalise", "benchmarks.arachne_eval:generalise", "clusters outside training")
    p.add_argument("--budget", type=float, default=20.0, help="the baselines' budget, s")
    p.add_argument("--teacher-budget", type=float, default=30.0)
    p.add_argument("--baselines", default="")
    _out(p, R / "arachne")
    p = _add(g, "latency", "benchmarks.arachne_eval:latency", "planning time vs cluster size (8-1024 GPUs)")
    p.add_argument("--baselines", default="", help="search baselines run beside arachne (comma-separated)")
    p.add_argument("--budget", type=float, default=20.0, help="the baselines' budget, s")
    p.add_argument("--target", type=_seconds, default=None, help="arachne's latency target, s (default: its own)")
    _out(p, R / "arachne")
    p = _add(g, "target", "benchmarks.arachne_eval:target", "throughput at several --target values")
    p.add_argument("--targets", default="0.8,2,4")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--min-gpus", type=int, default=200)
    p.add_argument("--n", type=int, default=12, help="cases (the first n large enough)")
    _out(p, R / "arachne")
    p = _add(g, "rule-order", "benchmarks.rule_order:rule_order", "how well templates are ordered for screening")
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--ranker", type=Path, nargs="+", default=None, help="ranker weights (default: the shipped ones)")
    _out(p, R / "arachne")

    g = _group(sub, "cost-model", "how right and how fast the cost model is")
    p = _add(g, "validate", "benchmarks.cost_model:validate", "vs Sailor's 9 measured mixed-RTX plans (MAPE)")
    p.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[1] / "data" / "sailor" /
                   "measured_mixed_rtx.json")
    _out(p, R / "cost_model")
    p = _add(g, "calibrate", "benchmarks.cost_model:calibrate", "fit the analytic compute model to measured blocks")
    _out(p, R / "cost_model")
    p = _add(g, "collectives", "benchmarks.collectives:run", "network model vs published NCCL busbw (data/nccl)")
    p.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[1] / "data" / "nccl" /
                   "measurements.json")
    p.add_argument("--min-bytes", type=float, default=1e6, help="only sizes at or above this (default 1 MB)")
    _out(p, R / "cost_model")
    p = _add(g, "speed", "benchmarks.cost_model:speed", "how fast CostModel.estimate prices a plan")
    p.add_argument("--repeats", type=int, default=200)
    _out(p, R / "cost_model")
    p = _add(g, "activations", "benchmarks.activations:run", "saved activations of a torch block vs arachne's count")
    _out(p, R / "cost_model")
    p = _add(g, "attention", "benchmarks.attention:run", "attention core vs kernel measurements (data/components)")
    p.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[1] / "data" / "components" /
                   "attention.yaml")
    _out(p, R / "cost_model")
    p = _add(g, "elementwise", "benchmarks.elementwise:run", "eager element-wise ops vs kernel measurements")
    p.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[1] / "data" / "components" /
                   "elementwise.yaml")
    _out(p, R / "cost_model")
    p = _add(g, "moe-layer", "benchmarks.moe_layer:run", "MoE layer vs whole-layer measurements by implementation")
    p.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[1] / "data" / "components" /
                   "moe_layer.yaml")
    p.add_argument("--fit", action="store_true", help="print the anchor fit beside the frozen constants")
    _out(p, R / "cost_model")
    p = _add(g, "device", "benchmarks.device_error:run", "vs what benchmarks/device/device_check.sh measured")
    p.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[1] / "data" / "device" /
                   "2026-12-04-h200", help="one output folder of the script (default: the 2026-12-04 H200 run)")
    p.add_argument("--gpu", default="H200", help="the GPU type it ran on (catalog name)")
    _out(p, R / "cost_model")
    p = _add(g, "published", "benchmarks.published:run", "vs published end-to-end runs (data/published_runs)")
    p.add_argument("--data", type=Path, default=None, help="runs file (default data/published_runs/runs.yaml)")
    _out(p, R / "cost_model")

    g = _group(sub, "work-clock", "fit the work clock's rates; check it keeps to wall time and to the same plans")
    p = _add(g, "fit", "benchmarks.work_clock:fit", "fit the rates (--install: write arachne/data/work_rates.json)")
    p.add_argument("--seeds", default="10,11")
    p.add_argument("--targets", default="0.4,0.8,1.6")
    p.add_argument("--n", type=int, default=1000, help="at most this many problems")
    p.add_argument("--clocks", default="wall,work", help="run on each clock (work: with the current rates)")
    p.add_argument("--install", action="store_true", help="write the fitted rates to the work clock's data file")
    p.add_argument("--rates-file", type=Path, default=None, help="where --install writes (default "
                                                                  "arachne/data/work_rates.json)")
    _out(p, R / "work_clock")
    p = _add(g, "check", "benchmarks.work_clock:check", "same plan idle and under load; wall / work")
    p.add_argument("--seeds", default="12")
    p.add_argument("--n", type=int, default=30)
    p.add_argument("--target", type=_seconds, default=None, help="s of work (default: the planner's own)")
    _out(p, R / "work_clock")

    p = _add(sub, "replan-trace", "benchmarks.replan_trace:replan_trace", "every planner follows a GPU "
                                                                          "availability trace (Sailor's)")
    p.add_argument("--trace", choices=["spot", "grow", "spot-churn", "steady-growth", "rack-failure"], default="spot")
    p.add_argument("--model", default=None, help="default: GPT-3-2.7B (spot), LLaMA-2-13B (grow)")
    p.add_argument("--gbs", type=int, default=None, help="default: 256 (spot), 1024 (grow)")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--baselines", default="sailor,metis,megatron")
    p.add_argument("--budget", type=float, default=10.0, help="baselines' planning budget per change, s")
    p.add_argument("--seed", type=int, default=0)
    _out(p, R / "replan_trace")

    p = _add(sub, "runtime", "benchmarks.runtime:runtime", "measured vs estimated iteration time, CPU processes")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2, help="leading steps left out of the measurement")
    p.add_argument("--sequence-length", type=int, default=128)
    p.add_argument("--only", default="", help="comma-separated plan names")
    _out(p, R / "runtime")

    g = _group(sub, "same-plans", "same plans, less time? for refactors that must not change a plan")
    p = _add(g, "run", "benchmarks.same_plans:run", "plan fixed problems, one JSON line each (plan digest, work)")
    p.add_argument("--sweeps", nargs="*", default=[], help="stored names or runs.json: 12 cases each")
    p.add_argument("--options", default="{}", help="ArachnePlanner options as a JSON object")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--limit", type=int, default=0, help="only the first N problems")
    p = _add(g, "compare", "benchmarks.same_plans:compare", "the problems whose plan, MFU or work differ")
    p.add_argument("a")
    p.add_argument("b")

    p = _add(sub, "suite", "benchmarks.suite:suite", "re-measure every reported number from what is stored")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--long-budget", action="store_true", help="also the search baselines at 60 s (an hour more)")
    p.add_argument("--logs", type=Path, default=R / "logs")

    p = _add(sub, "objectives", "benchmarks.objectives:run", "cost objective and --runtime megatron on the grid")
    p.add_argument("--all", action="store_true", help="all 25 grid cases (default: 6, a few minutes)")
    p.add_argument("--cases", default="", help="only cases whose name contains one of these (comma-separated)")
    p.add_argument("--time-budget", type=float, default=5.0, help="per planner and case, s (default 5)")
    _out(p, R / "objectives")

    p = _add(sub, "long-seq", "benchmarks.long_seq:run", "long sequences (32k-128k): arachne vs every baseline, cp")
    p.add_argument("--cases", default="", help="only cases whose name contains one of these (comma-separated)")
    p.add_argument("--time-budget", type=float, default=10.0, help="per planner and case, s (default 10)")
    p.add_argument("--tokens", type=int, default=2**22, help="tokens per iteration (default 4194304)")
    _out(p, R / "long_seq")

    p = _add(sub, "report", "benchmarks.report:report", "write docs/results.md and results/headline.json")
    p.add_argument("--results", type=Path, default=R, help="folder of result JSON (default results)")
    p.add_argument("--stored", nargs="*", default=None, help="stored sweeps to include (default: all)")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs" / "results.md")
    p.add_argument("--headline", type=Path, default=R / "headline.json")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = build().parse_args(argv)
    module, func = args.handler.split(":")
    getattr(importlib.import_module(module), func)(args)
