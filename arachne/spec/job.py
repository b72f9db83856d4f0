"""The training job: batch, sequence length, precision, optimizer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from arachne.errors import InputError

if TYPE_CHECKING:
    from arachne.spec.model import ModelSpec

MAX_GLOBAL_BATCH_SIZE = 10**9  # sequences per iteration; far above any real job, and keeps planning bounded
Precision = Literal["bf16", "fp16", "fp32"]
PRECISIONS: tuple[str, ...] = get_args(Precision)


def check_precision(value: str, source: str = "", field: str = "--precision") -> Precision:
    """``value`` as a :data:`Precision`, or an :class:`InputError` naming ``source`` and ``field``."""
    if value not in PRECISIONS:
        raise InputError(source, field, f"expected {', '.join(PRECISIONS[:-1])} or {PRECISIONS[-1]}, got {value!r}")
    return value  # type: ignore[return-value]


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
    optimizer: Literal["adam", "sgd"] = "adam"

    @property
    def tokens(self) -> int:
        return self.global_batch_size * self.sequence_length
