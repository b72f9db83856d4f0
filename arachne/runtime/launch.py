"""Launch a plan on this machine: one process per plan device, torch.multiprocessing + a local
TCP rendezvous on 127.0.0.1; the launcher watches its children and stops the job on a failure.

Every way the run can end stops every process it started: a failed or timed-out process (the rest
are stopped at once, a frozen one with SIGKILL), a stop signal (:class:`Stopped`, see
:mod:`arachne.runtime.signals`), or the launcher's own death (each worker watches a pipe only the
launcher holds). The checkpoint directory is locked for the run (:func:`checkpoint.locked`).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing.connection
import multiprocessing.forkserver
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from arachne.errors import InputError
from arachne.plan import Plan
from arachne.runtime import checkpoint as ckpt
from arachne.runtime.engine import WorkerConfig, spawn_entry
from arachne.runtime.flags import check_lr, check_timeout
from arachne.runtime.signals import STOP_SIGNALS, Stopped, raise_if_stopped, stop_on_signals
from arachne.spec.model import ModelSpec

# "RANK:STEP[:freeze]": that process dies (or stops itself with SIGSTOP) at the start of that step
FAULT_ENV = "ARACHNE_RUNTIME_FAULT"
SHAPE_FIELDS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_kv_heads",
                "vocab_size", "max_sequence_length", "num_experts", "experts_top_k", "moe_layer_frequency",
                "tied_embeddings", "mlp", "bias", "position_embedding", "moe_ffn_hidden_size",
                "num_shared_experts", "shared_expert_ffn_hidden_size", "first_dense_layers")


PRELOAD = ["arachne.runtime.engine", "arachne.runtime.profiler", "torch._dynamo"]
STOP_GRACE_S = 1.0  # after SIGTERM, before SIGKILL (a stopped or hung process ignores SIGTERM)

Log = Callable[[str], None]


class JobError(RuntimeError):
    """The distributed job failed (a process died or raised); the message says which and why."""


@dataclass
class RunConfig:
    """How to run a plan locally."""

    steps: int = 3  # steps to run now; after a resume, on top of the checkpoint's
    seed: int = 0
    lr: float = 1e-3
    simulate_devices: bool = False
    checkpoint_dir: Path | None = None
    timeout_s: float = 300.0
    threads: int | None = None
    fault: tuple[int, int] | tuple[int, int, str] | None = None

    def check(self) -> None:
        """Refuse values no process could run with (InputError naming the flag)."""
        if self.steps < 1:
            raise InputError("", "--steps", f"expected 1 or more, got {self.steps}")
        check_timeout(self.timeout_s)
        check_lr(self.lr)


@dataclass
class StepRecord:
    step: int
    loss: float
    time_s: float
    peak_memory_bytes: float | None = None  # on CUDA: the step's peak allocated bytes, largest over the ranks

    def to_dict(self) -> dict[str, Any]:
        out = {"step": self.step, "loss": self.loss, "time_s": self.time_s}
        return out if self.peak_memory_bytes is None else out | {"peak_memory_bytes": self.peak_memory_bytes}


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


def _fault_from_env() -> tuple[int, int] | tuple[int, int, str] | None:
    val = os.environ.get(FAULT_ENV)
    if not val:
        return None
    rank, step, *kind = val.split(":")
    return (int(rank), int(step), kind[0]) if kind else (int(rank), int(step))


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
             on_step: Callable[[StepRecord], None] | None = None, log: Log | None = None) -> RunResult:
    """Train ``config.steps`` more iterations of ``plan``; resumes from ``checkpoint_dir`` when it holds one.

    ``log`` receives start-up progress lines. SIGTERM, SIGHUP and SIGINT stop every process and raise
    :class:`Stopped` (the newest complete checkpoint stays loadable); a failed process, :class:`JobError`.
    """
    config.check()
    say: Log = log or (lambda _msg: None)
    world = len(plan.devices)
    use_cuda = not config.simulate_devices and torch.cuda.is_available()
    if not config.simulate_devices and not use_cuda:
        say(f"warning: no CUDA GPU found: the plan's {world} devices run as CPU processes (gloo); "
            "pass --simulate-devices to choose this")
    cores = os.cpu_count() or 1
    cfg = WorkerConfig(plan=plan.to_doc(), model=model.model_dump(), order=list(plan.devices), steps=config.steps,
                       seed=config.seed, lr=config.lr, backend="nccl" if use_cuda else "gloo",
                       init_method=f"tcp://127.0.0.1:{free_port()}", timeout_s=config.timeout_s,
                       cuda_index=_cuda_indices(plan, world) if use_cuda else None,
                       threads=config.threads or max(1, cores // world),
                       fault=config.fault or _fault_from_env())
    result = RunResult(world_size=world, device="cuda" if use_cuda else "cpu")
    with stop_on_signals(), contextlib.ExitStack() as held:
        root = config.checkpoint_dir
        if root is not None:
            held.enter_context(ckpt.locked(root))
            cfg.checkpoint_dir = str(root)
            found = resume_point(root, model)
            if found is not None:
                path, meta = found
                cfg.resume_from, cfg.start_step, cfg.start_sample = str(path), int(meta["step"]), int(meta["samples"])
                cfg.seed, cfg.extra["losses"] = int(meta["seed"]), list(meta.get("losses", []))
                result.resumed_from = cfg.start_step
                say(f"resumed from {root} at step {cfg.start_step}: {config.steps} more step(s), steps "
                    f"{cfg.start_step}..{cfg.start_step + config.steps - 1} (--steps counts the steps of this run)")
        say(f"starting {world} processes ({'CUDA, nccl' if use_cuda else 'CPU, gloo'})")
        try:
            _spawn(cfg, world, result, on_step, say)
        except Stopped as exc:
            done = f"every process was stopped after {len(result.records)} complete step(s)"
            newest = ckpt.latest(root) if root is not None else None
            exc.detail = done + (f"; newest checkpoint {newest}" if newest is not None else "")
            raise
    return result


def _stop_all(procs: list[Any], launcher: Any) -> None:
    """Stop every process at once: close the launcher pipe (each exits itself), SIGTERM, then SIGKILL
    what is left after :data:`STOP_GRACE_S` (a stopped or hung process). A stop signal arriving
    meanwhile is held back until they are all gone."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        launcher.close()
        for p in procs:
            if p.exitcode is None:
                p.terminate()
        end = time.monotonic() + STOP_GRACE_S
        for p in procs:
            p.join(max(0.0, end - time.monotonic()))
        for p in procs:
            if p.exitcode is None:
                p.kill()
        for p in procs:
            p.join(5)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _spawn(cfg: WorkerConfig, world: int, result: RunResult, on_step: Callable[[StepRecord], None] | None,
           say: Log) -> None:
    # children fork from a server that already imported these; torch.optim imports torch._dynamo
    # lazily (~2 s per process otherwise)
    mp.set_forkserver_preload(PRELOAD)
    mpctx = mp.get_context("forkserver")
    # a SimpleQueue's put is written to the pipe before it returns: a step reported just before another
    # process dies (and the rest are terminated) still arrives, where a Queue's feeder thread could lose it
    q: Any = mpctx.SimpleQueue()
    errors: dict[int, str] = {}
    phases: dict[str, set[int]] = {}
    done = False
    t0 = time.monotonic()
    announce = {"connected": f"{world}/{world} processes connected", "built": "model built; training"}

    def handle(msg: dict[str, Any]) -> None:
        nonlocal done
        if msg["type"] == "step":
            rec = StepRecord(msg["step"], msg["loss"], msg["time_s"], msg.get("peak_memory_bytes"))
            result.records.append(rec)
            if on_step:
                on_step(rec)
        elif msg["type"] == "phase":
            ranks = phases.setdefault(msg["phase"], set())
            ranks.add(msg["rank"])
            if len(ranks) == world and msg["phase"] in announce:
                say(f"{announce[msg['phase']]} ({time.monotonic() - t0:.1f} s)")
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
    multiprocessing.forkserver.ensure_running()  # the slow part (the server imports torch), before any worker
    # the workers' ends of this pipe see end of file once the launcher closes its end or dies
    launcher_r, launcher_w = mpctx.Pipe(duplex=False)
    procs: list[Any] = []
    failed: int | None = None
    finished = False
    try:
        ctx = mp.start_processes(spawn_entry, args=(cfg, q, launcher_r), nprocs=world, join=False,
                                 start_method="forkserver")
        procs = list(ctx.processes)
        launcher_r.close()
        failed = _watch(procs, errors, drain)
        finished = failed is None
    finally:
        if not finished:  # a failure, a stop signal, or any error of the launcher's own
            _stop_all(procs, launcher_w)
        launcher_w.close()
        launcher_r.close()
    drain(0.2)  # the children have exited, so their messages are all in the pipe
    if failed is None:
        return
    device = cfg.order[failed]
    code = procs[failed].exitcode
    if failed in errors:
        why = errors[failed]
    elif code is not None and code < 0:
        why = f"killed by signal {signal.Signals(-code).name}"
    else:
        why = f"exited with code {code}"
    raise JobError(f"process {failed} (device {device}) failed: {why}; the job was stopped "
                   f"after {len(result.records)} complete step(s)")


def _watch(procs: list[Any], errors: dict[int, str], drain: Callable[[], None]) -> int | None:
    """Wait until every process has exited (None) or one has failed (its rank).

    Of processes found failed together, one that died without reporting an error (killed, or exited
    on purpose) is the cause; the others' errors are what its death did to them."""
    while True:
        raise_if_stopped()
        drain()
        codes = [p.exitcode for p in procs]
        bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if bad:
            drain()  # a failed process reports its error before it exits
            silent = [r for r in bad if r not in errors]
            return (silent or bad)[0]
        if all(c == 0 for c in codes):
            return None
        multiprocessing.connection.wait([p.sentinel for p, c in zip(procs, codes) if c is None], timeout=0.1)
