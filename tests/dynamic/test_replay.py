"""Trace replay: the trace format (and hostile traces), Sailor's traces read as they are, and the replay's
arithmetic: tokens = sum over segments of the time trained at each rate, downtime = blocking planning + migration."""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from arachne.cost import CostModel
from arachne.dynamic.replay import PlannerReplay, Segment, follow, rename, replay
from arachne.dynamic.trace import load_trace, parse_trace_text, sailor_bundle
from arachne.errors import InputError
from arachne.plan import Pipeline, Plan, Stage
from arachne.planners.protocol import SearchBudget
from arachne.spec.job import Job
from arachne.spec.model import model_catalog

replan_mod = importlib.import_module("arachne.dynamic.replan")  # the package exports its function
replay_mod = importlib.import_module("arachne.dynamic.replay")
ROOT = Path(__file__).resolve().parents[2]
MODEL = "GPT-3-1.3B"
NODE = {"gpu": "A100-40", "gpus_per_node": 4, "inter_node_gbps": 12.5}


def doc(events: list, cluster: object = None, end_s: float = 400.0) -> dict:
    return {"format": "arachne-trace/1", "name": "t", "end_s": end_s, "events": events,
            "cluster": cluster if cluster is not None else {"name": "c", "nodes": [
                {"name": "a0", **NODE}, {"name": "b0", **NODE}]}}


def parse(d: dict, base: Path | None = None, name: str = "t.yaml"):
    return parse_trace_text(yaml.safe_dump(d), name, base)


def error(d: dict, base: Path | None = None) -> InputError:
    with pytest.raises(InputError) as e:
        parse(d, base)
    return e.value


# ---- the format ------------------------------------------------------------------------------------------------------
def test_a_trace_resolves_to_a_cluster_between_every_two_events():
    tr = parse(doc([{"t_s": 100, "leave": ["a0"]}, {"t_s": 200, "leave": ["b0:1"]},
                    {"t_s": 300, "join": [{"name": "c{i}", "count": 2, **NODE}]}]))
    assert [(s.start_s, s.end_s, s.cluster.num_gpus) for s in tr.snapshots] == [
        (0, 100, 8), (100, 200, 4), (200, 300, 3), (300, 400, 11)]
    # a node that lost a GPU is renumbered; its devices keep their trace ids
    assert tr.snapshots[2].trace_ids == {"b0:0": "b0:0", "b0:1": "b0:2", "b0:2": "b0:3"}
    assert [n.name for n in tr.snapshots[3].cluster.nodes] == ["b0", "c0", "c1"]


@pytest.mark.parametrize("events, field, words", [
    ([{"t_s": 100, "leave": ["zz"]}], "events[0].leave[0]", "unknown node"),
    ([{"t_s": 100, "leave": ["a0:7"]}], "events[0].leave[0]", "not a GPU"),
    ([{"t_s": 100, "leave": ["a0"]}, {"t_s": 150, "leave": ["a0"]}], "events[1].leave[0]", "unknown node"),
    ([{"t_s": -5, "leave": ["a0"]}], "events[0].t_s", "greater than 0"),
    ([{"t_s": 200, "leave": ["a0"]}, {"t_s": 100, "leave": ["b0"]}], "events[1].t_s", "time order"),
    ([{"t_s": 100, "leave": ["a0"]}, {"t_s": 100, "leave": ["b0"]}], "events[1].t_s", "time order"),
    ([{"t_s": 500, "leave": ["a0"]}], "end_s", "time order"),
    ([{"t_s": 100}], "events[0]", "join or a leave"),
    ([{"t_s": 100, "leave": ["a0", "b0"]}], "events[0]", "no GPU"),
    ([{"t_s": 100, "join": [{"name": "a0", **NODE}]}], "events[0].join[0].name", "already in the cluster"),
    ([{"t_s": 100, "leave": ["a0"], "join": [{"name": "a0", **NODE}]}], "events[0].join[0].name", "same time"),
    ([{"t_s": 100, "join": [{"name": "c0", "gpu": "nope"}]}], "events[0].join[0].gpu", "unknown GPU"),
    ([{"t_s": 100, "join": [{"name": "c0", **NODE, "colour": 1}]}], "events[0].join[0].colour", "unknown field"),
    ([{"t_s": float("nan"), "leave": ["a0"]}], "events[0].t_s", ""),
])
def test_hostile_events_are_one_error_naming_the_field(events, field, words):
    e = error(doc(events))
    assert e.source == "t.yaml" and e.field == field and words in e.reason, str(e)


def test_bad_documents_name_the_field():
    assert error({**doc([]), "format": "arachne-trace/9"}).field == "format"
    assert error({**doc([]), "extra": 1}).field == "extra"
    assert error(doc([], {"name": "c", "nodes": [{"name": "a", "gpu": "nope"}]})).field == "cluster.nodes[0].gpu"
    assert error(doc([], "c.yaml")).field == "cluster"  # a path, but no trace file to be relative to


def test_cluster_paths_stay_inside_the_trace_folder(tmp_path: Path):
    (tmp_path / "sub").mkdir()
    cluster = {"name": "c", "nodes": [{"name": "a0", **NODE}, {"name": "b0", **NODE}]}
    (tmp_path / "sub" / "c.yaml").write_text(yaml.safe_dump(cluster))
    (tmp_path / "outside.yaml").write_text(yaml.safe_dump(cluster))
    trace = tmp_path / "sub" / "t.yaml"
    ok = parse(doc([{"t_s": 100, "leave": ["a0"]}], "c.yaml"), trace)
    assert ok.snapshots[1].cluster.num_gpus == 4
    for bad in ("../outside.yaml", str(tmp_path / "outside.yaml"), "x/../../outside.yaml"):
        e = error(doc([], bad), trace)
        assert e.field == "cluster" and "inside" in e.reason, str(e)
    os.symlink(tmp_path / "outside.yaml", tmp_path / "sub" / "link.yaml")
    e = error(doc([], "link.yaml"), trace)
    assert e.field == "cluster" and "outside" in e.reason
    (tmp_path / "sub" / "bad.yaml").write_text("name: c\nnodes: []\n")
    e = error(doc([], "bad.yaml"), trace)
    assert e.source.endswith("bad.yaml") and e.field == "nodes"


def test_shipped_traces_load_and_sailor_traces_are_read_as_they_are(tmp_path: Path):
    for path in sorted((ROOT / "examples" / "traces").glob("*.yaml")):
        tr = load_trace(path)
        assert len(tr.events) >= 3 and tr.job.model and len({s.cluster.num_gpus for s in tr.snapshots}) > 1
        assert len({g for s in tr.snapshots for g in s.cluster.gpu_counts}) >= 2  # heterogeneous
    points = sailor_bundle()["a100_trace_original"]["points"]
    spot = load_trace("sailor:spot", seed=3)
    assert [s.cluster.gpu_counts["A100-SXM4-40GB"] for s in spot.snapshots] == [n for _, n in points]
    assert [s.start_s for s in spot.snapshots] == [t for t, _ in points]
    assert [s.cluster.num_gpus for s in load_trace("sailor:grow").snapshots] == [128, 320, 512]
    f = tmp_path / "a100.json"  # one Sailor trace in a file of its own
    f.write_text(json.dumps({"points": [[0, 4], [60, 2], [120, 2], [180, 3]]}))
    assert [s.cluster.num_gpus for s in load_trace(f).snapshots] == [20, 18, 19]  # repeated counts merged
    bundle = tmp_path / "bundle.json"
    bundle.write_text(json.dumps(sailor_bundle()))
    with pytest.raises(InputError, match="sailor:spot"):
        load_trace(bundle)
    f.write_text(json.dumps({"points": [[0, "x"]]}))
    with pytest.raises(InputError, match="points"):
        load_trace(f)
    with pytest.raises(InputError, match="unknown Sailor trace"):
        load_trace("sailor:nope")


# ---- the replay's arithmetic -----------------------------------------------------------------------------------------
def test_segment_tokens_are_the_time_trained_at_each_rate():
    s = Segment(1, 100.0, 400.0, 8, "move", 1000.0, 5.0, 20.0, 20.0, 5.0, 800.0)
    assert s.tokens == 5.0 * 800.0 + (300.0 - 5.0 - 20.0) * 1000.0
    assert s.steps() == [(100.0, 105.0, 800.0), (105.0, 125.0, 0.0), (125.0, 400.0, 1000.0)]
    blocked = Segment(1, 0.0, 10.0, 8, "plan", 1000.0, 30.0, 0.0, 10.0)  # downtime cut at the segment's end
    assert blocked.tokens == 0.0 and blocked.steps() == [(0.0, 10.0, 0.0)]
    run = PlannerReplay("x", (s, blocked))
    assert run.tokens == s.tokens and run.downtime_s == 30.0 and run.moves == 1


def _fixed_planner(planning_s: float):
    """A stand-in planner: data parallel over the cluster's last node, taking ``planning_s`` of wall time."""

    def plan(name, cluster, model, job, cm=None, budget=None, **options):
        node = cluster.nodes[-1]
        devices = tuple(f"{node.name}:{i}" for i in range(node.num_gpus))
        p = Plan(model=MODEL, global_batch_size=job.global_batch_size, sequence_length=job.sequence_length,
                 micro_batch_size=len(devices), pipelines=(Pipeline(micro_batches=job.global_batch_size // len(devices),
                                                         stages=(Stage(layers=(0, 24), devices=devices),)),))
        est = (cm or CostModel(cluster)).estimate(p)
        return p, est, SimpleNamespace(stats=SimpleNamespace(wall_time_s=planning_s))

    return plan


def test_keep_move_and_downtime_follow_the_gpus(monkeypatch):
    stub = _fixed_planner(0.5)
    monkeypatch.setattr(replay_mod, "run_planner", stub)
    monkeypatch.setattr(replan_mod, "run_planner", stub)
    tr = parse(doc([{"t_s": 100, "leave": ["a0"]},         # a node the plan does not use: keep it
                    {"t_s": 200, "leave": ["b0:1"]},       # a GPU the plan uses: re-plan, nothing trains
                    {"t_s": 300, "join": [{"name": "c0", **NODE}]}]))  # a new plan on c0: move
    run = follow("stub", tr, model_catalog().get(MODEL), Job(global_batch_size=12, sequence_length=2048),
                 SearchBudget(time_budget_s=1))
    first, keep, forced, move = run.segments
    assert (first.action, first.downtime_s, first.overlap_s) == ("plan", 0.5, 0.0)
    assert (keep.action, keep.downtime_s, keep.overlap_s, keep.migration_s) == ("keep", 0.0, 0.5, 0.0)
    assert keep.overlap_tokens_per_s == keep.tokens_per_s and keep.tokens == pytest.approx(100 * keep.tokens_per_s)
    # the three surviving GPUs of b0 already hold the whole model (renumbered, followed by identity)
    assert (forced.action, forced.overlap_s, forced.migration_s, forced.downtime_s) == ("move", 0.0, 0.0, 0.5)
    assert forced.tokens == pytest.approx(99.5 * forced.tokens_per_s)
    assert move.action == "move" and move.overlap_s == 0.5 and move.overlap_tokens_per_s == forced.tokens_per_s
    assert move.migration_s > 0 and move.downtime_s == move.migration_s and move.bytes_moved > 0
    assert move.tokens == pytest.approx(0.5 * forced.tokens_per_s + (99.5 - move.migration_s) * move.tokens_per_s)
    assert run.tokens == pytest.approx(sum(s.tokens for s in run.segments))
    assert (run.replans, run.moves) == (1, 2)


def test_rename_marks_a_plan_on_a_lost_gpu_as_not_running():
    p = _fixed_planner(0.0)("x", parse(doc([])).snapshots[0].cluster, model_catalog().get(MODEL),
                            Job(global_batch_size=12, sequence_length=2048))[0]
    q = rename(p, {"b0:0": "b0:0", "b0:2": "b0:1"})
    assert q.devices == ["b0:0", "b0:gone-1", "b0:1", "b0:gone-3"]


@pytest.mark.slow
def test_a_real_replay_counts_tokens_segment_by_segment():
    tr = parse(doc([{"t_s": 100, "leave": ["b0:3"]}, {"t_s": 250, "join": [{"name": "c0", **NODE}]}]))
    res = replay(tr, model_catalog().get(MODEL), Job(global_batch_size=16, sequence_length=2048),
                 ["megatron", "amp"], SearchBudget(time_budget_s=5))
    for run in res.planners:
        assert len(run.segments) == 3
        total = 0.0
        for s in run.segments:
            assert s.tokens_per_s > 0 and 0 <= s.downtime_s <= s.duration_s
            assert s.downtime_s == pytest.approx(min(s.duration_s, (0 if s.overlap_s else s.planning_s)
                                                     + s.migration_s))
            total += s.overlap_s * s.overlap_tokens_per_s + (s.duration_s - s.overlap_s - s.downtime_s) * s.tokens_per_s
        assert run.tokens == pytest.approx(total)
    d = res.to_doc()
    assert d["format"] == "arachne-replay/1" and [p["planner"] for p in d["planners"]] == ["megatron", "amp"]
    assert d["planners"][0]["vs_arachne"] is None  # arachne not replayed: no ratio
