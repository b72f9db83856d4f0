"""``cost-model published``: the cost model against published end-to-end training runs.

``data/published_runs/runs.yaml`` holds runs the project collected from papers and framework/vendor performance
pages (source, full configuration, the measured figure and the FLOP convention it was stated in). Each record is
turned into an arachne cluster and the ``arachne-plan/2`` plan of its configuration (interleaving, context and
sequence parallelism, ZeRO stage, recomputation, FP8, ep/etp as stated; what a row leaves unstated comes from
its source's ``defaults``), priced with ``CostModel(cluster).estimate(plan)``, and compared with the measured
iteration time (the source's metric converted with the source's convention). A record that used something the
cost model does not price (``UNPRICED``: sliding-window attention, all-to-all overlapped across micro-batches,
a synthetic gate routing each token to adjacent experts; chunks without a transformer block) is reported in its own group: it is not a fair check of the model.

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
    "cp": "context parallelism (cp > 1)",
    "zero3": "FSDP / ZeRO-3 (parameters sharded)",
    "fp8": "FP8 GEMMs",
    "selective_recompute": "selective recomputation",
    "etp": "expert tensor parallelism other than the dense tp",
    "ep_beyond_dp": "expert parallelism wider than the data-parallel groups (over dp x cp x tp)",
    "head_dim": "head width other than hidden / heads",
    "mla": "multi-head latent attention",
    "attention_variant": "sliding-window / sink attention: priced as full causal attention (unpriced)",
    "ep_overlap": "all-to-all overlapped with computation across micro-batches (plan field overlap_moe_comm)",
    "adjacent_routing": "a synthetic gate sending each token to k adjacent experts: a fraction of uniform top-k's "
                        "all-to-all bytes (unpriced)",
    "sequence_parallel": "sequence parallelism",
}
"""Version-2 features a record may use (``extra_features`` names those its configuration fields do not show)."""

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
    zero_stage: Literal[0, 1, 2] | None = None
    """Optimizer (1) or optimizer and gradient (2) sharding when stated; null: the source's default."""
    overlap: bool | None = None
    """Gradient reduction (and, when sharded, the parameter gather) overlapped with compute; null: the
    source's default."""
    sequence_parallel: bool | None = None
    """Megatron sequence parallelism, when stated."""
    recompute: Literal["none", "selective", "full"] = "none"
    """Activation recomputation."""
    recompute_modules: tuple[str, ...] | None = None
    """With ``recompute: selective``, Megatron-Core's ``recompute_modules`` when the recipe states them (the plan
    field of that name); null: the attention core only."""
    fp8_params: bool | None = None
    """fp8 parameters (Megatron ``fp8_param_gather``) when the recipe states them (the plan field of that name)."""
    elementwise_kernels: Literal["fused", "eager"] | None = None
    """``eager`` where the source says its norms and rotary embedding ran as eager PyTorch ops (torchtitan without
    ``torch.compile``); the plan field of that name. Null: fused (the plan's default)."""
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
    """Peak memory per GPU, 10^9 bytes, when published: the caching allocator's reserved peak (the sources with
    memory, torchtitan's pages, log ``torch.cuda`` max reserved), compared with ``MemoryBreakdown.reserved``."""

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


class SourceDefaults(_Strict):
    sequence_parallel: bool | None = None
    """Sequence parallelism whenever tp > 1."""
    zero_stage: Literal[0, 1, 2] | None = None
    """Optimizer sharding of the framework's recipes (Megatron's distributed optimizer: 1)."""
    overlap: bool | None = None
    """Overlapped gradient reduction / parameter gather."""
    framework: Literal["megatron", "torch"] | None = None
    """The plan's memory convention (``framework`` of formats v2 as arachne extends it): Megatron-Core with
    Transformer Engine, or plain PyTorch modules."""
    grad_reduce_in_fp32: bool | None = None
    """Gradients reduced (and, in Megatron, kept) in fp32; null: the plan's default (fp32)."""
    master_weights: Literal["fp32", "none"] | None = None
    """The plan field of that name (``none``: no fp32 master copy); null: the plan's default (fp32)."""
    optimizer_state_dtype: Literal["fp32", "bf16"] | None = None
    """The plan field of that name (Adam's moments); null: the plan's default (fp32)."""
    loss: Literal["standard", "fused"] | None = None
    """The plan field of that name (``fused``: no fp32 copy of the logits); null: the plan's default."""
    attention_kernel: Literal["cudnn", "flash2"] | None = None
    """The plan field of that name (the fused attention kernel the code ran); null: the plan's default."""
    basis: str = ""
    """Where these defaults come from (the recipe file, or why they are assumed)."""


class SourceEntry(_Strict):
    title: str
    """What the source is (paper, page, table set) and its version or date."""
    url: str
    """Where to read it."""
    repo_file: str | None = None
    """The repository file and commit the figures were read from, when the source is one."""
    note: str = ""
    """Conditions the source states for all its rows (balanced routing, mock data, network)."""
    defaults: SourceDefaults = SourceDefaults()
    """Settings of the source's framework recipes that its rows do not state (used where a record says null)."""


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
    """The record's model as an arachne ModelSpec: the catalog's entry when it has one (catalog entries carry the
    version-2 shape: head width, MLA, shared experts, dense first blocks), else the file's ``models``."""
    from arachne.spec.model import model_catalog, model_from_dict

    spec = model_catalog().get(rec.model)
    if spec is not None:
        return spec
    if rec.model in runs.models:
        return model_from_dict(dict(runs.models[rec.model].shape), "", "model")
    raise InputError("", "model", f"{rec.model!r} is neither a catalog model nor a key of models")


def _model_ref(runs: RunsFile, rec: Record) -> str | dict:
    from arachne.spec.model import model_catalog

    if model_catalog().get(rec.model) is not None:
        return rec.model
    return dict(runs.models[rec.model].shape)


def needs(runs: RunsFile, rec: Record) -> list[str]:
    """The version-2 features the run used (sorted), from its configuration and ``extra_features``."""
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
    if _sequence_parallel(runs, rec):
        out.add("sequence_parallel")
    if p.ep > 1 and p.etp is not None and p.etp != p.tp:
        out.add("etp")
    spec = model_of(runs, rec)
    if p.ep > 1 and _dp(rec) % p.ep:
        out.add("ep_beyond_dp")
    if spec.head_dim is not None and spec.head_dim * spec.num_attention_heads != spec.hidden_size:
        out.add("head_dim")
    if getattr(spec, "attention", "mha") == "mla":
        out.add("mla")
    entry = runs.models.get(rec.model)
    if entry is not None and entry.attention and entry.attention != "mla":
        out.add("attention_variant")
    return sorted(out)


UNPRICED = frozenset({"attention_variant", "adjacent_routing"})
"""Features the cost model does not price: a record using one is reported apart (not a fair check)."""


def unpriced(runs: RunsFile, rec: Record) -> list[str]:
    """What the record used that its arachne plan cannot carry or the cost model does not price."""
    out = [f for f in needs(runs, rec) if f in UNPRICED]
    if _vp_priced(runs, rec) != rec.parallel.vp:
        out.append("empty_chunks")
    if "interleaved" in rec.extra_features and rec.parallel.vp == 1:
        out.append("interleaving_depth_unstated")
    return out


def _vp_priced(runs: RunsFile, rec: Record) -> int:
    """Virtual stages of the priced plan: the stated vp, at most ``blocks / pp`` (Megatron can count the
    embedding and the loss as pipeline layers, leaving chunks without a transformer block; a plan's chunk holds
    at least one)."""
    p = rec.parallel
    return max(1, min(p.vp, model_of(runs, rec).num_layers // p.pp))


def _dp(rec: Record) -> int:
    p = rec.parallel
    return rec.gpus.count // (p.tp * p.pp * p.cp)


def _default(runs: RunsFile, rec: Record, key: str):
    """A setting the record leaves unstated: its source's stated framework default (``sources.*.defaults``)."""
    return getattr(runs.sources[rec.source.ref].defaults, key)


def _sequence_parallel(runs: RunsFile, rec: Record) -> bool:
    sp = rec.parallel.sequence_parallel
    if sp is None:
        sp = bool(_default(runs, rec, "sequence_parallel"))
    return sp and rec.parallel.tp > 1


def layer_split(num_layers: int, parts: int) -> list[tuple[int, int]]:
    """Contiguous block ranges, as even as possible, the first parts taking the extra blocks."""
    if num_layers < parts:
        raise InputError("", "parallel.pp", f"pp x vp = {parts} exceeds the model's {num_layers} blocks")
    base, extra = divmod(num_layers, parts)
    out, start = [], 0
    for s in range(parts):
        end = start + base + (s < extra)
        out.append((start, end))
        start = end
    return out


def convert(runs: RunsFile, rec: Record) -> tuple[dict, dict, dict[str, Any]]:
    """(cluster document, ``arachne-plan/2`` document, notes) of the run as its source describes it: one
    pipeline of ``pp`` stages (``vp`` interleaved chunks each, blocks split as evenly as possible), each stage
    ``dp`` groups of ``cp x tp`` GPUs, ep/etp for the routed experts, FSDP as ZeRO-3. More chunks than blocks
    (Megatron counting the embedding and loss as layers) are cut to ``blocks / pp`` (``notes['vp_priced']``)."""
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
    if p.gbs % (p.mbs * dp):
        raise InputError("", "parallel.gbs", f"gbs {p.gbs} is not a multiple of mbs x dp = {p.mbs * dp}")
    m = p.gbs // (p.mbs * dp)
    vp = _vp_priced(runs, rec)
    if vp > 1 and m % p.pp:
        raise InputError("", "parallel.vp", f"interleaving needs micro-batches ({m}) a multiple of pp {p.pp}")
    etp = p.etp
    if etp is None:  # unstated: Megatron-Core's default (the dense tp) when it fits beside ep, else 1
        etp = p.tp if (dp * p.cp * p.tp) % (p.ep * p.tp) == 0 else 1
    if spec.is_moe:
        if (dp * p.cp * p.tp) % (p.ep * etp) or spec.num_experts % p.ep:
            raise InputError("", "parallel.ep", f"ep {p.ep} x etp {etp} does not divide a stage's "
                             f"{dp * p.cp * p.tp} GPUs or the {spec.num_experts} experts")
    elif p.ep > 1:
        raise InputError("", "parallel.ep", f"ep {p.ep} on a dense model")
    node: dict[str, Any] = {"name": "n{i}", "count": g.count // g.per_node, "gpu": g.type,
                            "gpus_per_node": g.per_node}
    if g.inter_node_gbps is not None:
        node["inter_node_gbps"] = g.inter_node_gbps
    cluster = {"name": rec.id, "nodes": [node]}
    chunks = layer_split(spec.num_layers, p.pp * vp)
    per_stage = dp * p.cp * p.tp
    sp = _sequence_parallel(runs, rec)
    stages = []
    for s in range(p.pp):
        devs = [f"n{i // g.per_node}:{i % g.per_node}" for i in range(s * per_stage, (s + 1) * per_stage)]
        mine = [list(chunks[j * p.pp + s]) for j in range(vp)]
        st: dict[str, Any] = {"layers": mine if vp > 1 else mine[0], "devices": devs, "tp": p.tp, "dp": dp}
        if p.cp > 1:
            st["cp"] = p.cp
        if sp:
            st["sequence_parallel"] = True
        if spec.is_moe and p.ep > 1:
            st["ep"] = p.ep
        if spec.is_moe and etp != p.tp:
            st["etp"] = etp
        if p.recompute != "none":
            st["recompute"] = p.recompute
        if p.recompute_modules is not None:
            st["recompute_modules"] = list(p.recompute_modules)
        stages.append(st)
    zero = 3 if p.fsdp else (p.zero_stage if p.zero_stage is not None else int(_default(runs, rec, "zero_stage") or 0))
    overlap = p.overlap if p.overlap is not None else bool(_default(runs, rec, "overlap"))
    pipe: dict[str, Any] = {"micro_batches": m, "stages": stages}
    if vp > 1:
        pipe["virtual_stages"] = vp
    plan: dict[str, Any] = {
        "format": "arachne-plan/2", "model": _model_ref(runs, rec), "global_batch_size": p.gbs,
        "sequence_length": p.seq, "micro_batch_size": p.mbs * dp, "precision": p.precision, "zero_stage": zero,
        "schedule": "1f1b", "pipelines": [pipe]}
    for key in ("framework", "grad_reduce_in_fp32", "master_weights", "optimizer_state_dtype", "loss",
                "attention_kernel"):
        if _default(runs, rec, key) is not None:
            plan[key] = _default(runs, rec, key)
    if p.fp8_params:
        plan["fp8_params"] = True
    if p.elementwise_kernels is not None:
        plan["elementwise_kernels"] = p.elementwise_kernels
    if "ep_overlap" in rec.extra_features:
        plan["overlap_moe_comm"] = True
    if overlap:
        plan["overlap_grad_reduce"] = True
        if zero >= 1:
            plan["overlap_param_gather"] = True
    return cluster, plan, {"dp": dp, "vp_priced": vp, "zero_stage": zero, "overlap": overlap, "sp": sp}


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
    """One result row: the record priced as its ``arachne-plan/2`` plan."""
    from arachne.cost import CostModel
    from arachne.plan import plan_from_dict
    from arachne.spec.cluster import cluster_from_dict

    spec = model_of(runs, rec)
    cluster_doc, plan_doc, notes = convert(runs, rec)
    cluster = cluster_from_dict(cluster_doc, rec.id)
    est = CostModel(cluster).estimate(plan_from_dict(plan_doc, rec.id))
    p = rec.parallel
    measured = measured_iteration_s(rec.measured, spec, rec.gpus.count, p.gbs, p.seq)
    gaps = unpriced(runs, rec)
    row: dict[str, Any] = {
        "id": rec.id, "group": group_of(spec, cluster.nodes[0].gpu.name), "fair": not gaps,
        "held_out": rec.held_out, "gpus": rec.gpus.count, "gpu": cluster.nodes[0].gpu.name,
        "config": f"tp{p.tp} pp{p.pp} cp{p.cp} vp{p.vp} ep{p.ep} dp{notes['dp']} mbs{p.mbs} gbs{p.gbs} s{p.seq}",
        "measured_s": measured, "predicted_s": est.iteration_time_s,
        "error_pct": 100 * (est.iteration_time_s - measured) / measured,
        "predicted_memory_gb": est.max_memory_bytes / 1e9, "fits": est.fits,
        "predicted_reserved_gb": max(m.reserved for m in est.memory_detail.values()) / 1e9,
        "measured_memory_gb": rec.measured.peak_memory_gb, "memory_error_pct": None,
        "uses": ",".join(needs(runs, rec)) or "-", "unpriced": ",".join(gaps) or "-",
        "zero_stage": notes["zero_stage"], "overlap": notes["overlap"], "sequence_parallel": notes["sp"],
        "source": f"{rec.source.ref}: {rec.source.table}", "breakdown": dict(est.breakdown),
    }
    if rec.measured.peak_memory_gb:  # published peaks are the caching allocator's reserved peak (torchtitan logs
        # torch.cuda max_reserved): compared with the reserved bound, not the allocated peak that decides fitting
        row["memory_error_pct"] = 100 * (row["predicted_reserved_gb"] - rec.measured.peak_memory_gb) / \
            rec.measured.peak_memory_gb
    return row


def mape(rows: list[dict[str, Any]], key: str = "error_pct") -> float | None:
    xs = [abs(r[key]) for r in rows if r.get(key) is not None]
    return sum(xs) / len(xs) if xs else None


KINDS = (("priced as run", True), ("unpriced feature", False))


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """MAPE per group x (priced as run | uses an unpriced feature) x (visible | held out), overall per split,
    plus memory where published."""
    out = []
    for kind, fair in KINDS:
        for grp in (*GROUPS, "all"):
            for split, held in (("visible", False), ("held-out", True)):
                sel = [r for r in rows if (grp == "all" or r["group"] == grp) and r["fair"] == fair
                       and r["held_out"] == held]
                out.append({"group": grp, "kind": kind, "split": split, "runs": len(sel), "mape_pct": mape(sel),
                            "mean_error_pct": sum(r["error_pct"] for r in sel) / len(sel) if sel else None,
                            "not_fitting": sum(not r["fits"] for r in sel)})
    mem = [r for r in rows if r["memory_error_pct"] is not None]
    out.append({"group": "memory", "kind": "all", "split": "all", "runs": len(mem),
                "mape_pct": mape(mem, "memory_error_pct"), "mean_error_pct": None,
                "not_fitting": sum(not r["fits"] for r in mem)})
    return out


def _short(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per-record table rows narrow enough for 80 columns."""
    return [{"id": r["id"][:28], "held": "yes" if r["held_out"] else "", "meas s": f"{r['measured_s']:.2f}",
             "pred s": f"{r['predicted_s']:.2f}", "err %": f"{r['error_pct']:+.1f}",
             "mem GB": f"{r['predicted_memory_gb']:.0f}", "fits": "yes" if r["fits"] else "NO"} for r in rows]


def run(a) -> None:
    path = Path(getattr(a, "data", None) or DATA)
    try:
        runs = load(path)
        rows = [price(runs, r) for r in runs.records]
    except InputError as e:
        common.fail(str(e))
    for fair, title in ((True, "runs priced as they ran (a fair check)"),
                        (False, "runs using a feature the cost model does not price (NOT a fair check)")):
        sel = [r for r in rows if r["fair"] == fair]
        if sel:
            common.print_table(title, _short(sel))
    groups = summarize(rows)
    common.print_table("iteration-time MAPE % per group (memory: where published)",
                       [{"group": g["group"].replace("Hopper/Blackwell", "H/B"),
                         "kind": "fair" if g["kind"] == "priced as run" else "unpriced" if g["kind"] != "all"
                         else "all", "split": g["split"], "runs": str(g["runs"]),
                         "MAPE %": "-" if g["mape_pct"] is None else f"{g['mape_pct']:.1f}",
                         "mean %": "-" if g["mean_error_pct"] is None else f"{g['mean_error_pct']:+.1f}",
                         "no fit": str(g["not_fitting"])} for g in groups if g["runs"]])
    fair = [r for r in rows if r["fair"]]
    summary = {"records": len(rows), "fair": len(fair), "unpriced": len(rows) - len(fair),
               "mape_fair_pct": mape(fair), "mape_fair_held_out_pct": mape([r for r in fair if r["held_out"]]),
               "mape_fair_visible_pct": mape([r for r in fair if not r["held_out"]]),
               "mape_unpriced_pct": mape([r for r in rows if not r["fair"]]),
               "not_fitting": [r["id"] for r in rows if not r["fits"]],
               "groups": groups, "fitted_on_these_runs": []}
    common.console.print(f"{len(rows)} records: {len(fair)} priced as they ran, {len(rows) - len(fair)} use a "
                         f"feature the cost model does not price (reported apart); predicted not to fit: "
                         f"{len(summary['not_fitting'])}")
    shown = path.resolve().relative_to(common.ROOT) if path.resolve().is_relative_to(common.ROOT) else path.name
    common.write_result(a.out, "published", rows, summary, {"data": str(shown)}, benchmark="cost-model-published")
