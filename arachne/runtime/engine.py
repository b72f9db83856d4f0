"""One training process: its stage of the model, 1F1B with p2p, gradient sync, Adam, checkpoints.

Every process builds the same :class:`~arachne.runtime.layout.Layout`, creates all process
groups in the same order, runs its stage's schedule, all-reduces each parameter's gradient
among its holders (see ``Layout.grad_sync``) and steps its optimizer. Loss per micro-batch is
the summed token cross-entropy divided by the global token count, so the summed gradients are
exactly the full-batch gradient of the mean loss whatever the pipelines' shapes.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from arachne.plan import Plan, plan_from_dict
from arachne.runtime import checkpoint as ckpt
from arachne.runtime.layout import Layout, ParamSpec, Role, Route
from arachne.runtime.model import (
    LOCAL,
    Comm,
    ParamStore,
    StageModel,
    shard,
    synthetic_tokens,
)
from arachne.spec.model import ModelSpec

AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class WorkerConfig:
    """Everything a process needs; picklable, identical on every process."""

    plan: dict[str, Any]
    model: dict[str, Any]
    order: list[str]
    steps: int = 3
    seed: int = 0
    lr: float = 1e-3
    backend: str = "gloo"
    init_method: str = "env://"
    timeout_s: float = 300.0
    cuda_index: list[int] | None = None  # per rank; None = CPU
    threads: int = 1
    checkpoint_dir: str | None = None
    resume_from: str | None = None
    start_step: int = 0
    start_sample: int = 0
    # (rank, step[, kind]): that process dies there (kind "exit", the default) or stops itself
    # with SIGSTOP ("freeze"), as a hung process would (fault-injection tests)
    fault: tuple[int, int] | tuple[int, int, str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


Report = Callable[[dict[str, Any]], None]


class Worker:
    """The training loop of one rank."""

    def __init__(self, rank: int, cfg: WorkerConfig, report: Report):
        self.rank, self.cfg, self.report = rank, cfg, report
        self.plan: Plan = plan_from_dict(cfg.plan, "plan")
        self.model_spec = ModelSpec(**cfg.model)
        self.layout = Layout(self.plan, self.model_spec, list(cfg.order))
        self.role: Role = self.layout.roles[rank]
        if cfg.cuda_index is not None:
            torch.cuda.set_device(cfg.cuda_index[rank])
            self.device = torch.device("cuda", cfg.cuda_index[rank])
        else:
            self.device = torch.device("cpu")
        self.groups: dict[tuple[int, ...], dist.ProcessGroup] = {}

    # ---- setup -----------------------------------------------------------------------------
    def _setup_groups(self) -> None:
        timeout = datetime.timedelta(seconds=self.cfg.timeout_s)
        for members in self.layout.all_groups():  # every rank creates every group, same order
            pg = dist.new_group(list(members), timeout=timeout)
            if self.rank in members:
                self.groups[members] = pg
        dist.barrier()  # the default group is live before the first (batched) p2p

    def _comm(self, members: tuple[int, ...]) -> Comm:
        if len(members) == 1:
            return LOCAL
        return Comm(self.groups[members], members.index(self.rank), len(members))

    def build(self) -> None:
        role, cfg = self.role, self.cfg
        reader = ckpt.CheckpointReader(Path(cfg.resume_from)) if cfg.resume_from else None
        store = ParamStore(self.model_spec, cfg.seed, self.device, reader.get if reader else None)
        self.stage = StageModel(self.model_spec, role.layers, role.first, role.last, store,
                                self._comm(self.layout.tp_group(role)), self._comm(self.layout.ep_group(role)),
                                role.recompute)
        self.entries = store.entries
        self.by_spec = {s: p for s, p in self.entries}
        params = [p for _, p in self.entries]
        for p in params:  # gradients always exist (zero when unused), as in the reference
            p.grad = torch.zeros_like(p)
        if self.plan.optimizer == "sgd":
            self.opt: torch.optim.Optimizer = torch.optim.SGD(params, lr=cfg.lr)
        else:
            self.opt = torch.optim.Adam(params, lr=cfg.lr)
            if reader is not None:
                load_adam_state(self.opt, self.entries, reader, cfg.start_step)

    # ---- p2p ---------------------------------------------------------------------------------
    def _recv(self, routes: list[Route], shape: tuple[int, ...], dtype: torch.dtype, tag: int) -> Tensor:
        """Receive a [rows, seq, hidden] tensor whose row ranges come from ``routes``' peers."""
        buf = torch.empty(shape, dtype=dtype, device=self.device)
        ops = [dist.P2POp(dist.irecv, buf[r.dst_lo:r.dst_hi], r.peer, tag=tag) for r in routes]
        for w in dist.batch_isend_irecv(ops) if ops else []:
            w.wait()
        return buf

    def _send(self, routes: list[Route], t: Tensor, tag: int) -> list[tuple[Any, Tensor]]:
        """Start sending row ranges of ``t``; the caller waits (and keeps the pieces alive)."""
        pieces = [t[r.src_lo:r.src_hi].contiguous() for r in routes]
        ops = [dist.P2POp(dist.isend, piece, r.peer, tag=tag) for piece, r in zip(pieces, routes)]
        if not ops:
            return []
        return list(zip(dist.batch_isend_irecv(ops), pieces))

    # ---- one iteration -------------------------------------------------------------------------
    def train_step(self, sample_base: int) -> float:
        """Forward/backward all micro-batches of this stage; returns this rank's summed loss."""
        role, lay, spec = self.role, self.layout, self.model_spec
        seq = self.plan.sequence_length
        scale = 1.0 / (self.plan.global_batch_size * seq)
        act_dtype = AUTOCAST.get(self.plan.precision, torch.float32)
        autocast = (torch.autocast(self.device.type, dtype=act_dtype) if self.plan.precision in AUTOCAST
                    else contextlib.nullcontext())
        live: dict[int, tuple[Tensor | None, Tensor]] = {}
        pending: list[tuple[Any, Tensor]] = []
        loss_sum = 0.0
        share = lay.mbs(role.pipeline) // role.dp
        for kind, m in lay.schedule(role):
            if kind == "F":
                lo, hi = lay.samples(role, m)
                tokens = None
                if role.first or role.last:
                    tokens = synthetic_tokens(self.cfg.seed, sample_base + lo, sample_base + hi, seq,
                                              spec.vocab_size).to(self.device)
                if role.first:
                    x: Tensor = tokens[:, :-1]  # type: ignore[index]
                else:
                    x = self._recv(lay.recv_forward(role), (share, seq, spec.hidden_size), act_dtype, 2 * m)
                    x.requires_grad_()
                with autocast:
                    out = self.stage(x, tokens[:, 1:] if role.last else None)  # type: ignore[index]
                if role.last:
                    if role.tp_rank == 0:
                        loss_sum += float(out.detach())
                    live[m] = (None if role.first else x, out * scale)
                else:
                    out = out.to(act_dtype)
                    pending += self._send(lay.send_forward(role), out.detach(), 2 * m)
                    live[m] = (None if role.first else x, out)
            else:
                x_in, out = live.pop(m)
                if role.last:
                    out.backward()
                else:
                    g = self._recv(lay.recv_backward(role), tuple(out.shape), out.dtype, 2 * m + 1)
                    out.backward(g)
                if x_in is not None:
                    assert x_in.grad is not None
                    pending += self._send(lay.send_backward(role), x_in.grad, 2 * m + 1)
        for w, _ in pending:
            w.wait()
        return loss_sum

    def sync_grads(self) -> None:
        """Sum every parameter's gradient over all its holders (bucketed per process group)."""
        for members, items in self.layout.grad_sync(self.rank):
            bufs: list[Tensor] = []
            for it in items:
                if it.full:
                    buf = torch.zeros(it.specs[0].shape, device=self.device)
                    for s, contributes in zip(it.specs, it.contributes):
                        if contributes:
                            shard(buf, s).add_(self.by_spec[s].grad)  # type: ignore[arg-type]
                    bufs.append(buf)
                else:
                    bufs.append(self.by_spec[it.specs[0]].grad)  # type: ignore[arg-type]
            if len(members) > 1:
                flat = torch.cat([b.reshape(-1) for b in bufs])
                dist.all_reduce(flat, group=self.groups[members])
                off = 0
                for b in bufs:
                    b.copy_(flat[off:off + b.numel()].view_as(b))
                    off += b.numel()
            for it, b in zip(items, bufs):
                if it.full:
                    for s in it.specs:
                        self.by_spec[s].grad.copy_(shard(b, s))  # type: ignore[union-attr]

    def step(self, sample_base: int) -> float:
        """One optimizer step: gradients zeroed, forward and backward over the micro-batches, gradient sync,
        the update. Returns this rank's summed loss."""
        for p in self.by_spec.values():
            p.grad.zero_()  # type: ignore[union-attr]
        loss_sum = self.train_step(sample_base)
        self.sync_grads()
        self.opt.step()
        return loss_sum

    def save_checkpoint(self, step: int, samples: int, losses: list[float]) -> None:
        root = Path(self.cfg.checkpoint_dir)  # type: ignore[arg-type]
        mine = self.layout.checkpoint_writers.get(self.rank, [])
        pieces: dict[str, list[dict[str, Any]]] = {}
        for s in mine:
            p = self.by_spec[s]
            piece: dict[str, Any] = {"dim": s.dim, "start": s.start, "stop": s.stop, "param": p.detach().cpu()}
            st = self.opt.state.get(p, {})
            for key in ("exp_avg", "exp_avg_sq"):
                if key in st:
                    piece[key] = st[key].detach().cpu()
            pieces.setdefault(s.name, []).append(piece)
        if pieces:
            ckpt.save_pieces(root, step, self.rank, pieces)
        dist.barrier()
        if self.rank == 0:
            shapes = {name: hs[0][1].shape for name, hs in self.layout.holders.items()}
            meta = {"format": ckpt.CHECKPOINT_FORMAT, "step": step, "samples": samples, "seed": self.cfg.seed,
                    "lr": self.cfg.lr, "optimizer": self.plan.optimizer, "model": self.cfg.model,
                    "plan": self.cfg.plan, "losses": losses}
            ckpt.assemble(root, step, shapes, meta)
        dist.barrier()

    def run(self) -> None:
        cfg = self.cfg
        self._setup_groups()
        self.build()
        self.report({"type": "phase", "phase": "built", "rank": self.rank})
        world = self.layout.world_size
        samples = cfg.start_sample
        losses: list[float] = list(cfg.extra.get("losses", []))
        for i in range(cfg.steps):
            step = cfg.start_step + i
            if cfg.fault is not None and cfg.fault[1] == step:  # simulated crash (fault-injection tests),
                if world > 1:  # once every process has finished (and rank 0 reported) the steps before
                    dist.barrier()
                if cfg.fault[0] == self.rank:
                    if cfg.fault[2:] == ("freeze",):
                        os.kill(os.getpid(), signal.SIGSTOP)
                    else:
                        os._exit(17)
            t0 = time.perf_counter()
            loss_sum = self.step(samples)
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - t0
            total = torch.tensor([loss_sum], dtype=torch.float64, device=self.device)
            dt = torch.tensor([elapsed], dtype=torch.float64, device=self.device)
            if world > 1:
                dist.all_reduce(total)
                dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            peak = None
            if self.device.type == "cuda":  # the step's peak allocated bytes, the largest over the ranks
                mem = torch.tensor([float(torch.cuda.max_memory_allocated(self.device))], dtype=torch.float64,
                                   device=self.device)
                if world > 1:
                    dist.all_reduce(mem, op=dist.ReduceOp.MAX)
                peak = float(mem[0])
                torch.cuda.reset_peak_memory_stats(self.device)
            loss = float(total[0]) / (self.plan.global_batch_size * self.plan.sequence_length)
            samples += self.plan.global_batch_size
            losses.append(loss)
            if cfg.checkpoint_dir:
                self.save_checkpoint(step + 1, samples, losses)
            if self.rank == 0:
                msg = {"type": "step", "step": step, "loss": loss, "time_s": float(dt[0])}
                self.report(msg if peak is None else msg | {"peak_memory_bytes": peak})


def load_adam_state(opt: torch.optim.Optimizer, entries: list[tuple[ParamSpec, torch.nn.Parameter]],
                    reader: ckpt.CheckpointReader, step: int) -> None:
    """Re-shard saved Adam moments onto this rank's pieces."""
    for spec, p in entries:
        m, v = reader.get(spec.name, "exp_avg"), reader.get(spec.name, "exp_avg_sq")
        if m is None or v is None or step == 0:
            continue
        opt.state[p] = {"step": torch.tensor(float(step)),
                        "exp_avg": shard(m, spec).to(p.device, p.dtype).clone(),
                        "exp_avg_sq": shard(v, spec).to(p.device, p.dtype).clone()}


def init_distributed(rank: int, cfg: WorkerConfig) -> None:
    if cfg.backend == "gloo" and cfg.init_method.startswith("tcp://127."):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # local jobs stay on the loopback device
    torch.set_num_threads(max(1, cfg.threads))
    if cfg.cuda_index is not None:
        torch.cuda.set_device(cfg.cuda_index[rank])
    dist.init_process_group(cfg.backend, init_method=cfg.init_method, rank=rank, world_size=len(cfg.order),
                            timeout=datetime.timedelta(seconds=cfg.timeout_s))


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = re.sub(r"^\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*", "", text[0]) if text else ""  # gloo's source location
    return f"{type(exc).__name__}: {first}".rstrip(": ")


def _exit_with_launcher(launcher: Any) -> None:
    """Exit at once when the launcher's end of the ``launcher`` pipe closes: the launcher has ended
    or is stopping the job, whatever it was killed with, and no process may train on without it."""

    def watch() -> None:
        try:
            launcher.recv()  # nothing is ever sent: this returns only at end of file
        except (EOFError, OSError):
            pass
        os._exit(1)

    threading.Thread(target=watch, name="arachne-launcher-watch", daemon=True).start()


def spawn_entry(rank: int, cfg: WorkerConfig, queue: Any, launcher: Any = None) -> None:
    """Entry point of a process started by :func:`arachne.runtime.launch.run_plan`."""
    # Ctrl-C reaches every process of the terminal's group: the launcher alone decides, and stops us
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if launcher is not None:
        _exit_with_launcher(launcher)
    try:
        init_distributed(rank, cfg)
        queue.put({"type": "phase", "phase": "connected", "rank": rank})
        Worker(rank, cfg, queue.put).run()
        if rank == 0:
            queue.put({"type": "done"})
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as exc:  # report, then let the launcher stop the job
        # kept short: a pipe write under PIPE_BUF is atomic, so a process stopped meanwhile cannot leave
        # half a message that the launcher would wait on
        queue.put({"type": "error", "rank": rank, "message": one_line(exc)[:500]})
        raise
