"""`arachne train-policy`: generate problems, label them with the teacher (locally or on Ray),
train by imitation + reward ranking, relabel the policy's own states (DAgger), export weights."""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from arachne.fileio import replacing, write_text_safely
from arachne.planners.arachne.learned.policy import Policy
from arachne.planners.arachne.train.learn import TrainConfig, train_policy
from arachne.planners.arachne.train.problems import (
    Problem,
    ProblemConfig,
    random_problem,
)
from arachne.planners.arachne.train.teacher import Labelled, Record, label


@dataclass
class PipelineConfig:
    clusters: int = 400
    val_clusters: int = 40
    rounds: int = 2             # round 1: teacher states; later rounds add policy-visited states
    teacher_beam: int = 3
    teacher_seconds: float = 15.0
    workers: int = 1
    address: str | None = None  # Ray cluster address; None with workers > 1 starts a local Ray
    seed: int = 0
    problems: ProblemConfig = field(default_factory=ProblemConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


def _label_task(args: tuple) -> Labelled:
    problem, beam, seconds, policy = args
    return label(problem, beam, seconds, policy)


def label_all(problems: list[Problem], cfg: PipelineConfig, policy: Policy | None,
              advance: Callable[[int], None]) -> list[Labelled]:
    """Teacher-label problems: in-process, or spread over Ray workers."""
    tasks = [(p, cfg.teacher_beam, cfg.teacher_seconds, policy) for p in problems]
    return [r for r in map_tasks(_label_task, tasks, cfg.workers, cfg.address, advance) if r is not None]


def map_tasks(fn: Callable, tasks: list, workers: int, address: str | None,
              advance: Callable[[int], None]) -> list:
    """``[fn(t) for t in tasks]``, in-process or on Ray (a local one with ``workers`` CPUs, or the
    cluster at ``address``); results keep the order of ``tasks``."""
    if workers <= 1 and address is None:
        out = []
        for t in tasks:
            out.append(fn(t))
            advance(1)
        return out
    import ray

    if address is not None:
        check_reachable(address)
    if not ray.is_initialized():
        ray.init(address=address, num_cpus=None if address else workers, include_dashboard=False,
                 log_to_driver=False, ignore_reinit_error=True)
    remote = ray.remote(fn)
    pending = [remote.remote(t) for t in tasks]
    index = {ref: i for i, ref in enumerate(pending)}
    results: list = [None] * len(tasks)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for ref in done:
            results[index[ref]] = ray.get(ref)
            advance(1)
    return results


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast, in one line, on a Ray address nothing answers at (Ray itself retries for minutes)."""
    import socket

    if address == "auto":
        return
    host, _, port = address.split("://")[-1].rpartition(":")
    try:
        socket.create_connection((host or "localhost", int(port)), timeout=timeout_s).close()
    except (OSError, ValueError) as e:
        from arachne.errors import InputError

        raise InputError("", "--address", f"no Ray cluster answers at {address!r} ({e})") from None


def run_pipeline(cfg: PipelineConfig, out_dir: Path, progress: Callable | None = None,
                 log: Callable[[str], None] = print) -> tuple[Policy, dict]:
    """The whole offline pipeline; writes policy.npz, report.json and curve.png into ``out_dir``."""
    rng = random.Random(cfg.seed)
    t0 = time.perf_counter()
    problems = [random_problem(rng, cfg.problems) for _ in range(cfg.clusters)]
    val_problems = [random_problem(rng, cfg.problems) for _ in range(cfg.val_clusters)]
    adv = progress or (lambda n: None)
    labelled = label_all(problems, cfg, None, adv)
    val_labelled = label_all(val_problems, cfg, None, adv)
    train_records = [r for lab in labelled for r in lab.records]
    val_records = [r for lab in val_labelled for r in lab.records]
    log(f"round 1: {len(train_records)} decisions from {len(problems)} problems "
        f"(teacher {np.mean([lab.seconds for lab in labelled]):.1f} s/problem)")
    info = {"config": _jsonable(cfg), "trained_at": time.strftime("%Y-%m-%d"), "rounds": [], "pooled_actions": True}
    policy, curve = train_policy(train_records, val_records, cfg.train, info)
    info["rounds"].append({"round": 1, "decisions": len(train_records), "curve": curve})
    for rnd in range(2, cfg.rounds + 1):
        extra = label_all(problems[: max(1, len(problems) // 2)], cfg, policy, adv)
        train_records += [r for lab in extra for r in lab.records]
        log(f"round {rnd}: {len(train_records)} decisions (policy-visited states relabelled by the teacher)")
        policy, curve = train_policy(train_records, val_records, cfg.train, info)
        info["rounds"].append({"round": rnd, "decisions": len(train_records), "curve": curve})
    save_records(out_dir / DATA_FILE, train_records, val_records)
    info["training_problems"] = len(problems)
    info["decisions"] = len(train_records)
    info["gpu_types_seen"] = sorted({n["gpu"] for p in problems for n in p.cluster_doc["nodes"]
                                     if not n["gpu"].startswith("SynthGPU")})
    info["node_sizes_seen"] = sorted({n["gpus_per_node"] for p in problems for n in p.cluster_doc["nodes"]})
    info["max_gpus_seen"] = max(sum(n["count"] * n["gpus_per_node"] for n in p.cluster_doc["nodes"]) for p in problems)
    info["wall_time_s"] = time.perf_counter() - t0
    return write_outputs(policy, info, out_dir)


def save_records(path: Path, train: list[Record], val: list[Record]) -> None:
    """The labelled decisions, so the learning step can be rerun without the teacher."""
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for name, recs in (("train", train), ("val", val)):
        arrays[f"{name}_x"] = np.concatenate([r.x for r in recs]) if recs else np.zeros((0, 1), np.float32)
        arrays[f"{name}_v"] = np.concatenate([r.values for r in recs]) if recs else np.zeros(0)
        arrays[f"{name}_n"] = np.array([len(r.values) for r in recs], dtype=np.int64)
    with replacing(path) as tmp:
        np.savez_compressed(tmp, **arrays)


def load_records(path: Path) -> tuple[list[Record], list[Record]]:
    """Decisions saved by :func:`save_records`; a missing or foreign file is an :class:`InputError`."""
    from arachne.errors import InputError

    try:
        with np.load(path, allow_pickle=False) as z:
            out = []
            for name in ("train", "val"):
                x, v, n = z[f"{name}_x"], z[f"{name}_v"], z[f"{name}_n"]
                edges = np.concatenate([[0], np.cumsum(n)])
                out.append([Record(x[a:b], v[a:b]) for a, b in zip(edges, edges[1:])])
    except (OSError, ValueError, KeyError, EOFError) as e:
        raise InputError(str(path), "--data", f"not a data.npz written by train-policy ({e})") from None
    return out[0], out[1]


def retrain(data: Path, cfg: PipelineConfig, out_dir: Path, info_from: dict | None = None) -> tuple[Policy, dict]:
    """Rerun only the learning step on saved decisions (e.g. with other hyper-parameters)."""
    train_records, val_records = load_records(data)
    info = dict(info_from or {})
    info.update({"config": _jsonable(cfg), "trained_at": time.strftime("%Y-%m-%d"), "retrained_from": str(data)})
    policy, curve = train_policy(train_records, val_records, cfg.train, info)
    info["rounds"] = [{"round": 1, "decisions": len(train_records), "curve": curve}]
    info["decisions"] = len(train_records)
    return write_outputs(policy, info, out_dir)


OUTPUT_FILES = ("policy.npz", "report.json", "curve.png")
DATA_FILE = "data.npz"  # the teacher's labelled decisions, written by run_pipeline before learning


def write_outputs(policy: Policy, info: dict, out_dir: Path,
                  files: tuple[str, str, str] = OUTPUT_FILES) -> tuple[Policy, dict]:
    """Weights (+ info), report and training curve in ``out_dir`` (policy.npz, report.json, curve.png)."""
    policy.info = info
    out_dir.mkdir(parents=True, exist_ok=True)
    with replacing(out_dir / files[0]) as tmp:
        policy.save(tmp)
    write_text_safely(out_dir / files[1], json.dumps(info, indent=1))
    with replacing(out_dir / files[2]) as tmp:
        plot_curve(info, tmp)
    return policy, info


def plot_curve(info: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for r in info["rounds"]:
        ep = [c["epoch"] for c in r["curve"]]
        axes[0].plot(ep, [c["train_loss"] for c in r["curve"]], label=f"train (round {r['round']})")
        if "val_loss" in r["curve"][0]:
            axes[0].plot(ep, [c["val_loss"] for c in r["curve"]], "--", label=f"validation (round {r['round']})")
            axes[1].plot(ep, [c["val_top1"] for c in r["curve"]], "--", label=f"validation (round {r['round']})")
        axes[1].plot(ep, [c["train_top1"] for c in r["curve"]], label=f"train (round {r['round']})")
    axes[0].set(title="ranking loss", xlabel="epoch")
    axes[1].set(title="top-1 agreement with the teacher", xlabel="epoch", ylim=(0, 1))
    for a in axes:
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _jsonable(cfg: PipelineConfig) -> dict:
    d = asdict(cfg)
    d["problems"]["node_sizes"] = list(d["problems"]["node_sizes"])
    d["problems"]["exclude_gpus"] = list(d["problems"]["exclude_gpus"])
    return d
