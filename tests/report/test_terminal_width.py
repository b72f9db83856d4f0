"""Terminal output: tables fit the width (COLUMNS, else the terminal, else 80) without cutting names or numbers;
text from a user's file is printed as text, never as rich markup; planning times and assumptions are labelled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from arachne.cli.app import app
from arachne.cost import CostModel
from arachne.plan import load_plan
from arachne.report.tables import summary_table
from arachne.spec.cluster import load_cluster
from arachne.spec.gpus import gpu_catalog
from arachne.spec.model import model_catalog

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SMALL = EXAMPLES / "clusters" / "small-mixed.yaml"
ELLIPSIS = "…"


def invoke(args: list[str], columns: int | None = 80):
    env = {"COLUMNS": str(columns)} if columns else {}
    return CliRunner().invoke(app, [str(a) for a in args], env=env)


def assert_fits(text: str, width: int) -> None:
    wide = [ln for ln in text.splitlines() if len(ln) > width]
    assert not wide, f"{len(wide)} line(s) wider than {width}:\n" + "\n".join(wide)
    assert ELLIPSIS not in text, text


@pytest.mark.parametrize("columns", [80, 100])
def test_gpus_and_models_fit_and_show_every_name_in_full(columns):
    res = invoke(["gpus"], columns)
    assert res.exit_code == 0, res.output
    assert_fits(res.stdout, columns)
    for g in gpu_catalog().gpus:
        assert g.name in res.stdout
    res = invoke(["models"], columns)
    assert res.exit_code == 0, res.output
    assert_fits(res.stdout, columns)
    for m in model_catalog().models:
        assert m.name in res.stdout and f"{m.num_params / 1e9:.2f}B" in res.stdout


def test_columns_is_honoured_when_output_is_not_a_terminal():
    narrow, wide = invoke(["gpus"], 80).stdout, invoke(["gpus"], 200).stdout
    assert max(map(len, narrow.splitlines())) <= 80 < max(map(len, wide.splitlines())) <= 200


@pytest.mark.parametrize("columns", [80, 100])
def test_plan_tables_fit_without_cutting_gpu_names_or_numbers(columns):
    res = invoke(["plan", "-c", SMALL, "-m", "opt-350m", "-b", 64, "-s", 2048, "--planner", "megatron-oblivious"],
                 columns)
    assert res.exit_code == 0, res.output
    assert_fits(res.stdout, columns)
    assert "A100-SXM4-40GB" in res.stdout or "V100-SXM2-16GB" in res.stdout


@pytest.mark.parametrize("stem", ["datacenter-1000__llama3-70b-hopper", "h100-a100-l4__mixtral-8x7b-ep",
                                  "small-mixed__gpt3-1.3b-2stage"])
def test_estimate_tables_fit_80_columns(stem):
    cluster, plan = EXAMPLES / "clusters" / f"{stem.split('__')[0]}.yaml", EXAMPLES / "plans" / f"{stem}.json"
    res = invoke(["estimate", "-c", cluster, "-p", plan])
    assert res.exit_code == 0, res.output
    assert_fits(res.stdout, 80)
    doc = json.loads(invoke(["estimate", "-c", cluster, "-p", plan, "--json"]).stdout)
    assert f"{doc['tokens_per_s']:,.0f}" in res.stdout
    gpus = {s["gpu"] for s in doc["stages"]}
    assert gpus and all(g in res.stdout for g in gpus)


def test_compare_fits_and_keeps_the_tokens_per_second():
    args = ["compare", "-c", SMALL, "-m", "opt-350m", "-b", 64, "-s", 2048, "--planners", "megatron,amp,flashflex",
            "--time-budget", 5]
    res = invoke(args, 80)
    assert res.exit_code == 0, res.output
    assert_fits(res.stdout, 80)
    rows = json.loads(invoke([*args, "--json"]).stdout)["results"]
    for r in rows:
        assert r["planner"] in res.stdout and f"{r['estimate']['tokens_per_s']:,.0f}" in res.stdout


def test_profiles_list_prints_brackets_from_a_users_file_as_text(tmp_path):
    shipped = Path(__file__).resolve().parents[2] / "arachne" / "data" / "profiles" / "opt30__v10016__fp32.json"
    doc = json.loads(shipped.read_text())
    doc.update(model="OPT-30", source="[bold]lab[/bold] [/]x \x1b[2J")
    (tmp_path / "p.json").write_text(json.dumps(doc))
    res = invoke(["profiles", "list", "--profiles", tmp_path])
    assert res.exit_code == 0, res.output
    assert "[bold]lab[/bold] [/]x" in res.stdout and "\x1b" not in res.stdout
    assert_fits(res.stdout, 80)


def test_the_console_prints_markup_characters_as_text():
    from arachne.cli.common import console

    with console.capture() as cap:
        console.print("[/]x [bold]y[/bold]")
    assert cap.get().strip() == "[/]x [bold]y[/bold]"


def test_plan_says_which_planning_time_is_which():
    res = invoke(["plan", "-c", SMALL, "-m", "opt-350m", "-b", 64, "-s", 2048], 100)
    assert res.exit_code == 0, res.output
    assert "wall clock" in res.stdout and "work clock" in res.stdout
    assert " of work" not in res.stdout  # the unlabelled figure in the header


def test_plan_prints_what_it_assumed_for_a_missing_inter_node_bandwidth(tmp_path):
    cluster = tmp_path / "c.yaml"
    cluster.write_text(yaml.safe_dump({"name": "c", "nodes": [
        {"name": "a-{i}", "count": 2, "gpu": "A100-40", "gpus_per_node": 4},
        {"name": "b", "gpu": "A100-40", "gpus_per_node": 4, "inter_node_gbps": 25}]}))
    res = invoke(["plan", "-c", cluster, "-m", "opt-350m", "-b", 64, "-s", 2048, "--planner", "megatron"])
    assert res.exit_code == 0, res.output
    notes = [ln for ln in res.stderr.splitlines() if "inter_node_gbps" in ln]
    assert len(notes) == 1 and "nodes[0]" in notes[0] and "200 GB/s" in notes[0] and "A100-SXM4-40GB" in notes[0]
    res = invoke(["plan", "-c", SMALL, "-m", "opt-350m", "-b", 64, "-s", 2048, "--planner", "megatron"])
    assert "inter_node_gbps" not in res.stderr


def render(renderable, width: int = 80) -> str:
    from rich.console import Console

    console = Console(width=width, record=True, markup=False)
    console.print(renderable)
    return console.export_text()


def test_a_stage_near_full_memory_gets_a_headroom_remark():
    plan = load_plan(EXAMPLES / "plans" / "small-mixed__gpt3-1.3b-2stage.json")
    est = CostModel(load_cluster(SMALL)).estimate(plan)
    assert "headroom" not in render(summary_table(plan, est))
    worst = est.stages[-1]
    worst.memory_bytes = 0.995 * worst.capacity_bytes
    text = render(summary_table(plan, est))
    assert "headroom" in text and "100%" in text


@pytest.mark.parametrize("command", ["plan", "compare"])
def test_a_cluster_name_with_brackets_is_printed_as_text(tmp_path, command):
    cluster = tmp_path / "c.yaml"
    cluster.write_text(yaml.safe_dump({"name": "[/]x [bold]lab[/bold]", "nodes": [
        {"name": "a", "gpu": "A100-40", "gpus_per_node": 4, "inter_node_gbps": 25}]}))
    args = [command, "-c", cluster, "-m", "opt-350m", "-b", 16, "-s", 1024]
    res = invoke(args + (["--planner", "megatron"] if command == "plan" else ["--planners", "megatron"]))
    assert res.exit_code == 0, res.output
    assert "[/]x [bold]lab[/bold]" in res.stdout
