"""Unsharded checkpoints: per-layer files of canonical parameters and Adam state, plus meta.json.

Layout of a checkpoint directory::

    D/latest                     name of the newest complete step directory
    D/step-000002/meta.json      step, samples consumed, seed, lr, optimizer, model, plan
    D/step-000002/embedding.pt   {name: {"param": T, "exp_avg": T, "exp_avg_sq": T}}
    D/step-000002/layer-00000.pt ...
    D/step-000002/head.pt

Tensors are full (unsharded) canonical tensors, so a job can resume with any other plan.
Each writer rank saves its pieces to ``D/.tmp-step-N/rank-R.pt``; rank 0 assembles them.

A step is published only once complete: its files are written (and synced) in
``D/.staging-step-N``, renamed to ``D/step-N``, and then ``D/latest`` is replaced atomically. A run
stopped at any moment leaves the previous ``latest`` loadable. The run writing ``D`` holds an
exclusive lock on ``D/.lock`` (:func:`locked`), which also clears what a stopped run left half-written.

Node-local copies (elastic runs, :mod:`arachne.runtime.state_move`): with each save, every rank also
keeps everything it holds (all its pieces, with ``"writer"`` marking those the step's files took) in
storage of its own node, ``D/.local/NODE/gpu-I/step-N.pt`` (``{"save_id", "step", "pieces"}``; written
to a temporary name and renamed). This directory stands for a node's host memory or local disk, which
outlives a worker process but not its node: only that device's own process reads or removes it
(:func:`load_local`, :func:`prune_local`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from arachne.errors import InputError
from arachne.runtime.layout import checkpoint_file, name_order

CHECKPOINT_FORMAT = "arachne-checkpoint/1"
STATE_KEYS = ("param", "exp_avg", "exp_avg_sq")
KEEP = 2


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:06d}"


def tmp_dir(root: Path, step: int) -> Path:
    return root / f".tmp-step-{step:06d}"


def save_pieces(root: Path, step: int, rank: int, pieces: dict[str, list[dict[str, Any]]]) -> None:
    """Write one rank's pieces: ``{name: [{"dim", "start", "stop", "param", ...}]}``."""
    d = tmp_dir(root, step)
    d.mkdir(parents=True, exist_ok=True)
    torch.save(pieces, d / f"rank-{rank:05d}.pt")


def assemble(root: Path, step: int, shapes: dict[str, tuple[int, ...]], meta: dict[str, Any]) -> Path:
    """Merge every rank's pieces into per-layer files of full tensors and publish the step."""
    src = tmp_dir(root, step)
    full: dict[str, dict[str, Tensor]] = {}
    for f in sorted(src.glob("rank-*.pt")):
        for name, pieces in torch.load(f, map_location="cpu", weights_only=True).items():
            slot = full.setdefault(name, {})
            for piece in pieces:
                for key in STATE_KEYS:
                    if key not in piece:
                        continue
                    t = slot.setdefault(key, torch.zeros(shapes[name]))
                    view = t if piece["dim"] is None else t.narrow(piece["dim"], piece["start"],
                                                                    piece["stop"] - piece["start"])
                    view.copy_(piece[key])
    missing = sorted(set(shapes) - set(full), key=name_order)
    if missing:
        raise RuntimeError(f"checkpoint step {step}: no rank wrote {missing[0]}")
    files: dict[str, dict[str, dict[str, Tensor]]] = {}
    for name in sorted(full, key=name_order):
        files.setdefault(checkpoint_file(name), {})[name] = full[name]
    out = step_dir(root, step)
    staging = root / f".staging-step-{step:06d}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for fname, content in files.items():
        with open(staging / fname, "wb") as fh:
            torch.save(content, fh)
            _sync(fh)
    with open(staging / "meta.json", "w") as fh:
        fh.write(json.dumps(meta, indent=1) + "\n")
        _sync(fh)
    _sync_dir(staging)
    shutil.rmtree(out, ignore_errors=True)  # a step published by a stopped run but never made latest
    staging.replace(out)
    _sync_dir(root)
    latest_tmp = root / "latest.tmp"
    with open(latest_tmp, "w") as fh:
        fh.write(out.name + "\n")
        _sync(fh)
    latest_tmp.replace(root / "latest")
    _sync_dir(root)
    shutil.rmtree(src, ignore_errors=True)
    older = sorted(p for p in root.glob("step-*") if p.is_dir() and p.name < out.name)
    for old in older[:max(0, len(older) - (KEEP - 1))]:
        shutil.rmtree(old, ignore_errors=True)
    return out


def _sync(fh: Any) -> None:
    fh.flush()
    os.fsync(fh.fileno())


def _sync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (a power cut after it keeps the new name)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


LOCAL = ".local"


def local_dir(root: Path, device: str) -> Path:
    """The node-local directory of ``device`` (``node:index``)."""
    node, index = device.rsplit(":", 1)
    return root / LOCAL / node / f"gpu-{int(index)}"


def save_local(root: Path, device: str, step: int, save_id: str, pieces: dict[str, list[dict[str, Any]]]) -> Path:
    """Keep ``device``'s pieces of step ``step`` in its node-local directory (atomically replaced)."""
    d = local_dir(root, device)
    d.mkdir(parents=True, exist_ok=True)
    out = d / f"step-{step:06d}.pt"
    tmp = d / f".tmp-{out.name}"
    torch.save({"save_id": save_id, "step": step, "pieces": pieces}, tmp)
    tmp.replace(out)
    return out


def load_local(root: Path, device: str, step: int, save_id: str) -> dict[str, list[dict[str, Any]]] | None:
    """``device``'s own pieces of the save ``save_id`` (step ``step``), or None when it keeps none."""
    f = local_dir(root, device) / f"step-{step:06d}.pt"
    if not f.is_file():
        return None
    try:
        doc = torch.load(f, map_location="cpu", weights_only=True, mmap=True)
    except (OSError, RuntimeError, EOFError):  # unreadable: as if absent (the restore then reloads)
        return None
    return doc["pieces"] if doc.get("save_id") == save_id and doc.get("step") == step else None


def prune_local(root: Path, device: str, keep_from: int | None) -> None:
    """Remove ``device``'s node-local copies of steps before ``keep_from`` (the newest complete step; None:
    keep all) and what a killed write left behind."""
    d = local_dir(root, device)
    for f in d.glob(".tmp-*"):
        f.unlink(missing_ok=True)
    if keep_from is None:
        return
    for f in d.glob("step-*.pt"):
        if int(f.stem.split("-")[1]) < keep_from:
            f.unlink(missing_ok=True)


LOCK_FILE = ".lock"
PARTIAL = (".tmp-step-*", ".staging-step-*", "latest.tmp")


def clear_partial(root: Path) -> None:
    """Remove what a stopped run left half-written (never read: a later run of the same step
    would otherwise merge a stale rank's pieces). Only the lock holder may call this."""
    for pattern in PARTIAL:
        for p in root.glob(pattern):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    """Hold the checkpoint directory ``root`` (created if missing) for one run.

    An exclusive ``flock`` on ``root/.lock``, released when the holder exits, however it exits.
    A directory another run holds is refused with an :class:`InputError` naming that run's process.
    """
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise InputError(str(root), "", f"cannot use as a checkpoint directory "
                                        f"({exc.strerror or type(exc).__name__})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            who = f" (process {holder})" if holder.isdigit() else ""
            raise InputError(str(root), "", f"checkpoint directory in use by another run{who}; wait for it "
                                            "to end or stop it, or choose another --checkpoint-dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        clear_partial(root)
        yield
    finally:
        os.close(fd)


def latest(root: Path) -> Path | None:
    """The newest complete step directory, or None."""
    ptr = root / "latest"
    if not ptr.is_file():
        return None
    d = root / ptr.read_text().strip()
    return d if (d / "meta.json").is_file() else None


def read_meta(step_path: Path) -> dict[str, Any]:
    return json.loads((step_path / "meta.json").read_text())


class CheckpointReader:
    """Reads canonical tensors from a step directory, one per-layer file at a time (cached)."""

    def __init__(self, step_path: Path):
        self.path = step_path
        self._files: dict[str, dict[str, dict[str, Tensor]]] = {}

    def _file(self, name: str) -> dict[str, dict[str, Tensor]]:
        f = checkpoint_file(name)
        if f not in self._files:
            p = self.path / f
            self._files[f] = torch.load(p, map_location="cpu", weights_only=True, mmap=True) if p.exists() else {}
        return self._files[f]

    def get(self, name: str, key: str = "param") -> Tensor | None:
        entry = self._file(name).get(name)
        return None if entry is None else entry.get(key)

    def all(self, key: str = "param") -> dict[str, Tensor]:
        """Every canonical tensor of the checkpoint (for tests and tools)."""
        out: dict[str, Tensor] = {}
        for p in sorted(self.path.glob("*.pt")):
            for name, entry in torch.load(p, map_location="cpu", weights_only=True).items():
                if key in entry:
                    out[name] = entry[key]
        return out
