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
import re
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from arachne.errors import InputError, load_document
from arachne.runtime.layout import checkpoint_file, name_order

CHECKPOINT_FORMAT = "arachne-checkpoint/1"
STATE_KEYS = ("param", "exp_avg", "exp_avg_sq")
KEEP = 2
STEP_NAME = re.compile(r"step-[0-9]{6,}")  # what step_dir names (the only directories a run reads or removes)


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:06d}"


def step_number(name: str) -> int | None:
    """The step of a step directory's name as :func:`step_dir` writes it (``step-000012``), else None."""
    if not STEP_NAME.fullmatch(name):
        return None
    step = int(name[5:])
    return step if name == f"step-{step:06d}" else None


def step_dirs(root: Path) -> list[Path]:
    """The step directories in ``root`` (real directories named as :func:`step_dir` does), oldest first."""
    found = [p for p in root.iterdir() if step_number(p.name) is not None and p.is_dir() and not p.is_symlink()]
    return sorted(found, key=lambda p: step_number(p.name) or 0)


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
    older = [p for p in step_dirs(root) if (step_number(p.name) or 0) < step]  # never another name
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
        check_resumable(root)
        yield
    finally:
        os.close(fd)


LATEST_MAX_BYTES = 256


def latest(root: Path) -> Path | None:
    """The newest complete step directory, or None when ``root/latest`` does not exist.

    ``latest`` must be a regular file naming a step directory (``step-`` and digits) that exists directly in
    ``root`` and holds meta.json; anything else is an :class:`InputError` naming ``latest`` (never followed
    as a path, never taken for "no checkpoint", which would start again over the step directories).
    """
    ptr = root / "latest"
    try:
        mode = os.lstat(ptr).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InputError(str(ptr), "", f"cannot read ({exc.strerror or type(exc).__name__})") from None
    if not stat.S_ISREG(mode):
        raise InputError(str(ptr), "", "not a regular file (expected the name of a step directory, e.g. "
                                       "step-000002)")
    try:
        with open(ptr, "rb") as fh:
            raw = fh.read(LATEST_MAX_BYTES + 1)
        name = raw.decode("ascii", "replace").strip()
    except OSError as exc:
        raise InputError(str(ptr), "", f"cannot read ({exc.strerror or type(exc).__name__})") from None
    if len(raw) > LATEST_MAX_BYTES or step_number(name) is None:
        shown = name if len(name) <= 40 else name[:40] + "..."
        raise InputError(str(ptr), "", f"expected the name of a step directory (step- and 6 or more digits, "
                                       f"e.g. step-000002), got {shown!r}")
    d = root / name
    if not d.is_dir() or d.is_symlink():
        raise InputError(str(ptr), "", f"names {name}, which is not a step directory in {root}; write the name "
                                       "of an existing step-* directory into it, or choose another --checkpoint-dir")
    if not (d / "meta.json").is_file():
        raise InputError(str(ptr), "", f"names {name}, which has no meta.json (an incomplete step directory)")
    return d


def check_resumable(root: Path) -> None:
    """Refuse (:class:`InputError`) a checkpoint directory a run could not safely resume from or start in:
    a bad ``latest``, meta.json or tensor file, or step directories without ``latest`` (a new run would
    replace them: a run stopped between publishing its first step and writing ``latest`` leaves that too,
    and its step directory is complete, so naming it in ``latest`` resumes from it).
    Called by :func:`locked`, so by every run before it reads or writes ``root``."""
    found = latest(root)
    if found is not None:
        from arachne.spec.model import model_from_dict

        layers = model_from_dict(read_meta(found, RESUME_FIELDS)["model"]).num_layers
        for name in ["embed.", *(f"layers.{i}" for i in range(layers)), "head"]:
            f = found / checkpoint_file(name)
            if not f.is_file():  # every save writes each file; resuming without one would re-seed its tensors
                raise InputError(str(f), "", f"missing from {found.name} (every complete step holds embedding.pt, "
                                             f"layer-*.pt for each of the {layers} layers and head.pt); write "
                                             "the name of an intact step into latest, or choose another "
                                             "--checkpoint-dir")
            load_tensors(f)  # memory-mapped: the structure is read, not the tensors
        return
    steps = step_dirs(root)
    if steps:
        names = ", ".join(p.name for p in steps[-3:])
        raise InputError(str(root / "latest"), "", f"missing, but {root} holds step directories ({names}); a "
                                                    f"new run would write over them: write the name of the step to "
                                                    f"resume from into it (the newest is {steps[-1].name}), or "
                                                    "choose another --checkpoint-dir")


RESUME_FIELDS = ("format", "step", "samples", "seed", "model")  # what a run resuming reads (every save writes them)


def _int_field(doc: dict[str, Any], key: str, source: str, low: int | None = 0) -> None:
    value = doc[key]
    if type(value) is not int or (low is not None and value < low):
        raise InputError(source, key, f"expected an integer{'' if low is None else f' of {low} or more'}, "
                                      f"got {value!r}")


def read_meta(step_path: Path, required: tuple[str, ...] = ("step",)) -> dict[str, Any]:
    """The checked meta.json of a step directory: ``required`` fields present, every known field of the right
    kind (an :class:`InputError` naming the file and the field otherwise)."""
    from arachne.spec.model import model_from_dict

    path = step_path / "meta.json"
    source = str(path)
    doc = load_document(path)  # missing, unreadable, not JSON, not a mapping: one line naming the file
    for key in required:
        if key not in doc:
            raise InputError(source, key, "required field is missing")
    if "format" in doc and doc["format"] != CHECKPOINT_FORMAT:
        raise InputError(source, "format", f"expected {CHECKPOINT_FORMAT!r}, got {doc['format']!r}")
    for key, low in (("step", 0), ("samples", 0), ("seed", None)):
        if key in doc:
            _int_field(doc, key, source, low)
    if "step" in doc and (named := step_number(step_path.name)) is not None and doc["step"] != named:
        raise InputError(source, "step", f"is {doc['step']}, but the directory is {step_path.name}")
    if "model" in doc:
        if not isinstance(doc["model"], dict):
            raise InputError(source, "model", "expected a mapping (the model document)")
        model_from_dict(doc["model"], source, "model")
    losses = doc.get("losses", [])
    if not isinstance(losses, list):
        raise InputError(source, "losses", "expected a list of numbers")
    for i, x in enumerate(losses):
        if type(x) not in (int, float):
            raise InputError(source, f"losses[{i}]", f"expected a number, got {x!r}")
    if "save_id" in doc and not isinstance(doc["save_id"], str):
        raise InputError(source, "save_id", "expected a string")
    return doc


class CheckpointReader:
    """Reads canonical tensors from a step directory, one per-layer file at a time (cached)."""

    def __init__(self, step_path: Path):
        self.path = step_path
        self._files: dict[str, dict[str, dict[str, Tensor]]] = {}

    def _file(self, name: str) -> dict[str, dict[str, Tensor]]:
        f = checkpoint_file(name)
        if f not in self._files:
            p = self.path / f
            if not p.is_file():
                raise InputError(str(p), "", f"missing from {self.path.name} (a step saved by arachne holds it)")
            self._files[f] = load_tensors(p)
        return self._files[f]

    def get(self, name: str, key: str = "param") -> Tensor | None:
        """The saved ``key`` of canonical tensor ``name``. A parameter must be there (an :class:`InputError`
        naming the file otherwise: resuming would silently start it from the seed); Adam moments may be
        absent (a parameter that has had no gradient yet has none), so those are None."""
        entry = self._file(name).get(name)
        value = None if entry is None else entry.get(key)
        if value is None and key == "param":
            raise InputError(str(self.path / checkpoint_file(name)), name, "missing from the checkpoint (a step "
                                                                           "saved by arachne holds every parameter)")
        return value

    def all(self, key: str = "param") -> dict[str, Tensor]:
        """Every canonical tensor of the checkpoint (for tests and tools)."""
        out: dict[str, Tensor] = {}
        for p in sorted(self.path.glob("*.pt")):
            for name, entry in load_tensors(p, mmap=False).items():
                if key in entry:
                    out[name] = entry[key]
        return out


def load_tensors(path: Path, mmap: bool = True) -> dict[str, dict[str, Tensor]]:
    """A per-layer checkpoint file, ``{name: {key: tensor}}``, or an :class:`InputError` naming it."""
    try:
        doc = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # noqa: BLE001 - truncated, not torch's format, or unsafe to unpickle
        raise InputError(str(path), "", f"cannot load: damaged, truncated or not a checkpoint file written by "
                                        f"arachne ({type(exc).__name__})") from None
    if not isinstance(doc, dict):
        raise InputError(str(path), "", f"expected a mapping of tensor names, got {type(doc).__name__}")
    for name, entry in doc.items():
        if not isinstance(entry, dict) or not all(isinstance(t, Tensor) for t in entry.values()):
            raise InputError(str(path), str(name), "expected a mapping of state names to tensors")
    return doc
