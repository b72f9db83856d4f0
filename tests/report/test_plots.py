"""`--plot` on `plan` and `estimate`: the figure of a plan (GPUs by stage, the simulated timeline) and the
timeline's events, which re-run the cost model's own schedule simulation."""

from __future__ import annotations

import itertools
import random
import shutil
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from arachne.cli.app import app
from arachne.cost import CostModel, timeline
from arachne.cost.schedule import (
    interleaved_time,
    pipeline_time,
    simulate,
    simulate_interleaved,
)
from arachne.cost.timeline import (
    interleaved_events,
    pipeline_events,
    plan_timelines,
    schedule_time,
    steady_timeline,
)
from arachne.plan import load_plan, plan_from_dict
from arachne.report.plots import node_rows, pipeline_classes, plot_plan
from arachne.spec.cluster import cluster_from_dict, load_cluster

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = [
    ("a100-v100-cloud", "a100-v100-cloud__llama2-7b-two-pipelines"),
    ("small-mixed", "small-mixed__opt-350m-2stage-dp"),
    ("rtx-lab", "rtx-lab__gpt3-2.7b-3stage"),
    ("datacenter-1000", "datacenter-1000__llama3-70b-hopper"),
    ("datacenter-1000", "datacenter-1000__gpt3-6.7b-custom-x48"),
]


def _load(cluster: str, plan: str):
    cl = load_cluster(ROOT / "examples" / "clusters" / f"{cluster}.yaml")
    pl = load_plan(ROOT / "examples" / "plans" / f"{plan}.json")
    return cl, pl, CostModel(cl).estimate(pl)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def _check_timeline(events, fwd, bwd, sf, sb, m) -> None:
    S = len(fwd)
    assert len([e for e in events if e.kind in ("fwd", "bwd")]) == 2 * S * m
    # per stage, events do not overlap
    for s in range(S):
        evs = sorted((e for e in events if e.stage == s), key=lambda e: e.start)
        for a, b in itertools.pairwise(evs):
            assert b.start >= a.end - 1e-12, (a, b)
    f = {(e.stage, e.micro_batch): e for e in events if e.kind == "fwd"}
    b = {(e.stage, e.micro_batch): e for e in events if e.kind == "bwd"}
    for s in range(S):
        for j in range(m):
            assert f[s, j].end - f[s, j].start == pytest.approx(fwd[s])
            assert b[s, j].end - b[s, j].start == pytest.approx(bwd[s])
            assert b[s, j].start >= f[s, j].end - 1e-12  # a backward after its own forward
            if s:  # F(s, j) after F(s-1, j) and its send
                assert f[s, j].start >= f[s - 1, j].end + sf[s - 1] - 1e-9
            if s < S - 1:  # B(s, j) after B(s+1, j) and its send
                assert b[s, j].start >= b[s + 1, j].end + sb[s + 1] - 1e-9


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("times", [
    ((1.0, 2.0, 1.5), (2.0, 4.0, 3.0), (0.1, 0.3, 0.0), (0.0, 0.1, 0.3), 7),
    ((0.3,), (0.6,), (0.0,), (0.0,), 5),
    ((1.0, 1.0, 1.0, 1.0), (2.0, 2.0, 2.0, 2.0), (0.5, 0.5, 0.5, 0.0), (0.0, 0.5, 0.5, 0.5), 3),
])
def test_events_respect_the_schedule_and_end_at_its_makespan(times, schedule):
    fwd, bwd, sf, sb, m = times
    events = pipeline_events(fwd, bwd, sf, sb, m, schedule)
    _check_timeline(events, fwd, bwd, sf, sb, m)
    sends = [e for e in events if e.kind == "send"]
    assert len(sends) == m * (sum(x > 0 for x in sf) + sum(x > 0 for x in sb))
    assert max(e.end for e in events) == pytest.approx(simulate(fwd, bwd, sf, sb, m, schedule), rel=1e-12)


@pytest.mark.parametrize("cluster,plan", EXAMPLES)
def test_plan_timelines_match_the_estimate(cluster, plan):
    _, pl, est = _load(cluster, plan)
    tls = plan_timelines(pl, est)
    assert [t.pipeline for t in tls] == list(range(len(pl.pipelines)))
    for t in tls:
        rows = sorted((r for r in est.stages if r.pipeline == t.pipeline), key=lambda r: r.stage)
        _check_timeline(t.events, [r.fwd_s for r in rows], [r.bwd_s for r in rows],
                        [r.send_fwd_s for r in rows], [r.send_bwd_s for r in rows], t.micro_batches)
    # the slowest pipeline's last event ends at the schedule time the estimate reports
    assert max(t.makespan for t in tls) == pytest.approx(schedule_time(est), rel=0.01)


def _check_interleaved(events, fwd, bwd, sf, sb, m) -> None:
    S, v = len(fwd), len(fwd[0])
    assert len([e for e in events if e.kind in ("fwd", "bwd")]) == 2 * S * v * m
    for s in range(S):  # a stage computes one chunk at a time; its sends overlap its compute (overlap_p2p_comm)
        evs = sorted((e for e in events if e.stage == s and e.kind != "send"), key=lambda e: e.start)
        for a, b in itertools.pairwise(evs):
            assert b.start >= a.end - 1e-12, (a, b)
    f = {(e.stage, e.chunk, e.micro_batch): e for e in events if e.kind == "fwd"}
    b = {(e.stage, e.chunk, e.micro_batch): e for e in events if e.kind == "bwd"}
    assert len(f) == len(b) == S * v * m
    for (s, c, j), e in f.items():
        assert e.end - e.start == pytest.approx(fwd[s][c])
        assert b[s, c, j].end - b[s, c, j].start == pytest.approx(bwd[s][c])
        assert b[s, c, j].start >= e.end - 1e-12  # a backward after its own forward
        # the previous chunk in model order (stage s-1, or from stage 0 the last stage's chunk c-1) and its send
        prev = (s - 1, c) if s else ((S - 1, c - 1) if c else None)
        if prev:
            assert e.start >= f[(*prev, j)].end + sf[prev[0]][prev[1]] - 1e-9
        nxt = (s + 1, c) if s < S - 1 else ((0, c + 1) if c < v - 1 else None)
        if nxt:
            assert b[s, c, j].start >= b[(*nxt, j)].end + sb[nxt[0]][nxt[1]] - 1e-9


@pytest.mark.parametrize("times", [
    (((1.0, 0.5), (2.0, 1.0)), ((2.0, 1.0), (4.0, 2.0)), ((0.1, 0.2), (0.3, 0.0)), ((0.0, 0.2), (0.1, 0.3)), 4),
    (((1.0, 1.0, 1.0),) * 3, ((2.0, 2.0, 2.0),) * 3, ((0.5, 0.5, 0.5),) * 2 + ((0.5, 0.5, 0.0),),
     ((0.0, 0.5, 0.5),) + ((0.5, 0.5, 0.5),) * 2, 6),
])
def test_interleaved_events_respect_the_schedule_and_end_at_its_makespan(times):
    fwd, bwd, sf, sb, m = times
    events = interleaved_events(fwd, bwd, sf, sb, m)
    _check_interleaved(events, fwd, bwd, sf, sb, m)
    assert {e.chunk for e in events} == set(range(len(fwd[0])))
    assert max(e.end for e in events) == simulate_interleaved(fwd, bwd, sf, sb, m)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "interleaved"])
@pytest.mark.parametrize("seed", [0, 1, 2, *(pytest.param(s, marks=pytest.mark.slow) for s in range(3, 8))])
def test_a_long_pipeline_s_timeline_cuts_its_steady_state_and_keeps_every_other_event(schedule, seed, monkeypatch):
    """Past MAX_SIMULATED micro-batches the timeline simulates the cost model's second extrapolation run and
    stretches its middle: each event it lists is the full simulation's event of the same stage, kind, chunk and
    micro-batch at the same time, the steady spans hold the rest, and it ends at the extrapolated makespan (a
    batch of 10^6 sequences simulated every micro-batch: 43 s and 2.3 GB for one figure)."""
    rng = random.Random(seed)
    S, v = rng.randint(1, 5), (rng.randint(2, 3) if schedule == "interleaved" else 1)

    def draw(lo, hi):
        rows = [tuple(rng.uniform(lo, hi) for _ in range(v)) for _ in range(S)]
        return tuple(rows) if schedule == "interleaved" else tuple(r[0] for r in rows)
    fwd, bwd, sf, sb = draw(0.5, 2.0), draw(1.0, 4.0), draw(0.0, 0.4), draw(0.0, 0.4)
    if schedule != "interleaved":
        sf, sb = sf[:-1] + (0.0,), (0.0,) + sb[1:]
    m = S * 70 + 200 - (200 % S) if schedule == "interleaved" else 360 + seed
    monkeypatch.setattr(timeline, "MAX_SIMULATED", 8)
    events, steady = steady_timeline(fwd, bwd, sf, sb, m, schedule)
    full = (interleaved_events(fwd, bwd, sf, sb, m) if schedule == "interleaved"
            else pipeline_events(fwd, bwd, sf, sb, m, schedule))
    at: dict = {}  # a micro-batch's two sends (after its forward, after its backward) share a key
    for e in full:
        at.setdefault((e.stage, e.kind, e.chunk, e.micro_batch), []).append((e.start, e.end))
    assert steady and len(events) < len(full)
    end = max(e.end for e in full)
    for e in events:  # within the extrapolation error of the cost model itself (interleaved: ~1e-4)
        refs = at[(e.stage, e.kind, e.chunk, e.micro_batch)]
        assert any((e.start, e.end) == pytest.approx(r, abs=1e-3 * end) for r in refs), (e, refs)
    span = (interleaved_time(fwd, bwd, sf, sb, m) if schedule == "interleaved"
            else pipeline_time(fwd, bwd, sf, sb, m, schedule))
    assert max(e.end for e in events) == pytest.approx(end, rel=1e-3)
    if schedule != "gpipe":  # the makespan the estimate prices
        assert max(e.end for e in events) == pytest.approx(span, rel=1e-9)
    k = steady[0][3]  # every span holds the same micro-batches (GPipe: their forwards, then their backwards)
    for stage in range(S):
        assert len([e for e in events if e.stage == stage and e.kind != "send"]) == 2 * v * (m - k)


def _load_interleaved():
    cl = load_cluster(ROOT / "examples" / "v2" / "h100-2x8.yaml")
    pl = load_plan(ROOT / "examples" / "v2" / "interleaved-sp-selective.json")
    return cl, pl, CostModel(cl).estimate(pl)


def test_interleaved_plan_timelines_match_the_estimate():
    from arachne.cost.timeline import interleaved_chunk_times

    _, pl, est = _load_interleaved()
    assert any(p.virtual_stages > 1 for p in pl.pipelines)
    tls = plan_timelines(pl, est)
    for t in tls:
        p = pl.pipelines[t.pipeline]
        times = interleaved_chunk_times(est.pricer, pl, t.pipeline)
        _check_interleaved(t.events, *times, t.micro_batches)
        assert {e.chunk for e in t.events} == set(range(p.virtual_stages))
        # per stage, the chunks' times sum to the estimate's row
        rows = sorted((r for r in est.stages if r.pipeline == t.pipeline), key=lambda r: r.stage)
        for s, r in enumerate(rows):
            assert sum(times[0][s]) == pytest.approx(r.fwd_s, rel=1e-12)
            assert sum(times[1][s]) == pytest.approx(r.bwd_s, rel=1e-12)
            assert sum(times[2][s]) == pytest.approx(r.send_fwd_s, rel=1e-12)
    # the slowest pipeline's last event ends at the schedule time the estimate reports
    assert max(t.makespan for t in tls) == pytest.approx(schedule_time(est), rel=1e-9)


@pytest.mark.slow
def test_interleaved_plot_writes_a_png(tmp_path):
    cl, pl, est = _load_interleaved()
    out = tmp_path / "interleaved.png"
    plot_plan(pl, est, cl, out)
    w, h = _png_size(out)
    assert 800 <= w <= 4000 and 400 <= h <= 4000, (w, h)
    assert 20_000 < out.stat().st_size < 5_000_000


@pytest.mark.slow
@pytest.mark.parametrize("cluster,plan", EXAMPLES)
def test_plot_writes_a_png(tmp_path, cluster, plan):
    cl, pl, est = _load(cluster, plan)
    out = tmp_path / "plan.png"
    plot_plan(pl, est, cl, out)
    w, h = _png_size(out)
    assert 800 <= w <= 4000 and 400 <= h <= 4000, (w, h)
    assert 20_000 < out.stat().st_size < 5_000_000


@pytest.mark.slow
def test_plot_svg_and_pdf(tmp_path):
    cl, pl, est = _load("small-mixed", "small-mixed__opt-350m-2stage-dp")
    for name, magic in (("p.svg", b"<?xml"), ("p.pdf", b"%PDF")):
        plot_plan(pl, est, cl, tmp_path / name)
        assert (tmp_path / name).read_bytes()[:5].startswith(magic[:4])


def _big_cluster(nodes: int = 150):
    return cluster_from_dict({"name": "big $x$", "nodes": [
        {"name": "a-{i}", "count": nodes // 3, "gpu": "A100-40", "gpus_per_node": 8},
        {"name": "v-{i}", "count": nodes // 3, "gpu": "V100-16", "gpus_per_node": 4},
        {"name": "t-{i}", "count": nodes // 3, "gpu": "T4", "gpus_per_node": 2}]})


def _per_node_plan(cl, micro_batches=lambda k: 2):
    pipes = [{"micro_batches": micro_batches(k), "stages": [{"layers": [0, 24], "devices": [f"{n.name}:{i}"]}]}
             for k, n in enumerate(cl.nodes) for i in range(n.num_gpus)]
    return plan_from_dict({"model": "OPT-350M", "global_batch_size": sum(p["micro_batches"] for p in pipes),
                           "sequence_length": 512, "micro_batch_size": 1, "precision": "fp16", "pipelines": pipes})


@pytest.mark.slow
def test_large_clusters_stay_readable(tmp_path):
    cl = _big_cluster()
    # identical nodes: one row per node group
    pl = _per_node_plan(cl)
    est = CostModel(cl).estimate(pl)
    classes = pipeline_classes(pl, est, cl)
    assert len(classes) == 3 and sum(len(c.members) for c in classes) == len(pl.pipelines)
    key_of = {d: (ci, 0) for ci, c in enumerate(classes) for pi in c.members
              for d in pl.pipelines[pi].stages[0].devices}
    rows = node_rows(cl, key_of)
    assert [r.label for r in rows] == ["a-0..49 (x50)  A100-SXM4-40GB", "v-0..49 (x50)  V100-SXM2-16GB",
                                       "t-0..49 (x50)  T4"]
    # nodes that differ from their neighbours: at most 40 rows, runs collapsed into mixed rows
    pl2 = _per_node_plan(cl, lambda k: 2 + k % 2)
    est2 = CostModel(cl).estimate(pl2)
    classes2 = pipeline_classes(pl2, est2, cl)
    assert len(classes2) == 6
    key_of = {d: (ci, 0) for ci, c in enumerate(classes2) for pi in c.members
              for d in pl2.pipelines[pi].stages[0].devices}
    rows2 = node_rows(cl, key_of)
    assert len(rows2) <= 40 and any(r.mixed for r in rows2)
    assert sum(len(r.names) for r in rows2) == len(cl.nodes)
    out = tmp_path / "big.png"
    plot_plan(pl2, est2, cl, out, max_pipelines=4)
    assert _png_size(out)[1] <= 4000


def test_node_rows_keep_every_node_of_a_small_cluster():
    cl = load_cluster(ROOT / "examples" / "clusters" / "a100-v100-cloud.yaml")
    rows = node_rows(cl, {})
    assert [r.names for r in rows] == [[n.name] for n in cl.nodes]
    assert all(list(s) == [None] for r in rows for s in r.slots)


# ---- the CLI flag ----------------------------------------------------------------------------------

def _invoke(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture
def ws(tmp_path: Path) -> dict[str, Path]:
    files = {"cluster": tmp_path / "cluster.yaml", "plan": tmp_path / "plan.json"}
    shutil.copy(ROOT / "examples" / "clusters" / "small-mixed.yaml", files["cluster"])
    shutil.copy(ROOT / "examples" / "plans" / "small-mixed__opt-350m-2stage-dp.json", files["plan"])
    return files


@pytest.mark.slow
def test_estimate_plot_writes_the_figure(ws, tmp_path):
    out = tmp_path / "fig.png"
    res = _invoke("estimate", "-c", ws["cluster"], "-p", ws["plan"], "--plot", out)
    assert res.exit_code == 0, res.output
    assert f"figure written to {out}" in res.stdout.replace("\n", "")
    assert _png_size(out)[0] >= 800
    out.unlink()
    res = _invoke("estimate", "-c", ws["cluster"], "-p", ws["plan"], "--plot", out, "--json")
    assert res.exit_code == 0 and out.exists() and res.stdout.lstrip().startswith("{")


@pytest.mark.slow
def test_plan_plot_writes_the_figure(ws, tmp_path):
    out, doc = tmp_path / "fig.png", tmp_path / "out.json"
    res = _invoke("plan", "-c", ws["cluster"], "-m", "opt-350m", "-b", "32", "-s", "1024", "--time-budget", "5",
                  "--plot", out, "-o", doc)
    assert res.exit_code == 0, res.output
    assert out.exists() and doc.exists() and _png_size(out)[0] >= 800


def _one_error(res) -> str:
    assert res.exit_code == 2, (res.exit_code, res.output)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return lines[0]


@pytest.mark.parametrize("key,flag", [("cluster", "--cluster"), ("plan", "--plan")])
def test_estimate_plot_over_an_input_is_refused(ws, key, flag):
    before = ws[key].read_bytes()
    line = _one_error(_invoke("estimate", "-c", ws["cluster"], "-p", ws["plan"], "--plot", ws[key]))
    assert "--plot" in line and flag in line, line
    assert ws[key].read_bytes() == before


def test_plan_plot_over_an_input_or_the_output_is_refused(ws, tmp_path):
    job = ["-m", "opt-350m", "-b", "32", "-s", "1024", "--time-budget", "5"]
    before = ws["cluster"].read_bytes()
    line = _one_error(_invoke("plan", "-c", ws["cluster"], *job, "--plot", ws["cluster"]))
    assert "--plot" in line and "--cluster" in line, line
    line = _one_error(_invoke("plan", "-c", ws["cluster"], *job, "-o", ws["cluster"], "--plot", tmp_path / "f.png"))
    assert "-o" in line and "--cluster" in line, line
    assert ws["cluster"].read_bytes() == before
    same = tmp_path / "same.png"
    line = _one_error(_invoke("plan", "-c", ws["cluster"], *job, "-o", same, "--plot", same))
    assert "--plot" in line and not same.exists(), line


def test_plot_suffix_and_directory_are_refused(ws, tmp_path):
    line = _one_error(_invoke("estimate", "-c", ws["cluster"], "-p", ws["plan"], "--plot", tmp_path / "f.txt"))
    assert "--plot" in line and "unsupported image format" in line
    line = _one_error(_invoke("estimate", "-c", ws["cluster"], "-p", ws["plan"], "--plot", tmp_path))
    assert "--plot" in line and "directory" in line
