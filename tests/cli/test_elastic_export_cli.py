"""Bad flags of ``export --format torchrun --elastic``, ``run --elastic --store`` and ``elastic-agent``: one line
naming the flag, exit 2, nothing written, before torch is imported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from cli_checks import invoke, one_error_line

SIM = {"name": "SIM", "memory_gb": 5.06, "peak_tflops": 10, "memory_bandwidth_gbps": 100, "intra_node_gbps": 10,
       "inter_node_gbps": 1}
MODEL = {"name": "tiny", "num_layers": 2, "hidden_size": 32, "ffn_hidden_size": 64, "num_attention_heads": 4,
         "vocab_size": 97, "max_sequence_length": 16}


@pytest.fixture
def inputs(tmp_path: Path) -> tuple[Path, Path]:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"name": "e", "gpu_types": [SIM], "nodes": [
        {"name": "n0", "gpu": "SIM", "gpus_per_node": 1}, {"name": "n1", "gpu": "SIM", "gpus_per_node": 1}]}))
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"format": "arachne-plan/1", "model": MODEL, "global_batch_size": 4,
                                "sequence_length": 8, "micro_batch_size": 2, "precision": "fp32",
                                "pipelines": [{"micro_batches": 2, "stages": [{"layers": [0, 2],
                                                                                "devices": ["n0:0"]}]}]}))
    return cluster, plan


@pytest.mark.parametrize("extra,flag", [
    ([], "--checkpoint-dir"),
    (["--checkpoint-dir", "ck", "--master-port", "1"], "--master-port"),
    (["--checkpoint-dir", "ck", "--store-host", "a;touch x"], "--store-host"),
    (["--checkpoint-dir", "ck", "--store-host", "-rf"], "--store-host"),
    (["--checkpoint-dir", "ck", "--initial-nodes", "n0,nX"], "--initial-nodes"),
    (["--checkpoint-dir", "ck", "--initial-nodes", "n0,n0"], "--initial-nodes"),
    (["--checkpoint-dir", "ck", "--min-nodes", "3"], "--min-nodes"),
    (["--checkpoint-dir", "ck", "--min-nodes", "2", "--max-nodes", "1"], "--min-nodes"),
    (["--checkpoint-dir", "ck", "--store-port", "0"], "--store-port"),
])
def test_bad_elastic_export_flags(inputs, tmp_path, extra, flag):
    cluster, plan = inputs
    res = invoke("export", "-c", cluster, "-p", plan, "-f", "torchrun", "--elastic", "-o", tmp_path / "out", *extra)
    if flag == "--store-port":  # typer's own range check: a usage error
        assert res.exit_code == 2 and flag in res.stderr
    else:
        assert flag in one_error_line(res)
    assert not (tmp_path / "out").exists()


def test_elastic_flags_need_elastic_and_torchrun(inputs, tmp_path):
    cluster, plan = inputs
    assert "--elastic" in one_error_line(invoke("export", "-c", cluster, "-p", plan, "-f", "megatron", "--elastic",
                                                "--checkpoint-dir", "ck"))
    for extra in (["--store-host", "h"], ["--checkpoint-dir", "ck"], ["--initial-nodes", "n0"]):
        assert extra[0] in one_error_line(invoke("export", "-c", cluster, "-p", plan, "-f", "torchrun", *extra))


def test_export_never_writes_over_its_inputs(inputs, tmp_path):
    cluster, plan = inputs
    out = tmp_path / "out"
    out.mkdir()
    inside = out / "elastic_store.sh"
    inside.write_text(plan.read_text())
    res = invoke("export", "-c", cluster, "-p", inside, "-f", "torchrun", "--elastic", "--checkpoint-dir", "ck",
                 "-o", out)
    assert "-o" in one_error_line(res)
    assert inside.read_text() == plan.read_text()


@pytest.mark.parametrize("extra,flag", [
    (["--store", "n0:29400"], "--store"),  # without --elastic
    (["--initial-nodes", "n0"], "--initial-nodes"),
    (["--elastic", "--store", "n0", "--checkpoint-dir", "CK"], "--store"),
    (["--elastic", "--store", "a b:1", "--checkpoint-dir", "CK"], "--store"),
    (["--elastic", "--store", "127.0.0.1:29400", "--simulate-devices", "--checkpoint-dir", "CK"], "--store"),
    (["--elastic", "--store", "127.0.0.1:29400"], "--checkpoint-dir"),
    (["--elastic", "--store", "127.0.0.1:29400", "--checkpoint-dir", "CK", "--initial-nodes", "nX"],
     "--initial-nodes"),
])
def test_bad_run_store_flags(inputs, tmp_path, extra, flag):
    cluster, plan = inputs
    extra = [str(tmp_path / "ck") if a == "CK" else a for a in extra]
    assert flag in one_error_line(invoke("run", "-c", cluster, "-p", plan, *extra))
    assert not (tmp_path / "ck").exists()


@pytest.mark.parametrize("extra,flag", [
    (["--store", "n0", "--node", "n0"], "--store"),
    (["--store", "n0:99999", "--node", "n0"], "--store"),
    (["--store", "n0:29400", "--node", "a b"], "--node"),
    (["--store", "n0:29400", "--node", "n0", "--local-addr", "$(touch x)"], "--local-addr"),
])
def test_bad_elastic_agent_flags(extra, flag):
    assert flag in one_error_line(invoke("elastic-agent", *extra))
