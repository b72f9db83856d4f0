"""What ``CostModel.estimate`` returns: the priced plan and its per-stage rows (formats section 5/9)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from arachne.cost.memory import MemoryBreakdown


@dataclass
class StageEstimate:
    """What one stage costs: per-micro-batch times and the memory of its worst device."""

    pipeline: int
    stage: int
    gpu: str
    layers: tuple[int, int]
    tp: int
    dp: int
    ep: int
    fwd_s: float
    bwd_s: float
    compute_s: float
    tp_comm_s: float
    ep_comm_s: float
    send_fwd_s: float
    send_bwd_s: float
    memory_bytes: float
    capacity_bytes: float
    source: str

    def to_doc(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline, "stage": self.stage, "gpu": self.gpu, "layers": list(self.layers),
            "tp": self.tp, "dp": self.dp, "ep": self.ep, "time_per_microbatch_s": self.fwd_s + self.bwd_s,
            "memory_bytes": int(self.memory_bytes), "capacity_bytes": int(self.capacity_bytes),
            "compute_source": self.source,
        }


@dataclass
class Estimate:
    """The priced plan (formats v1 section 5) plus per-stage details.

    MFU, the per-device peaks and the per-stage rows are built on first use from ``parts`` (per
    pipeline: its index, the pipeline, its stage rows and memory): a search prices thousands of plans
    and reads them for a few."""

    iteration_time_s: float
    samples_per_s: float
    tokens_per_s: float
    max_memory_bytes: float
    fits: bool
    breakdown: dict[str, float]
    parts: list[tuple] = field(default_factory=list, repr=False, compare=False)
    model_flops_per_s: float = field(default=0.0, repr=False, compare=False)  # MFU's numerator
    device_flops: dict[str, float] = field(default_factory=dict, repr=False, compare=False)  # peak FLOP/s by device
    device_prices: dict[str, float | None] = field(default_factory=dict, repr=False, compare=False)  # USD/GPU-hour
    pricer: Any = field(default=None, repr=False, compare=False)  # the CostModel that priced it (timelines)
    _built: tuple | None = field(default=None, init=False, repr=False, compare=False)

    def _build(self) -> tuple:
        if self._built is None:
            peak: dict[str, float] = {}
            detail: dict[str, MemoryBreakdown] = {}
            stages: list[StageEstimate] = []
            for pi, p, out_rows, mems in self.parts:
                for si, st in enumerate(p.stages):
                    row = out_rows[si]
                    peak.update(dict.fromkeys(st.devices, row[12]))
                    detail.update(dict.fromkeys(st.devices, mems[si][0]))
                    stages.append(StageEstimate(pi, si, *row))
            self._built = (peak, detail, stages)
        return self._built

    @property
    def peak_memory_bytes(self) -> dict[str, float]:
        return self._build()[0]

    @property
    def memory_detail(self) -> dict[str, MemoryBreakdown]:
        return self._build()[1]

    @property
    def stages(self) -> list[StageEstimate]:
        return self._build()[2]

    @property
    def mfu(self) -> float:
        """Model FLOP/s over the summed peak of the devices the plan uses."""
        return self.model_flops_per_s / sum(self.device_flops[d] for d in self.peak_memory_bytes)

    @property
    def cost_per_hour(self) -> float | None:
        """USD per hour of the devices the plan uses, when every one of them has a price (formats v2 9)."""
        prices = [self.device_prices.get(d) for d in self.peak_memory_bytes]
        return None if not prices or None in prices else float(sum(prices))  # type: ignore[arg-type]

    @property
    def worst_memory_ratio(self) -> float:
        """Largest used/capacity over stages (> 1 means it does not fit)."""
        return max((s.memory_bytes / s.capacity_bytes for s in self.stages), default=0.0)

    def to_doc(self, details: bool = True) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "iteration_time_s": self.iteration_time_s,
            "samples_per_s": self.samples_per_s,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "peak_memory_bytes": {k: int(v) for k, v in self.peak_memory_bytes.items()},
            "max_memory_bytes": int(self.max_memory_bytes),
            "fits": self.fits,
            "breakdown": dict(self.breakdown),
        }
        if (cost := self.cost_per_hour) is not None:
            doc["cost_per_hour"] = cost
            doc["cost_per_million_tokens"] = cost / 3600 / self.tokens_per_s * 1e6
        if details:
            doc["stages"] = [s.to_doc() for s in self.stages]
        return doc
