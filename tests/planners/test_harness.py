"""`arachne compare` and the comparison library: rows, JSON contract, table, chart, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from arachne.cli.app import app
from arachne.errors import InputError
from arachne.planners.harness import default_planners, parse_planners, run_compare
from arachne.planners.protocol import SearchBudget
from arachne.report.compare import compare_table
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.job import Job
from arachne.spec.model import load_model

CLUSTER = {"name": "mini", "nodes": [{"name": "a", "gpu": "A100-40", "gpus_per_node": 4},
                                     {"name": "v", "gpu": "V100-16", "gpus_per_node": 4}]}


@pytest.fixture
def cluster_file(write_doc) -> Path:
    return write_doc("mini.yaml", CLUSTER)


def test_run_compare_rows_and_failures() -> None:
    c = cluster_from_dict(CLUSTER)
    rows = run_compare(c, load_model("OPT-350M"), Job(global_batch_size=64, sequence_length=2048),
                       ["megatron", "amp"], SearchBudget(time_budget_s=10))
    assert [r.planner for r in rows] == ["megatron", "amp"]
    assert all(r.estimate is not None and r.error is None for r in rows)
    doc = rows[0].to_doc()
    assert set(doc) == {"planner", "plan", "estimate", "planning_time_s", "plans_priced", "error"}
    assert compare_table(rows, "t").row_count == 2
    big = run_compare(c, load_model("LLaMA-2-70B"), Job(global_batch_size=64, sequence_length=2048),
                      ["amp"], SearchBudget(time_budget_s=5))
    assert big[0].plan is None and "no plan fits" in big[0].error


def test_a_search_that_found_nothing_keeps_its_statistics_in_the_row(monkeypatch) -> None:
    """A planner that searched and found no plan: its row says whether it timed out and what it looked at
    (the benchmarks' tables read them); a problem refused before any search has none."""
    from arachne.planners.baselines.megatron import MegatronPlanner
    from arachne.planners.protocol import PlannerResult, SearchStats

    def nothing(self, cluster, model, job, cost_model, budget):
        return PlannerResult([], [], SearchStats(candidates=7, timed_out=True, notes={"gave_up": "too large"}))

    monkeypatch.setattr(MegatronPlanner, "plan", nothing)
    c = cluster_from_dict(CLUSTER)
    (row,) = run_compare(c, load_model("OPT-350M"), Job(global_batch_size=64, sequence_length=2048), ["megatron"],
                         SearchBudget(time_budget_s=5))
    assert row.plan is None and "too large" in row.error
    assert row.timed_out and row.candidates == 7 and row.notes["gave_up"] == "too large"
    (early,) = run_compare(c, load_model("LLaMA-2-70B"), Job(global_batch_size=64, sequence_length=2048), ["megatron"],
                           SearchBudget(time_budget_s=5))
    assert early.plan is None and not early.timed_out and early.candidates == 0
    # a search that priced no layout does not blame memory for it
    monkeypatch.setattr(MegatronPlanner, "plan", lambda *_a: PlannerResult([], [], SearchStats()))
    (none,) = run_compare(c, load_model("OPT-350M"), Job(global_batch_size=64, sequence_length=2048), ["megatron"],
                          SearchBudget(time_budget_s=5))
    assert "it priced no layout" in none.error and "8 GPUs, a global batch of 64" in none.error
    assert "fits in memory" not in none.error


def test_default_planners_add_ep_variants_for_moe() -> None:
    dense, moe = default_planners(load_model("OPT-350M")), default_planners(load_model("Mixtral-8x7B"))
    assert "megatron" in dense and "metis+ep" not in dense
    assert "metis+ep" in moe and "amp+ep" in moe
    with pytest.raises(InputError):
        parse_planners("megatron,nope", load_model("OPT-350M"))


def test_cli_json_is_the_contract(cluster_file: Path) -> None:
    res = CliRunner().invoke(app, ["compare", "--cluster", str(cluster_file), "--model", "OPT-350M",
                                   "--global-batch-size", "64", "--sequence-length", "1024",
                                   "--planners", "megatron,sailor,amp", "--time-budget", "5", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert [r["planner"] for r in doc["results"]] == ["megatron", "sailor", "amp"]
    for r in doc["results"]:
        assert r["error"] is None and r["plan"]["format"] in ("arachne-plan/1", "arachne-plan/2")
        assert r["estimate"]["tokens_per_s"] > 0 and r["plans_priced"] > 0


@pytest.mark.slow
def test_cli_table_and_plot(cluster_file: Path, tmp_path: Path) -> None:
    png = tmp_path / "cmp.png"
    res = CliRunner().invoke(app, ["compare", "-c", str(cluster_file), "-m", "GPT-3-1.3B", "-b", "64", "-s", "1024",
                                   "--planners", "megatron,flashflex", "--time-budget", "5", "--plot", str(png)])
    assert res.exit_code == 0, res.output
    assert "megatron" in res.stdout and "vs best" in res.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args,needle", [
    (["--planners", "nope"], "unknown planner"),
    (["--precision", "fp8"], "--precision"),
    (["--model", "no-such-model"], "unknown model"),
])
def test_cli_bad_input_is_one_line_exit_2(cluster_file: Path, args: list[str], needle: str) -> None:
    base = ["compare", "--cluster", str(cluster_file), "--model", "OPT-350M", "-b", "64", "-s", "1024"]
    res = CliRunner().invoke(app, base + args)
    assert res.exit_code == 2
    assert needle in res.output and "Traceback" not in res.output


def test_plan_target_is_for_arachne_only(cluster_file: Path, tmp_path: Path) -> None:
    base = ["plan", "--cluster", str(cluster_file), "--model", "OPT-350M", "-b", "64", "-s", "1024"]
    res = CliRunner().invoke(app, base + ["--planner", "megatron", "--target", "2"])
    assert res.exit_code == 2 and "--target" in res.output and "Traceback" not in res.output
    out = tmp_path / "p.json"
    res = CliRunner().invoke(app, base + ["--target", "0.3", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["planner"] == "arachne"


def test_plan_table_shows_the_compute_ceiling_above_the_plan(cluster_file: Path) -> None:
    res = CliRunner().invoke(app, ["plan", "--cluster", str(cluster_file), "--model", "OPT-350M", "-b", "64",
                                   "-s", "1024", "--planner", "megatron"])
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.output.splitlines() if "compute ceiling" in ln)
    share = int(line.split("reaches ")[1].split("%")[0])
    assert 0 < share <= 100


def test_estimate_table_shows_the_compute_ceiling(cluster_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    res = CliRunner().invoke(app, ["plan", "--cluster", str(cluster_file), "--model", "OPT-350M", "-b", "64",
                                   "-s", "1024", "--planner", "megatron", "-o", str(out)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(app, ["estimate", "--cluster", str(cluster_file), "--plan", str(out)])
    assert res.exit_code == 0, res.output
    assert "compute ceiling" in res.output and "no plan" in res.output


def test_select_checks_the_best_plan_first_and_skips_one_that_breaks_the_format() -> None:
    """The harness prices every plan unchecked and checks the best first: a plan that prices faster but breaks
    the format (its micro-batches no longer sum to the batch; a device the cluster lacks) is never returned."""
    from arachne.cost import CostModel
    from arachne.planners.harness import run_planner, select

    c = cluster_from_dict(CLUSTER)
    plan, est, _ = run_planner("sailor", c, load_model("OPT-350M"), Job(global_batch_size=64, sequence_length=2048))
    cm = CostModel(c)
    pipe = plan.pipelines[0]
    assert pipe.micro_batches > 1
    short = plan.model_copy(update={"pipelines": tuple(p.model_copy(update={"micro_batches": p.micro_batches // 2})
                                                       for p in plan.pipelines)})
    assert cm.estimate(short, validate=False).iteration_time_s < est.iteration_time_s
    stage = pipe.stages[0]
    stranger = plan.model_copy(update={"pipelines": (pipe.model_copy(update={"stages": (
        stage.model_copy(update={"devices": ("nowhere:0", *stage.devices[1:])}), *pipe.stages[1:])}),
        *plan.pipelines[1:])})
    for first in (short, stranger):
        chosen, why = select([first, plan], cm)
        assert chosen is not None and chosen[0] == plan and why is None
    assert select([short, stranger], cm) == (None, None)


def test_every_planner_searches_with_the_cyclic_collector_off_and_gets_it_back(monkeypatch) -> None:
    import gc

    from arachne.planners import harness

    seen: list[bool] = []
    real = harness.get_planner

    class Spy:
        def __init__(self, inner, fail: bool) -> None:
            self.inner, self.fail = inner, fail

        def plan(self, *args):
            seen.append(gc.isenabled())
            if self.fail:
                raise RuntimeError("boom")
            return self.inner.plan(*args)

    c, m, job = cluster_from_dict(CLUSTER), load_model("OPT-350M"), Job(global_batch_size=64, sequence_length=2048)
    assert gc.isenabled()
    monkeypatch.setattr(harness, "get_planner", lambda name, **kw: Spy(real(name, **kw), False))
    plan, est, _ = harness.run_planner("megatron", c, m, job, budget=SearchBudget(time_budget_s=5))
    assert est.tokens_per_s > 0 and seen == [False] and gc.isenabled()
    monkeypatch.setattr(harness, "get_planner", lambda name, **kw: Spy(real(name, **kw), True))
    with pytest.raises(RuntimeError):
        harness.run_planner("megatron", c, m, job, budget=SearchBudget(time_budget_s=5))
    assert seen == [False, False] and gc.isenabled()
    gc.disable()  # a caller that turned it off itself keeps it off
    try:
        with harness.collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
