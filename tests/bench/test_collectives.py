"""``cost-model collectives``: nccl-tests' bus-bandwidth conventions, the NCCL data file's validity, and the
subcommand on the shipped data."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks import collectives as C

ROOT = Path(__file__).resolve().parents[2]


# ---- conversions, against hand-computed values (nccl-tests doc/PERFORMANCE.md) -------------------------------
def test_bus_factors_by_hand():
    assert C.bus_factor("all_reduce", 8) == pytest.approx(1.75)        # 2 * 7 / 8
    assert C.bus_factor("all_reduce", 2) == pytest.approx(1.0)
    assert C.bus_factor("all_gather", 16) == pytest.approx(0.9375)     # 15 / 16
    assert C.bus_factor("reduce_scatter", 4) == pytest.approx(0.75)
    assert C.bus_factor("all_to_all", 64) == pytest.approx(63 / 64)
    assert C.bus_factor("send_recv", 2) == 1.0
    with pytest.raises(ValueError):
        C.bus_factor("broadcast", 8)


def test_busbw_from_time_matches_a_published_row():
    # nccl issue #527, one p4d instance: 1 GiB all-reduce in 8142.6 us -> algbw 131.87, busbw 230.77 GB/s
    assert C.busbw_from_time("all_reduce", 8, 1073741824, 8142.6e-6) / 1e9 == pytest.approx(230.77, abs=0.01)
    # 1 GB all-gather over 16 ranks in 10 ms: algbw 100 GB/s, busbw 93.75
    assert C.busbw_from_time("all_gather", 16, 1e9, 0.01) / 1e9 == pytest.approx(93.75)


def test_flat_ring_busbw_is_the_per_gpu_share_for_large_messages():
    rec = next(r for r in C.load() if r.id == "efa-p4d-2x8-allreduce-1gib")
    cluster = C.cluster_of(rec)
    assert C.flat_share(cluster) == pytest.approx(50e9 / 8)            # 400 Gb/s per node over 8 GPUs
    from arachne.cost.calibration import NetworkCalibration
    t = C.flat_time(cluster, NetworkCalibration(), "all_reduce", 16, 1e12)
    assert C.busbw_from_time("all_reduce", 16, 1e12, t) == pytest.approx(50e9 / 8, rel=1e-3)


def test_single_node_arachne_busbw_is_the_gpu_collective_bandwidth():
    rec = next(r for r in C.load() if r.id == "nvswitch-a100-40-1x8-allreduce")
    row = C.price(rec)[0]
    from arachne.spec.gpus import gpu_catalog
    want = gpu_catalog().get("A100-SXM4-40GB").collective_bandwidth / 1e9
    assert row["arachne_busbw"] == pytest.approx(want, rel=0.02)       # latency is negligible at 1 GiB


# ---- the data file -------------------------------------------------------------------------------------------
def test_data_file_validates_with_sources_and_monotone_sizes():
    recs = C.load()
    assert len(recs) >= 8 and len({r.fabric["kind"] for r in recs}) >= 4
    for r in recs:
        assert r.source["url"].startswith("https://") and r.source["date"] and r.source["where"]
        sizes = [row["bytes"] for row in r.rows]
        assert sizes == sorted(set(sizes))
    readme = (ROOT / "data" / "nccl" / "README.md").read_text()
    assert all(r.source["url"] in readme for r in recs), "every source is attributed in the README"


def _write(tmp_path, doc) -> Path:
    p = tmp_path / "m.json"
    p.write_text(json.dumps(doc))
    return p


def _one(**over):
    rec = json.loads((C.DATA).read_text())["records"][0]
    rec.update(over)
    return {"records": [rec]}


@pytest.mark.parametrize("over, field", [
    ({"source": {"url": "https://x", "date": "2020-01-01"}}, "records[0].source.where"),
    ({"held_out": None}, "records[0].held_out"),
    ({"degraded": True, "degraded_why": ""}, "records[0].degraded_why"),
    ({"algorithm": "collnet"}, "records[0].algorithm"),
    ({"collective": "broadcast"}, "records[0].collective"),
    ({"rows": [{"bytes": 2097152, "busbw_gbps": 1.0}, {"bytes": 1048576, "busbw_gbps": 1.0}]}, "records[0].rows[1].bytes"),
    ({"rows": [{"bytes": 1073741824, "busbw_gbps": 100.0, "algbw_gbps": 131.87}]}, "records[0].rows[0].busbw_gbps"),
])
def test_bad_records_exit_2_naming_file_and_field(tmp_path, capsys, over, field):
    p = _write(tmp_path, _one(**over))
    with pytest.raises(SystemExit) as e:
        C.load(p)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(p) in err and field in err


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=1 << 34), min_size=2, max_size=6))
def test_validator_accepts_exactly_strictly_increasing_sizes(tmp_path_factory, sizes):
    p = _write(tmp_path_factory.mktemp("h"), _one(rows=[{"bytes": b, "busbw_gbps": 1.0} for b in sizes]))
    increasing = all(a < b for a, b in itertools.pairwise(sizes))
    if increasing:
        assert C.load(p)[0].rows[-1]["bytes"] == sizes[-1]
    else:
        with pytest.raises(SystemExit):
            C.load(p)


# ---- the subcommand ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_subcommand_runs_on_the_data(tmp_path):
    res = subprocess.run([sys.executable, "-m", "benchmarks", "cost-model", "collectives", "--out", str(tmp_path)],
                         capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    doc = json.loads((tmp_path / "collectives.json").read_text())
    assert doc["benchmark"] == "cost-model-collectives"
    assert doc["rows"] and all(r["bytes"] >= 1e6 for r in doc["rows"])
    s = doc["summary"]
    assert s["records"] == len(C.load()) and s["by_collective_fabric"] and s["by_fabric"]
    assert all(r["arachne_busbw"] > 0 and r["flat_busbw"] > 0 for r in doc["rows"])


# ---- the split, the fit and the result ---------------------------------------------------------------------
@pytest.mark.slow
def test_shipped_split_follows_the_rule_and_a_flipped_flag_is_refused(tmp_path, capsys):
    recs = C.load()
    assert C.split_ok(recs)
    batches = [[r for r in recs if r.batch == b] for b in {r.batch for r in recs}]
    assert sum(r.held_out for r in recs) == sum(len(b) // 2 for b in batches)
    doc = json.loads(C.DATA.read_text())
    doc["records"][0]["held_out"] = not doc["records"][0]["held_out"]
    p = _write(tmp_path, doc)
    assert not C.split_ok(C.load(p))
    res = subprocess.run([sys.executable, "-m", "benchmarks", "cost-model", "collectives", "--data", str(p),
                          "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
    assert res.returncode == 2 and "held_out" in res.stderr and "Traceback" not in res.stderr


def test_shipped_efa_efficiency_is_the_refit_on_the_calibration_half():
    from arachne.cost.calibration import NetworkCalibration

    recs = C.load()
    fitted = C.fit_efficiency(recs, "efa_nic_efficiency", "cloud-efa")
    assert fitted == pytest.approx(NetworkCalibration().efa_nic_efficiency, abs=0.0051)
    # the fit never sees the check half: flipping every EFA record to held out leaves nothing to fit
    held = [dataclasses.replace(r, held_out=True) for r in recs]
    assert C.fit_efficiency(held, "efa_nic_efficiency", "cloud-efa") is None


def test_pinned_ring_is_priced_as_the_ring():
    rec = next(r for r in C.load() if r.id == "ib-h100-2x4-allreduce-ring")
    assert rec.algorithm == "ring"
    free = dataclasses.replace(rec, algorithm=None)
    assert C.price(free)[0]["arachne_busbw"] > 1.5 * C.price(rec)[0]["arachne_busbw"]   # the 2-node tree


@pytest.mark.slow
def test_result_reports_both_halves_and_tables_fit_80_columns(tmp_path):
    env = {**os.environ, "COLUMNS": "200"}  # wide terminal: the tables must be narrow by themselves
    res = subprocess.run([sys.executable, "-m", "benchmarks", "cost-model", "collectives", "--out", str(tmp_path)],
                         capture_output=True, text=True, cwd=ROOT, timeout=120, check=False, env=env)
    assert res.returncode == 0, res.stderr
    assert max(len(line) for line in res.stderr.splitlines() if not line.startswith("wrote ")) <= 80
    s = json.loads((tmp_path / "collectives.json").read_text())["summary"]
    for half in ("calibration", "check", "degraded"):
        assert s[half]["records"] > 0 and s[half]["arachne_mape_pct"] >= 0
    assert s["calibration"]["records"] + s["check"]["records"] + s["degraded"]["records"] == s["records"]


def test_shipped_p2p_share_is_the_refit_on_the_calibration_half():
    from arachne.cost.calibration import NetworkCalibration

    recs = C.load()
    assert any(C.p2p_intra(r) and not r.held_out and not r.degraded for r in recs)
    fitted = C.fit_efficiency(recs, "p2p_intra_share", C.p2p_intra)
    assert fitted == pytest.approx(NetworkCalibration().p2p_intra_share, abs=0.0051)
    held = [dataclasses.replace(r, held_out=True) for r in recs]
    assert C.fit_efficiency(held, "p2p_intra_share", C.p2p_intra) is None


@pytest.mark.slow
def test_all_to_all_latency_is_the_calibration_half_refit_and_never_sees_the_check_half():
    from arachne.cost.calibration import NetworkCalibration

    recs = C.load()
    cal = NetworkCalibration()
    fit = C.fit_a2a_latency(recs)
    assert fit is not None
    for f, v in fit.items():
        assert v == pytest.approx(getattr(cal, f), abs=0.26e-6), f
    held = [dataclasses.replace(r, held_out=True) if r.fabric["nodes"] > 1 else r for r in recs]
    assert C.fit_a2a_latency(held) is None  # no multi-node record left in the calibration half
    # the check half's 80-rank sweep at 32 MiB: within 30% (the old (n - 1) x 30 us start: 68% slow)
    rec = next(r for r in recs if r.id == "infiniband-h100-10x8-alltoall")
    assert rec.held_out and abs(C.price(rec)[0]["arachne_error_pct"]) < 30


def test_split_is_drawn_per_batch_so_an_added_batch_never_moves_older_records():
    recs = C.load()
    assert C.split_ok(recs) and {r.batch for r in recs} >= {1, 2}
    first = [r for r in recs if r.batch == 1]
    assert C.split_ok(first)                               # batch 1 alone still follows the rule
    new = dataclasses.replace(first[0], id="aaa-new-record", batch=max(r.batch for r in recs) + 1, held_out=False)
    assert C.split_ok(recs + [new])                        # a new batch leaves every older flag as it is
    assert not C.split_ok(recs + [dataclasses.replace(new, held_out=True)])


def test_per_collective_table_shows_every_collective_with_its_halves():
    recs = C.load()
    rows = [r for rec in recs for r in C.price(rec)]
    table = C._collective_rows(rows)
    assert [t["collective"] for t in table] == list(C.COLLECTIVES)
    assert all(t["recs"] >= 1 for t in table)              # every collective has a healthy record now
    by = C._by_collective(rows)
    assert set(by) == set(C.COLLECTIVES)
    assert sum(v["calibration"]["records"] + v["check"]["records"] for v in by.values()) == \
        sum(not r.degraded for r in recs)
    # a collective without a healthy record is still listed, with no MAPE
    only_ar = [r for r in rows if r["collective"] == "all_reduce"]
    assert [t["recs"] for t in C._collective_rows(only_ar)][1:] == [0, 0, 0, 0]
