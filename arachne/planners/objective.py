"""What a planner optimises (``arachne plan --objective``, formats v2 section 10): tokens/s or USD per token,
under hard limits on USD per hour and tokens/s. One :class:`Objective` scores every priced plan the same way
for every planner (the harness's selection)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from arachne.cost import Estimate
from arachne.errors import InputError
from arachne.spec.cluster import Cluster


def usd_per_million_tokens(est: Estimate) -> float | None:
    """USD per million tokens of a priced plan (None when a device it uses has no price)."""
    cost = est.cost_per_hour
    if cost is None or est.tokens_per_s <= 0:
        return None
    return cost / 3600.0 / est.tokens_per_s * 1e6


@dataclass(frozen=True)
class Objective:
    """``throughput`` maximises tokens/s; ``cost`` minimises USD per token (a cheaper plan may leave GPUs
    idle). The limits hold for both."""

    kind: Literal["throughput", "cost"] = "throughput"
    """What is optimised."""
    max_cost_per_hour: float | None = None
    """USD per hour of the devices a plan uses, at most (needs prices)."""
    min_tokens_per_s: float | None = None
    """Tokens per second, at least."""

    def __post_init__(self) -> None:
        if self.kind not in ("throughput", "cost"):
            raise InputError("", "--objective", f"expected throughput or cost, got {self.kind!r}")
        for name in ("max_cost_per_hour", "min_tokens_per_s"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise InputError("", "--" + name.replace("_", "-"), f"must be a positive number, got {v}")

    @property
    def needs_prices(self) -> bool:
        return self.kind == "cost" or self.max_cost_per_hour is not None

    @property
    def default(self) -> bool:
        """Plain throughput with no limits (what planners optimise by themselves)."""
        return self.kind == "throughput" and self.max_cost_per_hour is None and self.min_tokens_per_s is None

    def check_prices(self, cluster: Cluster) -> None:
        """:class:`InputError` naming the first GPU type without a price, when the objective needs prices."""
        if not self.needs_prices:
            return
        for n in cluster.nodes:
            if n.price_per_gpu_hour is None:
                flag = "--objective" if self.kind == "cost" else "--max-cost-per-hour"
                raise InputError("", flag, f"no price for GPU type {n.gpu.name} (node {n.name}): set "
                                           "price_per_gpu_hour in the cluster file (the catalog has no default "
                                           "for it)")

    def score(self, est: Estimate) -> float:
        """Lower is better: iteration time (throughput) or USD per million tokens (cost; inf without prices)."""
        if self.kind == "throughput":
            return est.iteration_time_s
        usd = usd_per_million_tokens(est)
        return float("inf") if usd is None else usd

    def limit_error(self, est: Estimate) -> str | None:
        """The first hard limit ``est`` breaks, in words (None: within every limit)."""
        if self.min_tokens_per_s is not None and est.tokens_per_s < self.min_tokens_per_s:
            return f"--min-tokens-per-s {self.min_tokens_per_s:g} (best plan found: {est.tokens_per_s:,.0f} tokens/s)"
        if self.max_cost_per_hour is not None:
            cost = est.cost_per_hour
            if cost is None or cost > self.max_cost_per_hour:
                got = "no price" if cost is None else f"${cost:,.2f}/h"
                return f"--max-cost-per-hour {self.max_cost_per_hour:g} (best plan found: {got})"
        return None
