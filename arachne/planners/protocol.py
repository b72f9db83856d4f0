"""What every planner implements and returns: the :class:`Planner` protocol, :class:`PlannerResult`,
time budgets (:class:`SearchBudget`, :class:`Deadline`) and the progress bar planners show on stderr."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol, runtime_checkable

from arachne.cost import CostModel
from arachne.plan import Plan
from arachne.spec.cluster import Cluster
from arachne.spec.job import Job
from arachne.spec.model import ModelSpec


@dataclass(frozen=True)
class SearchBudget:
    """How long a planner may search, its seed, and how many ranked plans it returns."""

    time_budget_s: float = 60.0
    seed: int = 0
    top_k: int = 16
    progress: bool = False  # show a rich progress bar on stderr
    cpu: bool = False  # count the budget in CPU seconds of the calling thread (load-independent), not on the wall

    def deadline(self) -> "Deadline":
        return Deadline(self.time_budget_s, time.thread_time if self.cpu else None)


class Deadline:
    """A budget of ``seconds`` started at construction, on the wall clock or on another ``clock`` (e.g. the
    arachne planner's :class:`~arachne.planners.arachne.work_clock.WorkClock`, or ``time.thread_time``); with
    ``cap`` it also expires when that deadline does."""

    def __init__(self, seconds: float, clock: Callable[[], float] | None = None,
                 cap: Deadline | None = None):
        self.clock = clock or time.perf_counter  # (looked up per deadline: a test may stand in for the wall)
        self.start = self.clock()
        self.seconds = seconds
        self.cap = cap

    @property
    def elapsed(self) -> float:
        return self.clock() - self.start

    def expired(self) -> bool:
        return self.elapsed >= self.seconds or (self.cap is not None and self.cap.expired())

    @property
    def remaining(self) -> float:
        own = max(0.0, self.seconds - self.elapsed)
        return own if self.cap is None else min(own, self.cap.remaining)

    def child(self, seconds: float) -> Deadline:
        """``seconds`` from now on the same clock, ending no later than this deadline."""
        return Deadline(max(0.0, min(seconds, self.remaining)), self.clock, self)


@dataclass
class SearchStats:
    wall_time_s: float = 0.0
    candidates: int = 0
    plans_priced: int = 0
    timed_out: bool = False
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass
class PlannerResult:
    """Ranked plans (best first by the planner's own formula) and their native scores."""

    plans: list[Plan]
    scores: list[float]
    stats: SearchStats


@runtime_checkable
class Planner(Protocol):
    name: str

    def plan(self, cluster: Cluster, model: ModelSpec, job: Job, cost_model: CostModel,
             budget: SearchBudget) -> PlannerResult: ...


@contextmanager
def progress_bar(enabled: bool, description: str, total: float | None = None) -> Iterator[Callable[..., None]]:
    """A rich progress bar on stderr (never stdout); yields ``advance(n=1, description=None)``."""
    if not enabled:
        yield lambda *a, **k: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:.0f}"),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as prog:
        task = prog.add_task(description, total=total)

        def advance(n: float = 1, description: str | None = None) -> None:
            prog.update(task, advance=n, **({"description": description} if description else {}))

        yield advance


def _stderr_is_tty() -> bool:
    return sys.stderr.isatty()
