"""The training job: batch, sequence length, precision, optimizer."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Precision = Literal["bf16", "fp16", "fp32"]


class Job(BaseModel):
    """What is trained per iteration (formats v1 section 3)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    global_batch_size: int = Field(ge=1)
    sequence_length: int = Field(ge=1)
    precision: Precision = "bf16"
    optimizer: Literal["adam", "sgd"] = "adam"

    @property
    def tokens(self) -> int:
        return self.global_batch_size * self.sequence_length
