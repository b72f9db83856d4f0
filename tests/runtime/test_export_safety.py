"""`export` never lets a name or a path from the user's files reach a shell or a path unchecked."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from arachne.cli.app import app
from arachne.errors import InputError
from arachne.runtime.export import launch_script, output_path

MODEL = {"name": "tiny", "num_layers": 2, "hidden_size": 32, "ffn_hidden_size": 64, "num_attention_heads": 4,
         "vocab_size": 97, "max_sequence_length": 16}


def write_inputs(tmp: Path, node: str, plan_name: str = "plan.json") -> tuple[Path, Path]:
    """A one-node cluster whose node is called ``node`` (written verbatim into YAML) and a 2-stage plan."""
    cluster = tmp / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"name": "c", "nodes": [{"name": node, "gpu": "A100-40", "gpus_per_node": 2}]}))
    plan = tmp / plan_name
    plan.write_text(json.dumps({"format": "arachne-plan/1", "model": MODEL, "global_batch_size": 4,
                                "sequence_length": 8, "micro_batch_size": 2, "precision": "fp32",
                                "pipelines": [{"micro_batches": 2, "stages": [
                                    {"layers": [0, 1], "devices": [f"{node}:0"]},
                                    {"layers": [1, 2], "devices": [f"{node}:1"]}]}]}))
    return cluster, plan


def export(cluster: Path, plan: Path, out: Path):
    return CliRunner().invoke(app, ["export", "-c", str(cluster), "-p", str(plan), "-f", "torchrun", "-o", str(out)])


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("node", ["a\ntouch INJECTED #", "x/../../escaped", "$(touch INJECTED)", "a b"])
def test_a_hostile_node_name_is_refused_and_nothing_is_written(tmp_path, node):
    work = tmp_path / "deep" / "work"
    work.mkdir(parents=True)
    cluster, plan = write_inputs(work, node)
    before = files_under(tmp_path)
    res = export(cluster, plan, work / "out")
    assert res.exit_code == 2, res.output
    assert len(res.stderr.strip().splitlines()) == 1 and "nodes[0].name" in res.stderr
    assert "Traceback" not in res.output
    assert files_under(tmp_path) == before


def test_every_written_path_stays_inside_the_output_directory(tmp_path):
    out = tmp_path / "out"
    assert output_path(out, "launch_n0.sh") == out / "launch_n0.sh"
    for name in ("launch_x/../../escaped.sh", "../escaped.sh", "/etc/passwd", "a/b.sh", "..", "", "x\n.sh"):
        with pytest.raises(InputError):
            output_path(out, name)
    out.mkdir()
    (out / "rank_map.json").symlink_to(tmp_path / "elsewhere.json")  # a symlink in out/ that leads out
    with pytest.raises(InputError):
        output_path(out, "rank_map.json")


def test_launch_scripts_quote_every_value_even_for_an_unchecked_name():
    node = {"node": "a\ntouch INJECTED #", "node_rank": 0, "nproc_per_node": 2, "first_rank": 0,
            "command": "torchrun --node-name 'a\ntouch INJECTED #'"}
    with pytest.raises(InputError):
        launch_script(node)  # a name that is not safe never reaches a script, even from code


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs a POSIX shell")
def test_a_launch_script_passes_paths_with_shell_characters_through_unchanged(tmp_path):
    inputs = tmp_path / "in $(touch INJECTED) `x`; 'q'"
    inputs.mkdir()
    cluster, plan = write_inputs(inputs, "n0", plan_name="p $HOME \"x\".json")
    res = export(cluster, plan, tmp_path / "out")
    assert res.exit_code == 0, res.output
    script = tmp_path / "out" / "launch_n0.sh"
    # a fake torchrun that records its arguments
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "torchrun"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    "json.dump(sys.argv[1:], open(sys.argv[0] + '.args', 'w'))\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["sh", str(script)], cwd=tmp_path, env=env, check=True, timeout=30)
    args = json.loads((bin_dir / "torchrun.args").read_text())
    assert args[args.index("--plan") + 1] == str(plan) and args[args.index("--cluster") + 1] == str(cluster)
    assert args[args.index("--node-name") + 1] == "n0"
    assert not list(tmp_path.rglob("INJECTED"))
