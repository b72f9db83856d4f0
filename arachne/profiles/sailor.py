"""Convert Sailor's profile tables (eth-easl/sailor, MIT licence) into ``arachne-profile/1`` files.

Sailor numbers layers with the embedding first (index 0), the transformer blocks next
(1..L) and the output side last (final norm, LM head, loss: one or two indices); arachne keeps
blocks 0..L-1 and folds the output indices into ``head``. Sailor's model names are kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from arachne.errors import InputError, load_document
from arachne.profiles.format import (
    BlockTimes,
    MemoryProfile,
    PassTimes,
    ProfileDocument,
    ProfileEntry,
    profile_filename,
    write_profile,
)
from arachne.spec.model import model_catalog

SEQUENCE_LENGTHS = {"OPT-350": 2048, "GPT-Neo-2.7": 2048, "LLAMA-3-8": 8192, "OPT-30": 2048}
ATTRIBUTION = ("Measured by Sailor (Strati et al., SOSP'25), github.com/eth-easl/sailor @ cf2c8e3, "
               "MIT licence, Copyright (c) 2023 - present ETH Zurich; converted by arachne")


def convert_sailor(data: dict[str, Any], source: str, layer_memory: dict[str, Any] | None = None,
                   variant: str = "simulator") -> list[ProfileDocument]:
    """One profile document per (model, GPU) of a Sailor ``profiles_*.json`` document."""
    table = data.get("data")
    if not isinstance(table, dict):
        raise InputError(source, "data", "expected Sailor's data[model][gpu][mbs][tp] table")
    docs = []
    for model_name, per_gpu in table.items():
        spec = model_catalog().get(model_name)
        if spec is None:
            continue
        L = spec.num_layers
        for gpu, per_mbs in per_gpu.items():
            entries = []
            for mbs, per_tp in per_mbs.items():
                for tp, rec in per_tp.items():
                    fwd, bwd = rec.get("fwd_s"), rec.get("bwd_s")
                    if not isinstance(fwd, list) or not isinstance(bwd, list) or len(fwd) < L + 2:
                        raise InputError(source, f"data.{model_name}.{gpu}.{mbs}.{tp}", "malformed fwd_s/bwd_s")
                    if len(fwd) > L + 3:  # e.g. the planner table's GPT-Neo/GH-96 copy of OPT-350
                        continue
                    memory = None
                    if layer_memory is not None:
                        mem_tp = layer_memory.get("data", {}).get(model_name, {}).get(str(tp))
                        if mem_tp and len(mem_tp.get("act_mem_bytes", [])) == len(fwd):
                            act = [x * int(mbs) for x in mem_tp["act_mem_bytes"]]
                            memory = MemoryProfile(block_activation_bytes=tuple(act[1:L + 1]),
                                                   embedding_activation_bytes=act[0],
                                                   head_activation_bytes=sum(act[L + 1:]))
                    entries.append(ProfileEntry(
                        micro_batch_size=int(mbs), tp=int(tp),
                        embedding=PassTimes(fwd_s=fwd[0], bwd_s=bwd[0]),
                        blocks=BlockTimes(fwd_s=tuple(fwd[1:L + 1]), bwd_s=tuple(bwd[1:L + 1])),
                        head=PassTimes(fwd_s=sum(fwd[L + 1:]), bwd_s=sum(bwd[L + 1:])),
                        optimizer_s=rec.get("update_s") or None,
                        memory=memory,
                    ))
            if entries:
                docs.append(ProfileDocument(
                    model=model_name, gpu=gpu, precision="fp32", sequence_length=SEQUENCE_LENGTHS.get(model_name, 2048),
                    source=f"{ATTRIBUTION}; table: {variant} ({Path(source).name})", date="2025-08-14",
                    device=gpu, entries=sorted(entries, key=lambda e: (e.tp, e.micro_batch_size))))
    return docs


def import_sailor(path: str | Path, out_dir: str | Path, layer_memory: str | Path | None = None) -> list[Path]:
    """Convert a Sailor profile file into ``out_dir``; returns the written files."""
    data = load_document(path)
    mem = load_document(layer_memory) if layer_memory else None
    variant = "planner" if "planner" in Path(path).name else "simulator"
    docs = convert_sailor(data, str(path), mem, variant)
    if not docs:
        raise InputError(str(path), "data", "no profiles of catalog models found")
    out = Path(out_dir)
    written = []
    for doc in docs:
        target = out / profile_filename(doc.model, doc.gpu, doc.precision)
        write_profile(doc, target)
        written.append(target)
    return written
