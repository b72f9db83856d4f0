"""`arachne replay`: a tiny trace end to end (table, --json, -o, --plot), and bad input as one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from cli_checks import invoke, one_error_line

NODE = {"gpu": "A100-40", "gpus_per_node": 4, "inter_node_gbps": 12.5}
TINY = {"format": "arachne-trace/1", "name": "tiny", "end_s": 600,
        "job": {"model": "GPT-3-1.3B", "global_batch_size": 32, "sequence_length": 2048},
        "cluster": {"name": "c", "nodes": [{"name": "a0", **NODE},
                                           {"name": "v0", "gpu": "V100-16", "gpus_per_node": 4}]},
        "events": [{"t_s": 200, "leave": ["v0"], "label": "v0 leaves"},
                   {"t_s": 400, "join": [{"name": "a1", **NODE}]}]}




@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return path


@pytest.mark.slow
def test_replay_prints_a_table_writes_the_result_and_the_figure(tiny: Path, tmp_path: Path):
    out, fig = tmp_path / "r.json", tmp_path / "r.png"
    short = tmp_path / "short.yaml"  # one event: two planning calls per planner
    short.write_text(yaml.safe_dump({**TINY, "events": TINY["events"][:1], "end_s": 400}))
    res = invoke("replay", "--trace", short, "--planners", "arachne,megatron", "--time-budget", "2", "-o", out,
                 "--plot", fig)
    assert res.exit_code == 0, (res.output, res.exception)
    assert "tiny: 1 event over" in res.stdout and "vs arachne" in res.stdout and "1.000x" in res.stdout
    assert all(len(line) <= 80 for line in res.stdout.splitlines())
    doc = json.loads(out.read_text())
    assert doc["format"] == "arachne-replay/1" and doc["model"] == "GPT-3-1.3B" and doc["events_s"] == [200]
    runs = {p["planner"]: p for p in doc["planners"]}
    assert runs["arachne"]["vs_arachne"] == 1.0 and runs["megatron"]["tokens"] > 0
    for p in runs.values():
        assert p["tokens"] == pytest.approx(sum(s["tokens"] for s in p["segments"]))
        assert [s["start_s"] for s in p["segments"]] == [0, 200]
    assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_replay_json_is_one_object_and_flags_override_the_trace_job(tiny: Path):
    res = invoke("replay", "--trace", tiny, "--planners", "megatron", "--time-budget", "2", "--json",
                 "-b", "64", "-m", "OPT-350M")
    assert res.exit_code == 0, (res.output, res.exception)
    doc = json.loads(res.stdout)
    assert doc["global_batch_size"] == 64 and doc["model"] == "OPT-350M" and len(doc["planners"]) == 1


def test_a_sequence_too_long_is_blamed_on_where_it_came_from(tmp_path: Path):
    long = tmp_path / "long.yaml"
    long.write_text(yaml.safe_dump({**TINY, "job": {**TINY["job"], "sequence_length": 4096}}))
    line = one_error_line(invoke("replay", "--trace", long, "--planners", "megatron"))
    assert "long.yaml: job.sequence_length: 4096 tokens exceed" in line, line
    line = one_error_line(invoke("replay", "--trace", long, "--planners", "megatron", "-s", 9999))
    assert line.startswith("error: --sequence-length: 9999 tokens exceed"), line


def test_sailor_traces_are_bounded(tmp_path: Path):
    """A point of 10^9 GPUs held 16 GB within a minute; a negative count crashed the rows form."""
    for name, doc in (("pts.json", {"points": [[0, 4], [10, 10**9]]}),
                      ("rows.json", {"rows": [{"timestamp": 0, "gpus": {"A100-40_z": -2}}]})):
        (tmp_path / name).write_text(json.dumps(doc))
        line = one_error_line(invoke("replay", "--trace", tmp_path / name, "-m", "GPT-3-1.3B", "-b", 32, "-s", 2048,
                                     "--planners", "megatron"))
        assert name in line and "100,000" in line, line


def test_bad_replay_input_is_one_line(tiny: Path, tmp_path: Path):
    assert "nope.yaml" in one_error_line(invoke("replay", "--trace", tmp_path / "nope.yaml"))
    assert "sailor:nope" in one_error_line(invoke("replay", "--trace", "sailor:nope"))
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**TINY, "events": [{"t_s": 100, "leave": ["zz"]}]}))
    line = one_error_line(invoke("replay", "--trace", bad))
    assert "bad.yaml: events[0].leave[0]" in line and "unknown node" in line
    bad.write_text(yaml.safe_dump({**TINY, "cluster": "../../etc/passwd"}))
    assert "bad.yaml: cluster:" in one_error_line(invoke("replay", "--trace", bad))
    bad.write_text(yaml.safe_dump({**TINY, "job": {**TINY["job"], "model": str(tiny)}}))  # catalog names only
    assert "bad.yaml: job.model: unknown model" in one_error_line(invoke("replay", "--trace", bad))
    nojob = tmp_path / "nojob.yaml"
    nojob.write_text(yaml.safe_dump({k: v for k, v in TINY.items() if k != "job"}))
    assert "--model" in one_error_line(invoke("replay", "--trace", nojob))
    assert "--planners" in one_error_line(invoke("replay", "--trace", tiny, "--planners", "nope"))
    assert "--trace" in one_error_line(invoke("replay", "--trace", tiny, "-o", tiny))
    assert "--plot" in one_error_line(invoke("replay", "--trace", tiny, "--plot", tmp_path / "x.txt"))
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(TINY["cluster"]))
    bad.write_text(yaml.safe_dump({**TINY, "cluster": "c.yaml"}))
    assert "c.yaml: -o: is the --trace cluster file" in one_error_line(
        invoke("replay", "--trace", bad, "-o", tmp_path / "c.yaml"))
    assert tiny.read_text() == yaml.safe_dump(TINY)  # the inputs were not touched


@pytest.mark.slow
@pytest.mark.parametrize("name", ["spot-churn", "steady-growth", "rack-failure"])
def test_shipped_traces_replay_end_to_end(name: str):
    trace = Path(__file__).resolve().parents[2] / "examples" / "traces" / f"{name}.yaml"
    res = invoke("replay", "--trace", trace, "--planners", "megatron,amp", "--time-budget", "5", "--json")
    assert res.exit_code == 0, (res.output, res.exception)
    doc = json.loads(res.stdout)
    for p in doc["planners"]:
        assert p["tokens"] > 0 and p["no_plan"] == 0
        assert len(p["segments"]) == len(doc["events_s"]) + 1
