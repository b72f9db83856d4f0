"""The work clock: deadlines on a virtual clock, the work tally, and plans that do not depend on how busy
or fast the machine is."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from arachne.cost import CostModel
from arachne.planners.arachne.context import PlanningContext
from arachne.planners.arachne.planner import ArachnePlanner
from arachne.planners.arachne.work_clock import RATES, WORK_FIELDS, Work, WorkClock
from arachne.planners.protocol import Deadline, SearchBudget
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.job import Job
from arachne.spec.model import model_catalog


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@given(st.floats(0.01, 10), st.floats(0.01, 10), st.floats(0, 20))
def test_a_child_deadline_never_outlives_its_parent(parent_s, child_s, advance):
    clock = FakeClock()
    parent = Deadline(parent_s, clock)
    child = parent.child(child_s)
    assert child.remaining <= parent.remaining + 1e-12
    clock.t = advance
    assert child.expired() == (advance >= min(parent_s, child_s))
    assert child.remaining == max(0.0, min(parent_s, child_s) - advance) or child.expired()


def test_a_capped_deadline_expires_with_its_wall_guard():
    clock = FakeClock()
    d = Deadline(100.0, clock, cap=Deadline(0.0))  # the work clock never moves; the wall guard is spent
    assert d.expired() and d.remaining == 0.0


def test_the_clock_counts_work_and_charges_it_at_the_fitted_rates():
    assert set(RATES) == set(WORK_FIELDS) and all(r >= 0 for r in RATES.values()) and any(RATES.values())
    cl = cluster_from_dict({"name": "s", "nodes": [{"name": "a{i}", "count": 2, "gpu": "A100-40", "gpus_per_node": 4}]})
    ctx = PlanningContext(cl, model_catalog().get("GPT-3-1.3B"), Job(global_batch_size=32, sequence_length=1024),
                          CostModel(cl))
    clock = WorkClock(ctx.work, ctx.cost_model)
    assert clock() == 0.0 and clock.tally() == Work()
    from arachne.planners.arachne.actions import Action, State
    from arachne.planners.arachne.search.pricer import Pricer

    Pricer(ctx).price_state(State(0).push(Action("own", 1, 1, 1, 2, 4)))
    w = clock.tally()
    assert w.prices == 1 and w.estimates >= 1 and w.estimated_stages >= 2 and w.estimated_devices >= 8
    assert w.fill_stages >= 2 and w.profile_calls >= w.profiles and w.profiles >= 1
    assert clock() == pytest.approx(sum(getattr(w, f) * RATES[f] for f in WORK_FIELDS))
    assert w.estimated_cells > 0


def busy_problem():
    cl = cluster_from_dict({"name": "m", "nodes": [
        {"name": "h{i}", "count": 2, "gpu": "H100", "gpus_per_node": 8},
        {"name": "a{i}", "count": 3, "gpu": "A100-40", "gpus_per_node": 8},
        {"name": "v{i}", "count": 4, "gpu": "V100-16", "gpus_per_node": 8},
        {"name": "t{i}", "count": 8, "gpu": "T4", "gpus_per_node": 4}]})
    return cl, model_catalog().get("LLaMA-2-13B"), Job(global_batch_size=256, sequence_length=2048)


def plan_json(target: float, clock: str, slow_s: float = 0.0) -> tuple[str, dict]:
    cl, m, job = busy_problem()
    cm = CostModel(cl)
    if slow_s:  # a machine that prices every plan more slowly
        est = cm.estimate

        def slow(plan, validate=True):
            time.sleep(slow_s)
            return est(plan, validate)

        cm.estimate = slow
    r = ArachnePlanner(target_s=target, clock=clock).plan(cl, m, job, cm, SearchBudget(time_budget_s=30))
    return r.plans[0].model_dump_json(), r.stats.notes


@pytest.mark.slow
def test_the_same_problem_gets_the_same_plan_on_a_slower_machine():
    """On the work clock the search does the same work however long it takes, so the plan is the same; the
    run's work stays near its target."""
    fast, notes = plan_json(0.3, "work")
    slow, slow_notes = plan_json(0.3, "work", slow_s=0.001)
    assert fast == slow
    assert notes["work"] == slow_notes["work"] and notes["work_s"] == slow_notes["work_s"]
    assert 0.2 <= notes["work_s"] <= 0.3 * 1.5


@pytest.mark.slow
def test_the_wall_clock_is_still_available():
    plan, notes = plan_json(0.2, "wall")
    assert plan and notes["clock"] == "wall"


@pytest.mark.slow
def test_a_warm_cost_model_does_not_change_the_work_or_the_plan():
    """The tally counts work requested, not cache misses: a second plan on the same (now warm) cost model
    does the same work and finds the same plan."""
    cl, m, job = busy_problem()
    cm = CostModel(cl)
    runs = [ArachnePlanner(target_s=0.2).plan(cl, m, job, cm, SearchBudget(time_budget_s=30)) for _ in range(2)]
    assert runs[0].stats.notes["work"] == runs[1].stats.notes["work"]
    assert runs[0].plans[0].model_dump_json() == runs[1].plans[0].model_dump_json()


class Racing:
    """A clock that finds ``step`` seconds gone at every look (a machine loaded far past its cores)."""

    def __init__(self, step: float = 10.0):
        self.t, self.step = 0.0, step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


def odd_problem():
    cl = cluster_from_dict({"name": "o", "nodes": [
        {"name": "h{i}", "count": 2, "gpu": "H100", "gpus_per_node": 6},
        {"name": "a{i}", "count": 2, "gpu": "A100-40", "gpus_per_node": 8}]})
    return cl, model_catalog().get("GPT-3-1.3B"), Job(global_batch_size=64, sequence_length=1024)


def plan_odd(budget_s: float = 30.0):
    cl, m, job = odd_problem()
    r = ArachnePlanner(target_s=0.1).plan(cl, m, job, CostModel(cl), SearchBudget(time_budget_s=budget_s))
    return r.plans[0].model_dump_json(), r.stats.notes


@pytest.mark.slow
def test_a_racing_wall_clock_changes_neither_the_work_nor_the_plan(monkeypatch):
    """The budget and the guard count the planning thread's CPU seconds: a loaded machine, whose wall clock
    runs ahead of the work done, gets the same plan after the same work (nodes of 6: both node views)."""
    calm, calm_notes = plan_odd(budget_s=5.0)
    monkeypatch.setattr(time, "perf_counter", Racing())
    loaded, notes = plan_odd(budget_s=5.0)
    assert loaded == calm and notes["work"] == calm_notes["work"] and "guard_expired" not in notes


def test_a_spent_cpu_guard_still_returns_a_plan_and_says_so(monkeypatch):
    """Where the thread's CPU time runs out (a machine many times slower than the work rates say), the run
    stops early, still returns a plan, and its notes say the plan depended on the machine's speed."""
    monkeypatch.setattr(time, "thread_time", Racing())
    plan, notes = plan_odd()
    assert plan and notes["guard_expired"] is True


def test_a_cpu_budget_counts_the_threads_cpu_seconds(monkeypatch):
    monkeypatch.setattr(time, "thread_time", Racing(100.0))
    assert SearchBudget(time_budget_s=50, cpu=True).deadline().expired()
    assert not SearchBudget(time_budget_s=50).deadline().expired()  # (the wall clock: baselines by default)


def test_the_framework_floor_runs_its_grid_on_the_same_cpu_budget(monkeypatch):
    """Under a framework's rules the arachne planner prices that framework's own grid as a floor: its budget too
    counts CPU seconds, so the floor does not depend on the load either."""
    from arachne.planners import registry
    from arachne.planners.arachne.rules_view import framework_floor

    seen = []

    class Grid:
        def plan(self, cluster, model, job, cost_model, budget):
            seen.append(budget)
            raise ValueError("no layout")

    monkeypatch.setattr(registry, "get_planner", lambda name, **opts: Grid())
    cl, m, job = odd_problem()
    assert framework_floor(cl, m, job, CostModel(cl), SearchBudget(time_budget_s=5), lambda e: 0.0) == []
    assert seen and all(b.cpu and b.time_budget_s == 5 for b in seen)
