"""Planning time counted in work done instead of wall time.

A planner bounded by the wall clock finds a different plan on a loaded machine, in a cold process or
on a slower CPU than on an idle one. The arachne planner's latency target is therefore measured on a
:class:`WorkClock`: virtual seconds charged per unit of work requested (plans priced, layer splits,
placements, policy and ranker rows) at rates fitted on the reference machine (2-core CI box, one
planner per core; refit with ``python benchmarks/work_clock.py fit``). The same problem then gets the
same plan on any machine and under any load; only the wall time it takes varies."""

from __future__ import annotations

from dataclasses import dataclass, fields

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
    estimates: int = 0  # the cost model's estimates ...
    estimated_stages: int = 0  # ... their stages ...
    estimated_devices: int = 0  # ... their GPUs ...
    estimated_cells: int = 0  # ... and the stage x micro-batch cells of their schedules

    def vector(self) -> np.ndarray:
        return np.array([getattr(self, f.name) for f in fields(self)], dtype=float)


WORK_FIELDS = tuple(f.name for f in fields(Work))

# seconds per unit of each Work field, fitted by ``python benchmarks/work_clock.py fit`` ("sends", added
# after the last fit, is timed alone: 2.5 us per boundary with ``stage_sends`` on a 673-GPU cluster;
# "fill_stages" was 1.546e-06 (the plain bisection over numpy prefix sums, 1.45 us per stage fill when
# replayed) and is scaled by 1.26 / 1.45, the layer split that skips ahead over list prefix sums: replaying
# the 68,743 splits planning seed 3 asks for, idle machine,
# ``python benchmarks/split_speed.py results/robustness/seed3/runs.json``)
RATES = {
    "prices": 4.602e-05, "screens": 0.0001552, "fill_stages": 1.343e-06, "placed_slots": 8.424e-06,
    "policy_calls": 0.0003229, "policy_rows": 4.751e-06, "rank_rows": 2.131e-05, "profile_calls": 0.0,
    "profiles": 4.61e-05, "mix_proxies": 0.0001918, "sends": 2.5e-06, "estimates": 0.0001234, "estimated_stages":
    1.086e-05, "estimated_devices": 3.001e-08, "estimated_cells": 3.674e-07
}


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
