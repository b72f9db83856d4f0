"""Distributed runs (CPU, gloo, fp32) reproduce single-process full-batch training.

Each test launches the processes of a plan, then compares per-step losses and the final
(unsharded, checkpointed) weights and Adam moments with :func:`reference_run`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

from arachne.runtime import checkpoint as ckpt  # noqa: E402
from arachne.runtime.launch import JobError, RunConfig, run_plan  # noqa: E402
from arachne.runtime.reference import reference_run  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

SEED = 3


def _run_and_compare(rt, load, doc, tmp_path, steps: int = 3) -> None:
    plan, model = load(doc)
    res = run_plan(plan, model, RunConfig(steps=steps, seed=SEED, simulate_devices=True, checkpoint_dir=tmp_path,
                                          timeout_s=60))
    ref = reference_run(model, plan.global_batch_size, plan.sequence_length, steps, seed=SEED)
    rt.assert_losses([r.loss for r in res.records], ref.losses)
    assert [r.step for r in res.records] == list(range(steps))
    reader = ckpt.CheckpointReader(ckpt.latest(tmp_path))
    rt.assert_matches(reader.all("param"), ref.params)
    rt.assert_matches(reader.all("exp_avg"), ref.exp_avg)


def test_heterogeneous_pipelines_uneven_split_tp_and_stage_dp(rt, load, tmp_path):
    """Two pipelines of different depth and micro-batch count; layers split 1+3 and 3+1; the
    first stage has tp 2, the next tp 1 with stage dp 2 (6 processes)."""
    doc = rt.make_plan(rt.DENSE, [
        {"micro_batches": 3, "stages": [rt.stage(0, 1, [0, 1], tp=2), rt.stage(1, 4, [2, 3], dp=2)]},
        {"micro_batches": 1, "stages": [rt.stage(0, 3, [4]), rt.stage(3, 4, [5])]}])
    _run_and_compare(rt, load, doc, tmp_path)


def test_gqa_overlapping_kv_tied_recompute_gpipe_mixed_micro_batch_sizes(rt, load, tmp_path):
    """tp 2 over 3 KV heads (both ranks hold KV head 1), tied embedding/head across stages, a
    recomputed stage, GPipe, and a pipeline with its own micro-batch size (5 processes)."""
    doc = rt.make_plan(rt.GQA_TIED, [
        {"micro_batches": 2, "stages": [rt.stage(0, 1, [0, 1], tp=2, recompute=True), rt.stage(1, 3, [2])]},
        {"micro_batches": 1, "micro_batch_size": 4, "stages": [rt.stage(0, 3, [3, 4], tp=2)]}], schedule="gpipe")
    _run_and_compare(rt, load, doc, tmp_path)


def test_moe_expert_parallel(rt, load, tmp_path):
    """Top-2 of 4 experts plus a shared expert; ep 2 over stage dp 2, and ep 2 with tp 2 (7 processes)."""
    doc = rt.make_plan(rt.MOE, [
        {"micro_batches": 1, "stages": [rt.stage(0, 1, [0]), rt.stage(1, 2, [1, 2], dp=2, ep=2)]},
        {"micro_batches": 1, "stages": [rt.stage(0, 2, [3, 4, 5, 6], tp=2, dp=2, ep=2)]}], mbs=4)
    _run_and_compare(rt, load, doc, tmp_path)


def test_stage_dp_2_to_3_splits_micro_batches_across_groups(rt, load, tmp_path):
    """Micro-batches of 6 cut 3+3 on one stage and 2+2+2 on the next (5 processes)."""
    doc = rt.make_plan(rt.DENSE, [{"micro_batches": 2, "stages": [
        rt.stage(0, 2, [0, 1], dp=2), rt.stage(2, 4, [2, 3, 4], dp=3)]}], gbs=12, mbs=6)
    _run_and_compare(rt, load, doc, tmp_path, steps=2)


def test_bf16_autocast_runs_close_to_fp32(rt, load):
    doc = rt.make_plan(rt.DENSE, [{"micro_batches": 2, "stages": [rt.stage(0, 2, [0]), rt.stage(2, 4, [1, 2], tp=2)]},
                                  {"micro_batches": 2, "stages": [rt.stage(0, 4, [3])]}], precision="bf16")
    plan, model = load(doc)
    res = run_plan(plan, model, RunConfig(steps=2, seed=SEED, simulate_devices=True, timeout_s=60))
    ref = reference_run(model, 8, 8, 2, seed=SEED)
    rt.assert_losses([r.loss for r in res.records], ref.losses, rtol=2e-2)


def test_resume_with_a_different_plan_continues_the_trajectory(rt, load, tmp_path):
    """2 steps on plan A (tp 1 -> tp 2 stages), then 2 more from its checkpoint on plan B
    (tp 2 -> stage dp 2, plus a second pipeline), equal 4 reference steps: the state is re-sharded."""
    plan_a, model = load(rt.make_plan(rt.DENSE, [
        {"micro_batches": 4, "stages": [rt.stage(0, 2, [0]), rt.stage(2, 4, [1, 2], tp=2)]}]))
    plan_b, _ = load(rt.make_plan(rt.DENSE, [
        {"micro_batches": 2, "stages": [rt.stage(0, 3, [0, 1], tp=2), rt.stage(3, 4, [2, 3], dp=2)]},
        {"micro_batches": 2, "stages": [rt.stage(0, 4, [4])]}]))
    cfg = RunConfig(steps=2, seed=SEED, simulate_devices=True, checkpoint_dir=tmp_path, timeout_s=60)
    first = run_plan(plan_a, model, cfg)
    second = run_plan(plan_b, model, cfg)
    assert first.resumed_from is None and second.resumed_from == 2
    ref = reference_run(model, 8, 8, 4, seed=SEED)
    rt.assert_losses([r.loss for r in first.records + second.records], ref.losses)
    assert [r.step for r in second.records] == [2, 3]
    reader = ckpt.CheckpointReader(ckpt.latest(tmp_path))
    rt.assert_matches(reader.all("param"), ref.params)
    rt.assert_matches(reader.all("exp_avg"), ref.exp_avg)
    assert ckpt.read_meta(ckpt.latest(tmp_path))["step"] == 4


def test_a_dying_process_stops_the_job_with_a_clear_message(rt, load):
    plan, model = load(rt.make_plan(rt.DENSE, [
        {"micro_batches": 4, "stages": [rt.stage(0, 2, [0]), rt.stage(2, 4, [1])]}]))
    t0 = time.monotonic()
    with pytest.raises(JobError, match=r"process 1 \(device n0:1\) failed: exited with code 17") as info:
        run_plan(plan, model, RunConfig(steps=3, simulate_devices=True, timeout_s=60, fault=(1, 1)))
    assert "after 1 complete step" in str(info.value)
    assert time.monotonic() - t0 < 30


def test_torchrun_worker_matches_run(rt, load, tmp_path):
    """The exported launch path: torchrun starting ``arachne.runtime.worker`` on each rank."""
    doc = rt.make_plan(rt.DENSE, [{"micro_batches": 4, "stages": [rt.stage(0, 1, [0]), rt.stage(1, 4, [1])]}])
    plan, model = load(doc)
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    (tmp_path / "cluster.json").write_text(json.dumps(rt.CLUSTER_DOC))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "arachne.runtime.worker", "--plan", str(tmp_path / "plan.json"),
           "--cluster", str(tmp_path / "cluster.json"), "--node-name", "n0", "--steps", "2", "--seed", str(SEED),
           "--cpu", "--timeout", "60"]
    for _attempt in range(2):  # torchrun's local rendezvous occasionally aborts a rank on a loaded 2-core box
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
        if out.returncode == 0:
            break
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    ref = reference_run(model, 8, 8, 2, seed=SEED)
    rt.assert_losses([r["loss"] for r in rows], ref.losses)
