"""``cost-model attention``: the shipped kernel measurements, and the attention core against them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from benchmarks import attention as A

ROOT = Path(__file__).resolve().parents[2]


def test_every_row_names_its_source_and_the_anchors_reproduce_the_constants(tmp_path):
    doc = yaml.safe_load((ROOT / "data" / "components" / "attention.yaml").read_text())
    assert all(r["source"] and r["read"] and r["tflops"] > 0 for r in doc["rows"])
    A.run(argparse.Namespace(data=ROOT / "data" / "components" / "attention.yaml", out=tmp_path))
    res = json.loads((tmp_path / "attention.json").read_text())
    anchors = [r for r in res["rows"] if r["anchor"] and r["seq"] == A.ANCHOR_SEQ]
    assert len(anchors) == 6  # the five 8K anchors and the H100 FlashAttention-2 forward at 8K
    # every constant read from an 8K row gives that row back (FlashAttention-2's backward came out of its
    # forward + backward row, so that row is exact too)
    assert all(abs(r["error_pct"]) < 0.5 for r in anchors), anchors
    checks = [r for r in res["rows"] if not r["anchor"]]
    assert res["summary"]["check_rows"] == len(checks) > 20
    assert res["summary"]["check_mape_pct"] < 15  # the model is checked, not fitted, on these
