"""The safe-name rule (docs/formats.md, Names): node, cluster, model and GPU type names read from a file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from arachne.cli.app import app
from arachne.errors import InputError
from arachne.plan import load_plan
from arachne.spec.cluster import cluster_from_dict, load_cluster
from arachne.spec.gpus import gpu_catalog
from arachne.spec.model import load_model, model_catalog
from arachne.spec.names import check_name, name_error, printable

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

HOSTILE = ["a\ntouch INJECTED #", "x/../../escaped", "../up", "[/]x", "[bold]x", ".hidden", "a..b", "a b", "a:b",
           "a;rm -rf x", "$(id)", "`id`", "a'b", "tab\tname", "esc\x1b[2J", "", "x" * 101, "nœud"]
SAFE = ["a100", "v100-{i}".replace("{i}", "3"), "A100-SXM4-40GB", "GPT-3-1.3B", "Qwen1.5-MoE-A2.7B", "rack_0.n1",
        "x" * 100]
CUSTOM = {"name": "MyAccel-48GB", "memory_gb": 48, "peak_tflops": 180, "memory_bandwidth_gbps": 960,
          "intra_node_gbps": 64, "inter_node_gbps": 12.5}
MODEL = {"name": "tiny", "num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 256, "num_attention_heads": 4,
         "vocab_size": 1000}


@pytest.mark.parametrize("name", SAFE)
def test_safe_names_pass(name):
    assert name_error(name) is None and check_name(name) == name


@pytest.mark.parametrize("name", HOSTILE, ids=repr)
def test_hostile_names_are_refused_in_one_line(name):
    why = name_error(name)
    assert why is not None and "\n" not in why and "\x1b" not in why and len(why) < 200


def test_every_catalog_and_example_name_passes_the_rule():
    names = [n for g in gpu_catalog().gpus for n in (g.name, *g.aliases)]
    names += [n for m in model_catalog().models for n in (m.name, *m.aliases)]
    for path in sorted((EXAMPLES / "clusters").glob("*.yaml")):
        cl = load_cluster(path)
        names += [cl.name, *(n.name for n in cl.nodes)]
    for path in sorted((EXAMPLES / "plans").glob("*.json")):
        names.append(load_plan(path).resolve_model(str(path)).name)
    assert [n for n in names if name_error(n) is not None] == []


@pytest.mark.parametrize("name", HOSTILE[:-3], ids=repr)
def test_a_hostile_node_name_is_refused_when_the_cluster_is_read(name):
    doc = {"nodes": [{"name": "ok", "gpu": "T4"}, {"name": name, "gpu": "T4"}]}
    with pytest.raises(InputError) as info:
        cluster_from_dict(doc, "c.yaml")
    assert info.value.field == "nodes[1].name" and str(info.value).startswith("c.yaml: nodes[1].name: ")
    assert "\n" not in str(info.value)


def test_node_names_are_checked_after_expansion():
    assert [n.name for n in cluster_from_dict({"nodes": [{"name": "n-{i}", "count": 2, "gpu": "T4"}]}).nodes] \
        == ["n-0", "n-1"]
    with pytest.raises(InputError) as info:
        cluster_from_dict({"nodes": [{"name": "n/{i}", "count": 2, "gpu": "T4"}]}, "c.yaml")
    assert info.value.field == "nodes[0].name" and "'n/0'" in str(info.value)


def test_a_cluster_name_is_one_line_of_text_and_gpu_type_names_follow_the_rule():
    # the cluster's name is only shown: any text on one line (benchmark clusters are called 'mit_v1/OPT-350/N2_D1')
    assert cluster_from_dict({"name": "[/]x lab/1", "nodes": [{"name": "a", "gpu": "T4"}]}).name == "[/]x lab/1"
    for bad in ("a\nb", "esc\x1b[2J", ""):
        with pytest.raises(InputError) as info:
            cluster_from_dict({"name": bad, "nodes": [{"name": "a", "gpu": "T4"}]}, "c.yaml")
        assert info.value.field == "name" and "\n" not in str(info.value)
    with pytest.raises(InputError) as info:
        cluster_from_dict({"nodes": [{"name": "a", "gpu": "x\ny"}], "gpu_types": [{**CUSTOM, "name": "x\ny"}]},
                          "c.yaml")
    assert info.value.field == "gpu_types[0].name"


def test_model_names_follow_the_rule_in_files_and_in_plans(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps({**MODEL, "name": "[/]evil"}))
    with pytest.raises(InputError) as info:
        load_model(str(path))
    assert info.value.field == "name" and str(path) in str(info.value)
    with pytest.raises(InputError) as info:
        load_model({**MODEL, "name": "a\nb"}, "plan.json", "model")
    assert info.value.field == "model.name"


def test_the_cli_refuses_a_hostile_node_name_with_one_line(tmp_path):
    cluster = tmp_path / "c.yaml"
    cluster.write_text('nodes:\n  - name: "a\\ntouch INJECTED #"\n    gpu: T4\n')
    res = CliRunner().invoke(app, ["plan", "-c", str(cluster), "-m", "opt-350m", "-b", "8", "-s", "512"])
    assert res.exit_code == 2, res.output
    assert len(res.stderr.strip().splitlines()) == 1 and "nodes[0].name" in res.stderr
    assert "Traceback" not in res.output


def test_printable_escapes_control_characters_and_keeps_brackets():
    assert printable("a\nb\x1b[31m[/]c\x07") == "a\\nb\\x1b[31m[/]c\\x07"
    assert printable("plain [text]") == "plain [text]"
