"""``cost-model elementwise``: the eager element-wise term against the shipped kernel measurements."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from benchmarks import elementwise as E

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data" / "components" / "elementwise.yaml"


def test_the_anchors_give_their_rows_back_and_the_checks_hold(tmp_path):
    E.run(argparse.Namespace(data=DATA, out=tmp_path))
    res = json.loads((tmp_path / "elementwise.json").read_text())
    anchors = [r for r in res["rows"] if r["anchor"]]
    assert len(anchors) == 4 and all(abs(r["error_pct"]) < 0.5 for r in anchors), anchors
    assert res["summary"]["check_rows"] >= 12
    assert res["summary"]["check_mape_pct"] < 15  # checked, not fitted


def test_a_bad_data_file_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rows:\n- {op: rms_norm, direction: sideways}\ngpu: {hbm_tbps: 3.9}\n")
    r = subprocess.run([sys.executable, "-m", "benchmarks", "cost-model", "elementwise", "--data", str(bad),
                        "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "rows[0]" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
