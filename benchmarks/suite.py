"""``suite``: re-measure every number ``docs/results.md`` reports, from what is stored, then write the report.

Two single-threaded streams run side by side (one per core of the reference machine); the benchmarks that
time wall clock or load every core run alone afterwards. Every step is ``python -m benchmarks ...``; its log
goes to ``--logs/<name>.txt``. arachne is re-planned against the stored baselines (``benchmarks/stored/``),
so nothing has to be unpacked or re-drawn. About 90 minutes on 2 cores (``--long-budget``: an hour more);
``--dry-run`` prints the plan.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import threading
import time

from benchmarks import common

SEVEN_TWENTY_EIGHT = ["seed[0-5]", "seed3[1-6]", "odd10[0-6]", "odd11[0-5]"]  # the stored set the README quoted
STREAM_A = [
    ("replay-grid", ["replay", "grid", "--rerun-arachne"]),
    ("replay-sweeps", ["replay", "sweeps", *SEVEN_TWENTY_EIGHT]),
    ("replay-target-0.7", ["replay", "sweeps", *SEVEN_TWENTY_EIGHT, "--options", '{"target_s": 0.7}',
                           "--name", "target-0.7"]),
    ("replay-ceiling", ["replay", "ceiling", *SEVEN_TWENTY_EIGHT]),
    ("target", ["arachne", "target"]),
    ("replan-spot", ["replan-trace", "--trace", "spot"]),
    ("replan-grow", ["replan-trace", "--trace", "grow"]),
]
STREAM_B = [
    ("latency", ["arachne", "latency", "--baselines", "sailor,flashflex,metis,amp,megatron", "--budget", "30"]),
    ("optimality", ["arachne", "optimality", "--oracle-budget", "60"]),
    ("optimality-medium", ["arachne", "optimality", "--set", "medium", "--oracle-budget", "3600"]),
    ("ablation8", ["arachne", "ablation", "--k", "8", "--out", "results/arachne/k8"]),
    ("ablation24", ["arachne", "ablation"]),
    ("generalise", ["arachne", "generalise", "--budget", "10", "--teacher-budget", "30"]),
    ("rule-order", ["arachne", "rule-order"]),
    ("replay-sweeps-rest", ["replay", "sweeps", "seed2[6-9]", "seed30", "odd10[7-9]", "--name", "sweeps-rest"]),
]
ALONE = [  # wall-time ratios, or every core loaded on purpose
    ("split-speed", ["replay", "split-speed", "seed3"]),
    ("sweep-latency", ["replay", "latency", "odd103", "odd104"]),
    ("latency-alone", ["arachne", "latency", "--baselines", "megatron", "--out", "results/arachne/latency_alone"]),
    ("work-clock", ["work-clock", "check"]),
    ("cost-validate", ["cost-model", "validate"]),
    ("cost-calibrate", ["cost-model", "calibrate"]),
    ("cost-speed", ["cost-model", "speed"]),
]
LONG = [  # --long-budget: about an hour more
    ("long-budget", ["replay", "long-budget", "seed[0-5]", "--budget", "60", "--workers", "2"]),
]
REPORT = [("report", ["report"])]


def step(logs, name: str, argv: list[str], failed: list[str]) -> None:
    cmd = [sys.executable, "-m", "benchmarks", *argv]
    print(f"== {name}: python -m benchmarks {shlex.join(argv)}", file=sys.stderr, flush=True)
    with open(logs / f"{name}.txt", "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=common.ROOT).returncode
    if rc != 0:
        failed.append(name)
        print(f"!! {name} failed (exit {rc}), see {logs / f'{name}.txt'}", file=sys.stderr, flush=True)


def suite(a) -> None:
    alone = ALONE + (LONG if a.long_budget else []) + REPORT
    if a.dry_run:
        for label, steps in (("stream A", STREAM_A), ("stream B (beside A)", STREAM_B), ("then alone", alone)):
            print(f"# {label}")
            for name, argv in steps:
                print(f"python -m benchmarks {shlex.join(argv)}   # {name}")
        return
    a.logs.mkdir(parents=True, exist_ok=True)
    failed: list[str] = []
    t0 = time.perf_counter()

    def stream(steps):
        for name, argv in steps:
            step(a.logs, name, argv, failed)

    threads = [threading.Thread(target=stream, args=(s,)) for s in (STREAM_A, STREAM_B)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stream(alone)
    print(f"suite done in {(time.perf_counter() - t0) / 60:.0f} min; logs in {a.logs}"
          + (f"; failed: {', '.join(failed)}" if failed else ""), file=sys.stderr)
    if failed:
        raise SystemExit(1)
