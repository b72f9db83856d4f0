"""``python -m benchmarks cost-model moe-layer``: the cost model's MoE layer against whole-layer measurements
(``data/components/moe_layer.yaml``: SonicMoE's Figure 14, one H100, bf16, six implementations, four model
shapes of three granularities each, forward and backward).

Per row, the model's time is the experts' GEMMs and the router at the cost model's GEMM rate
(:func:`arachne.cost.moe_layer.expert_gemms`) plus :data:`~arachne.cost.calibration.MOE_LAYER_PASSES` over the
expert outputs and weights at HBM bandwidth (:func:`~arachne.cost.moe_layer.moe_extra_bytes`). The pass counts
of an implementation class are a non-negative least-squares fit of the time beyond the GEMMs on its anchor rows
(the 7B and 30B panels); the 1.4B and 120B panels (the smallest and the widest experts) are checks. ``--fit``
prints the fit beside the frozen constants.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks import common

DATA = Path(__file__).resolve().parents[1] / "data" / "components" / "moe_layer.yaml"
CLASSES = {"megatron": "grouped", "sonicmoe": "fused"}
"""The implementations whose rows set an implementation class's constants (the others are reported only)."""
ANCHOR_PANELS = ("7B", "30B")
KEYS = ("impl", "panel", "T", "d", "n", "E", "K", "fwd_tflops", "bwd_tflops")


def _spec(r: dict):
    from arachne.spec.model import model_from_dict

    return model_from_dict({"name": f"moe-{r['panel']}-{r['n']}", "num_layers": 1, "hidden_size": r["d"],
                            "ffn_hidden_size": r["n"], "moe_ffn_hidden_size": r["n"], "num_attention_heads": 8,
                            "vocab_size": 1000, "num_experts": r["E"], "experts_top_k": r["K"], "mlp": "swiglu"},
                           "moe_layer.yaml")


def layer_parts(r: dict) -> dict[str, float]:
    """A row's GEMM seconds (forward; backward twice) and its two traffic features (seconds per pass)."""
    from arachne.cost import CostModel
    from arachne.cost.moe_layer import expert_gemms, traffic_elements
    from arachne.spec.cluster import cluster_from_dict

    cm = CostModel(cluster_from_dict({"nodes": [{"name": "n0", "gpu": "H100-SXM5-80GB", "count": 1}]}, "bench"))
    comp = cm.compute
    gpu = cm.cluster.nodes[0].gpu
    peak = comp.gemm_peak(gpu, "bf16")
    spec = _spec(r)
    gemm = expert_gemms(lambda f: comp._gemm(f, peak), spec, r["T"], 1, 1, None) \
        + comp._gemm(2 * r["T"] * r["d"] * r["E"], peak)
    outputs, weights = traffic_elements(spec, r["T"], 1, 1, None)  # bf16: two bytes each
    return {"gemm_s": gemm, "out_s": outputs * 2 / gpu.hbm_bandwidth, "w_s": weights * 2 / gpu.hbm_bandwidth}


def fit(rows: list[dict]) -> dict[str, tuple[float, float, float, float]]:
    """Pass counts per implementation class: (out fwd, weights fwd, out bwd, weights bwd) on the anchor rows."""
    import numpy as np
    from scipy.optimize import nnls

    out = {}
    for impl, cls in CLASSES.items():
        coef = []
        for d, mult in (("fwd", 1), ("bwd", 2)):
            X, y = [], []
            for r in rows:
                if r["impl"] != impl or r["panel"] not in ANCHOR_PANELS:
                    continue
                p = r["parts"]
                t = mult * 6 * r["T"] * r["K"] * r["d"] * r["n"] / (r[f"{d}_tflops"] * 1e12)
                X.append([p["out_s"], p["w_s"]])
                y.append(t - mult * p["gemm_s"])
            c, _ = nnls(np.array(X), np.array(y))
            coef += [float(c[0]), float(c[1])]
        out[cls] = (coef[0], coef[1], coef[2], coef[3])
    return out


def load(path: str) -> list[dict]:
    import yaml

    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        common.fail(f"{path}: {type(exc).__name__}")
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        common.fail(f"{path}: rows: a list of measurements is needed")
    rows = []
    for i, r in enumerate(doc["rows"]):
        if not isinstance(r, dict) or any(k not in r for k in KEYS) or not isinstance(r["impl"], str) \
                or not all(isinstance(r[k], (int, float)) and not isinstance(r[k], bool) and r[k] > 0
                           for k in KEYS[2:]) or r["K"] > r["E"]:
            common.fail(f"{path}: rows[{i}]: needs impl, panel and positive numbers {', '.join(KEYS[2:])} "
                        "(K at most E)")
        rows.append(dict(r))
    return rows


def run(a) -> None:
    from arachne.cost.calibration import MOE_LAYER_PASSES

    rows = load(a.data)
    for r in rows:
        r["parts"] = layer_parts(r)
    fitted = fit(rows)
    out = []
    for r in rows:
        cls = CLASSES.get(r["impl"])
        if cls is None:
            continue
        p = r["parts"]
        passes = MOE_LAYER_PASSES[cls]
        res = {"impl": r["impl"], "class": cls, "panel": r["panel"], "n": r["n"], "E": r["E"], "K": r["K"],
               "anchor": r["panel"] in ANCHOR_PANELS}
        for d, mult, (po, pw) in (("fwd", 1, passes[:2]), ("bwd", 2, passes[2:])):
            flops = mult * 6 * r["T"] * r["K"] * r["d"] * r["n"]
            model_s = mult * p["gemm_s"] + po * p["out_s"] + pw * p["w_s"]
            res[f"{d}_measured_tflops"] = r[f"{d}_tflops"]
            res[f"{d}_model_tflops"] = round(flops / model_s / 1e12, 1)
            res[f"{d}_error_pct"] = round(100 * (r[f"{d}_tflops"] / (flops / model_s / 1e12) - 1), 2)
        out.append(res)
    summary = []
    for cls in CLASSES.values():
        for d in ("fwd", "bwd"):
            for anchor in (True, False):
                errs = [abs(x[f"{d}_error_pct"]) for x in out if x["class"] == cls and x["anchor"] == anchor]
                summary.append({"class": cls, "direction": d, "rows": "anchor" if anchor else "check",
                                "n": len(errs), "mape_pct": round(sum(errs) / len(errs), 2) if errs else None,
                                "max_pct": round(max(errs), 2) if errs else None})
    common.print_table("MoE layer on one H100, bf16: time error of the model (anchors: the 7B and 30B panels)",
                       summary)
    checks = [abs(x[f"{d}_error_pct"]) for x in out if not x["anchor"] for d in ("fwd", "bwd")]
    total = {"rows": len(out), "check_rows": len(checks),
             "check_mape_pct": round(sum(checks) / len(checks), 2) if checks else None,
             "frozen": {k: list(v) for k, v in MOE_LAYER_PASSES.items()},
             "fitted": {k: [round(x, 3) for x in v] for k, v in fitted.items()}, "groups": summary}
    common.console.print(f"{len(out)} rows, {len(checks)} check values: MAPE {total['check_mape_pct']}%",
                         markup=False, highlight=False)
    if a.fit:
        for cls, v in fitted.items():
            common.console.print(f"fitted {cls}: " + ", ".join(f"{x:.2f}" for x in v) +
                                 f"  (frozen: {', '.join(str(x) for x in MOE_LAYER_PASSES[cls])})",
                                 markup=False, highlight=False)
    common.write_result(a.out, "moe_layer", out, total, {"data": f"data/components/{Path(a.data).name}"},
                        benchmark="cost-model-moe-layer")
