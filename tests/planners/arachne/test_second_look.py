"""The second search beside the planner's own (portfolio.py): a forked child's result comes back; without fork
the same result, computed in process; the faster plan wins; the same input, the same plan; off where it should be."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from arachne.cost import CostModel
from arachne.planners.arachne import planner as planner_mod
from arachne.planners.arachne import portfolio
from arachne.planners.arachne.planner import ArachnePlanner
from arachne.planners.harness import run_planner
from arachne.planners.protocol import SearchBudget
from arachne.spec.cluster import load_cluster
from arachne.spec.job import Job
from arachne.spec.model import load_model
from arachne.spec.runtimes import Legality

ROOT = Path(__file__).resolve().parents[3]
SMALL = load_cluster(ROOT / "examples" / "clusters" / "small-mixed.yaml")
JOB = Job(global_batch_size=32, sequence_length=1024)
MODEL = load_model("OPT-350M")


def _value() -> tuple[int, int]:
    return 6 * 7, os.getpid()


def _fails() -> None:
    raise ValueError("no luck\nsecond line")


def test_a_forked_child_returns_its_value_and_its_cpu_time():
    (value, pid), cpu, error = portfolio.Forked(_value).result()
    assert value == 42 and error is None and cpu >= 0
    assert pid != os.getpid()  # it ran in the child


def test_without_fork_the_same_value_is_computed_in_process(monkeypatch):
    monkeypatch.delattr(os, "fork")
    (value, pid), _, error = portfolio.Forked(_value).result()
    assert value == 42 and error is None and pid == os.getpid()


def test_a_fork_that_fails_runs_the_function_in_process(monkeypatch):
    def no_fork():
        raise OSError("no more processes")
    monkeypatch.setattr(os, "fork", no_fork)
    (value, pid), _, error = portfolio.Forked(_value).result()
    assert value == 42 and error is None and pid == os.getpid()


def test_an_error_in_the_child_comes_back_as_one_line_not_raised():
    value, _, error = portfolio.Forked(_fails).result()
    assert value is None and error == "second search failed: ValueError: no luck"


def test_cancel_stops_a_child_that_is_still_running():
    f = portfolio.Forked(lambda: time.sleep(30))
    pid = f.pid
    f.cancel()
    assert f.pid is None
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped: no such child any more


def _plan(**options):
    return run_planner("arachne", SMALL, MODEL, JOB, CostModel(SMALL), SearchBudget(), Legality.of("arachne"),
                       **options)


@pytest.mark.slow
def test_the_faster_of_the_two_searches_wins_and_the_plan_is_the_same_each_time():
    plan, est, res = _plan()
    _, alone, _ = _plan(second_look=False)
    note = res.stats.notes["second_look"]
    assert note.get("error") is None and note["work_s"] > 0 and note["cpu_s"] > 0
    assert est.iteration_time_s <= alone.iteration_time_s * (1 + 1e-9)
    assert note["won"] == (note["best"] < alone.iteration_time_s * (1 - 1e-9))
    again, _, _ = _plan()
    assert again.model_dump(exclude={"planning_time_s"}) == plan.model_dump(exclude={"planning_time_s"})


@pytest.mark.slow
def test_the_second_search_in_process_finds_what_the_forked_one_does(monkeypatch):
    forked, _, _ = _plan()
    monkeypatch.delattr(os, "fork")
    inline, _, res = _plan()
    assert res.stats.notes["second_look"].get("error") is None
    assert inline.model_dump(exclude={"planning_time_s"}) == forked.model_dump(exclude={"planning_time_s"})


@pytest.mark.slow
def test_a_failing_second_search_leaves_the_first_ones_plan(monkeypatch):
    _, alone, _ = _plan(second_look=False)

    def broken(self, *a, **k):
        if self.options.target.second_look:
            return original(self, *a, **k)
        raise RuntimeError("boom")
    original = ArachnePlanner._plan_views
    monkeypatch.setattr(ArachnePlanner, "_plan_views", broken)
    _, est, res = _plan()
    assert res.stats.notes["second_look"]["error"] == "second search failed: RuntimeError: boom"
    assert est.iteration_time_s == pytest.approx(alone.iteration_time_s)


@pytest.mark.parametrize("options", [{"second_look": False}, {"mode": "floor"}, {"use_ranker": False},
                                     {"rank_k": 8}])
def test_no_second_search_when_off_or_in_an_ablation_arm(options):
    _, _, res = _plan(**options)
    assert "second_look" not in res.stats.notes


def test_no_second_search_above_its_cluster_size(monkeypatch):
    monkeypatch.setattr(planner_mod, "SECOND_LOOK_MAX_GPUS", len(SMALL.devices) - 1)
    _, _, res = _plan()
    assert "second_look" not in res.stats.notes


@pytest.mark.slow
def test_the_whole_block_pass_runs_last_and_only_adds_plans():
    """The second search's last pass (decision 0048) leaves every phase before it as it was and returns a plan at
    least as fast (on 96 blocks over single-GPU MI300X nodes and V100 nodes it screens the rule at 5 replicas)."""
    from arachne.spec.cluster import cluster_from_dict
    from arachne.spec.model import model_catalog

    cl = cluster_from_dict({"name": "wb", "nodes": [
        {"name": "m{i}", "count": 122, "gpu": "MI300X", "gpus_per_node": 1},
        {"name": "v{i}", "count": 6, "gpu": "V100-16", "gpus_per_node": 8}]})
    job, spec = Job(global_batch_size=1024, sequence_length=2048), model_catalog().get("GPT-3-175B")
    runs = {}
    for whole in (False, True):
        opts = {**portfolio.SECOND_LOOK, "second_look": False, "whole_block_mix": whole}
        plan, est, res = run_planner("arachne", cl, spec, job, CostModel(cl), SearchBudget(time_budget_s=60),
                                     Legality.of("arachne"), **opts)
        runs[whole] = (est, res.stats.notes["phases"], res.stats.notes.get("whole_blocks"))
    phases = runs[True][1]
    assert "whole_blocks" in phases and "whole_blocks" not in runs[False][1]
    assert {k: v for k, v in phases.items() if k != "whole_blocks"} == runs[False][1]
    assert runs[True][2]["screened"] >= 1 and runs[False][2] is None
    assert runs[True][0].tokens_per_s >= runs[False][0].tokens_per_s
