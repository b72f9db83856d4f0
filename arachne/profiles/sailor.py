"""Convert Sailor's profile tables (eth-easl/sailor, MIT licence) into ``arachne-profile/1`` files.

Sailor numbers layers with the embedding first (index 0), the transformer blocks next
(1..L) and the output side last (final norm, LM head, loss: one or two indices); arachne keeps
blocks 0..L-1 and folds the output indices into ``head``. Sailor's model names are kept.

A table that cannot be converted (a model or GPU type arachne does not know, lists of the wrong
length such as the planner table's GPT-Neo-2.7/GH-96 copy of OPT-350, values that are not times)
is skipped and reported; the rest is imported. Nothing is written when nothing can be imported.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arachne.errors import InputError, load_document
from arachne.profiles.format import (
    MAX_SECONDS,
    MIN_BLOCK_SECONDS,
    BlockTimes,
    MemoryProfile,
    PassTimes,
    ProfileDocument,
    ProfileEntry,
    profile_filename,
    write_profile,
)
from arachne.spec.gpus import gpu_catalog
from arachne.spec.model import ModelSpec, model_catalog

SEQUENCE_LENGTHS = {"OPT-350": 2048, "GPT-Neo-2.7": 2048, "LLAMA-3-8": 8192, "OPT-30": 2048}
ATTRIBUTION = ("Measured by Sailor (Strati et al., SOSP'25), github.com/eth-easl/sailor @ cf2c8e3, "
               "MIT licence, Copyright (c) 2023 - present ETH Zurich; converted by arachne")
TABLE_LAYOUT = "expected Sailor's data[model][gpu][micro_batch_size][tp] table"
MEMORY_LAYOUT = "expected Sailor's layer_memory.json, data[model][tp].act_mem_bytes"
_DEGREE = re.compile(r"[1-9][0-9]{0,5}")  # a micro-batch size or tp degree as Sailor writes it: "1" .. "999999"


@dataclass(frozen=True)
class Skipped:
    """A part of a Sailor table that was not imported: where (``data.MODEL.GPU...``) and why."""

    field: str
    reason: str

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}"


@dataclass
class SailorImport:
    """What :func:`import_sailor` wrote, and what it skipped."""

    written: list[Path] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)


def _times(value: Any) -> list[float] | None:
    """``value`` as a list of finite numbers >= 0, or None."""
    if not isinstance(value, list):
        return None
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            return None
        out.append(float(v))
    return out


def _degree(key: Any) -> int | None:
    return int(key) if isinstance(key, str) and _DEGREE.fullmatch(key) else None


def read_layer_memory(doc: dict[str, Any], source: str) -> dict[str, dict[int, list[float]]]:
    """Sailor's ``layer_memory.json`` as ``{model: {tp: act_mem_bytes}}``; any other document is an
    :class:`InputError` naming the field."""
    table = doc.get("data")
    if not isinstance(table, dict) or not table:
        raise InputError(source, "data", MEMORY_LAYOUT)
    out: dict[str, dict[int, list[float]]] = {}
    for model, per_tp in table.items():
        if not isinstance(per_tp, dict) or not per_tp:
            raise InputError(source, f"data.{model}", f"{MEMORY_LAYOUT} (a mapping from tp degree)")
        for tp, rec in per_tp.items():
            where = f"data.{model}.{tp}"
            if _degree(tp) is None:
                raise InputError(source, where, f"{MEMORY_LAYOUT}: {tp!r} is not a tp degree")
            if not isinstance(rec, dict) or "act_mem_bytes" not in rec:
                raise InputError(source, f"{where}.act_mem_bytes", "required field is missing")
            act = _times(rec["act_mem_bytes"])
            if act is None:
                raise InputError(source, f"{where}.act_mem_bytes", "expected a list of numbers >= 0")
            out.setdefault(model, {})[int(tp)] = act
    return out


def _entry(spec: ModelSpec, mbs: int, tp: int, rec: Any, act: list[float] | None) -> ProfileEntry | str:
    """One (micro-batch size, tp) record as a profile entry, or why it cannot be one."""
    L = spec.num_layers
    if not isinstance(rec, dict):
        return "expected an object with fwd_s and bwd_s"
    fwd, bwd = _times(rec.get("fwd_s")), _times(rec.get("bwd_s"))
    if fwd is None or bwd is None:
        return "fwd_s and bwd_s must be lists of times >= 0"
    if len(fwd) != len(bwd) or len(fwd) not in (L + 2, L + 3):
        return (f"fwd_s/bwd_s have {len(fwd)}/{len(bwd)} values, expected {L + 2} or {L + 3} "
                f"(embedding, {spec.name}'s {L} blocks, output layers)")
    if not all(MIN_BLOCK_SECONDS <= t <= MAX_SECONDS for t in fwd[1:L + 1] + bwd[1:L + 1]):
        return f"block times must be {MIN_BLOCK_SECONDS:g} to {MAX_SECONDS:g} s"
    if sum(fwd[L + 1:]) > MAX_SECONDS or sum(bwd[L + 1:]) > MAX_SECONDS or max(fwd[0], bwd[0]) > MAX_SECONDS:
        return f"times must be at most {MAX_SECONDS:g} s"
    update = rec.get("update_s")
    if update is not None and (_times([update]) is None or update > MAX_SECONDS):
        return f"update_s must be a time from 0 to {MAX_SECONDS:g} s"
    memory = None
    if act is not None and len(act) == len(fwd):
        act = [x * mbs for x in act]
        memory = MemoryProfile(block_activation_bytes=tuple(act[1:L + 1]), embedding_activation_bytes=act[0],
                               head_activation_bytes=sum(act[L + 1:]))
    return ProfileEntry(
        micro_batch_size=mbs, tp=tp,
        embedding=PassTimes(fwd_s=fwd[0], bwd_s=bwd[0]),
        blocks=BlockTimes(fwd_s=tuple(fwd[1:L + 1]), bwd_s=tuple(bwd[1:L + 1])),
        head=PassTimes(fwd_s=sum(fwd[L + 1:]), bwd_s=sum(bwd[L + 1:])),
        optimizer_s=update or None,
        memory=memory,
    )


def _table(spec: ModelSpec, where: str, per_mbs: Any, memory: dict[int, list[float]] | None,
           skipped: list[Skipped]) -> list[ProfileEntry]:
    """The entries of one (model, GPU) table; what cannot be converted goes to ``skipped``, grouped by reason."""
    if not isinstance(per_mbs, dict):
        skipped.append(Skipped(where, TABLE_LAYOUT))
        return []
    entries: list[ProfileEntry] = []
    bad: dict[str, list[str]] = {}
    for mbs_key, per_tp in per_mbs.items():
        if _degree(mbs_key) is None or not isinstance(per_tp, dict):
            bad.setdefault(f"{TABLE_LAYOUT}: {mbs_key!r} is not a micro-batch size with tp entries", []).append(
                str(mbs_key))
            continue
        for tp_key, rec in per_tp.items():
            tp = _degree(tp_key)
            got = (_entry(spec, int(mbs_key), tp, rec, (memory or {}).get(tp)) if tp is not None
                   else f"{TABLE_LAYOUT}: {tp_key!r} is not a tp degree")
            if isinstance(got, str):
                bad.setdefault(got, []).append(f"{mbs_key}.{tp_key}")
            else:
                entries.append(got)
    for reason, keys in bad.items():
        if len(keys) == 1:
            skipped.append(Skipped(f"{where}.{keys[0]}", reason))
        else:
            shown = ", ".join(keys[:3]) + (", ..." if len(keys) > 3 else "")
            skipped.append(Skipped(where, f"{len(keys)} entries ({shown}): {reason}"))
    return entries


def convert_sailor(data: dict[str, Any], source: str, layer_memory: dict[str, dict[int, list[float]]] | None = None,
                   variant: str = "simulator", skipped: list[Skipped] | None = None) -> list[ProfileDocument]:
    """One profile document per (model, GPU) of a Sailor ``profiles_*.json`` document. What cannot be
    converted is appended to ``skipped``."""
    table = data.get("data")
    if not isinstance(table, dict):
        raise InputError(source, "data", TABLE_LAYOUT)
    skipped = [] if skipped is None else skipped
    docs: list[ProfileDocument] = []
    files: dict[str, str] = {}
    for model_name, per_gpu in table.items():
        spec = model_catalog().get(model_name)
        if spec is None:
            skipped.append(Skipped(f"data.{model_name}", "not a model of the catalog (see `arachne models`)"))
            continue
        if not isinstance(per_gpu, dict):
            skipped.append(Skipped(f"data.{model_name}", TABLE_LAYOUT))
            continue
        for gpu, per_mbs in per_gpu.items():
            where = f"data.{model_name}.{gpu}"
            if gpu_catalog().get(gpu) is None:
                skipped.append(Skipped(where, "unknown GPU type (see `arachne gpus`)"))
                continue
            entries = _table(spec, where, per_mbs, (layer_memory or {}).get(model_name), skipped)
            if not entries:
                continue
            name = profile_filename(model_name, gpu, "fp32")
            if name in files:
                skipped.append(Skipped(where, f"the same profile as {files[name]}"))
                continue
            files[name] = where
            docs.append(ProfileDocument(
                model=model_name, gpu=gpu, precision="fp32", sequence_length=SEQUENCE_LENGTHS.get(model_name, 2048),
                source=f"{ATTRIBUTION}; table: {variant} ({Path(source).name})", date="2025-08-14",
                device=gpu, entries=sorted(entries, key=lambda e: (e.tp, e.micro_batch_size))))
    return docs


def import_sailor(path: str | Path, out_dir: str | Path, layer_memory: str | Path | None = None) -> SailorImport:
    """Convert a Sailor profile file into ``out_dir``. Every input is read and checked before anything is
    written; when nothing can be converted, :class:`InputError` says why and nothing is written."""
    data = load_document(path)
    memory = read_layer_memory(load_document(layer_memory), str(layer_memory)) if layer_memory else None
    variant = "planner" if "planner" in Path(path).name else "simulator"
    result = SailorImport()
    docs = convert_sailor(data, str(path), memory, variant, result.skipped)
    if not docs:
        first = result.skipped[0] if result.skipped else Skipped("data", "empty")
        more = f" (and {len(result.skipped) - 1} more)" if len(result.skipped) > 1 else ""
        raise InputError(str(path), first.field, f"nothing to import: {first.reason}{more}")
    if memory is not None and not any(d.model in memory for d in docs):
        raise InputError(str(layer_memory), "data", f"no entry for the imported models "
                                                    f"({', '.join(sorted({d.model for d in docs}))})")
    out = Path(out_dir)
    for doc in docs:
        target = out / profile_filename(doc.model, doc.gpu, doc.precision)
        write_profile(doc, target)
        result.written.append(target)
    return result
