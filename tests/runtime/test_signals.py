"""`arachne run` under signals, frozen workers, a busy checkpoint directory and bad flags.

The slow tests start `arachne run` as a real subprocess in its own session, so that every process it
starts (workers, the forkserver, the resource tracker) stays in its process group and can be
found in /proc after the launcher has exited.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from arachne.cli import runtime_cmds

RUN = [sys.executable, "-c", "from arachne.cli.app import main; main()", "run"]


@pytest.fixture
def files(tmp_path, rt):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(rt.CLUSTER_DOC))
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(rt.make_plan(rt.DENSE, [
        {"micro_batches": 4, "stages": [rt.stage(0, 2, [0]), rt.stage(2, 4, [1])]}])))
    return cluster, plan


def _main(monkeypatch, capsys, *args) -> tuple[int, str]:
    """Run the real entry point in-process; its exit code and stderr."""
    from arachne.cli.app import main

    monkeypatch.setattr(sys, "argv", ["arachne", *[str(a) for a in args]])
    with pytest.raises(SystemExit) as info:
        main()
    return int(info.value.code or 0), capsys.readouterr().err


# ---- flags checked before anything starts ------------------------------------------------------

@pytest.mark.parametrize("flag,value", [("--timeout", "0"), ("--timeout", "-1"), ("--timeout", "nan"),
                                        ("--timeout", "inf"), ("--lr", "nan"), ("--lr", "inf"), ("--lr", "-1")])
def test_run_flags_are_checked_before_anything_starts(monkeypatch, capsys, files, flag, value):
    cluster, plan = files

    def no_torch(command: str) -> None:
        raise AssertionError("got past the flag checks")

    monkeypatch.setattr(runtime_cmds, "_need_torch", no_torch)
    code, err = _main(monkeypatch, capsys, "run", "-c", cluster, "-p", plan, "--simulate-devices", flag, value)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"error: {flag}: ") and "Traceback" not in err


@pytest.mark.parametrize("port", ["-1", "0", "99999"])
def test_export_master_port_out_of_range_is_one_line(monkeypatch, capsys, files, port):
    cluster, plan = files
    code, err = _main(monkeypatch, capsys, "export", "-c", cluster, "-p", plan, "-f", "torchrun",
                      "--master-port", port)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "--master-port" in err and "Traceback" not in err


@pytest.mark.torch
@pytest.mark.parametrize("flag,value", [("--timeout", "0"), ("--lr", "nan")])
def test_torchrun_worker_checks_flags_before_joining(capsys, files, flag, value):
    pytest.importorskip("torch")
    from arachne.runtime.worker import main

    cluster, plan = files
    assert main(["--plan", str(plan), "--cluster", str(cluster), flag, value]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"error: {flag}: ")


# ---- start-up messages, CPU fallback, resume wording (no processes: the launch is stubbed) --------

@pytest.fixture
def no_launch(monkeypatch):
    """run_plan does everything except starting processes; CUDA is absent."""
    torch = pytest.importorskip("torch")
    from arachne.runtime import launch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(launch, "_spawn", lambda *a, **k: None)


@pytest.mark.torch
def test_cpu_without_simulate_devices_says_so(monkeypatch, capsys, files, no_launch):
    cluster, plan = files
    code, err = _main(monkeypatch, capsys, "run", "-c", cluster, "-p", plan, "--steps", 2)
    assert code == 0, err
    assert "warning: no CUDA GPU" in err and "--simulate-devices" in err
    assert "starting 2 processes" in err
    code, err = _main(monkeypatch, capsys, "run", "-c", cluster, "-p", plan, "--steps", 2, "--simulate-devices")
    assert code == 0 and "warning" not in err and "starting 2 processes" in err


@pytest.mark.torch
@pytest.mark.slow
def test_resume_says_which_steps_it_runs(monkeypatch, capsys, files, tmp_path, rt):
    cluster, plan = files
    ck = tmp_path / "ck"
    code, err = _main(monkeypatch, capsys, "run", "-c", cluster, "-p", plan, "--steps", 4, "--simulate-devices",
                      "--checkpoint-dir", ck)
    assert code == 0, err
    assert (ck / "latest").read_text().strip() == "step-000004"
    code, err = _main(monkeypatch, capsys, "run", "-c", cluster, "-p", plan, "--steps", 3, "--simulate-devices",
                      "--checkpoint-dir", ck)
    assert code == 0, err
    assert f"resumed from {ck} at step 4" in err and "steps 4..6" in err and "3 more" in err


# ---- the checkpoint directory lock -------------------------------------------------------------

@pytest.mark.torch
def test_a_second_run_on_a_locked_checkpoint_dir_is_refused(monkeypatch, capsys, files, tmp_path, no_launch):
    from arachne.runtime import checkpoint as ckpt

    cluster, plan = files
    ck = tmp_path / "ck"
    with ckpt.locked(ck):
        code, err = _main(monkeypatch, capsys, "run", "-c", cluster, "-p", plan, "--simulate-devices",
                          "--checkpoint-dir", ck)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and str(ck) in err and "in use by another run" in err
    assert f"process {os.getpid()}" in err
    code, err = _main(monkeypatch, capsys, "run", "-c", cluster, "-p", plan, "--simulate-devices",
                      "--checkpoint-dir", ck)
    assert code == 0, err  # released with the holder


@pytest.mark.torch
def test_taking_the_lock_removes_what_a_stopped_run_left_half_written(tmp_path):
    pytest.importorskip("torch")
    from arachne.runtime import checkpoint as ckpt

    # a stopped run's pieces must never be merged into a later run's checkpoint of the same step
    ckpt.save_pieces(tmp_path, 3, 5, {"layers.0.w": []})
    (tmp_path / ".staging-step-000003").mkdir()
    (tmp_path / "latest.tmp").write_text("step-000003\n")
    with ckpt.locked(tmp_path):
        left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [".lock"]


# ---- real runs, stopped by signals -------------------------------------------------------------

def _group(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(entry.name))
    return out


def _terminal_signals() -> None:
    """Start the run as from a terminal: Ctrl-C live. (A background job of a non-interactive shell, such as
    a CI step, starts with SIGINT ignored, and `arachne run` keeps an ignored signal ignored, as nohup asks.)"""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


class Run:
    """`arachne run` in its own session; stdout lines are collected as they come."""

    def __init__(self, cluster: Path, plan: Path, *args: object, env: dict[str, str] | None = None):
        # stderr goes to a file: a process left behind would keep a pipe open, and reading it would hang
        self.err = cluster.with_name("stderr.txt")
        with open(self.err, "w") as err:
            self.proc = subprocess.Popen([*RUN, "-c", str(cluster), "-p", str(plan), "--simulate-devices", "--json",
                                          *[str(a) for a in args]], stdout=subprocess.PIPE, stderr=err,
                                         text=True, start_new_session=True, preexec_fn=_terminal_signals,
                                         env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
        self.lines: list[str] = []
        self.times: list[float] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            self.times.append(time.monotonic())

    def wait_steps(self, n: int, timeout: float = 60) -> None:
        end = time.monotonic() + timeout
        while len(self.lines) < n:
            assert self.proc.poll() is None, self.err.read_text()
            assert time.monotonic() < end, "no progress"
            time.sleep(0.05)

    def finish(self, timeout: float = 30) -> tuple[int | None, str]:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            rc = None
        self._reader.join(1)
        return rc, self.err.read_text()

    def assert_nothing_left(self, within: float = 5.0) -> None:
        end = time.monotonic() + within
        while (left := _group(self.proc.pid)) and time.monotonic() < end:
            time.sleep(0.1)
        for pid in left:  # do not leak them into the rest of the suite
            os.kill(pid, signal.SIGKILL)
        assert not left, f"processes left behind: {left}"

    def kill_all(self) -> None:
        for pid in _group(self.proc.pid):
            os.kill(pid, signal.SIGKILL)


def _assert_loadable(ck: Path, at_least: int) -> None:
    from arachne.runtime import checkpoint as ckpt

    path = ckpt.latest(ck)
    assert path is not None
    assert ckpt.read_meta(path)["step"] >= at_least
    params = ckpt.CheckpointReader(path).all("param")
    assert {n.split(".")[0] for n in params} >= {"embed", "layers"}
    assert all(bool(t.isfinite().all()) for t in params.values())


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("sig,code,to_group", [(signal.SIGTERM, 143, False), (signal.SIGHUP, 129, False),
                                               (signal.SIGINT, 130, True)])
def test_a_signal_stops_every_process_and_keeps_the_last_checkpoint(files, tmp_path, sig, code, to_group):
    """SIGTERM/SIGHUP to the launcher (what Slurm and Kubernetes send), SIGINT to the whole process group
    (Ctrl-C in a terminal): every process stops, the exit code is 128 + the signal, and the newest
    complete checkpoint loads."""
    pytest.importorskip("torch")
    cluster, plan = files
    ck = tmp_path / "ck"
    run = Run(cluster, plan, "--steps", 100000, "--checkpoint-dir", ck)
    try:
        run.wait_steps(3)
        assert len(_group(run.proc.pid)) >= 5  # launcher, resource tracker, forkserver, 2 workers
        t0 = time.monotonic()
        if to_group:
            os.killpg(run.proc.pid, sig)
        else:
            os.kill(run.proc.pid, sig)
        rc, err = run.finish(timeout=120)
        # seconds on an idle machine; a process inside fsync of a checkpoint cannot die before it returns,
        # which on a loaded disk takes long, so the bound is generous
        assert time.monotonic() - t0 < 30
        run.assert_nothing_left()
    finally:
        run.kill_all()
    assert rc == code, err
    lines = err.strip().splitlines()
    assert lines[-1].startswith(f"error: stopped by {signal.Signals(sig).name}"), err
    assert "Traceback" not in err
    assert any("processes connected" in line for line in lines), err  # start-up progress
    _assert_loadable(ck, 3)


@pytest.mark.slow
@pytest.mark.torch
def test_a_frozen_worker_stops_the_run_within_the_timeout(files, tmp_path):
    """Rank 1 stops itself (SIGSTOP) at step 3; the others' collectives time out after --timeout
    seconds, and the launcher stops every process (the frozen one with SIGKILL) at once."""
    pytest.importorskip("torch")
    cluster, plan = files
    run = Run(cluster, plan, "--steps", 100, "--timeout", 3, env={"ARACHNE_RUNTIME_FAULT": "1:3:freeze"})
    try:
        run.wait_steps(3)
        rc, err = run.finish()
        took = time.monotonic() - run.times[2]
        run.assert_nothing_left()
    finally:
        run.kill_all()
    assert rc == 1, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: process ") and "Timed out" in last and ".cc:" not in last, err
    assert took < 3 + 4, f"stopped {took:.1f} s after the last step"


@pytest.mark.slow
@pytest.mark.torch
def test_a_killed_launcher_takes_its_workers_with_it(files, tmp_path):
    """SIGKILL cannot be handled: each worker watches a pipe only the launcher holds, and exits."""
    pytest.importorskip("torch")
    cluster, plan = files
    ck = tmp_path / "ck"
    run = Run(cluster, plan, "--steps", 100000, "--checkpoint-dir", ck)
    try:
        run.wait_steps(3)
        os.kill(run.proc.pid, signal.SIGKILL)
        assert run.finish()[0] == -signal.SIGKILL
        run.assert_nothing_left()
    finally:
        run.kill_all()
    _assert_loadable(ck, 3)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_stop_swallowed_where_it_landed_is_raised_again_by_the_wait_loop():
    """A handler can run inside a ``__del__`` or a finalizer, where Python drops the exception; the run
    must still stop: the launcher's wait loop raises it again (it hung under load before)."""
    from arachne.runtime.signals import Stopped, raise_if_stopped, stop_on_signals

    class Swallows:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, inside __del__
            time.sleep(0.05)

    with stop_on_signals():
        raise_if_stopped()  # nothing pending yet
        obj = Swallows()
        del obj  # Python reports "Exception ignored in ... __del__" and goes on
        with pytest.raises(Stopped) as err:
            raise_if_stopped()
        assert err.value.exit_code == 143
    raise_if_stopped()  # the context's exit clears it
