"""A damaged or hostile checkpoint directory is refused with one line naming the file, before a run reads or
writes it; nothing in it is lost. And the runtime commands' numeric flags refuse absurd values up front."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

torch = pytest.importorskip("torch")

from arachne.cli.app import app
from arachne.errors import InputError
from arachne.runtime import checkpoint as ckpt
from arachne.spec.model import model_from_dict

pytestmark = [pytest.mark.torch]

NAMES = ("embed.word", "layers.0.w", "layers.1.w", "layers.2.w", "layers.3.w", "final_norm.weight")


def _checkpoint(root: Path, rt, steps: tuple[int, ...] = (2, 3)) -> None:
    """Steps saved as a run saves them (pieces, assembled, published): ``latest`` names the last."""
    model = model_from_dict(dict(rt.DENSE), "", "model").model_dump()
    for step in steps:
        pieces = {n: [{"dim": None, "start": 0, "stop": 3, "param": torch.full((3,), float(step)),
                       "exp_avg": torch.zeros(3), "exp_avg_sq": torch.zeros(3)}] for n in NAMES}
        ckpt.save_pieces(root, step, 0, pieces)
        meta = {"format": ckpt.CHECKPOINT_FORMAT, "step": step, "samples": 8 * step, "seed": 0, "lr": 1e-3,
                "optimizer": "adam", "model": model, "plan": {}, "losses": [4.5] * step}
        ckpt.assemble(root, step, {n: (3,) for n in NAMES}, meta)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
            and p.name != ckpt.LOCK_FILE}


def _refused(root: Path, needle: str) -> str:
    """``locked(root)`` refuses the directory with one line containing ``needle``; nothing in it changed."""
    before = _tree(root)
    with pytest.raises(InputError) as err:
        with ckpt.locked(root):
            pass
    msg = str(err.value)
    assert "\n" not in msg and needle in msg, msg
    assert _tree(root) == before
    return msg


@pytest.fixture
def ck(tmp_path, rt) -> Path:
    root = tmp_path / "ck"
    _checkpoint(root, rt)
    assert sorted(p.name for p in root.glob("step-*")) == ["step-000002", "step-000003"]
    return root


def test_a_sound_checkpoint_resumes_from_latest(ck):
    with ckpt.locked(ck):
        found = ckpt.latest(ck)
        assert found == ck / "step-000003"
        assert ckpt.read_meta(found)["step"] == 3
        assert float(ckpt.CheckpointReader(found).get("layers.2.w")[0]) == 3.0
    (ck / "latest").write_text("step-000002")  # an older step directory, no newline: fine
    with ckpt.locked(ck):
        assert ckpt.latest(ck) == ck / "step-000002"


# ---- defect 1: the latest pointer -------------------------------------------------------------

def test_latest_naming_a_missing_step_is_refused_and_the_steps_are_kept(ck):
    (ck / "latest").write_text("step-999999")
    msg = _refused(ck, str(ck / "latest"))
    assert "step-999999" in msg and "not a step directory" in msg
    assert (ck / "step-000002" / "meta.json").is_file() and (ck / "step-000003" / "meta.json").is_file()


@pytest.mark.parametrize("text", ["../../etc", "/etc", "step-000003/../step-000002", "step-000002/", "step-3",
                                  "step-0000003", "", "step-000003\x00", "\u0661step", "x" * 10_000])
def test_latest_that_is_not_a_step_name_is_never_followed(ck, text):
    (ck / "latest").write_text(text, errors="surrogateescape")
    with pytest.raises(InputError) as err:
        ckpt.latest(ck)
    assert str(err.value).startswith(f"{ck / 'latest'}: expected the name of a step directory"), err.value
    _refused(ck, "expected the name of a step directory")


def test_latest_that_is_not_a_regular_file_is_refused(ck, tmp_path):
    (ck / "latest").unlink()
    (ck / "latest").symlink_to(tmp_path / "elsewhere")
    _refused(ck, "not a regular file")
    (ck / "latest").unlink()
    os.mkfifo(ck / "latest")  # would block a reader
    _refused(ck, "not a regular file")


def test_latest_naming_a_symlink_or_a_step_without_meta_is_refused(ck, tmp_path):
    (tmp_path / "outside").mkdir()
    (ck / "step-000007").symlink_to(tmp_path / "outside")
    (ck / "latest").write_text("step-000007\n")
    _refused(ck, "not a step directory")
    (ck / "latest").write_text("step-000003\n")
    (ck / "step-000003" / "meta.json").unlink()
    _refused(ck, "has no meta.json")


def test_step_directories_without_latest_are_refused_not_overwritten(ck):
    (ck / "latest").unlink()
    msg = _refused(ck, str(ck / "latest"))
    assert "missing" in msg and "step-000003" in msg


def test_a_fresh_or_unrelated_directory_is_accepted_and_foreign_names_are_never_removed(tmp_path, rt):
    root = tmp_path / "ck"
    (root / "step-0-old").mkdir(parents=True)  # not a name step_dir writes: neither a step nor pruned
    (root / "step-notes").mkdir()
    with ckpt.locked(root):
        assert ckpt.latest(root) is None
    _checkpoint(root, rt, steps=(1, 2, 3))
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["step-0-old", "step-000002", "step-000003",
                                                                    "step-notes"]


# ---- defect 2: damaged meta.json and tensor files ----------------------------------------------

def _edit_meta(path: Path, **changes) -> None:
    doc = json.loads(path.read_text())
    for k, v in changes.items():
        if v is None:
            del doc[k]
        else:
            doc[k] = v
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("edit,field", [
    ("{", "invalid JSON"), ("[]", "expected a mapping"), ("", "invalid JSON"), ("\xff\xfe", "cannot read"),
    ({"step": None}, "step: required field is missing"), ({"step": 2}, "step: is 2, but the directory"),
    ({"step": "3"}, "step: expected an integer"), ({"samples": -1}, "samples: expected an integer"),
    ({"seed": 1.5}, "seed: expected an integer"), ({"model": 5}, "model: expected a mapping"),
    ({"model": {"name": "m"}}, "model."), ({"losses": ["x"]}, "losses[0]: expected a number"),
    ({"format": "other/9"}, "format: expected"), ({"save_id": 3}, "save_id: expected a string"),
    ({"model": None}, "model: required field is missing"), ({"seed": None}, "seed: required field is missing"),
])
def test_a_damaged_meta_json_is_one_line_naming_it(ck, edit, field):
    meta = ck / "step-000003" / "meta.json"
    if isinstance(edit, str):
        meta.write_bytes(edit.encode("latin-1"))
    else:
        _edit_meta(meta, **edit)
    with pytest.raises(InputError) as err:
        ckpt.read_meta(ck / "step-000003", ckpt.RESUME_FIELDS)
    assert str(err.value).startswith(f"{meta}: ") and field in str(err.value), err.value
    _refused(ck, str(meta))


@pytest.mark.parametrize("damage,needle", [
    (lambda p: p.write_bytes(os.urandom(100)), "cannot load"),
    (lambda p: p.write_bytes(p.read_bytes()[:200]), "cannot load"),  # truncated
    (lambda p: torch.save([1, 2], p), "expected a mapping of tensor names"),
    (lambda p: torch.save({"layers.1.w": {"param": 3}}, p), "layers.1.w: expected a mapping of state names"),
])
def test_a_damaged_tensor_file_is_one_line_naming_it(ck, damage, needle):
    f = ck / "step-000003" / "layer-00001.pt"
    damage(f)
    msg = _refused(ck, str(f))
    assert needle in msg, msg
    with pytest.raises(InputError) as err:  # what a worker process reads: the same line
        ckpt.CheckpointReader(ck / "step-000003").get("layers.1.w")
    assert str(f) in str(err.value)



@pytest.mark.parametrize("name", ["embedding.pt", "layer-00001.pt", "head.pt"])
def test_a_step_missing_a_tensor_file_is_refused_not_reseeded(ck, name):
    f = ck / "step-000003" / name
    f.unlink()
    msg = _refused(ck, str(f))
    assert "missing from step-000003" in msg, msg
    with pytest.raises(InputError) as err:  # a worker reading it directly: the same file named
        ckpt.CheckpointReader(ck / "step-000003").get({"embedding.pt": "embed.word", "head.pt": "final_norm.weight"}
                                                      .get(name, "layers.1.w"))
    assert str(f) in str(err.value)


def test_a_parameter_missing_from_its_file_is_refused_moments_may_be_absent(ck):
    f = ck / "step-000003" / "layer-00001.pt"
    torch.save({"other": {"param": torch.zeros(3)}}, f)
    reader = ckpt.CheckpointReader(ck / "step-000003")
    with pytest.raises(InputError) as err:
        reader.get("layers.1.w")
    assert str(f) in str(err.value) and "layers.1.w" in str(err.value)
    torch.save({"layers.1.w": {"param": torch.zeros(3)}}, f)  # no Adam moments: None, resumed from the seed
    reader = ckpt.CheckpointReader(ck / "step-000003")
    assert reader.get("layers.1.w", "exp_avg") is None and reader.get("layers.1.w") is not None

# ---- defects 3 and 4: absurd flag values, refused up front --------------------------------------

def _one_error_line(*args: object) -> str:
    res = CliRunner().invoke(app, [str(a) for a in args])
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return lines[0]


@pytest.mark.parametrize("value", ["1e300", "604801", "inf"])
def test_run_refuses_an_absurd_timeout(tmp_path, value):
    line = _one_error_line("run", "-c", tmp_path / "no-cluster.yaml", "-p", tmp_path / "no-plan.json",
                           "--simulate-devices", "--timeout", value)
    assert line.startswith("error: --timeout: expected"), line


def test_run_accepts_a_week_of_timeout(tmp_path):
    line = _one_error_line("run", "-c", tmp_path / "no-cluster.yaml", "-p", tmp_path / "no-plan.json",
                           "--simulate-devices", "--timeout", 7 * 24 * 3600)
    assert "--timeout" not in line and "no-cluster.yaml" in line, line  # past the flag check


def test_elastic_agent_refuses_an_absurd_connect_timeout():
    line = _one_error_line("elastic-agent", "--store", "127.0.0.1:29400", "--node", "n0",
                           "--connect-timeout", "1e300")
    assert line.startswith("error: --connect-timeout: expected at most"), line


@pytest.mark.parametrize("threads", [1025, 100000, 2147483648, 2**70])
def test_profile_refuses_out_of_range_threads(tmp_path, threads):
    # a bad --precision too: were --threads not checked first, the command would stop there, not profile
    line = _one_error_line("profile", "-m", "OPT-350M", "-o", tmp_path / "out", "--threads", threads,
                           "--precision", "fp7")
    assert line.startswith("error: --threads: expected 1 to 1024"), line
    assert not (tmp_path / "out").exists()


def test_profile_accepts_1024_threads(tmp_path):
    line = _one_error_line("profile", "-m", "OPT-350M", "-o", tmp_path / "out", "--threads", 1024,
                           "--precision", "fp7")
    assert "--threads" not in line and "fp7" in line, line  # past the flag check
