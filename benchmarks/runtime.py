"""``runtime``: measured vs estimated iteration time for a handful of plans run as CPU processes.

Profiles a small dense model on this machine (``arachne.runtime.profiler``), declares a
cluster of pseudo-GPUs of type ``Local-CPU`` (one per process) whose profile that is, runs each
plan with ``arachne.runtime.launch.run_plan`` (gloo, one process per plan device, one thread
each) and prices it with ``arachne.cost.CostModel``. Prints a table and writes
``runtime_measure.csv`` / ``.json`` (plus the profile, cluster and plans) to ``--out``.

Caveat: processes share this machine's cores and caches; when a plan has more processes than
the machine can run in parallel, measured times include that contention, which the cost model
does not model. The script measures that parallelism (``effective_cores``: N one-thread matmul
loops at once vs one alone) and records the load average, since other jobs skew CPU timings.

    python -m benchmarks runtime [--out results/runtime]   (needs torch: the runtime extra)
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import yaml

from arachne.plan import Plan, plan_from_dict, validate_plan
from arachne.profiles.format import ProfileDB, profile_filename, write_profile
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.model import ModelSpec
from benchmarks import common

GPU = "Local-CPU"
MODEL: dict[str, Any] = {"name": "bench-tiny", "num_layers": 4, "hidden_size": 256, "ffn_hidden_size": 1024,
                         "num_attention_heads": 8, "vocab_size": 2048, "max_sequence_length": 128}


def cluster_doc(devices: int) -> dict[str, Any]:
    """One node of ``devices`` pseudo-GPUs; links are nominal loopback figures (gloo over TCP)."""
    return {"name": "local-cpu", "nodes": [{"name": "cpu", "gpu": GPU, "gpus_per_node": devices}],
            "gpu_types": [{"name": GPU, "memory_gb": 16, "peak_tflops": 0.2, "fp32_tflops": 0.1,
                           "memory_bandwidth_gbps": 20, "intra_node_gbps": 10, "inter_node_gbps": 10,
                           "gpus_per_node": devices}]}


def _stage(a: int, b: int, devs: list[int], **kw: Any) -> dict[str, Any]:
    return {"layers": [a, b], "devices": [f"cpu:{d}" for d in devs], **kw}


def plans(seq: int) -> dict[str, dict[str, Any]]:
    base = {"format": "arachne-plan/1", "model": MODEL, "global_batch_size": 8, "sequence_length": seq,
            "micro_batch_size": 2, "precision": "fp32"}
    return {name: base | {"pipelines": p} for name, p in {
        "single": [{"micro_batches": 4, "stages": [_stage(0, 4, [0])]}],
        "dp2": [{"micro_batches": 2, "stages": [_stage(0, 4, [i])]} for i in range(2)],
        "pp2": [{"micro_batches": 4, "stages": [_stage(0, 2, [0]), _stage(2, 4, [1])]}],
        "tp2": [{"micro_batches": 4, "stages": [_stage(0, 4, [0, 1], tp=2)]}],
        "hetero-3": [{"micro_batches": 3, "stages": [_stage(0, 1, [0]), _stage(1, 4, [1])]},
                     {"micro_batches": 1, "stages": [_stage(0, 4, [2])]}],
        "pp2-dp2": [{"micro_batches": 2, "stages": [_stage(0, 2, [2 * i]), _stage(2, 4, [2 * i + 1])]}
                    for i in range(2)],
    }.items()}


def _matmul_loop(_: int) -> float:
    import torch

    torch.set_num_threads(1)
    a = torch.randn(384, 384)
    t0 = time.perf_counter()
    for _ in range(150):
        a @ a
    return time.perf_counter() - t0


def effective_cores() -> float:
    """How many one-thread compute loops this machine runs at full speed at once."""
    import multiprocessing as mp

    n = os.cpu_count() or 1
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        solo = min(pool.map(_matmul_loop, range(2)))
    with ctx.Pool(n) as pool:
        together = statistics.mean(pool.map(_matmul_loop, range(n)))
    return n * solo / together


def runtime(a) -> None:
    import torch

    from arachne.cost import CostModel
    from arachne.runtime.launch import RunConfig, run_plan
    from arachne.runtime.profiler import ProfileSettings, profile_model

    a.out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]
    eff = effective_cores()
    print(f"cpu_count {os.cpu_count()}, effective parallel cores {eff:.2f}, load average {load_before:.2f}")
    model = ModelSpec(**MODEL)
    torch.set_num_threads(1)  # each run process gets one thread; measure the profile the same way
    prof = profile_model(model, ProfileSettings(micro_batch_sizes=(1, 2, 4), tps=(1, 2),
                                                sequence_length=a.sequence_length, precision="fp32", repeats=5),
                         gpu=GPU, log=lambda m: print(f"  {m}", flush=True))
    write_profile(prof, a.out / "profiles" / profile_filename(prof.model, prof.gpu, prof.precision))
    db = ProfileDB()
    db.add(prof)
    todo = plans(a.sequence_length)
    if a.only:
        todo = {k: v for k, v in todo.items() if k in a.only.split(",")}
    devices = max(len(plan_from_dict(d).devices) for d in todo.values())
    cdoc = cluster_doc(max(devices, 1))
    (a.out / "cluster.yaml").write_text(yaml.safe_dump(cdoc, sort_keys=False))
    cluster = cluster_from_dict(cdoc)
    cost = CostModel(cluster, profiles=db)
    rows = []
    for name, doc in todo.items():
        plan: Plan = plan_from_dict(doc, name)
        validate_plan(plan, cluster, model)
        (a.out / "plans").mkdir(exist_ok=True)
        plan.save(a.out / "plans" / f"{name}.json")
        res = run_plan(plan, model, RunConfig(steps=a.steps, simulate_devices=True, threads=1))
        times = [r.time_s for r in res.records][a.warmup:]
        mean, median = statistics.fmean(times), statistics.median(times)
        est = cost.estimate(plan)
        e = est.iteration_time_s
        src = ",".join(sorted({s.source for s in est.stages}))
        procs = len(plan.devices)
        rows.append({"plan": name, "processes": procs, "effective_cores": round(eff, 2), "steps_measured": len(times),
                     "measured_mean_s": mean, "measured_median_s": median, "estimated_s": e,
                     "relative_error": (e - mean) / mean, "relative_error_median": (e - median) / median,
                     "compute_source": src, "step_times_s": times})
        flag = " (more processes than effective cores)" if procs > eff + 0.25 else ""
        print(f"{name}: {procs} processes, measured median {median:.4f} s, estimate {e:.4f} s{flag}", flush=True)
    common.print_table("measured vs estimated iteration time (CPU processes)", rows,
                       ["plan", "processes", "measured_median_s", "estimated_s", "relative_error_median"])
    load_after = os.getloadavg()[0]
    mean_abs = statistics.fmean(abs(r["relative_error_median"]) for r in rows)
    common.write_result(a.out, "runtime", rows,
                        {"plans": len(rows), "mean_abs_error_median_times": mean_abs, "effective_cores": eff,
                         "load_average_before": load_before, "load_average_after": load_after},
                        {"model": MODEL, "sequence_length": a.sequence_length, "steps": a.steps, "warmup": a.warmup,
                         "device": prof.device}, benchmark="runtime")
    print(f"mean |error| (median times) {mean_abs:.1%}; load average {load_before:.2f} -> {load_after:.2f}")
