"""``cost-model published``: the cost model against published end-to-end training runs.

``data/published_runs/runs.yaml`` holds runs the project collected from papers and framework/vendor performance
pages (source, full configuration, the measured figure and the FLOP convention it was stated in). Each record is
turned into an arachne cluster and the nearest ``arachne-plan/1`` plan (one pipeline of uniform stages, the stated
tp/pp/dp/ep), priced with ``CostModel(cluster).estimate(plan)``, and compared with the measured iteration time
(the source's metric converted with the source's convention). A record whose run used something v1 cannot say
(interleaved stages, context parallelism, FSDP, FP8, ...) is still priced, as its nearest v1 plan, but it is
flagged with the features it needs and reported in its own group: it is not a fair validation of the model.

Nothing here is fitted: the records are a check, never a calibration input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from arachne.errors import InputError, from_validation_error, load_document
from benchmarks import common

DATA = common.ROOT / "data" / "published_runs" / "runs.yaml"
FORMAT = "arachne-published-runs/1"

FEATURES = {
    "interleaved": "interleaved 1F1B (virtual pipeline stages, vp > 1)",
    "cp": "context parallelism (cp > 1): priced with the cp ranks as extra data-parallel groups",
    "zero3": "FSDP / ZeRO-3 (parameters sharded): priced as ZeRO-1",
    "fp8": "FP8 compute: priced at bf16 rates and memory",
    "selective_recompute": "selective recomputation: priced without recomputation",
    "etp": "expert tensor parallelism other than the dense tp",
    "ep_beyond_dp": "expert parallelism wider than the data-parallel groups: priced at the largest ep dividing dp",
    "head_dim": "head width other than hidden / heads: priced at hidden / heads",
    "mla": "multi-head latent attention: priced as multi-head attention",
    "attention_variant": "sliding-window / sink attention: priced as full causal attention",
    "ep_overlap": "all-to-all overlapped with computation across micro-batches",
    "sequence_parallel": "sequence parallelism",
}
"""Features a record may need that formats v1 cannot express (what the nearest v1 plan does instead)."""

GROUPS = ("dense A100", "dense Hopper/Blackwell", "MoE")


# ---- the data file ------------------------------------------------------------------------------------------
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class SourceRef(_Strict):
    ref: str
    """Key into the file's ``sources``."""
    table: str = Field(min_length=1)
    """Table or figure, and the row, the figures were read from."""
    date: str = Field(min_length=1)
    """Publication (or page version) date."""


class Gpus(_Strict):
    type: str
    """arachne GPU catalog name (or alias)."""
    count: int = Field(ge=1)
    """GPUs in the run."""
    per_node: int = Field(ge=1, le=64)
    """GPUs per node."""
    inter_node_gbps: float | None = Field(default=None, gt=0)
    """Per-node network bandwidth, GB/s, only when the source states it (else the catalog's)."""


class Parallel(_Strict):
    tp: int = Field(default=1, ge=1)
    """Tensor-parallel degree."""
    pp: int = Field(default=1, ge=1)
    """Pipeline stages."""
    cp: int = Field(default=1, ge=1)
    """Context-parallel degree."""
    vp: int = Field(default=1, ge=1)
    """Virtual stages per pipeline rank (1: plain 1F1B)."""
    ep: int = Field(default=1, ge=1)
    """Expert-parallel degree."""
    etp: int | None = Field(default=None, ge=1)
    """Expert tensor-parallel degree; null when the source does not state it."""
    fsdp: bool = False
    """Parameters sharded over data-parallel ranks (FSDP, ZeRO-3)."""
    zero_stage: Literal[0, 1] = 0
    """Optimizer sharding (ZeRO-1) when stated; 0 otherwise."""
    sequence_parallel: bool | None = None
    """Megatron sequence parallelism, when stated."""
    recompute: Literal["none", "selective", "full"] = "none"
    """Activation recomputation."""
    mbs: int = Field(ge=1)
    """Micro-batch size (sequences per data-parallel rank per micro-batch)."""
    gbs: int = Field(ge=1)
    """Global batch size (sequences per iteration)."""
    seq: int = Field(ge=1)
    """Sequence length."""
    precision: Literal["bf16", "fp16", "fp8"] = "bf16"
    """Compute precision of the run."""


class Measured(_Strict):
    step_time_s: float | None = Field(default=None, gt=0)
    """Iteration time, s."""
    tokens_per_s_per_gpu: float | None = Field(default=None, gt=0)
    """Training throughput per GPU."""
    tokens_per_s: float | None = Field(default=None, gt=0)
    """Training throughput of the whole run."""
    tflops_per_gpu: float | None = Field(default=None, gt=0)
    """Achieved model TFLOP/s per GPU in the source's ``flop_convention``."""
    mfu: float | None = Field(default=None, gt=0, le=1)
    """Model FLOPs utilization in the source's ``flop_convention`` over ``peak_tflops`` per GPU."""
    flop_convention: Literal["megatron", "megatron-recompute", "6n", "6n-attn"] | None = None
    """How the source counts FLOPs (see ``flops_per_iteration``)."""
    peak_tflops: float | None = Field(default=None, gt=0)
    """The per-GPU peak the source divided by (with ``mfu``)."""
    peak_memory_gb: float | None = Field(default=None, gt=0)
    """Peak memory per GPU, 10^9 bytes, when published."""

    @model_validator(mode="after")
    def _one_metric(self) -> Measured:
        given = [k for k in METRICS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(METRICS)} (got {len(given)})")
        if given[0] in ("tflops_per_gpu", "mfu") and self.flop_convention is None:
            raise ValueError(f"{given[0]} needs flop_convention")
        if given[0] == "mfu" and self.peak_tflops is None:
            raise ValueError("mfu needs peak_tflops")
        return self


METRICS = ("step_time_s", "tokens_per_s_per_gpu", "tokens_per_s", "tflops_per_gpu", "mfu")


class Record(_Strict):
    id: str = Field(min_length=1, max_length=100)
    """Unique name of the record."""
    source: SourceRef
    """Where the figures come from."""
    model: str
    """arachne catalog model name, or a key of the file's ``models``."""
    gpus: Gpus
    parallel: Parallel
    measured: Measured
    reported: dict[str, Any] = {}
    """Other figures of the same row (not used; kept for cross-checks)."""
    extra_features: tuple[str, ...] = ()
    """Features the run used that the configuration fields do not show (keys of ``FEATURES``)."""
    held_out: bool
    """In the held-out half (assigned before any record was priced)."""


class ModelEntry(_Strict):
    shape: dict[str, Any]
    """A formats-v1 model document."""
    head_dim: int | None = Field(default=None, ge=1)
    """The real head width, when it is not hidden / heads."""
    attention: str | None = None
    """``mla`` or another attention kind v1 cannot price."""
    source: str = Field(min_length=1)
    """Where the shape comes from."""


class SourceEntry(_Strict):
    title: str
    """What the source is (paper, page, table set) and its version or date."""
    url: str
    """Where to read it."""
    repo_file: str | None = None
    """The repository file and commit the figures were read from, when the source is one."""
    note: str = ""
    """Conditions the source states for all its rows (balanced routing, mock data, network)."""


class RunsFile(_Strict):
    format: Literal["arachne-published-runs/1"]
    """Format version."""
    sources: dict[str, SourceEntry]
    """Sources by key (records refer to them)."""
    models: dict[str, ModelEntry] = {}
    """Model shapes not in arachne's catalog, by name."""
    records: list[Record] = Field(min_length=1)
    """The published runs."""


def load(path: Path = DATA) -> RunsFile:
    """Read and check the data file (``InputError`` naming file and field on bad input)."""
    from arachne.spec.gpus import gpu_catalog

    src = str(path)
    doc = load_document(path)
    try:
        runs = RunsFile.model_validate(doc)
    except ValidationError as e:
        raise from_validation_error(src, e) from None
    seen: set[str] = set()
    for i, r in enumerate(runs.records):
        at = f"records[{i}]"
        if r.id in seen:
            raise InputError(src, f"{at}.id", f"duplicate id {r.id!r}")
        seen.add(r.id)
        if r.source.ref not in runs.sources:
            raise InputError(src, f"{at}.source.ref", f"unknown source {r.source.ref!r}")
        bad = [f for f in r.extra_features if f not in FEATURES]
        if bad:
            raise InputError(src, f"{at}.extra_features", f"unknown feature {bad[0]!r}")
        if gpu_catalog().get(r.gpus.type) is None:
            raise InputError(src, f"{at}.gpus.type", f"unknown GPU type {r.gpus.type!r} (see `arachne gpus`)")
        try:
            model_of(runs, r)
            convert(runs, r)
        except InputError as e:
            raise InputError(src, f"{at}.{e.field}" if e.field else at, e.reason) from None
    return runs


# ---- one record -> model, cluster, plan -----------------------------------------------------------------------
def model_of(runs: RunsFile, rec: Record):
    """The record's model as an arachne ModelSpec (catalog first, then the file's ``models``)."""
    from arachne.spec.model import model_catalog, model_from_dict

    if rec.model in runs.models:
        return model_from_dict(dict(runs.models[rec.model].shape), "", "model")
    spec = model_catalog().get(rec.model)
    if spec is None:
        raise InputError("", "model", f"{rec.model!r} is neither a catalog model nor a key of models")
    return spec


def needs(runs: RunsFile, rec: Record, ep_v1: int | None = None) -> list[str]:
    """The v2 features the run used (sorted), from its configuration and ``extra_features``."""
    p, out = rec.parallel, set(rec.extra_features)
    if p.vp > 1:
        out.add("interleaved")
    if p.cp > 1:
        out.add("cp")
    if p.fsdp:
        out.add("zero3")
    if p.precision == "fp8":
        out.add("fp8")
    if p.recompute == "selective":
        out.add("selective_recompute")
    if p.sequence_parallel:
        out.add("sequence_parallel")
    if p.ep > 1 and p.etp is not None and p.etp != p.tp:
        out.add("etp")
    if ep_v1 is not None and ep_v1 != p.ep:
        out.add("ep_beyond_dp")
    entry = runs.models.get(rec.model)
    if entry is not None:
        spec = model_of(runs, rec)
        if entry.head_dim is not None and entry.head_dim != spec.hidden_size // spec.num_attention_heads:
            out.add("head_dim")
        if entry.attention == "mla":
            out.add("mla")
        elif entry.attention:
            out.add("attention_variant")
    return sorted(out)


def layer_split(num_layers: int, pp: int) -> list[tuple[int, int]]:
    """Contiguous block ranges, as even as possible, the first stages taking the extra blocks."""
    if num_layers < pp:
        raise InputError("", "parallel.pp", f"pp {pp} exceeds the model's {num_layers} blocks")
    base, extra = divmod(num_layers, pp)
    out, start = [], 0
    for s in range(pp):
        end = start + base + (s < extra)
        out.append((start, end))
        start = end
    return out


def convert(runs: RunsFile, rec: Record) -> tuple[dict, dict, dict[str, Any]]:
    """(cluster document, plan document, notes) of the nearest v1 plan. The cp ranks become extra data-parallel
    groups; ep becomes the largest divisor of the stated ep that divides both dp and the experts."""
    p, g = rec.parallel, rec.gpus
    spec = model_of(runs, rec)
    if g.count % g.per_node:
        raise InputError("", "gpus.count", f"{g.count} GPUs is not a whole number of {g.per_node}-GPU nodes")
    ranks = p.tp * p.pp * p.cp
    if g.count % ranks:
        raise InputError("", "parallel", f"tp x pp x cp = {ranks} does not divide {g.count} GPUs")
    if g.per_node % p.tp:
        raise InputError("", "parallel.tp", f"tp {p.tp} does not divide {g.per_node} GPUs per node")
    dp = g.count // ranks
    dp_v1 = dp * p.cp
    if p.gbs % (p.mbs * dp_v1):
        raise InputError("", "parallel.gbs", f"gbs {p.gbs} is not a multiple of mbs x dp x cp = {p.mbs * dp_v1}")
    ep_v1 = 1
    if spec.is_moe:
        ep_v1 = max(e for e in range(1, p.ep + 1) if p.ep % e == 0 and dp_v1 % e == 0 and spec.num_experts % e == 0)
    elif p.ep > 1:
        raise InputError("", "parallel.ep", f"ep {p.ep} on a dense model")
    node = {"name": "n{i}", "count": g.count // g.per_node, "gpu": g.type, "gpus_per_node": g.per_node}
    if g.inter_node_gbps is not None:
        node["inter_node_gbps"] = g.inter_node_gbps
    cluster = {"name": rec.id, "nodes": [node]}
    per_stage = p.tp * dp_v1
    stages = []
    for s, (a, b) in enumerate(layer_split(spec.num_layers, p.pp)):
        devs = [f"n{i // g.per_node}:{i % g.per_node}" for i in range(s * per_stage, (s + 1) * per_stage)]
        st: dict[str, Any] = {"layers": [a, b], "devices": devs, "tp": p.tp, "dp": dp_v1}
        if ep_v1 > 1:
            st["ep"] = ep_v1
        if p.recompute == "full":
            st["recompute"] = True
        stages.append(st)
    plan = {"format": "arachne-plan/1",
            "model": rec.model if rec.model not in runs.models else dict(runs.models[rec.model].shape),
            "global_batch_size": p.gbs, "sequence_length": p.seq, "micro_batch_size": p.mbs * dp_v1,
            "precision": "bf16" if p.precision == "fp8" else p.precision,
            "zero_stage": 1 if (p.fsdp or p.zero_stage) else 0, "schedule": "1f1b",
            "pipelines": [{"micro_batches": p.gbs // (p.mbs * dp_v1), "stages": stages}]}
    return cluster, plan, {"dp": dp, "dp_v1": dp_v1, "ep_v1": ep_v1}


# ---- the source's metric -> iteration time ------------------------------------------------------------------
def flops_per_iteration(convention: str, spec, gbs: int, seq: int) -> float:
    """Model FLOPs of one iteration (``gbs`` sequences of ``seq`` tokens) as the source counts them.

    ``megatron``: Narayanan et al. 2021 (arXiv 2104.04473) eq. (3) without recomputation,
    ``72 B s l h^2 (1 + s/(6h) + V/(12 l h))``; ``megatron-recompute``: the same paper's count with full
    recomputation (four forward passes), ``96 B s l h^2 (1 + s/(6h) + V/(16 l h))``; ``6n``: 6 x active
    parameters x tokens; ``6n-attn``: PaLM (Chowdhery et al. 2022, appendix B), ``(6N + 12 l h s)`` per token with
    N the active parameters."""
    b, s, l, h, v = gbs, seq, spec.num_layers, spec.hidden_size, spec.vocab_size
    if convention == "megatron":
        return 72 * b * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))
    if convention == "megatron-recompute":
        return 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    if convention == "6n":
        return 6 * spec.active_params * b * s
    if convention == "6n-attn":
        return (6 * spec.active_params + 12 * l * h * s) * b * s
    raise ValueError(f"unknown FLOP convention {convention!r}")


def measured_iteration_s(m: Measured, spec, gpus: int, gbs: int, seq: int) -> float:
    """The source's metric as seconds per iteration."""
    if m.step_time_s is not None:
        return m.step_time_s
    if m.tokens_per_s_per_gpu is not None:
        return gbs * seq / (m.tokens_per_s_per_gpu * gpus)
    if m.tokens_per_s is not None:
        return gbs * seq / m.tokens_per_s
    flops = flops_per_iteration(m.flop_convention, spec, gbs, seq)  # type: ignore[arg-type]
    per_gpu = m.tflops_per_gpu * 1e12 if m.tflops_per_gpu is not None else m.mfu * m.peak_tflops * 1e12
    return flops / (per_gpu * gpus)


def group_of(spec, gpu_name: str) -> str:
    if spec.is_moe:
        return "MoE"
    return "dense A100" if gpu_name.upper().startswith(("A100", "A800")) else "dense Hopper/Blackwell"


# ---- the subcommand ----------------------------------------------------------------------------------------
def price(runs: RunsFile, rec: Record) -> dict[str, Any]:
    """One result row: the record priced as its nearest v1 plan."""
    from arachne.cost import CostModel
    from arachne.plan import plan_from_dict
    from arachne.spec.cluster import cluster_from_dict

    spec = model_of(runs, rec)
    cluster_doc, plan_doc, notes = convert(runs, rec)
    cluster = cluster_from_dict(cluster_doc, rec.id)
    est = CostModel(cluster).estimate(plan_from_dict(plan_doc, rec.id))
    p = rec.parallel
    measured = measured_iteration_s(rec.measured, spec, rec.gpus.count, p.gbs, p.seq)
    feats = needs(runs, rec, notes["ep_v1"])
    row: dict[str, Any] = {
        "id": rec.id, "group": group_of(spec, cluster.nodes[0].gpu.name), "expressible": not feats,
        "held_out": rec.held_out, "gpus": rec.gpus.count, "gpu": cluster.nodes[0].gpu.name,
        "config": f"tp{p.tp} pp{p.pp} cp{p.cp} vp{p.vp} ep{p.ep} dp{notes['dp']} mbs{p.mbs} gbs{p.gbs} s{p.seq}",
        "measured_s": measured, "predicted_s": est.iteration_time_s,
        "error_pct": 100 * (est.iteration_time_s - measured) / measured,
        "predicted_memory_gb": est.max_memory_bytes / 1e9, "fits": est.fits,
        "measured_memory_gb": rec.measured.peak_memory_gb, "memory_error_pct": None,
        "needs": ",".join(feats) or "-", "v1_ep": notes["ep_v1"],
        "source": f"{rec.source.ref}: {rec.source.table}", "breakdown": dict(est.breakdown),
    }
    if rec.measured.peak_memory_gb:
        row["memory_error_pct"] = 100 * (row["predicted_memory_gb"] - rec.measured.peak_memory_gb) / \
            rec.measured.peak_memory_gb
    return row


def mape(rows: list[dict[str, Any]], key: str = "error_pct") -> float | None:
    xs = [abs(r[key]) for r in rows if r.get(key) is not None]
    return sum(xs) / len(xs) if xs else None


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """MAPE per group x (expressible | needs v2) x (visible | held out), plus memory where published."""
    out = []
    for kind, fair in (("v1-expressible", True), ("needs v2 (nearest v1 plan)", False)):
        for grp in GROUPS:
            for split, held in (("visible", False), ("held-out", True)):
                sel = [r for r in rows if r["group"] == grp and r["expressible"] == fair and r["held_out"] == held]
                out.append({"group": grp, "kind": kind, "split": split, "runs": len(sel), "mape_pct": mape(sel),
                            "mean_error_pct": sum(r["error_pct"] for r in sel) / len(sel) if sel else None,
                            "predicted_not_fitting": sum(not r["fits"] for r in sel)})
    mem = [r for r in rows if r["memory_error_pct"] is not None]
    out.append({"group": "memory", "kind": "all", "split": "all", "runs": len(mem),
                "mape_pct": mape(mem, "memory_error_pct"), "mean_error_pct": None,
                "predicted_not_fitting": sum(not r["fits"] for r in mem)})
    return out


def run(a) -> None:
    path = Path(getattr(a, "data", None) or DATA)
    try:
        runs = load(path)
        rows = [price(runs, r) for r in runs.records]
    except InputError as e:
        common.fail(str(e))
    for fair, title in ((True, "v1-expressible runs (a fair check of the cost model)"),
                        (False, "runs that need formats v2: priced as their nearest v1 plan, NOT a fair check")):
        common.print_table(title, [r for r in rows if r["expressible"] == fair],
                           ["id", "group", "held_out", "gpus", "config", "measured_s", "predicted_s", "error_pct",
                            "predicted_memory_gb", "fits", "needs"])
    groups = summarize(rows)
    common.print_table("MAPE of iteration time per group (memory: where published)", [g for g in groups if g["runs"]])
    fair = [r for r in rows if r["expressible"]]
    summary = {"records": len(rows), "expressible": len(fair), "needs_v2": len(rows) - len(fair),
               "mape_expressible_pct": mape(fair), "mape_expressible_held_out_pct":
               mape([r for r in fair if r["held_out"]]), "mape_needs_v2_pct": mape([r for r in rows if not r["expressible"]]),
               "groups": groups, "fitted_on_these_runs": []}
    common.console.print(f"{len(rows)} records: {len(fair)} v1-expressible, {len(rows) - len(fair)} need v2 features "
                         f"(priced as their nearest v1 plan, reported apart)")
    common.write_result(a.out, "published", rows, summary, {"data": str(path)}, benchmark="cost-model-published")
