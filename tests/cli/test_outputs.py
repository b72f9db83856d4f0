"""Every command that writes: never over one of its inputs, a bad output path refused with one line
(exit 2) before any work, existing output replaced atomically; `compare` with no plan exits 3."""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from pathlib import Path

import pytest
import yaml
from cli_checks import invoke, one_error_line

from arachne.errors import InputError
from arachne.fileio import check_output, replacing, write_text_safely

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "examples" / "clusters" / "small-mixed.yaml"
PLAN = ROOT / "examples" / "plans" / "small-mixed__opt-350m-2stage-dp.json"
TINY_MODEL = {"name": "tiny-dense", "num_layers": 2, "hidden_size": 32, "ffn_hidden_size": 64,
              "num_attention_heads": 4, "vocab_size": 97, "max_sequence_length": 16}
# Small enough that, without the early check, the work itself ends within seconds.
QUICK_TRAIN = ["--clusters", "2", "--val-clusters", "1", "--epochs", "1"]




@pytest.fixture
def ws(tmp_path: Path) -> dict[str, Path]:
    """A working folder with one of every input file a writing command reads."""
    files = {"cluster": tmp_path / "cluster.yaml", "plan": tmp_path / "plan.json",
             "model": tmp_path / "model.yaml", "profiles": tmp_path / "profiles",
             "sailor": tmp_path / "profiles_simulator.json", "memory": tmp_path / "layer_memory.json",
             "data": tmp_path / "data.npz"}
    shutil.copy(CLUSTER, files["cluster"])
    shutil.copy(PLAN, files["plan"])
    files["model"].write_text(yaml.safe_dump(TINY_MODEL))
    files["profiles"].mkdir()
    files["sailor"].write_text('{"OPT-350": {}}\n')
    files["memory"].write_text("{}\n")
    files["data"].write_bytes(b"not really npz")
    return files


# Each writing command as (name, output flag, output kind, args for the working folder and an output).
JOB = ["-b", "64", "-s", "2048", "--time-budget", "5"]
COMMANDS = {
    "plan": ("-o", "file", lambda w, o: ["plan", "-c", w["cluster"], "-m", w["model"], *JOB,
                                         "--profiles", w["profiles"], "-o", o]),
    "replan": ("-o", "file", lambda w, o: ["replan", "-c", w["cluster"], "-p", w["plan"], "--time-budget", "5",
                                           "--profiles", w["profiles"], "-o", o]),
    "compare": ("--plot", "file", lambda w, o: ["compare", "-c", w["cluster"], "-m", w["model"], *JOB,
                                                "--planners", "megatron", "--plot", o]),
    "import-sailor": ("-o", "dir", lambda w, o: ["profiles", "import-sailor", w["sailor"], "--layer-memory",
                                                 w["memory"], "-o", o]),
    "profile": ("-o", "dir", lambda w, o: ["profile", "-m", w["model"], "--sequence-length", "8", "--blocks", "1",
                                           "--repeats", "1", "--micro-batch-sizes", "1", "-o", o]),
    "export": ("-o", "dir", lambda w, o: ["export", "-p", w["plan"], "-c", w["cluster"], "-f", "torchrun",
                                          "-o", o]),
    "run": ("--checkpoint-dir", "dir", lambda w, o: ["run", "-c", w["cluster"], "-p", w["plan"], "--steps", "1",
                                                     "--simulate-devices", "--checkpoint-dir", o]),
    "train-policy": ("-o", "dir", lambda w, o: ["train-policy", "--data", w["data"], *QUICK_TRAIN, "-o", o]),
    "train-ranker": ("-o", "dir", lambda w, o: ["train-ranker", *QUICK_TRAIN, "-o", o]),
}
# The inputs each command reads, by the flag that names them.
INPUTS = {
    "plan": {"--cluster": "cluster", "--model": "model"},
    "replan": {"--cluster": "cluster", "--plan": "plan"},
    "compare": {"--cluster": "cluster", "--model": "model"},
    "import-sailor": {"Sailor": "sailor", "--layer-memory": "memory"},
    "profile": {"--model": "model"},
    "export": {"--plan": "plan", "--cluster": "cluster"},
    "run": {"--cluster": "cluster", "--plan": "plan"},
    "train-policy": {"--data": "data"},
}
INPUT_CASES = [(cmd, flag, key) for cmd, flags in INPUTS.items() for flag, key in flags.items()]


@pytest.mark.parametrize("cmd,flag,key", INPUT_CASES, ids=[f"{c}{f}" for c, f, _ in INPUT_CASES])
def test_output_equal_to_an_input_is_refused_and_the_input_kept(ws, cmd, flag, key):
    out_flag, _, args = COMMANDS[cmd]
    before = ws[key].read_bytes()
    line = one_error_line(invoke(*args(ws, ws[key])))
    assert out_flag in line and flag in line and str(ws[key]) in line, line
    assert ws[key].read_bytes() == before


@pytest.mark.parametrize("cmd,flag,key", [("plan", "--cluster", "cluster"), ("replan", "--plan", "plan")])
def test_output_linked_to_an_input_is_refused(ws, tmp_path, cmd, flag, key):
    """Symlinks and hard links to an input are the input."""
    _, _, args = COMMANDS[cmd]
    before = ws[key].read_bytes()
    soft, hard = tmp_path / "soft.json", tmp_path / "hard.json"
    soft.symlink_to(ws[key])
    os.link(ws[key], hard)
    for out in (soft, hard):
        line = one_error_line(invoke(*args(ws, out)))
        assert flag in line and str(ws[key]) in line, line
    assert ws[key].read_bytes() == before


@pytest.mark.parametrize("fmt,name", [("megatron", "megatron.json"), ("torchrun", "rank_map.json")])
def test_export_into_a_folder_holding_an_input_plan_is_refused(ws, tmp_path, fmt, name):
    out = tmp_path / "out"
    out.mkdir()
    plan = out / name
    shutil.copy(PLAN, plan)
    before = plan.read_bytes()
    line = one_error_line(invoke("export", "-p", plan, "-c", ws["cluster"], "-f", fmt, "-o", out))
    assert "--plan" in line and str(plan) in line, line
    assert plan.read_bytes() == before


def test_train_policy_into_a_folder_holding_its_data_is_refused_only_on_a_clash(tmp_path):
    data = tmp_path / "policy.npz"
    data.write_bytes(b"x")
    line = one_error_line(invoke("train-policy", "--data", data, *QUICK_TRAIN, "-o", tmp_path))
    assert "--data" in line and str(data) in line
    assert data.read_bytes() == b"x"
    # the usual retraining, `--data DIR/data.npz -o DIR`, writes nothing over data.npz
    keep = tmp_path / "data.npz"
    keep.write_bytes(b"x")
    check_output(tmp_path, {"--data": keep}, kind="dir", names=("policy.npz", "report.json", "curve.png"))


def test_plan_output_inside_the_profiles_folder_is_refused(ws):
    _, _, args = COMMANDS["plan"]
    line = one_error_line(invoke(*args(ws, ws["profiles"] / "plan.json")))
    assert "--profiles" in line
    assert list(ws["profiles"].iterdir()) == []


WRONG_KIND = [(cmd, kind) for cmd, (_, kind, _) in COMMANDS.items()]


@pytest.mark.parametrize("cmd,kind", WRONG_KIND, ids=[c for c, _ in WRONG_KIND])
def test_output_of_the_wrong_kind_is_refused(ws, tmp_path, cmd, kind):
    """A file command given a directory; a directory command (checkpoint dir included) given a file."""
    out_flag, _, args = COMMANDS[cmd]
    if kind == "file":
        out = tmp_path / "out.png"
        out.mkdir()
    else:
        out = tmp_path / "out.txt"
        out.write_text("mine\n")
    line = one_error_line(invoke(*args(ws, out)))
    assert out_flag in line and str(out) in line
    assert ("is a directory" if kind == "file" else "not a directory") in line, line
    assert out.is_dir() if kind == "file" else out.read_text() == "mine\n"


UNWRITABLE = [(cmd, path) for cmd in COMMANDS for path in ("/dev/full", "/proc/x")]


@pytest.mark.parametrize("cmd,path", UNWRITABLE, ids=[f"{c}:{p}" for c, p in UNWRITABLE])
def test_unwritable_output_is_refused(ws, cmd, path):
    out_flag, _, args = COMMANDS[cmd]
    if cmd == "compare":
        path = path + ".png" if path.startswith("/proc") else path
    line = one_error_line(invoke(*args(ws, path)))
    assert out_flag in line and path in line, line


LONG = {  # without the early check each of these works before it writes (quick settings: seconds, not hours)
    "train-policy": lambda w, o: ["train-policy", *QUICK_TRAIN, "--rounds", "1", "--teacher-seconds", "0.1",
                                  "-o", o],
    "train-ranker": COMMANDS["train-ranker"][2],
    "profile": COMMANDS["profile"][2],
}


@pytest.mark.parametrize("cmd", list(LONG))
@pytest.mark.parametrize("bad", ["/proc/x", "file"])
def test_long_commands_refuse_before_any_work(ws, tmp_path, cmd, bad):
    out_flag, args = COMMANDS[cmd][0], LONG[cmd]
    out = Path(bad)
    if bad == "file":
        out = tmp_path / "ckpt"
        out.write_text("")
    t0 = time.perf_counter()
    line = one_error_line(invoke(*args(ws, out)))
    assert time.perf_counter() - t0 < 2.0
    assert out_flag in line


def test_install_target_is_checked_before_training(monkeypatch, tmp_path):
    from arachne.planners.arachne.learned import policy

    monkeypatch.setattr(policy, "weights_dir", lambda: Path("/proc/weights"))
    t0 = time.perf_counter()
    line = one_error_line(invoke("train-ranker", *QUICK_TRAIN, "--install", "-o", tmp_path / "out"))
    assert time.perf_counter() - t0 < 2.0
    assert "--install" in line and "/proc/weights" in line


@pytest.mark.slow
def test_plan_output_replaces_an_existing_file_atomically_keeping_its_mode(ws, tmp_path):
    out = tmp_path / "old.json"
    out.write_text("old\n")
    out.chmod(0o640)
    res = invoke("plan", "-c", ws["cluster"], "-m", "opt-350m", "-b", "64", "-s", "2048", "--precision", "fp16",
                 "--time-budget", "5", "-o", out)
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["format"] in ("arachne-plan/1", "arachne-plan/2")  # v2 with modern knobs
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_compare_exits_3_when_no_planner_finds_a_plan(ws, tmp_path):
    plot = tmp_path / "chart.png"
    res = invoke("compare", "-c", ws["cluster"], "-m", "llama-3-70b", "-b", "64", "-s", "2048",
                 "--planners", "arachne,megatron", "--time-budget", "5", "--json", "--plot", plot)
    line = one_error_line(res, 3)
    assert "no plan" in line
    rows = json.loads(res.stdout)["results"]
    assert [r["planner"] for r in rows] == ["arachne", "megatron"] and all(r["error"] for r in rows)
    assert not plot.exists()


# ---- the helpers themselves -------------------------------------------------------------------------

def test_replacing_leaves_the_old_file_on_error(tmp_path):
    target = tmp_path / "a.npz"
    target.write_text("old")
    with pytest.raises(RuntimeError), replacing(target) as tmp:
        assert tmp.parent == tmp_path and tmp.suffix == ".npz" and tmp != target
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.npz"]


def test_write_text_safely_follows_a_symlink_and_writes_dev_null(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_text_safely(link, "new")
    assert link.is_symlink() and real.read_text() == "new"
    check_output(os.devnull)
    write_text_safely(os.devnull, "x")


@pytest.mark.parametrize("path,kind,needle", [
    ("/dev/full", "file", "is a device"), ("/proc/x", "file", "cannot write in directory"),
    ("/proc/x/y", "dir", "cannot write in directory"), ("/dev/full", "dir", "not a directory"),
    ("", "file", "expected a path"),
])
def test_check_output_reasons(path, kind, needle):
    with pytest.raises(InputError, match=needle):
        check_output(path, kind=kind)


def test_check_output_creates_nothing(tmp_path):
    check_output(tmp_path / "new" / "deeper", kind="dir")
    check_output(tmp_path / "plan.json")
    assert list(tmp_path.iterdir()) == []
