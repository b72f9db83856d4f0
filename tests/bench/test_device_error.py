"""``cost-model device``: reads the GPU script's output and prices its run (data/device/2026-12-04-h200)."""

from __future__ import annotations

import argparse
import json

from benchmarks import common, device_error

DATA = common.ROOT / "data" / "device" / "2026-12-04-h200"


def test_sections_split_the_log_by_title():
    log = "== 12:00:00 run a cuda\n{\"step\": 0, \"loss\": 2.0}\nnoise\n== 12:00:01 run a cpu\n{\"step\": 0, \"loss\": 2.0}\n"
    secs = device_error.sections(log)
    assert list(secs) == ["run a cuda", "run a cpu"]
    assert device_error.json_lines(secs["run a cuda"]) == [{"step": 0, "loss": 2.0}]
    assert device_error.loss_rows(secs) == [{"plan": "a", "steps": 1, "max_rel_diff": 0.0, "note": ""}]


def test_a_missing_side_is_reported_not_compared():
    secs = device_error.sections("== 12:00:00 run a cuda\nerror: failed\n== 12:00:01 run a cpu\n{\"loss\": 1.0}\n")
    assert device_error.loss_rows(secs)[0]["max_rel_diff"] is None


def test_the_stored_h200_run(tmp_path):
    device_error.run(argparse.Namespace(data=DATA, gpu="H200", out=tmp_path))
    doc = json.loads((tmp_path / "device.json").read_text())
    s = doc["summary"]
    assert s["max_loss_rel_diff"] < 1e-5  # CUDA/NCCL and CPU processes train the same model
    runs = s["runs"]
    assert set(runs) == {f"llama8b-4l-bf16 / {k}" for k in ("analytic, fused", "analytic, eager", "profile")}
    # the profile of the model's blocks prices the run it came with closely; the analytic terms describe fused
    # stacks and are optimistic on the eager runtime, less so with its element-wise ops priced eager
    assert abs(runs["llama8b-4l-bf16 / profile"]["time_pct"]) < 5
    assert runs["llama8b-4l-bf16 / analytic, fused"]["time_pct"] < runs["llama8b-4l-bf16 / analytic, eager"]["time_pct"]
    assert abs(runs["llama8b-4l-bf16 / profile"]["memory_pct"]) < 10


def test_a_folder_without_the_log_is_one_line_and_exit_2(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit) as exc:
        device_error.run(argparse.Namespace(data=tmp_path, gpu="H200", out=tmp_path))
    assert exc.value.code == 2 and "no runs.txt" in capsys.readouterr().err


def test_the_gemm_timing_is_named(tmp_path):
    """A log that timed one GEMM per pair of events says so (its small GEMMs measure the host's dispatch); one
    that timed them back to back does not."""
    for title, want in (("bf16 GEMM throughput (median of 20 after 5 warm-ups)", "one GEMM per event pair"),
                        ("bf16 GEMM throughput (50 back-to-back between two events)", "many GEMMs per event pair")):
        (tmp_path / "runs.txt").write_text(f"== 12:00:00 {title}\ngemm 4096 4096 4096 700.0\n")
        device_error.run(argparse.Namespace(data=tmp_path, gpu="H200", out=tmp_path))
        s = json.loads((tmp_path / "device.json").read_text())["summary"]
        assert s["gemm_timing"].startswith(want)
        assert s["gemm_mape_pct_over_50_gflop"] is not None
