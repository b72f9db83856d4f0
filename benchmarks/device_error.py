"""``cost-model device``: the cost model against what ``benchmarks/device/device_check.sh`` measured on a GPU.

Reads one output folder of that script (``data/device/<date>-<gpu>``: ``runs.txt`` and ``prof/*/*.json``) and
prints four tables:

  layers   per-layer times of arachne's runtime (the bf16 profiles) vs the analytic compute model, with fused
           element-wise kernels and with eager ones (``elementwise_kernels: eager``, what ``arachne run`` runs)
  gemm     bf16 GEMM throughput vs the rate the analytic model charges for a GEMM of that many FLOPs
  losses   ``arachne run`` on CUDA vs on CPU processes: the largest relative loss difference over the steps
  run      the ``--measure`` run: iteration time and peak memory vs the estimate (analytic, fused and eager,
           and from the same day's profile of the model's blocks)

Nothing here is fitted: the analytic model's constants come from other measurements (docs/cost-model.md).
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Any

from arachne.cost import CostModel
from arachne.cost.calibration import DEFAULT_CALIBRATION
from arachne.cost.compute import ComputeModel
from arachne.plan import load_plan
from arachne.profiles.format import ProfileDB, profile_from_dict
from arachne.spec.cluster import load_cluster
from arachne.spec.gpus import gpu_catalog
from arachne.spec.model import model_catalog
from benchmarks import common

PLANS = common.ROOT / "benchmarks" / "device"
SMALL_GFLOP = 50
"""GEMMs under this many GFLOP are reported apart: a log that timed one GEMM between two CUDA events (the
2026-12-04 one) has the host's dispatch of that GEMM inside the interval, a floor of about 18 us that dominates
them (its five GEMMs under 300 GFLOP follow ``18 us + FLOPs / 823 TFLOP/s`` within 4%)."""
BACK_TO_BACK = "back-to-back"  # in the GEMM section's title when the script timed many GEMMs per event pair
SECTION = re.compile(r"^== \d\d:\d\d:\d\d (.*)$")


def sections(log: str) -> dict[str, list[str]]:
    """The log's lines by section title (``== HH:MM:SS title`` lines, as device_check.sh writes them)."""
    out: dict[str, list[str]] = {}
    cur: list[str] = []
    for line in log.splitlines():
        m = SECTION.match(line)
        if m:
            cur = out.setdefault(m.group(1), [])
        else:
            cur.append(line)
    return out


def json_lines(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(x) for x in lines if x.startswith("{")]


def _err(pred: float, meas: float) -> float:
    """Signed error of the prediction, % of the measurement (negative: the model is optimistic)."""
    return round(100 * (pred - meas) / meas, 1)


def layer_rows(profiles: list[Path], gpu_name: str) -> list[dict[str, Any]]:
    cm = ComputeModel(None, DEFAULT_CALIBRATION.compute)
    gpu = gpu_catalog().get(gpu_name)
    rows = []
    for path in profiles:
        doc = json.loads(path.read_text())
        model = model_catalog().get(doc["model"])
        seq = doc["sequence_length"]
        for e in doc["entries"]:
            b = e["micro_batch_size"]
            meas = e["blocks"]["fwd_s"][0] + e["blocks"]["bwd_s"][0]
            fused = sum(cm.analytic_block(model, gpu, doc["precision"], seq, b, e["tp"], 1, model.moe_layers[0]))
            eager = sum(cm.analytic_block(model, gpu, doc["precision"], seq, b, e["tp"], 1, model.moe_layers[0],
                                          eager="split"))
            _, emb_b, head_f, head_b = cm.analytic_ends(model, gpu, doc["precision"], seq, b, e["tp"])
            head = e["head"]["fwd_s"] + e["head"]["bwd_s"]
            rows.append({"model": model.name, "mbs": b, "block_ms": round(meas * 1e3, 2),
                         "fused_pct": _err(fused, meas), "eager_pct": _err(eager, meas),
                         "head_ms": round(head * 1e3, 2), "head_pct": _err(head_f + head_b, head),
                         "emb_bwd_ms": round(e["embedding"]["bwd_s"] * 1e3, 2),
                         "emb_bwd_pct": _err(emb_b, e["embedding"]["bwd_s"]),
                         "moe": bool(model.moe_layers[0])})
    return rows


def gemm_rows(lines: list[str], gpu_name: str) -> list[dict[str, Any]]:
    cm = ComputeModel(None, DEFAULT_CALIBRATION.compute)
    peak = cm.gemm_peak(gpu_catalog().get(gpu_name), "bf16")
    rows = []
    for line in lines:
        parts = line.split()
        if len(parts) == 5 and parts[0] == "gemm":
            m, n, k, tflops = int(parts[1]), int(parts[2]), int(parts[3]), float(parts[4])
            flops = 2 * m * n * k
            pred = flops / cm._gemm(flops, peak) / 1e12
            rows.append({"gemm": f"{m}x{n}x{k}", "gflop": round(flops / 1e9, 1), "measured_tflops": tflops, "model_tflops": round(pred, 1),
                         "err_pct": _err(pred, tflops)})
    return rows


def loss_rows(secs: dict[str, list[str]]) -> list[dict[str, Any]]:
    rows = []
    for title, lines in secs.items():
        if not (title.startswith("run ") and title.endswith(" cuda")):
            continue
        name = title.split()[1]
        gpu, cpu = json_lines(lines), json_lines(secs.get(f"run {name} cpu", []))
        if not gpu or len(gpu) != len(cpu):
            rows.append({"plan": name, "steps": len(gpu), "max_rel_diff": None, "note": "did not run on both"})
            continue
        diff = max(abs(a["loss"] - c["loss"]) / abs(c["loss"]) for a, c in zip(gpu, cpu))
        rows.append({"plan": name, "steps": len(gpu), "max_rel_diff": diff, "note": ""})
    return rows


def _four_block_profile(path: Path, model) -> ProfileDB:
    """The full model's profile as one of the run's shorter copy: the same blocks, the first ``L`` of them, and
    the optimizer step scaled by parameters (as the profiler scales it)."""
    doc = json.loads(path.read_text())
    full = model_catalog().get(doc["model"])
    L = model.num_layers
    for e in doc["entries"]:
        e["blocks"] = {k: v[:L] for k, v in e["blocks"].items()}
        if e.get("memory") and e["memory"].get("block_activation_bytes"):
            e["memory"]["block_activation_bytes"] = e["memory"]["block_activation_bytes"][:L]
        if e.get("optimizer_s") is not None:
            e["optimizer_s"] *= model.num_params / full.num_params
    doc["model"] = model.name
    db = ProfileDB()
    db.add(profile_from_dict(doc, str(path)))
    return db


def run_rows(secs: dict[str, list[str]], profiles: list[Path]) -> list[dict[str, Any]]:
    rows = []
    for title, lines in secs.items():
        if not (title.startswith("run ") and title.endswith(" measure")):
            continue
        name = title.split()[1]
        recs = json_lines(lines)
        meas = next((r for r in recs if "measured_iteration_time_s" in r), None)
        steps = [r for r in recs if "step" in r]
        if meas is None or not steps:
            continue
        cluster = load_cluster(PLANS / "cluster-h200.yaml")
        plan = load_plan(PLANS / f"{name}.json")
        model = plan.resolve_model(name)
        peak = max(r.get("peak_memory_bytes", 0.0) for r in steps)
        t = meas["measured_iteration_time_s"]
        estimates = {"analytic, fused": CostModel(cluster, profiles=None).estimate(plan),
                     "analytic, eager": CostModel(cluster, profiles=None).estimate(
                         plan.model_copy(update={"elementwise_kernels": "eager"}))}
        base = model.name.split(".layers-")[0]
        for path in profiles:
            if json.loads(path.read_text())["model"] == base:
                estimates["profile"] = CostModel(cluster, profiles=_four_block_profile(path, model)).estimate(plan)
        for how, est in estimates.items():
            rows.append({"plan": name, "estimate": how, "measured_s": round(t, 4), "estimated_s": round(est.iteration_time_s, 4),
                         "time_pct": _err(est.iteration_time_s, t), "measured_gib": round(peak / 2**30, 2),
                         "estimated_gib": round(est.max_memory_bytes / 2**30, 2),
                         "memory_pct": _err(est.max_memory_bytes, peak) if peak else None,
                         "source": ",".join(sorted({s.source for s in est.stages}))})
    return rows


def run(a) -> None:
    data = Path(a.data)
    if not (data / "runs.txt").is_file():
        common.fail(f"{data}: not an output folder of benchmarks/device/device_check.sh (no runs.txt)")
    if gpu_catalog().get(a.gpu) is None:
        common.fail(f"--gpu: unknown GPU type {a.gpu!r} (see `arachne gpus`)")
    log = (data / "runs.txt").read_text()
    secs = sections(log)
    gpu_name = a.gpu
    profiles = sorted(data.glob("prof/*/*.json"))
    layers = layer_rows(profiles, gpu_name)
    gemm_title = next((t for t in secs if t.startswith("bf16 GEMM")), "")
    gemms = gemm_rows(secs.get(gemm_title, []), gpu_name)
    gemm_timing = "many GEMMs per event pair" if BACK_TO_BACK in gemm_title else \
        "one GEMM per event pair (the host's dispatch inside: small GEMMs not judged)"
    losses = loss_rows(secs)
    runs = run_rows(secs, profiles)
    dense = [r for r in layers if not r["moe"]]
    big = [r for r in gemms if r["gflop"] >= SMALL_GFLOP]
    summary = {
        "dense_block_mape_fused_pct": statistics.mean(abs(r["fused_pct"]) for r in dense) if dense else None,
        "dense_block_mape_eager_pct": statistics.mean(abs(r["eager_pct"]) for r in dense) if dense else None,
        "head_mape_pct": statistics.mean(abs(r["head_pct"]) for r in layers) if layers else None,
        "moe_block_mape_eager_pct": {m: statistics.mean(abs(r["eager_pct"]) for r in layers if r["model"] == m)
                                     for m in sorted({r["model"] for r in layers if r["moe"]})},
        "gemm_mape_pct_over_50_gflop": statistics.mean(abs(r["err_pct"]) for r in big) if big else None,
        "gemm_small_err_pct": {r["gemm"]: r["err_pct"] for r in gemms if r["gflop"] < SMALL_GFLOP},
        "gemm_timing": gemm_timing,
        "max_loss_rel_diff": max((r["max_rel_diff"] or 0.0) for r in losses) if losses else None,
        "runs": {f"{r['plan']} / {r['estimate']}": {"time_pct": r["time_pct"], "memory_pct": r["memory_pct"]}
                 for r in runs},
    }
    common.print_table("fwd+bwd of one micro-batch (2048 tokens): analytic vs measured",
                       layers, ["model", "mbs", "block_ms", "fused_pct", "eager_pct", "head_ms", "head_pct"])
    if layers:
        lo, hi = min(r["emb_bwd_pct"] for r in layers), max(r["emb_bwd_pct"] for r in layers)
        common.console.print(f"embedding backward: analytic {lo:+.0f}% to {hi:+.0f}% of the measured (the dense "
                             "vocabulary-wide weight gradient is not priced)", highlight=False)
    common.print_table("bf16 GEMM: measured vs the analytic model's rate", gemms,
                       ["gemm", "measured_tflops", "model_tflops", "err_pct"])
    common.console.print(f"GEMM timing: {gemm_timing}", highlight=False)
    common.print_table("arachne run: CUDA/NCCL vs CPU processes, same seed", losses)
    common.print_table("arachne run --measure vs the estimate", runs,
                       ["estimate", "measured_s", "estimated_s", "time_pct", "measured_gib", "estimated_gib",
                        "memory_pct"])
    common.write_result(a.out, "device", layers + gemms + losses + runs, summary,
                        {"data": str(data.resolve().relative_to(common.ROOT)) if data.resolve().is_relative_to(common.ROOT)
                         else data.name,  # a folder outside the repository: its name, not this machine's path
                         "gpu": gpu_name}, benchmark="cost-model-device")
