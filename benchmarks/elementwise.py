"""``python -m benchmarks cost-model elementwise``: the cost model's eager element-wise term against published
kernel measurements (``data/components/elementwise.yaml``: eager PyTorch RMSNorm and rotary embedding against
``torch.compile`` of the same op, bf16, H100 NVL).

Per row, the model's extra time of the eager op is its extra bytes per element (``EAGER_NORM_BYTES``,
``EAGER_ROPE_BYTES``) times the row's elements over the card's nominal HBM bandwidth; the measurement is the
eager time less the compiled time. The rows of width 8192 (RMSNorm) and of 8192 tokens (rope, 32 x 256 wide
queries) set the constants; every other row is a check, and the summary says which is which.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks import common

DATA = Path(__file__).resolve().parents[1] / "data" / "components" / "elementwise.yaml"
SMALL = 8_000_000
"""Rows with fewer elements are launch-bound (a few microseconds of compiled time): reported, not in the MAPE."""


def _anchor(row: dict) -> bool:
    if row["op"] == "rms_norm":
        return row["width"] == 8192
    return row["tokens"] == 8192 and row["q_heads"] * row["head_dim"] == 8192


def run(a) -> None:
    import yaml

    from arachne.cost.compute import EAGER_NORM_BYTES, EAGER_ROPE_BYTES

    try:
        doc = yaml.safe_load(Path(a.data).read_text())
    except (OSError, yaml.YAMLError) as exc:
        common.fail(f"{a.data}: {type(exc).__name__}")
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        common.fail(f"{a.data}: rows: a list of measurements is needed")
    try:
        bw = float(doc["gpu"]["hbm_tbps"]) * 1e12
    except (KeyError, TypeError, ValueError):
        common.fail(f"{a.data}: gpu.hbm_tbps: the card's nominal HBM bandwidth (TB/s) is needed")
    need = {"rms_norm": ("direction", "tokens", "width", "eager_ms", "compiled_ms"),
            "rope": ("direction", "tokens", "q_heads", "kv_heads", "head_dim", "eager_ms", "compiled_ms")}
    rows = []
    for i, r in enumerate(doc["rows"]):
        keys = need.get(r.get("op") if isinstance(r, dict) else "", need["rope"])
        if not isinstance(r, dict) or r.get("op") not in need or any(k not in r for k in keys) \
                or r["direction"] not in ("fwd", "bwd") \
                or not all(isinstance(r[k], (int, float)) and not isinstance(r[k], bool) and r[k] > 0
                           for k in keys[1:]) or r["eager_ms"] <= r["compiled_ms"]:
            common.fail(f"{a.data}: rows[{i}]: needs op (rms_norm or rope), direction (fwd or bwd) and positive "
                        f"numbers {', '.join(keys[1:])}, eager_ms above compiled_ms")
        if r["op"] == "rms_norm":
            elements, per = r["tokens"] * r["width"], EAGER_NORM_BYTES
        else:
            elements, per = r["tokens"] * (r["q_heads"] + r["kv_heads"]) * r["head_dim"], EAGER_ROPE_BYTES
        model_ms = per[0 if r["direction"] == "fwd" else 1] * elements / bw * 1e3
        measured = r["eager_ms"] - r["compiled_ms"]
        rows.append({"op": r["op"], "direction": r["direction"], "elements": elements,
                     "measured_extra_ms": round(measured, 5), "model_extra_ms": round(model_ms, 5),
                     "error_pct": round(100 * (model_ms / measured - 1), 2), "anchor": _anchor(r),
                     "in_mape": not _anchor(r) and elements >= SMALL})
    summary = []
    for op in ("rms_norm", "rope"):
        for d in ("fwd", "bwd"):
            rs = [x for x in rows if x["op"] == op and x["direction"] == d]
            checks = [abs(x["error_pct"]) for x in rs if x["in_mape"]]
            if rs:
                summary.append({"op": op, "direction": d, "rows": len(rs), "check_rows": len(checks),
                                "check_mape_pct": round(sum(checks) / len(checks), 2) if checks else None,
                                "max_abs_error_pct": round(max(abs(x["error_pct"]) for x in rs), 2)})
    checks = [abs(x["error_pct"]) for x in rows if x["in_mape"]]
    total = {"rows": len(rows), "check_rows": len(checks),
             "check_mape_pct": round(sum(checks) / len(checks), 2) if checks else None, "groups": summary}
    common.print_table("eager element-wise ops: extra time over compiled, model vs measured (checks: rows not read "
                       f"into the constants, {SMALL:,} elements or more)", summary)
    common.console.print(f"{len(rows)} rows, {len(checks)} checks: MAPE {total['check_mape_pct']}%",
                         markup=False, highlight=False)
    common.write_result(a.out, "elementwise", rows, total, {"data": f"data/components/{Path(a.data).name}"},
                        benchmark="cost-model-elementwise")
