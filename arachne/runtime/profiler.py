"""Measure a model's per-layer times and activation memory on the local device.

Writes the ``arachne-profile/1`` format. To stay quick, only ``blocks`` transformer blocks of
each kind (dense / MoE) are built and timed; every block of the model gets the mean of the
measured blocks of its kind (the blocks of one kind are identical in shape). ``optimizer_s``
is the Adam step of the measured parts scaled by parameter count to the whole model's
per-rank share. TP > 1 runs ``tp`` processes with a real TP group (gloo on CPU, NCCL on GPUs),
so times include TP communication. Activation bytes are the bytes of tensors autograd keeps
for backward (parameters excluded), counted with saved-tensor hooks.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor

from arachne.cost.calibration import DEFAULT_CALIBRATION
from arachne.cost.compute import act_bytes
from arachne.cost.memory import block_activation_bytes, block_transient_bytes, head_transient_bytes
from arachne.profiles.format import (
    BlockTimes,
    MemoryProfile,
    PassTimes,
    ProfileDocument,
    ProfileEntry,
)
from arachne.runtime.model import LOCAL, Block, Comm, Embedding, Head, ParamStore
from arachne.spec.model import ModelSpec

AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class ProfileSettings:
    micro_batch_sizes: tuple[int, ...] = (1, 2, 4)
    tps: tuple[int, ...] = (1,)
    sequence_length: int = 2048
    precision: str = "fp32"
    blocks: int = 2
    repeats: int = 3
    warmup: int = 1


def measured_blocks(model: ModelSpec, per_kind: int) -> list[int]:
    """The first ``per_kind`` block indices of each kind (dense, MoE) present in the model."""
    out: list[int] = []
    for kind in (False, True):
        out += [i for i in range(model.num_layers) if model.moe_layers[i] == kind][:per_kind]
    return sorted(out)


PROCESS_OVERHEAD_BYTES = 0.5e9  # torch and its libraries in one process
STATE_BYTES_PER_PARAM = 16  # ParamStore keeps fp32 weights; plus fp32 gradients and Adam's two moments


def rank_memory_bytes(model: ModelSpec, s: ProfileSettings, tp: int) -> float:
    """Estimated peak memory of one process profiling ``model`` at ``tp``: the measured parts' weights,
    gradients and Adam state, the largest micro-batch's activations (SDPA keeps no attention scores), and
    the whole token embedding that is initialised before it is sharded."""
    cal = DEFAULT_CALIBRATION.memory
    h, vocab = model.hidden_size, model.padded_vocab()
    idx = measured_blocks(model, s.blocks)
    params = (model.embedding_params() + sum(model.block_params(i) for i in idx) / tp
              + vocab * h / tp + h * (2 if model.bias else 1))
    per_param = STATE_BYTES_PER_PARAM + (2 if s.precision in AUTOCAST else 0)  # autocast's 16-bit weight copies
    init = 4 * params + 3 * 4 * vocab * h
    b, seq = max(s.micro_batch_sizes), s.sequence_length
    scale = act_bytes(s.precision) / act_bytes("bf16")  # the flash-attention accounting, at this element size
    block = max(block_activation_bytes(model, i, seq, b, tp, "bf16", cal)
                + block_transient_bytes(model, seq, b, tp, "bf16", cal) for i in idx) * scale
    act = 4 * b * seq * h + max(block, head_transient_bytes(model, seq, b, tp, cal))
    return max(init, per_param * params + act) + PROCESS_OVERHEAD_BYTES


def profile_memory_bytes(model: ModelSpec, s: ProfileSettings, use_cuda: bool) -> float:
    """Peak memory a profile needs: of one GPU with CUDA, else of the host (``tp`` processes at once)."""
    return max(rank_memory_bytes(model, s, tp) * (1 if use_cuda else tp) for tp in s.tps)


def _cgroup_available() -> float | None:
    """Memory the cgroup (container) may still use, when it is limited."""
    v1 = "/sys/fs/cgroup/memory/memory."
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         (v1 + "limit_in_bytes", v1 + "usage_in_bytes")):
        try:
            text = open(limit).read().strip()
            if text == "max" or int(text) >= 2**60:
                return None
            return int(text) - int(open(usage).read().strip())
        except (OSError, ValueError):
            continue
    return None


def available_memory_bytes(use_cuda: bool) -> float | None:
    """Free memory of CUDA device 0, or the host's available memory (the container's limit included);
    None when it cannot be read."""
    if use_cuda:
        return float(torch.cuda.mem_get_info(0)[0])
    host = None
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                host = float(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        pass
    if host is None:
        try:
            host = float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (OSError, ValueError, AttributeError):
            host = None
    group = _cgroup_available()
    return group if host is None else host if group is None else min(host, group)


@contextlib.contextmanager
def saved_bytes(params: set[int]) -> Iterator[list[int]]:
    """Count bytes of tensors saved for backward (distinct storages, parameters excluded)."""
    total = [0]
    seen: set[int] = set()

    def pack(t: Tensor) -> Tensor:
        try:
            ptr = t.untyped_storage().data_ptr()
            size = t.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError):
            return t
        if ptr not in params and ptr not in seen:
            seen.add(ptr)
            total[0] += size
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield total


class _Timer:
    def __init__(self, device: torch.device, tp: Comm):
        self.device, self.tp = device, tp

    def __call__(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        if self.tp.group is not None:
            dist.barrier(group=self.tp.group)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return out, time.perf_counter() - t0


def measure_entry(model: ModelSpec, mbs: int, s: ProfileSettings, device: torch.device, tp: Comm) -> ProfileEntry:
    """Times and activation bytes of embedding, measured blocks and head at one (mbs, tp)."""
    store = ParamStore(model, 0, device)
    emb = Embedding(model, store)
    idx = measured_blocks(model, s.blocks)
    blocks = {i: Block(model, i, store, tp, LOCAL) for i in idx}
    head = Head(model, store, tp)
    params = [p for _, p in store.entries]
    pptr = {p.untyped_storage().data_ptr() for p in params}
    seq = s.sequence_length
    g = torch.Generator().manual_seed(mbs)
    ids = torch.randint(0, model.vocab_size, (mbs, seq + 1), generator=g).to(device)
    ac = (lambda: torch.autocast(device.type, dtype=AUTOCAST[s.precision])) if s.precision in AUTOCAST \
        else contextlib.nullcontext
    timer = _Timer(device, tp)
    times: dict[str, list[float]] = {}
    mem: dict[str, int] = {}

    def rec(key: str, t: float, keep: bool) -> None:
        if keep:
            times.setdefault(key, []).append(t)

    for it in range(s.warmup + s.repeats):
        keep = it >= s.warmup
        with ac(), saved_bytes(pptr) as m:
            x, t = timer(lambda: emb(ids[:, :-1]))
        rec("emb_f", t, keep)
        mem["emb"] = m[0]
        h = x.detach()
        for i, blk in blocks.items():
            inp = h.detach().requires_grad_()
            with ac(), saved_bytes(pptr) as m:
                out, t = timer(lambda: blk(inp))
            rec(f"b{i}_f", t, keep)
            mem[f"b{i}"] = m[0]
            grad = torch.randn_like(out) * 1e-3
            _, t = timer(lambda: out.backward(grad))
            rec(f"b{i}_b", t, keep)
            h = out.detach()
        inp = h.detach().requires_grad_()
        with ac(), saved_bytes(pptr) as m:
            loss, t = timer(lambda: head(inp, ids[:, 1:]))
        rec("head_f", t, keep)
        mem["head"] = m[0]
        _, t = timer(lambda: loss.backward())
        rec("head_b", t, keep)
        _, t = timer(lambda: x.backward(torch.randn_like(x) * 1e-3))
        rec("emb_b", t, keep)
    opt = torch.optim.Adam(params, lr=1e-4)
    opt_times = []
    for it in range(s.warmup + s.repeats):
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        _, t = timer(opt.step)
        if it >= s.warmup:
            opt_times.append(t)
    local = sum(p.numel() for p in params)
    opt_s = statistics.median(opt_times) * (model.num_params / tp.size) / max(1, local)

    def med(key: str) -> float:
        return statistics.median(times[key])

    kind_f: dict[bool, list[float]] = {}
    kind_b: dict[bool, list[float]] = {}
    kind_m: dict[bool, list[float]] = {}
    for i in idx:
        k = model.moe_layers[i]
        kind_f.setdefault(k, []).append(med(f"b{i}_f"))
        kind_b.setdefault(k, []).append(med(f"b{i}_b"))
        kind_m.setdefault(k, []).append(float(mem[f"b{i}"]))
    per = [model.moe_layers[i] for i in range(model.num_layers)]
    return ProfileEntry(
        micro_batch_size=mbs, tp=tp.size,
        embedding=PassTimes(fwd_s=med("emb_f"), bwd_s=med("emb_b")),
        blocks=BlockTimes(fwd_s=tuple(statistics.mean(kind_f[k]) for k in per),
                          bwd_s=tuple(statistics.mean(kind_b[k]) for k in per)),
        head=PassTimes(fwd_s=med("head_f"), bwd_s=med("head_b")),
        optimizer_s=opt_s,
        memory=MemoryProfile(block_activation_bytes=tuple(statistics.mean(kind_m[k]) for k in per),
                             embedding_activation_bytes=float(mem["emb"]), head_activation_bytes=float(mem["head"])),
    )


def _tp_entry(rank: int, model_doc: dict[str, Any], s: ProfileSettings, tp: int, init: str, use_cuda: bool,
              threads: int, q: Any) -> None:
    """One rank of a TP profile run; rank 0 reports the entries."""
    try:
        torch.set_num_threads(threads)
        backend = "nccl" if use_cuda else "gloo"
        dist.init_process_group(backend, init_method=init, rank=rank, world_size=tp,
                                timeout=datetime.timedelta(seconds=600))
        device = torch.device("cuda", rank) if use_cuda else torch.device("cpu")
        if use_cuda:
            torch.cuda.set_device(device)
        comm = Comm(dist.new_group(list(range(tp))), rank, tp)
        model = ModelSpec(**model_doc)
        entries = [measure_entry(model, mbs, s, device, comm).model_dump() for mbs in s.micro_batch_sizes]
        if rank == 0:
            q.put(entries)
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as exc:
        q.put({"error": f"{type(exc).__name__}: {exc}"})
        raise


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def default_gpu_name(device: torch.device) -> str:
    """The catalog name of the local GPU when it is in the catalog, else its reported name; CPU: "CPU"."""
    if device.type != "cuda":
        return "CPU"
    from arachne.spec.gpus import gpu_catalog

    raw = torch.cuda.get_device_name(device)
    for cand in (raw, raw.replace("NVIDIA ", ""), raw.replace("NVIDIA ", "").split(" ")[0]):
        g = gpu_catalog().get(cand)
        if g is not None:
            return g.name
    return raw


def profile_model(model: ModelSpec, s: ProfileSettings, gpu: str | None = None,
                  log: Callable[[str], None] = lambda _m: None) -> ProfileDocument:
    """Profile ``model`` on this machine (first CUDA device, else CPU) at every (mbs, tp)."""
    from arachne.runtime.launch import PRELOAD, free_port

    use_cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if use_cuda else torch.device("cpu")
    entries: list[ProfileEntry] = []
    cores = torch.get_num_threads()
    for tp in s.tps:
        if tp == 1:
            for mbs in s.micro_batch_sizes:
                log(f"profiling tp=1 mbs={mbs}")
                entries.append(measure_entry(model, mbs, s, device, LOCAL))
            continue
        if use_cuda and torch.cuda.device_count() < tp:
            log(f"skipping tp={tp}: only {torch.cuda.device_count()} CUDA devices")
            continue
        log(f"profiling tp={tp} ({tp} processes)")
        mp.set_forkserver_preload(PRELOAD)
        q: Any = mp.get_context("forkserver").Queue()
        try:
            mp.start_processes(_tp_entry, args=(model.model_dump(), s, tp, f"tcp://127.0.0.1:{free_port()}",
                                                 use_cuda, max(1, cores // tp), q), nprocs=tp,
                               start_method="forkserver")
        except (mp.ProcessExitedException, mp.ProcessRaisedException) as exc:
            raise RuntimeError(f"tp={tp} profile failed: {str(exc).strip().splitlines()[-1]}") from None
        got = q.get(timeout=60)
        if isinstance(got, dict):
            raise RuntimeError(f"tp={tp} profile failed: {got['error']}")
        entries += [ProfileEntry(**e) for e in got]
    if not entries:
        raise RuntimeError("no profile entry could be measured")
    n = len(measured_blocks(model, s.blocks))
    return ProfileDocument(
        model=model.name, gpu=gpu or default_gpu_name(device), precision=s.precision,
        sequence_length=s.sequence_length,
        source=(f"arachne profile, torch {torch.__version__}: {n} of {model.num_layers} blocks measured, every "
                "block takes the mean of the measured blocks of its kind; optimizer_s scaled by parameters"),
        date=datetime.date.today().isoformat(), device=device_name(device), entries=entries)
