"""``python -m benchmarks cost-model attention``: the cost model's attention core against published kernel
measurements (``data/components/attention.yaml``: causal bf16 attention, head dim 128, by sequence length).

Each row's shape is priced by :meth:`ComputeModel.attention_core` on the row's GPU with its kernel; the
model's time is turned into TFLOPS with the source's own FLOP convention (causal forward ``2 b a s^2 d``,
backward 2.5x, both 3.5x) and compared with the measured TFLOPS. The 8K-token rows anchored
``ATTENTION_EFFICIENCY`` and the H100 FlashAttention-2 forward rows ``ATTENTION_SEQ_HALF``; every other row is
a check, and the summary says which is which.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks import common

DATA = Path(__file__).resolve().parents[1] / "data" / "components" / "attention.yaml"
ANCHOR_SEQ = 8192


ANCHORS = {("H100-SXM5-80GB", "cudnn", "fwd"), ("H200", "cudnn", "bwd"), ("H100-SXM5-80GB", "flash2", "fwd+bwd"),
           ("GB200", "cudnn", "fwd"), ("GB200", "cudnn", "bwd")}
"""The 8K-token rows ``ATTENTION_EFFICIENCY`` was read from (the H100 FlashAttention-2 forward rows: all of them,
for ``ATTENTION_SEQ_HALF`` as well)."""


def _anchor(row: dict) -> bool:
    """Whether a row was read into the model's constants (``anchors`` in the data file)."""
    if row["gpu"] == "H100-SXM5-80GB" and row["kernel"] == "flash2" and row["direction"] == "fwd":
        return True
    return row["seq"] == ANCHOR_SEQ and (row["gpu"], row["kernel"], row["direction"]) in ANCHORS


def run(a) -> None:
    import yaml

    from arachne.cost.calibration import DEFAULT_CALIBRATION
    from arachne.cost.compute import ComputeModel
    from arachne.spec.gpus import gpu_catalog
    from arachne.spec.model import ModelSpec

    try:
        doc = yaml.safe_load(Path(a.data).read_text())
    except (OSError, yaml.YAMLError) as exc:
        common.fail(f"{a.data}: {type(exc).__name__}")
    need = ("gpu", "kernel", "direction", "seq", "heads", "head_dim", "tflops")
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        common.fail(f"{a.data}: rows: a list of measurements is needed")
    for i, r in enumerate(doc["rows"]):
        if not isinstance(r, dict) or any(k not in r for k in need):
            common.fail(f"{a.data}: rows[{i}]: needs {', '.join(need)}")
    cm = ComputeModel(None, DEFAULT_CALIBRATION.compute)
    rows = []
    for r in doc["rows"]:
        gpu = gpu_catalog().get(r["gpu"])
        heads, d, seq = r["heads"], r["head_dim"], r["seq"]
        model = ModelSpec(name="attention-probe", num_layers=1, hidden_size=heads * d,
                          ffn_hidden_size=4 * heads * d, num_attention_heads=heads, vocab_size=32000,
                          max_sequence_length=seq, head_dim=d)
        fwd, bwd = cm.attention_core(model, gpu, "bf16", seq, 1.0, 1, r["kernel"])
        flops = 2 * heads * seq * seq * d  # causal forward, per sequence
        t, mult = {"fwd": (fwd, 1.0), "bwd": (bwd, 2.5), "fwd+bwd": (fwd + bwd, 3.5)}[r["direction"]]
        model_tflops = mult * flops / t / 1e12
        rows.append({"gpu": r["gpu"], "kernel": r["kernel"], "direction": r["direction"], "seq": seq,
                     "measured_tflops": r["tflops"], "model_tflops": round(model_tflops, 1),
                     "error_pct": round(100 * (model_tflops / r["tflops"] - 1), 2),
                     "anchor": _anchor(r)})
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["gpu"], row["kernel"], row["direction"]), []).append(row)
    summary = []
    for (gpu, kernel, direction), rs in groups.items():
        checks = [abs(x["error_pct"]) for x in rs if not x["anchor"]]
        summary.append({"gpu": gpu, "kernel": kernel, "direction": direction, "rows": len(rs),
                        "check_rows": len(checks),
                        "check_mape_pct": round(sum(checks) / len(checks), 2) if checks else None,
                        "max_abs_error_pct": round(max(abs(x["error_pct"]) for x in rs), 2)})
    checks = [abs(x["error_pct"]) for x in rows if not x["anchor"]]
    total = {"rows": len(rows), "check_rows": len(checks),
             "check_mape_pct": round(sum(checks) / len(checks), 2) if checks else None,
             "groups": summary}
    common.print_table("attention core vs kernel measurements (check rows: not read into the constants)", summary)
    common.console.print(f"{len(rows)} rows, {len(checks)} checks: MAPE {total['check_mape_pct']}%",
                         markup=False, highlight=False)
    common.write_result(a.out, "attention", rows, total, {"data": f"data/components/{Path(a.data).name}"},
                        benchmark="cost-model-attention")
