"""`arachne run`, `arachne profile`, `arachne export`: output formats and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from arachne.cli import runtime_cmds


@pytest.fixture
def cli():
    """A typer app with only the runtime commands (independent of other command modules)."""
    app = typer.Typer(pretty_exceptions_enable=False)
    runtime_cmds.register(app)

    @app.command("noop", hidden=True)
    def _noop() -> None:  # a second command keeps typer in multi-command mode
        pass

    runner = CliRunner()
    return lambda *args: runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def files(tmp_path, rt):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(rt.CLUSTER_DOC))
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(rt.make_plan(rt.DENSE, [
        {"micro_batches": 2, "stages": [rt.stage(0, 1, [0]), rt.stage(1, 4, [1])]},
        {"micro_batches": 2, "stages": [rt.stage(0, 4, [2])]}])))
    return cluster, plan


def test_import_arachne_and_help_do_not_import_torch():
    code = ("import sys, arachne, arachne.runtime, arachne.runtime.layout, arachne.runtime.export, "
            "arachne.cli.runtime_cmds; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.slow
def test_run_json_prints_one_object_per_step(cli, files):
    pytest.importorskip("torch")
    cluster, plan = files
    res = cli("run", "--cluster", cluster, "--plan", plan, "--steps", 2, "--json", "--simulate-devices")
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert all(set(r) == {"step", "loss", "time_s"} and r["loss"] > 0 and r["time_s"] > 0 for r in rows)


@pytest.mark.parametrize("mutate,needle", [
    (lambda c, p: ("run", "--cluster", c, "--plan", p.with_name("missing.json")), "missing.json: file not found"),
    (lambda c, p: ("run", "--cluster", c.with_name("nope.yaml"), "--plan", p), "nope.yaml: file not found"),
    (lambda c, p: ("export", "--cluster", c, "--plan", p, "--format", "slurm"), "--format"),
])
def test_bad_input_is_one_line_exit_2(cli, files, mutate, needle):
    cluster, plan = files
    res = cli(*mutate(cluster, plan))
    assert res.exit_code == 2
    assert needle in res.stderr and len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.output


def test_bad_plan_field_names_the_field(cli, files, rt):
    cluster, plan = files
    doc = json.loads(plan.read_text())
    doc["pipelines"][0]["stages"][1]["tp"] = 3
    plan.write_text(json.dumps(doc))
    res = cli("run", "--cluster", cluster, "--plan", plan, "--simulate-devices")
    assert res.exit_code == 2
    assert "pipelines[0].stages[1].tp" in res.stderr and str(plan) in res.stderr


def test_export_megatron_refuses_heterogeneous_plan(cli, files):
    cluster, plan = files
    res = cli("export", "--cluster", cluster, "--plan", plan, "--format", "megatron")
    assert res.exit_code == 2
    line = res.stderr.strip()
    assert len(line.splitlines()) == 1 and "cannot express" in line and "heterogeneous pipelines" in line


def test_export_megatron_and_torchrun_files(cli, files, rt, tmp_path):
    cluster, _ = files
    plan = tmp_path / "homog.json"
    plan.write_text(json.dumps(rt.make_plan(rt.DENSE, [
        {"micro_batches": 2, "stages": [rt.stage(0, 2, [2 * p]), rt.stage(2, 4, [2 * p + 1])]} for p in range(2)])))
    res = cli("export", "--cluster", cluster, "--plan", plan, "--format", "megatron", "-o", tmp_path / "meg")
    assert res.exit_code == 0, res.output
    args = (tmp_path / "meg" / "megatron_args.txt").read_text().split()
    assert args[args.index("--pipeline-model-parallel-size") + 1] == "2"
    res = cli("export", "--cluster", cluster, "--plan", plan, "--format", "torchrun", "-o", tmp_path / "tr")
    assert res.exit_code == 0, res.output
    rank_map = json.loads((tmp_path / "tr" / "rank_map.json").read_text())
    assert rank_map["world_size"] == 4 and len(rank_map["ranks"]) == 4
    assert "torchrun" in (tmp_path / "tr" / "launch_n0.sh").read_text()


@pytest.mark.slow
def test_profile_writes_a_loadable_profile(cli, tmp_path):
    pytest.importorskip("torch")
    from arachne.profiles.format import load_profile

    res = cli("profile", "--model", "opt-350m", "--num-layers", 3, "--hidden-size", 32, "--ffn-hidden-size", 64,
              "--num-attention-heads", 4, "--vocab-size", 100, "--sequence-length", 16,
              "--micro-batch-sizes", "1,2", "--tp", "1,2", "--repeats", 1, "--threads", 1, "-o", tmp_path)
    assert res.exit_code == 0, res.output
    (path,) = list(tmp_path.glob("*.json"))
    doc = load_profile(path)
    assert doc.model.startswith("OPT-350M.layers-3.hidden-32") and doc.gpu == "CPU" and doc.sequence_length == 16
    assert sorted((e.tp, e.micro_batch_size) for e in doc.entries) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    for e in doc.entries:
        assert len(e.blocks.fwd_s) == 3 and all(t > 0 for t in e.blocks.fwd_s + e.blocks.bwd_s)
        assert e.memory is not None and all(b > 0 for b in e.memory.block_activation_bytes)
    by = {(e.tp, e.micro_batch_size): e for e in doc.entries}
    assert by[(1, 2)].memory.block_activation_bytes[0] > by[(1, 1)].memory.block_activation_bytes[0]


@pytest.mark.slow
def test_run_measure_reports_measured_and_estimated(cli, files, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("arachne.cost")
    cluster, plan = files
    res = cli("run", "--cluster", cluster, "--plan", plan, "--steps", 2, "--json", "--simulate-devices", "--measure")
    assert res.exit_code == 0, res.output
    last = json.loads(res.stdout.splitlines()[-1])
    assert last["measured_iteration_time_s"] > 0 and last["estimated_iteration_time_s"] > 0
    assert last["steps_measured"] == 1 and last["relative_error"] is not None


@pytest.mark.slow
def test_checkpoint_resume_from_cli(cli, files, tmp_path):
    pytest.importorskip("torch")
    cluster, plan = files
    ck = tmp_path / "ck"
    first = cli("run", "--cluster", cluster, "--plan", plan, "--steps", 1, "--json", "--simulate-devices",
                "--checkpoint-dir", ck)
    assert first.exit_code == 0, first.output
    second = cli("run", "--cluster", cluster, "--plan", plan, "--steps", 1, "--json", "--simulate-devices",
                 "--checkpoint-dir", ck)
    assert second.exit_code == 0, second.output
    assert json.loads(second.stdout.splitlines()[0])["step"] == 1
    assert "resumed from" in second.stderr
    assert (Path(ck) / "latest").read_text().strip() == "step-000002"
