"""The profile format (``arachne-profile/1``) and lookup with interpolation across micro-batch sizes.

One JSON file per (model, GPU type, precision)::

    {"format": "arachne-profile/1", "model": "OPT-350", "gpu": "Titan-RTX", "precision": "fp32",
     "sequence_length": 2048, "source": "...", "date": "2025-08-14", "device": "...",
     "entries": [{"micro_batch_size": 1, "tp": 4,
                  "embedding": {"fwd_s": .., "bwd_s": ..},
                  "blocks": {"fwd_s": [...], "bwd_s": [...]},     # one value per transformer block
                  "head": {"fwd_s": .., "bwd_s": ..},              # final norm + output head + loss
                  "optimizer_s": ..,                               # optional, whole profiled model
                  "memory": {"block_activation_bytes": [...],      # optional, kept for backward
                             "embedding_activation_bytes": .., "head_activation_bytes": ..}}]}

Times are seconds for one micro-batch on one GPU of a TP group of ``tp`` GPUs inside one node
(TP communication included). Models match case- and punctuation-insensitively, GPU types through
the catalog's aliases.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from arachne.errors import InputError, from_validation_error, load_document
from arachne.spec.gpus import GPUCatalog, gpu_catalog, normalize_name

PROFILE_FORMAT = "arachne-profile/1"
MAX_SECONDS = 1e4
"""The longest time a profile may give one pass of one micro-batch (s): a longer one is a unit mistake, and
its products overflow the pricing."""
MIN_BLOCK_SECONDS = 1e-9
"""The shortest time of a block's pass (s): stage speeds are blocks over time, so a block needs a time."""
Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS)]
BlockSeconds = Annotated[float, Field(ge=MIN_BLOCK_SECONDS, le=MAX_SECONDS)]


class PassTimes(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    fwd_s: Seconds
    bwd_s: Seconds


class BlockTimes(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    fwd_s: tuple[BlockSeconds, ...]
    bwd_s: tuple[BlockSeconds, ...]


class MemoryProfile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow", allow_inf_nan=False)
    block_activation_bytes: tuple[float, ...] | None = None
    embedding_activation_bytes: float | None = None
    head_activation_bytes: float | None = None


class ProfileEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    micro_batch_size: int = Field(ge=1)
    tp: int = Field(ge=1)
    embedding: PassTimes
    blocks: BlockTimes
    head: PassTimes
    optimizer_s: Seconds | None = None
    memory: MemoryProfile | None = None


class ProfileDocument(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    format: str = PROFILE_FORMAT
    model: str
    gpu: str
    precision: str = "fp32"
    sequence_length: int = Field(ge=1)
    source: str = ""
    date: str | None = None
    device: str | None = None
    entries: list[ProfileEntry] = Field(min_length=1)


@dataclass(frozen=True)
class LayerTimes:
    """Forward/backward seconds of one micro-batch through a part of the model."""

    fwd: float
    bwd: float


class ProfileSet:
    """All entries of one (model, GPU, precision): lookup by (mbs, tp) with interpolation."""

    def __init__(self, doc: ProfileDocument):
        self.doc = doc
        self.by_tp: dict[int, dict[int, ProfileEntry]] = {}
        for e in doc.entries:
            self.by_tp.setdefault(e.tp, {})[e.micro_batch_size] = e
        self._mbs = {tp: sorted(v) for tp, v in self.by_tp.items()}

    @property
    def tps(self) -> list[int]:
        return sorted(self.by_tp)

    def _bracket(self, tp: int, mbs: float) -> list[tuple[ProfileEntry, float]]:
        """Entries and weights whose combination estimates micro-batch size ``mbs``.

        Linear interpolation between the measured sizes around ``mbs``; beyond the largest
        measured size, per-sample time of the largest; below the smallest, linear to it
        through the origin-free line of the two smallest (never below the per-sample rate).
        """
        sizes = self._mbs[tp]
        table = self.by_tp[tp]
        if mbs in table:
            return [(table[int(mbs)], 1.0)]
        i = bisect.bisect_left(sizes, mbs)
        if i == 0:
            return [(table[sizes[0]], mbs / sizes[0])]
        if i == len(sizes):
            return [(table[sizes[-1]], mbs / sizes[-1])]
        lo, hi = sizes[i - 1], sizes[i]
        w = (mbs - lo) / (hi - lo)
        return [(table[lo], 1 - w), (table[hi], w)]

    def has_tp(self, tp: int) -> bool:
        return tp in self.by_tp

    def parts(self, tp: int, mbs: float) -> tuple[LayerTimes, list[LayerTimes], LayerTimes, float | None]:
        """(embedding, blocks, head, optimizer_s) at ``tp`` for micro-batch size ``mbs``."""
        br = self._bracket(tp, mbs)
        emb = LayerTimes(sum(e.embedding.fwd_s * w for e, w in br), sum(e.embedding.bwd_s * w for e, w in br))
        head = LayerTimes(sum(e.head.fwd_s * w for e, w in br), sum(e.head.bwd_s * w for e, w in br))
        nb = len(br[0][0].blocks.fwd_s)
        blocks = [LayerTimes(sum(e.blocks.fwd_s[i] * w for e, w in br), sum(e.blocks.bwd_s[i] * w for e, w in br))
                  for i in range(nb)]
        opt = [e.optimizer_s for e, _ in br if e.optimizer_s is not None]
        return emb, blocks, head, (max(opt) if opt else None)


class ProfileDB:
    """Profiles keyed by (model, GPU type, precision); GPU names resolved through the catalog."""

    def __init__(self, catalog: GPUCatalog | None = None):
        self.catalog = catalog or gpu_catalog()
        self.sets: dict[tuple[str, str, str], ProfileSet] = {}

    def _gpu_key(self, name: str) -> str:
        g = self.catalog.get(name)
        return normalize_name(g.name if g else name)

    def add(self, doc: ProfileDocument) -> None:
        key = (normalize_name(doc.model), self._gpu_key(doc.gpu), doc.precision)
        if key in self.sets:  # merge entries (later files add or override (mbs, tp) points)
            old = {(e.micro_batch_size, e.tp): e for e in self.sets[key].doc.entries}
            old.update({(e.micro_batch_size, e.tp): e for e in doc.entries})
            doc = doc.model_copy(update={"entries": list(old.values())})
        self.sets[key] = ProfileSet(doc)

    def get(self, model: str, gpu: str, precision: str) -> ProfileSet | None:
        return self.sets.get((normalize_name(model), self._gpu_key(gpu), precision))

    def load_dir(self, directory: str | Path) -> "ProfileDB":
        d = Path(directory)
        if not d.exists():
            raise InputError(str(d), "", "profiles directory not found")
        if not d.is_dir():
            raise InputError(str(d), "", "expected a directory of profile JSON files, got a file")
        for path in sorted(d.glob("*.json")):
            self.add(load_profile(path))
        return self

    def __len__(self) -> int:
        return len(self.sets)


def profile_from_dict(data: dict[str, Any], source: str = "") -> ProfileDocument:
    try:
        doc = ProfileDocument(**data)
    except ValidationError as err:
        raise from_validation_error(source, err) from None
    if doc.format != PROFILE_FORMAT:
        raise InputError(source, "format", f"unsupported profile format {doc.format!r}")
    for i, e in enumerate(doc.entries):
        if len(e.blocks.fwd_s) != len(e.blocks.bwd_s):
            raise InputError(source, f"entries[{i}].blocks", "fwd_s and bwd_s differ in length")
    return doc


def load_profile(path: str | Path) -> ProfileDocument:
    return profile_from_dict(load_document(path), str(path))


def write_profile(doc: ProfileDocument, path: str | Path) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    from arachne.fileio import write_text_safely

    write_text_safely(p, json.dumps(doc.model_dump(exclude_none=True), indent=1) + "\n")


def profile_filename(model: str, gpu: str, precision: str) -> str:
    return f"{normalize_name(model)}__{normalize_name(gpu)}__{precision}.json"


PROFILE_FILE_GLOB = "*__*__*.json"  # every name profile_filename gives


@lru_cache(maxsize=1)
def default_profile_db() -> ProfileDB:
    """The profiles shipped in ``arachne/data/profiles`` (converted Sailor measurements)."""
    db = ProfileDB()
    root = resources.files("arachne.data").joinpath("profiles")
    for item in sorted(root.iterdir(), key=lambda x: x.name):
        if item.name.endswith(".json"):
            db.add(profile_from_dict(json.loads(item.read_text()), f"arachne/data/profiles/{item.name}"))
    return db


def merged_profile_db(extra: str | Path | None = None) -> ProfileDB:
    """The shipped profiles plus those in the directory ``extra``: where both measure the same (model, GPU,
    precision), the extra file's (micro-batch, tp) points add to or override the shipped ones."""
    db = ProfileDB()
    for s in default_profile_db().sets.values():
        db.add(s.doc)
    if extra is not None:
        for s in ProfileDB().load_dir(extra).sets.values():
            db.add(s.doc)
    return db
