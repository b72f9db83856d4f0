"""`arachne profiles import-sailor`: Sailor's tables converted, what cannot be converted skipped and named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from arachne.cli.app import app
from arachne.errors import InputError
from arachne.profiles.format import load_profile
from arachne.profiles.sailor import import_sailor

ROOT = Path(__file__).resolve().parents[2]
SAILOR = ROOT / "data" / "sailor"
SHIPPED = ROOT / "arachne" / "data" / "profiles"
OPT350 = {"fwd_s": [1e-3] * 26, "bwd_s": [2e-3] * 26, "update_s": 1e-3}  # embedding, 24 blocks, head


def invoke(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_the_planner_table_imports_all_but_its_broken_gpt_neo_copy(tmp_path):
    """Its GPT-Neo-2.7/GH-96 table is OPT-350's (26 layers for GPT-Neo's 34): skipped, the rest imported."""
    res = invoke("profiles", "import-sailor", SAILOR / "profiles_planner.json", "-o", tmp_path)
    assert res.exit_code == 0, res.output
    (warning,) = res.stderr.strip().splitlines()
    assert warning.startswith(f"warning: {SAILOR / 'profiles_planner.json'}: skipped data.GPT-Neo-2.7.GH-96: "), warning
    assert "fwd_s/bwd_s have 26/26 values, expected 34 or 35" in warning
    written = sorted(p.name for p in tmp_path.iterdir())
    assert len(written) == 16 and "gptneo2.7__gh96__fp32.json" not in written
    assert res.stdout.strip() == f"wrote 16 profile files to {tmp_path}"
    for name in written:
        doc = load_profile(tmp_path / name)
        assert "table: planner (profiles_planner.json)" in doc.source


def test_the_simulator_table_converts_to_the_shipped_profiles(tmp_path):
    result = import_sailor(SAILOR / "profiles_simulator.json", tmp_path, SAILOR / "layer_memory.json")
    assert result.skipped == []
    assert {p.name for p in result.written} == {p.name for p in SHIPPED.glob("*.json")}
    for path in result.written:
        assert json.loads(path.read_text()) == json.loads((SHIPPED / path.name).read_text()), path.name


def test_what_cannot_be_converted_is_skipped_and_named(tmp_path):
    table = {"data": {
        "OPT-350": {
            "A100-40": {"1": {"1": OPT350, "2": {"fwd_s": ["x"] * 26, "bwd_s": [1e-3] * 26}},
                        "abc": {"1": OPT350}, "2": {"1": {"fwd_s": [1e-3] * 3, "bwd_s": [1e-3] * 3}}},
            "No-Such-GPU": {"1": {"1": OPT350}},
        },
        "My-Model": {"A100-40": {"1": {"1": OPT350}}},
    }}
    src = tmp_path / "t.json"
    src.write_text(json.dumps(table))
    result = import_sailor(src, tmp_path / "out")
    assert [p.name for p in result.written] == ["opt350__a10040__fp32.json"]
    assert [(e.micro_batch_size, e.tp) for e in load_profile(result.written[0]).entries] == [(1, 1)]
    got = {str(s) for s in result.skipped}
    assert got == {
        "data.OPT-350.A100-40.1.2: fwd_s and bwd_s must be lists of times >= 0",
        "data.OPT-350.A100-40.abc: expected Sailor's data[model][gpu][micro_batch_size][tp] table: 'abc' is not a "
        "micro-batch size with tp entries",
        "data.OPT-350.A100-40.2.1: fwd_s/bwd_s have 3/3 values, expected 26 or 27 (embedding, OPT-350's 24 blocks, "
        "output layers)",
        "data.OPT-350.No-Such-GPU: unknown GPU type (see `arachne gpus`)",
        "data.My-Model: not a model of the catalog (see `arachne models`)",
    }


@pytest.mark.parametrize("table,field", [
    ({"data": {"OPT-350": {"A100-40": {"1": {"1": {"fwd_s": [1.0], "bwd_s": [1.0]}}}}}}, "data.OPT-350.A100-40.1.1"),
    ({"data": {"Nobody": {}}}, "data.Nobody"),
    ({"data": {}}, "data"),
    ({"rows": []}, "data"),
])
def test_nothing_to_import_is_one_line_and_writes_nothing(tmp_path, table, field):
    src = tmp_path / "t.json"
    src.write_text(json.dumps(table))
    res = invoke("profiles", "import-sailor", src, "-o", tmp_path / "out")
    assert res.exit_code == 2, res.output
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith(f"error: {src}: {field}: "), line
    assert not (tmp_path / "out").exists()
    with pytest.raises(InputError):
        import_sailor(src, tmp_path / "out")
