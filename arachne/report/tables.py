"""Rich renderings of plans and estimates (each table fits the terminal: see :mod:`arachne.report.fit`)."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Group
from rich.table import Table
from rich.text import Text

from arachne.cost.model import Estimate, StageEstimate
from arachne.plan import Plan
from arachne.report.fit import Fit, caption, column, compact_table, text, wide_table

GIB = 2 ** 30
TIGHT_MEMORY = 0.9  # share of a GPU's memory above which a stage is shown with little headroom (yellow, a remark)


def fmt_bytes(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def fmt_time(s: float) -> str:
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def memory_style(ratio: float) -> str:
    """Red when a stage does not fit, yellow when it has little headroom, else green."""
    return "red" if ratio > 1 else ("yellow" if ratio > TIGHT_MEMORY else "green")


@dataclass(frozen=True)
class _StageRow:
    micro: tuple[int, int] | None  # (micro-batches, size) on a pipeline's first stage
    stage: int
    gpu: str
    layers: tuple[int, int]
    recompute: bool | str
    devices: int
    tp: int
    dp: int
    ep: int
    time_s: float
    memory: float
    capacity: float
    source: str


def _stage_rows(plan: Plan, est: Estimate) -> list[tuple[str, list[_StageRow]]]:
    """(pipe label, its stage rows); consecutive pipelines whose rows are the same are one block (``3-231``)."""
    rows: dict[int, list[_StageRow]] = {}
    for s in est.stages:
        st = plan.pipelines[s.pipeline].stages[s.stage]
        p = plan.pipelines[s.pipeline]
        micro = None if s.stage else (p.micro_batches, plan.mbs(p))
        rows.setdefault(s.pipeline, []).append(
            _StageRow(micro, s.stage, s.gpu, tuple(s.layers), st.recompute, len(st.devices), s.tp, s.dp,
                      s.ep, s.fwd_s + s.bwd_s, s.memory_bytes, s.capacity_bytes, s.source))
    order, blocks, i = sorted(rows), [], 0
    while i < len(order):
        j = i + 1
        while j < len(order) and rows[order[j]] == rows[order[i]]:
            j += 1
        blocks.append((str(order[i]) if j - i == 1 else f"{order[i]}-{order[j - 1]}", rows[order[i]]))
        i = j
    return blocks


def _stage_wide(blocks: list[tuple[str, list[_StageRow]]], title: str) -> Table:
    t = wide_table(title)
    for col, just in (("pipe", "right"), ("µbatches", "right"), ("stage", "right"), ("GPU", "left"),
                      ("layers", "left"), ("GPUs", "right"), ("tp", "right"), ("dp", "right"), ("ep", "right"),
                      ("time/µbatch", "right"), ("memory / capacity", "right"), ("compute from", "left")):
        column(t, col, just)
    for label, block in blocks:
        for k, r in enumerate(block):
            ratio = r.memory / r.capacity
            mem = f"{fmt_bytes(r.memory)} / {fmt_bytes(r.capacity)} ({ratio:.0%})"
            t.add_row(label if k == 0 else "", f"{r.micro[0]} x {r.micro[1]}" if r.micro else "", str(r.stage),
                      text(r.gpu), _layers(r.layers) + _rc(r.recompute),
                      str(r.devices), str(r.tp), str(r.dp), str(r.ep), fmt_time(r.time_s),
                      Text(mem, style=memory_style(ratio)), text(r.source))
    return t


def _layers(layers) -> str:
    """``[a, b)``, or an interleaved stage's chunks ``[a, b)+[c, d)``."""
    if layers and isinstance(layers[0], (tuple, list)):
        return "+".join(f"[{a},{b})" for a, b in layers)
    return f"[{layers[0]}, {layers[1]})"


def _rc(recompute) -> str:
    """The stage's recomputation, short: `` rc`` (full), `` sel`` (selective), nothing otherwise."""
    return {True: " rc", "full": " rc", "selective": " sel"}.get(recompute, "")


def _stage_compact(blocks: list[tuple[str, list[_StageRow]]], title: str) -> Table:
    """Short headers, ``tp/dp/ep`` in one column, memory as peak and share; the GPU count (tp x dp) is dropped
    and the compute source becomes a caption when every stage has the same one."""
    sources = sorted({r.source for _, block in blocks for r in block})
    t = compact_table(title)
    for col, just in (("pipe", "right"), ("µb", "right"), ("st", "right"), ("GPU", "left"), ("layers", "left"),
                      ("tp/dp/ep", "right"), ("time/µb", "right"), ("memory", "right")):
        column(t, col, just)
    if len(sources) > 1:
        column(t, "compute from", "left")
    for label, block in blocks:
        for k, r in enumerate(block):
            ratio = r.memory / r.capacity
            cells = [label if k == 0 else "", f"{r.micro[0]}x{r.micro[1]}" if r.micro else "", str(r.stage),
                     text(r.gpu), _layers(r.layers) + _rc(r.recompute),
                     f"{r.tp}/{r.dp}/{r.ep}", fmt_time(r.time_s),
                     Text(f"{fmt_bytes(r.memory)} {ratio:.0%}", style=memory_style(ratio))]
            t.add_row(*cells, *([text(r.source)] if len(sources) > 1 else []))
    legend = "µb: micro-batches x size; memory: peak per GPU, share of its capacity"
    return caption(t, [legend + (f"; compute from {sources[0]}" if len(sources) == 1 else "")])


def stage_table(plan: Plan, est: Estimate, title: str = "Stages") -> Fit:
    """Per stage: GPU type, layers, tp/dp/ep, time per micro-batch, memory against capacity; per pipeline its
    micro-batches (count x size). Consecutive pipelines whose rows are the same are shown once (``pipe``
    3-231: 229 replicas)."""
    blocks = _stage_rows(plan, est)
    return Fit(lambda: _stage_wide(blocks, title), lambda: _stage_compact(blocks, title))


def pipeline_shapes(plan: Plan) -> str:
    """``232 x 2`` for 232 pipelines of 2 stages; ``16 x 4 + 1 x 3`` for mixed depths, in plan order."""
    runs: list[list[int]] = []
    for p in plan.pipelines:
        if runs and runs[-1][1] == len(p.stages):
            runs[-1][0] += 1
        else:
            runs.append([1, len(p.stages)])
    return " + ".join(f"{n} x {S}" for n, S in runs)


def micro_batch_sizes(plan: Plan) -> str:
    """``micro-batch 2``, or per size the pipelines that use it: ``micro-batches of 2 (96 pipelines), 1 (160)``."""
    count: dict[int, int] = {}
    for p in plan.pipelines:
        count[plan.mbs(p)] = count.get(plan.mbs(p), 0) + 1
    if len(count) == 1:
        return f"micro-batch {next(iter(count))}"
    parts = [f"{b} ({n} pipeline{'s' if n > 1 else ''})" if i == 0 else f"{b} ({n})"
             for i, (b, n) in enumerate(sorted(count.items(), reverse=True))]
    return "micro-batches of " + ", ".join(parts)


def headroom_remark(est: Estimate) -> str | None:
    """A remark when the fullest stage fits but with little memory to spare (above :data:`TIGHT_MEMORY`):
    the estimate is a model, and allocators, fragmentation and framework buffers need room it does not see."""
    worst: StageEstimate | None = max(est.stages, key=lambda s: s.memory_bytes / s.capacity_bytes, default=None)
    if worst is None:
        return None
    ratio = worst.memory_bytes / worst.capacity_bytes
    if not TIGHT_MEMORY < ratio <= 1:
        return None
    return (f"little: pipeline {worst.pipeline} stage {worst.stage} uses {ratio:.0%} of its GPU memory; "
            f"a real run may run out (allocator fragmentation, framework buffers)")


def _summary_rows(plan: Plan, est: Estimate, planning_time_s: float | None, ceiling_tokens_per_s: float | None,
                  search_work_s: float | None) -> list[tuple[str, str | Text]]:
    rows: list[tuple[str, str | Text]] = [
        ("model", text(plan.model_name)),
        ("batch", (f"{plan.global_batch_size} x {plan.sequence_length} tokens, {micro_batch_sizes(plan)}, "
                   f"{plan.precision}, zero {plan.zero_stage}, {plan.schedule}")),
        ("pipelines x stages", pipeline_shapes(plan)),
        ("GPUs used", str(len(plan.devices))),
        ("iteration time", fmt_time(est.iteration_time_s)),
        ("throughput", f"{est.tokens_per_s:,.0f} tokens/s ({est.samples_per_s:,.2f} samples/s)"),
        ("MFU", f"{est.mfu:.1%}"),
    ]
    if ceiling_tokens_per_s:
        reach = est.tokens_per_s / ceiling_tokens_per_s
        rows += [("compute ceiling", f"{ceiling_tokens_per_s:,.0f} tokens/s (this plan reaches {reach:.0%})"),
                 ("", "no plan can pass it on this cluster")]
    rows += [("peak memory", fmt_bytes(est.max_memory_bytes)),
             ("fits", Text("yes", style="green") if est.fits else Text("NO", style="bold red"))]
    if est.fits and (remark := headroom_remark(est)) is not None:
        rows.append(("headroom", Text(remark, style="yellow")))
    for k, v in est.breakdown.items():
        rows.append((f"  {k.removesuffix('_s').replace('_', ' ')}", fmt_time(v)))
    if planning_time_s is not None:
        rows.append(("planning time", f"{fmt_time(planning_time_s)} wall clock on this machine"))
    if search_work_s is not None:
        rows.append(("search work", f"{search_work_s:.2f} s on the work clock (what --target counts)"))
    return rows


def summary_table(plan: Plan, est: Estimate, planning_time_s: float | None = None,
                  ceiling_tokens_per_s: float | None = None, search_work_s: float | None = None) -> Fit:
    """Throughput, MFU, iteration time, fit (with a remark when headroom is small), the time breakdown, the
    compute ceiling and the planning times (wall clock, and the arachne planner's work clock), when given."""
    rows = _summary_rows(plan, est, planning_time_s, ceiling_tokens_per_s, search_work_s)

    def build(table: Table) -> Table:
        column(table, "what", "left")
        column(table, "value", "left")
        for label, value in rows:
            table.add_row(label, value)
        return table

    return Fit(lambda: build(wide_table("Estimate", show_header=False)),
               lambda: build(compact_table("Estimate", show_header=False)))


def plan_report(plan: Plan, est: Estimate, planning_time_s: float | None = None,
                ceiling_tokens_per_s: float | None = None, search_work_s: float | None = None) -> Group:
    return Group(stage_table(plan, est),
                 summary_table(plan, est, planning_time_s, ceiling_tokens_per_s, search_work_s))
