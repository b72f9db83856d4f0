"""Launch a plan on this machine: one process per plan device, torch.multiprocessing + a local
TCP rendezvous on 127.0.0.1; the launcher watches its children and stops the job on a failure.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.multiprocessing as mp
from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

from arachne.errors import InputError
from arachne.plan import Plan
from arachne.runtime import checkpoint as ckpt
from arachne.runtime.engine import WorkerConfig, spawn_entry
from arachne.spec.model import ModelSpec

FAULT_ENV = "ARACHNE_RUNTIME_FAULT"  # "RANK:STEP": that process dies at the start of that step
SHAPE_FIELDS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_kv_heads",
                "vocab_size", "max_sequence_length", "num_experts", "experts_top_k", "moe_layer_frequency",
                "tied_embeddings", "mlp", "bias", "position_embedding", "moe_ffn_hidden_size",
                "num_shared_experts", "shared_expert_ffn_hidden_size", "first_dense_layers")


PRELOAD = ["arachne.runtime.engine", "arachne.runtime.profiler", "torch._dynamo"]


class JobError(RuntimeError):
    """The distributed job failed (a process died or raised); the message says which and why."""


@dataclass
class RunConfig:
    """How to run a plan locally."""

    steps: int = 3
    seed: int = 0
    lr: float = 1e-3
    simulate_devices: bool = False
    checkpoint_dir: Path | None = None
    timeout_s: float = 300.0
    threads: int | None = None
    fault: tuple[int, int] | None = None


@dataclass
class StepRecord:
    step: int
    loss: float
    time_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "loss": self.loss, "time_s": self.time_s}


@dataclass
class RunResult:
    records: list[StepRecord] = field(default_factory=list)
    resumed_from: int | None = None
    world_size: int = 0
    device: str = "cpu"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _fault_from_env() -> tuple[int, int] | None:
    val = os.environ.get(FAULT_ENV)
    if not val:
        return None
    rank, step = val.split(":")
    return int(rank), int(step)


def _cuda_indices(plan: Plan, world: int) -> list[int]:
    n = torch.cuda.device_count()
    devices = plan.devices
    nodes = {d.split(":")[0] for d in devices}
    local = [int(d.split(":")[1]) for d in devices]
    if len(nodes) == 1 and max(local) < n:
        return local
    if world <= n:
        return list(range(world))
    raise InputError("", "pipelines", f"the plan has {world} devices but this machine has {n} CUDA devices; "
                                      "use --simulate-devices to run on CPU processes")


def resume_point(root: Path, model: ModelSpec) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint to resume from (its directory and meta), checking it fits the model."""
    path = ckpt.latest(root)
    if path is None:
        return None
    meta = ckpt.read_meta(path)
    saved = ModelSpec(**meta["model"])
    for f in SHAPE_FIELDS:
        if getattr(saved, f) != getattr(model, f):
            raise InputError(str(path / "meta.json"), f"model.{f}",
                             f"checkpoint has {getattr(saved, f)!r}, the plan's model {getattr(model, f)!r}")
    return path, meta


def run_plan(plan: Plan, model: ModelSpec, config: RunConfig,
             on_step: Callable[[StepRecord], None] | None = None) -> RunResult:
    """Train ``config.steps`` iterations of ``plan``; resumes from ``checkpoint_dir`` when it holds one."""
    world = len(plan.devices)
    use_cuda = not config.simulate_devices and torch.cuda.is_available()
    cores = os.cpu_count() or 1
    cfg = WorkerConfig(plan=plan.to_doc(), model=model.model_dump(), order=list(plan.devices), steps=config.steps,
                       seed=config.seed, lr=config.lr, backend="nccl" if use_cuda else "gloo",
                       init_method=f"tcp://127.0.0.1:{free_port()}", timeout_s=config.timeout_s,
                       cuda_index=_cuda_indices(plan, world) if use_cuda else None,
                       threads=config.threads or max(1, cores // world),
                       fault=config.fault or _fault_from_env())
    result = RunResult(world_size=world, device="cuda" if use_cuda else "cpu")
    if config.checkpoint_dir is not None:
        config.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        cfg.checkpoint_dir = str(config.checkpoint_dir)
        found = resume_point(config.checkpoint_dir, model)
        if found is not None:
            path, meta = found
            cfg.resume_from, cfg.start_step, cfg.start_sample = str(path), int(meta["step"]), int(meta["samples"])
            cfg.seed, cfg.extra["losses"] = int(meta["seed"]), list(meta.get("losses", []))
            result.resumed_from = cfg.start_step
    _spawn(cfg, world, result, on_step)
    return result


def _spawn(cfg: WorkerConfig, world: int, result: RunResult, on_step: Callable[[StepRecord], None] | None) -> None:
    # children fork from a server that already imported these; torch.optim imports torch._dynamo
    # lazily (~2 s per process otherwise)
    mp.set_forkserver_preload(PRELOAD)
    # a SimpleQueue's put is written to the pipe before it returns: a step reported just before another
    # process dies (and the rest are terminated) still arrives, where a Queue's feeder thread could lose it
    q: Any = mp.get_context("forkserver").SimpleQueue()
    errors: dict[int, str] = {}
    done = False

    def handle(msg: dict[str, Any]) -> None:
        nonlocal done
        if msg["type"] == "step":
            rec = StepRecord(msg["step"], msg["loss"], msg["time_s"])
            result.records.append(rec)
            if on_step:
                on_step(rec)
        elif msg["type"] == "error":
            errors.setdefault(msg["rank"], msg["message"])
        elif msg["type"] == "done":
            done = True

    def drain(wait: float = 0.0) -> None:
        """Handle queued messages; ``wait``: how long to wait for each next one."""
        until = time.monotonic() + wait
        while not done:
            if not q.empty():
                handle(q.get())
                until = time.monotonic() + wait
            elif time.monotonic() < until:
                time.sleep(0.01)
            else:
                return

    # the launcher reports failures itself; torch's "Terminating process ..." warnings are noise here
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    ctx = mp.start_processes(spawn_entry, args=(cfg, q), nprocs=world, join=False, start_method="forkserver")
    try:
        while not ctx.join(timeout=0.1):
            drain()
    except (ProcessExitedException, ProcessRaisedException) as exc:
        drain(0.5)
        rank = exc.error_index
        device = cfg.order[rank]
        if rank in errors:
            why = errors[rank]
        elif isinstance(exc, ProcessExitedException):
            why = (f"killed by signal {exc.signal_name}" if exc.signal_name
                   else f"exited with code {exc.exit_code}")
        else:
            why = exc.msg.strip().splitlines()[-1] if exc.msg.strip() else "raised an exception"
        raise JobError(f"process {rank} (device {device}) failed: {why}; the job was stopped "
                       f"after {len(result.records)} complete step(s)") from None
    except BaseException:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
        raise
    drain(0.2)  # the children have exited, so their messages are all in the pipe
