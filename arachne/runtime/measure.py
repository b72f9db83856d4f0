"""Measured iteration time of a run next to the cost model's estimate (torch-free)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Sequence

from arachne.plan import Plan
from arachne.profiles.format import ProfileDB
from arachne.spec.cluster import Cluster


@dataclass
class Measurement:
    """Mean measured seconds per iteration (warm-up step excluded when there are others)."""

    measured_s: float
    steps: int
    estimated_s: float | None
    compute_source: str | None = None
    note: str = ""

    @property
    def error(self) -> float | None:
        """(estimate - measured) / measured."""
        if self.estimated_s is None or self.measured_s <= 0:
            return None
        return (self.estimated_s - self.measured_s) / self.measured_s

    def to_dict(self) -> dict[str, Any]:
        return {"measured_iteration_time_s": self.measured_s, "steps_measured": self.steps,
                "estimated_iteration_time_s": self.estimated_s, "relative_error": self.error,
                "compute_source": self.compute_source, "note": self.note or None}

    def line(self) -> str:
        est = "n/a" if self.estimated_s is None else f"{self.estimated_s:.4f} s"
        err = "" if self.error is None else f" (estimate error {self.error:+.1%})"
        src = f" [{self.compute_source}]" if self.compute_source else ""
        note = f"; {self.note}" if self.note else ""
        return f"measured {self.measured_s:.4f} s/iteration over {self.steps} step(s), estimated {est}{src}{err}{note}"


def mean_iteration(times: Sequence[float]) -> tuple[float, int]:
    """Mean of the step times, leaving out the first (warm-up) step when there are two or more."""
    use = list(times[1:]) if len(times) > 1 else list(times)
    return (statistics.fmean(use) if use else 0.0), len(use)


def estimate(plan: Plan, cluster: Cluster, profiles: ProfileDB | None) -> tuple[float | None, str | None, str]:
    """(iteration_time_s, compute source, note) from ``arachne.cost.CostModel``."""
    try:
        from arachne.cost import CostModel
    except ImportError as exc:  # the cost model is optional for running
        return None, None, f"cost model unavailable ({exc})"
    est = CostModel(cluster, profiles=profiles if profiles is not None else "default").estimate(plan)
    sources = sorted({s.source for s in getattr(est, "stages", [])})
    return est.iteration_time_s, (", ".join(sources) or None), ""


def measure(plan: Plan, cluster: Cluster, times: Sequence[float], profiles: ProfileDB | None) -> Measurement:
    measured, n = mean_iteration(times)
    est, src, note = estimate(plan, cluster, profiles)
    return Measurement(measured, n, est, src, note)
