"""``cost-model moe-layer``: the MoE layer's pass counts against the shipped whole-layer measurements."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import moe_layer as M

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data" / "components" / "moe_layer.yaml"


@pytest.mark.slow
def test_the_frozen_passes_are_the_anchor_fit_and_the_checks_hold(tmp_path):
    """MOE_LAYER_PASSES is the fit on the 7B and 30B panels (to 0.1 pass); the 1.4B and 120B panels check it."""
    M.run(argparse.Namespace(data=DATA, out=tmp_path, fit=True))
    res = json.loads((tmp_path / "moe_layer.json").read_text())
    for cls, fitted in res["summary"]["fitted"].items():
        assert res["summary"]["frozen"][cls] == pytest.approx(fitted, abs=0.051), cls
    assert res["summary"]["check_rows"] == 24
    assert res["summary"]["check_mape_pct"] < 12  # checked, not fitted
    anchors = [abs(r[f"{d}_error_pct"]) for r in res["rows"] if r["anchor"] for d in ("fwd", "bwd")]
    assert max(anchors) < 15


@pytest.mark.slow
def test_a_bad_data_file_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rows:\n- {impl: megatron, panel: x, T: 4096, d: 1024, n: 512, E: 8, K: 16}\n")
    r = subprocess.run([sys.executable, "-m", "benchmarks", "cost-model", "moe-layer", "--data", str(bad),
                        "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "rows[0]" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
