"""Planning time counted in work done instead of wall time.

A planner bounded by the wall clock finds a different plan on a loaded machine, in a cold process or
on a slower CPU than on an idle one. The arachne planner's latency target is therefore measured on a
:class:`WorkClock`: virtual seconds charged per unit of work requested (plans priced, layer splits,
placements, policy and ranker rows) at rates fitted on the reference machine (2-core CI box, one
planner per core; refit with ``python -m benchmarks work-clock fit``). The same problem then gets the
same plan on any machine and under any load; only the wall time it takes varies."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from importlib import resources

import numpy as np


@dataclass
class Work:
    """Work requested while planning one problem (cache hits count: the tally must not depend on what an
    earlier plan in the same process left in a cache)."""

    prices: int = 0  # templates completed and priced in full
    screens: int = 0  # templates screened (the cheap first look)
    fill_stages: int = 0  # stages of every attempted layer split (a bisection makes several attempts)
    placed_slots: int = 0  # stage slots of every template placed onto nodes
    policy_calls: int = 0  # policy forward passes ...
    policy_rows: int = 0  # ... and the (state, action) rows they scored
    rank_rows: int = 0  # templates the ranker scored
    profile_calls: int = 0  # per-slot layer profiles asked for ...
    profiles: int = 0  # ... and built (cached per problem)
    mix_proxies: int = 0  # mixed-pipeline rules given a quick throughput guess
    sends: int = 0  # stage boundaries whose send time a send-balanced layer split looked up
    split_cells: int = 0  # stage x micro-batch cells of the schedules a layer split's trim simulated
    estimates: int = 0  # the cost model's estimates ...
    estimated_stages: int = 0  # ... their stages ...
    estimated_devices: int = 0  # ... their GPUs ...
    estimated_cells: int = 0  # ... and the stage x micro-batch cells of their schedules
    knob_plans: int = 0  # version-2 variants the modern-knobs pass built and priced (completion/modern.py) ...
    knob_stages: int = 0  # ... and their stages: each variant is a new plan (cold in the cost model's caches,
    # overlap, interleaving, cp and per-stage recomputation priced), charged on top of its estimate's counters

    def vector(self) -> np.ndarray:
        return np.array([getattr(self, f.name) for f in fields(self)], dtype=float)


WORK_FIELDS = tuple(f.name for f in fields(Work))


def load_rates(text: str | None = None) -> dict[str, float]:
    """Seconds per unit of each :class:`Work` field, from ``arachne/data/work_rates.json`` (or ``text``).

    The rates are data, fitted by ``python -m benchmarks work-clock fit --install``; the file also says
    when, by which command and on which machine."""
    if text is None:
        text = resources.files("arachne.data").joinpath("work_rates.json").read_text()
    rates = json.loads(text)["rates"]
    missing = [f for f in WORK_FIELDS if f not in rates]
    if missing or any(not isinstance(rates[f], (int, float)) or rates[f] < 0 for f in WORK_FIELDS):
        raise ValueError(f"work_rates.json: every Work field needs a rate >= 0 (missing: {missing})")
    return {f: float(rates[f]) for f in WORK_FIELDS}


RATES = load_rates()


class WorkClock:
    """Virtual seconds since construction: the work tallied in ``work`` (and the cost model's estimates)
    times :data:`RATES`. Callable, so it can drive a :class:`~arachne.planners.protocol.Deadline`."""

    def __init__(self, work: Work, cost_model, rates: dict[str, float] | None = None):
        self.work, self.cost_model = work, cost_model
        self.rates = np.array([(rates or RATES)[f] for f in WORK_FIELDS])
        self._cm0 = self._cm()
        self._w0 = work.vector()

    def _cm(self) -> tuple[int, ...]:
        cm = self.cost_model
        return cm.estimates, cm.estimated_stages, cm.estimated_devices, cm.estimated_cells

    def tally(self) -> Work:
        """The work done since construction."""
        v = self.work.vector() - self._w0
        w = Work(*(int(x) for x in v))
        cm = self._cm()
        w.estimates, w.estimated_stages, w.estimated_devices, w.estimated_cells = (a - b for a, b in zip(cm, self._cm0))
        return w

    def __call__(self) -> float:
        return float(self.tally().vector() @ self.rates)
