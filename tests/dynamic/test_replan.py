"""Re-planning for a changed cluster: the new plan, the old plan's fate, the migration volume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs
from typer.testing import CliRunner

from arachne.cli.app import app
from arachne.cost.calibration import MemoryCalibration
from arachne.cost.memory import state_bytes_per_param
from arachne.dynamic import migration_cost, replan
from arachne.plan import Pipeline, Plan, Stage, validate_plan
from arachne.planners.harness import run_planner
from arachne.planners.protocol import SearchBudget
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.job import Job
from arachne.spec.model import model_catalog

FULL = {"name": "full", "nodes": [{"name": "a{i}", "count": 2, "gpu": "A100-40", "gpus_per_node": 4},
                                  {"name": "v{i}", "count": 2, "gpu": "V100-16", "gpus_per_node": 4}]}
LOST = {"name": "lost", "nodes": [{"name": "a{i}", "count": 2, "gpu": "A100-40", "gpus_per_node": 4},
                                  {"name": "v{i}", "count": 1, "gpu": "V100-16", "gpus_per_node": 4}]}
MODEL = "GPT-3-1.3B"


def planned(planner: str = "megatron", cluster: dict = FULL) -> Plan:
    cl = cluster_from_dict(cluster)
    plan, _, _ = run_planner(planner, cl, model_catalog().get(MODEL), Job(global_batch_size=64, sequence_length=2048),
                             budget=SearchBudget(time_budget_s=5))
    return plan


@pytest.mark.slow
def test_lost_node_gets_a_valid_plan_without_its_gpus_and_a_migration_price():
    old = planned("arachne")
    lost = cluster_from_dict(LOST)
    res = replan(old, lost, SearchBudget(time_budget_s=5))
    validate_plan(res.plan, lost)
    assert not any(d.startswith("v1:") for d in res.plan.devices)
    if any(d.startswith("v1:") for d in old.devices):
        assert "unknown device" in res.old_problem and res.old_estimate is None and not res.kept_old
        assert res.migration.bytes_moved > 0 and res.migration.seconds > 0
    assert res.estimate.fits and res.estimate.tokens_per_s > 0


def test_unchanged_cluster_keeps_the_running_plan_and_moves_nothing():
    old = planned("megatron")
    res = replan(old, cluster_from_dict(FULL), SearchBudget(time_budget_s=5), planner="megatron")
    assert res.kept_old and res.old_problem is None and res.plan == old
    assert res.migration.bytes_moved == 0 and res.migration.devices_unchanged == res.migration.devices
    assert res.break_even_iterations is None


def single_stage(devices: list[str], tp: int) -> Plan:
    return Plan(model=MODEL, global_batch_size=8, sequence_length=2048, micro_batch_size=1,
                pipelines=(Pipeline(micro_batches=8, stages=(Stage(layers=(0, 24), devices=tuple(devices), tp=tp),)),))


@settings(max_examples=20, deadline=None)
@given(tp=hs.sampled_from([1, 2, 4]), same=hs.booleans())
def test_migration_moves_the_whole_state_to_fresh_gpus_and_nothing_in_place(tp, same):
    cl = cluster_from_dict(FULL)
    model = model_catalog().get(MODEL)
    old = single_stage([f"a0:{i}" for i in range(tp)], tp)
    new = old if same else single_stage([f"a1:{i}" for i in range(tp)], tp)
    mig = migration_cost(old, new, model, cl)
    if same:
        assert mig.bytes_moved == 0 and mig.seconds == 0
        return
    w, _, o = state_bytes_per_param("bf16", MemoryCalibration())
    shard = (sum(model.block_params(i) for i in range(24)) + model.embedding_params(tp) + model.head_params(tp)) / tp
    assert mig.bytes_moved == pytest.approx(tp * shard * (w + o))
    assert mig.seconds == pytest.approx(mig.bytes_moved / cl.node_by_name["a1"].inter_node_bw)


def test_changing_tp_in_place_still_moves_the_reshaped_state():
    cl = cluster_from_dict(FULL)
    model = model_catalog().get(MODEL)
    old = single_stage(["a0:0", "a0:1"], 1)
    old = old.model_copy(update={"pipelines": (Pipeline(micro_batches=8, stages=(
        Stage(layers=(0, 24), devices=("a0:0", "a0:1"), tp=1, dp=2),)),)})
    new = single_stage(["a0:0", "a0:1"], 2)
    assert migration_cost(old, new, model, cl).bytes_moved > 0


@pytest.fixture
def files(write_doc, tmp_path: Path) -> tuple[Path, Path]:
    plan = tmp_path / "old.json"
    planned("megatron").save(plan)
    return write_doc("lost.yaml", LOST), plan


@pytest.mark.slow
def test_cli_replan_writes_the_new_plan_and_reports_json(files, tmp_path: Path):
    cluster, plan = files
    out = tmp_path / "new.json"
    res = CliRunner().invoke(app, ["replan", "--cluster", str(cluster), "--plan", str(plan), "--time-budget", "5",
                                   "--json", "-o", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)  # stderr has notes (assumed figures, docs/formats.md 8.11)
    assert {"plan", "estimate", "migration", "old_problem", "kept_old", "break_even_iterations"} <= set(doc)
    assert json.loads(out.read_text())["planner"] == ("megatron" if doc["kept_old"] else "arachne")
    assert doc["plan"] == json.loads(out.read_text())


@pytest.mark.parametrize("args,needle", [
    (["--planner", "megatron", "--target", "1"], "--target"),
    (["--planner", "nope"], "unknown planner"),
])
def test_cli_replan_bad_input_is_one_line_exit_2(files, args, needle):
    cluster, plan = files
    res = CliRunner().invoke(app, ["replan", "--cluster", str(cluster), "--plan", str(plan)] + args)
    assert res.exit_code == 2 and needle in res.output and "Traceback" not in res.output


def test_cli_replan_missing_plan_file_names_it(files, tmp_path: Path):
    cluster, _ = files
    res = CliRunner().invoke(app, ["replan", "--cluster", str(cluster), "--plan", str(tmp_path / "none.json")])
    assert res.exit_code == 2 and "none.json" in res.output and "Traceback" not in res.output
