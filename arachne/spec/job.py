"""The training job: batch, sequence length, precision, optimizer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from arachne.errors import InputError

if TYPE_CHECKING:
    from arachne.spec.model import ModelSpec

MAX_GLOBAL_BATCH_SIZE = 10**6
"""Sequences per iteration, at most: far above any real job (16M tokens is 2,048 sequences of 8,192). Planning
holds a few lists as long as the batch: 10^6 costs a replan about 0.1 GB, 10^8 2.3 GB, 10^9 did not fit in 24 GB."""

Precision = Literal["bf16", "fp16", "fp32"]
"""A precision every GPU trains in: the one a plan is built in (fp8 is an option on top of bf16)."""
PRECISIONS: tuple[str, ...] = get_args(Precision)
JOB_PRECISIONS: tuple[str, ...] = (*PRECISIONS, "fp8")
"""What a job may ask for: ``fp8`` lets a plan run FP8 GEMMs (formats v2 section 7) where every GPU serving it
has an FP8 rate, bf16 elsewhere."""
FP8_BASE: Precision = "bf16"
"""The precision of an fp8 job's plans where FP8 is not used (Transformer Engine's FP8 recipe runs on bf16)."""


def check_precision(value: str, source: str = "", field: str = "--precision", fp8: bool = False) -> str:
    """``value`` as a precision (:data:`PRECISIONS`, with ``fp8`` also ``fp8``), or an :class:`InputError`
    naming ``source`` and ``field``."""
    allowed = JOB_PRECISIONS if fp8 else PRECISIONS
    if value not in allowed:
        raise InputError(source, field, f"expected {', '.join(allowed[:-1])} or {allowed[-1]}, got {value!r}")
    return value


def sequence_error(sequence_length: int, model: ModelSpec) -> str | None:
    """Why ``model`` cannot train sequences of ``sequence_length`` tokens, or None."""
    if sequence_length > model.max_sequence_length:
        return (f"{sequence_length} tokens exceed {model.name}'s max_sequence_length "
                f"{model.max_sequence_length}")
    return None


class Job(BaseModel):
    """What is trained per iteration (formats v1 section 3)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    global_batch_size: int = Field(ge=1, le=MAX_GLOBAL_BATCH_SIZE)
    sequence_length: int = Field(ge=1)
    precision: Precision = "bf16"
    """The precision plans are built in. ``precision="fp8"`` is read as bf16 with :attr:`fp8` set."""
    optimizer: Literal["adam", "sgd"] = "adam"
    fp8: bool = False
    """FP8 GEMMs allowed (the job asked for precision ``fp8``): a planner may give a plan ``precision: fp8``
    where every GPU of the plan has an FP8 rate; a plan elsewhere stays in bf16. Only with bf16."""

    @model_validator(mode="before")
    @classmethod
    def _fp8_precision(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("precision") == "fp8":
            if data.get("fp8") is False:
                raise ValueError("precision fp8 with fp8 false")
            data = {**data, "precision": FP8_BASE, "fp8": True}
        return data

    @model_validator(mode="after")
    def _fp8_on_bf16(self) -> Job:
        if self.fp8 and self.precision != FP8_BASE:
            raise ValueError(f"fp8 runs on {FP8_BASE}, not {self.precision}")
        return self

    @property
    def requested_precision(self) -> str:
        """The precision the job asked for: ``fp8`` when FP8 is allowed, else :attr:`precision`."""
        return "fp8" if self.fp8 else self.precision

    @property
    def tokens(self) -> int:
        return self.global_batch_size * self.sequence_length
