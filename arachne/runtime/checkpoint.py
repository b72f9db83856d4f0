"""Unsharded checkpoints: per-layer files of canonical parameters and Adam state, plus meta.json.

Layout of a checkpoint directory::

    D/latest                     name of the newest complete step directory
    D/step-000002/meta.json      step, samples consumed, seed, lr, optimizer, model, plan
    D/step-000002/embedding.pt   {name: {"param": T, "exp_avg": T, "exp_avg_sq": T}}
    D/step-000002/layer-00000.pt ...
    D/step-000002/head.pt

Tensors are full (unsharded) canonical tensors, so a job can resume with any other plan.
Each writer rank saves its pieces to ``D/.tmp-step-N/rank-R.pt``; rank 0 assembles them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

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
        torch.save(content, staging / fname)
    (staging / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    staging.replace(out)
    latest_tmp = root / "latest.tmp"
    latest_tmp.write_text(out.name + "\n")
    latest_tmp.replace(root / "latest")
    shutil.rmtree(src, ignore_errors=True)
    steps = sorted(p for p in root.glob("step-*") if p.is_dir())
    for old in steps[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    return out


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
