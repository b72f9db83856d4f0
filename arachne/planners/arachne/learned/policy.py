"""The learned policy at inference: a small MLP in plain numpy scoring (state, action) pairs.

The weights are trained offline with torch (``arachne train-policy``) and shipped as an ``.npz``
with the config and seed that produced them; loading needs only numpy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

WEIGHTS_PACKAGE = "arachne.planners.arachne.weights"
"""The one name of the folder that holds the shipped checkpoints (see :func:`weights_dir`)."""
WEIGHTS_FILE = "policy.npz"


def weights_dir() -> Path:
    """The shipped checkpoints' folder on disk (where ``--install`` writes)."""
    return Path(str(resources.files(WEIGHTS_PACKAGE)))


@dataclass
class Policy:
    """MLP: input -> (Linear, tanh) x n -> Linear -> logit; inputs normalised by stored mean/std."""

    layers: list[tuple[np.ndarray, np.ndarray]]
    mean: np.ndarray
    std: np.ndarray
    info: dict[str, Any]

    @property
    def pooled_actions(self) -> bool:
        """Whether its teacher offered pooled mixed actions (checkpoints from before them never saw one)."""
        return bool(self.info.get("pooled_actions", False))

    def logits(self, x: np.ndarray) -> np.ndarray:
        h = (x - self.mean) / self.std
        for i, (w, b) in enumerate(self.layers):
            h = h @ w + b
            if i < len(self.layers) - 1:
                h = np.tanh(h)
        return h[:, 0]

    def save(self, path: str | Path) -> None:
        arrays = {"mean": self.mean, "std": self.std, "info": np.array(json.dumps(self.info))}
        for i, (w, b) in enumerate(self.layers):
            arrays[f"w{i}"], arrays[f"b{i}"] = w, b
        np.savez_compressed(path, **arrays)

    @classmethod
    def load(cls, path: str | Path) -> "Policy":
        with np.load(path, allow_pickle=False) as z:
            n = sum(1 for k in z.files if k.startswith("w"))
            layers = [(z[f"w{i}"], z[f"b{i}"]) for i in range(n)]
            return cls(layers, z["mean"], z["std"], json.loads(str(z["info"])))


def load_shipped(name: str) -> Policy | None:
    """A checkpoint inside the package's weights folder, or None when none has been trained yet."""
    try:
        ref = resources.files(WEIGHTS_PACKAGE).joinpath(name)
        if not ref.is_file():
            return None
        with resources.as_file(ref) as p:
            return Policy.load(p)
    except (ModuleNotFoundError, FileNotFoundError):
        return None


def shipped_sha256(name: str = WEIGHTS_FILE) -> str | None:
    """SHA-256 of a shipped checkpoint file (None when absent): ties a ranker to the policy it ranked."""
    import hashlib

    try:
        ref = resources.files(WEIGHTS_PACKAGE).joinpath(name)
        return hashlib.sha256(ref.read_bytes()).hexdigest() if ref.is_file() else None
    except (ModuleNotFoundError, FileNotFoundError):
        return None


@lru_cache(maxsize=1)
def shipped_policy() -> Policy | None:
    """The policy checkpoint inside the package, or None when none has been trained yet."""
    return load_shipped(WEIGHTS_FILE)
