"""Rich renderings of plans and estimates."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from arachne.cost.model import Estimate
from arachne.plan import Plan

GIB = 2 ** 30


def fmt_bytes(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def fmt_time(s: float) -> str:
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def stage_table(plan: Plan, est: Estimate, title: str = "Stages") -> Table:
    """Per stage: GPU type, layers, tp/dp/ep, time per micro-batch, memory against capacity; per pipeline its
    micro-batches (count x size). Consecutive pipelines whose rows are the same are shown once (``pipe``
    3-231: 229 replicas)."""
    t = Table(title=title, title_justify="left")
    for col, just in (("pipe", "right"), ("µbatches", "right"), ("stage", "right"), ("GPU", "left"),
                      ("layers", "left"), ("GPUs", "right"), ("tp", "right"), ("dp", "right"), ("ep", "right"),
                      ("time/µbatch", "right"), ("memory / capacity", "right"), ("compute from", "left")):
        t.add_column(col, justify=just)
    rows: dict[int, list[tuple]] = {}
    for s in est.stages:
        st = plan.pipelines[s.pipeline].stages[s.stage]
        ratio = s.memory_bytes / s.capacity_bytes
        style = "red" if ratio > 1 else ("yellow" if ratio > 0.9 else "green")
        mem = f"{fmt_bytes(s.memory_bytes)} / {fmt_bytes(s.capacity_bytes)} ({ratio:.0%})"
        extras = " rc" if st.recompute else ""
        p = plan.pipelines[s.pipeline]
        micro = "" if s.stage else f"{p.micro_batches} x {plan.mbs(p)}"
        rows.setdefault(s.pipeline, []).append(
            (micro, str(s.stage), s.gpu, f"[{s.layers[0]}, {s.layers[1]}){extras}", str(len(st.devices)), str(s.tp),
             str(s.dp), str(s.ep), fmt_time(s.fwd_s + s.bwd_s), (mem, style), s.source))
    order = sorted(rows)
    i = 0
    while i < len(order):
        j = i + 1
        while j < len(order) and rows[order[j]] == rows[order[i]]:
            j += 1
        label = str(order[i]) if j - i == 1 else f"{order[i]}-{order[j - 1]}"
        for k, (mb, stage, gpu, layers, n, tp, dp, ep, tm, (mem, style), src) in enumerate(rows[order[i]]):
            t.add_row(label if k == 0 else "", mb, stage, gpu, layers, n, tp, dp, ep, tm, Text(mem, style=style), src)
        i = j
    return t


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


def summary_table(plan: Plan, est: Estimate, planning_time_s: float | None = None,
                  ceiling_tokens_per_s: float | None = None) -> Table:
    """Throughput, MFU, iteration time, fit, the time breakdown, and (if given) the compute ceiling."""
    t = Table(title="Estimate", title_justify="left", show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    t.add_row("model", plan.model_name)
    t.add_row("batch", f"{plan.global_batch_size} x {plan.sequence_length} tokens, {micro_batch_sizes(plan)}, "
                       f"{plan.precision}, zero {plan.zero_stage}, {plan.schedule}")
    t.add_row("pipelines x stages", pipeline_shapes(plan))
    t.add_row("GPUs used", str(len(plan.devices)))
    t.add_row("iteration time", fmt_time(est.iteration_time_s))
    t.add_row("throughput", f"{est.tokens_per_s:,.0f} tokens/s  ({est.samples_per_s:,.2f} samples/s)")
    t.add_row("MFU", f"{est.mfu:.1%}")
    if ceiling_tokens_per_s:
        t.add_row("compute ceiling", f"{ceiling_tokens_per_s:,.0f} tokens/s on the whole cluster, which no plan "
                                     f"can pass (this one reaches {est.tokens_per_s / ceiling_tokens_per_s:.0%})")
    t.add_row("peak memory", fmt_bytes(est.max_memory_bytes))
    t.add_row("fits", Text("yes", style="green") if est.fits else Text("NO", style="bold red"))
    for k, v in est.breakdown.items():
        t.add_row(f"  {k.removesuffix('_s').replace('_', ' ')}", fmt_time(v))
    if planning_time_s is not None:
        t.add_row("planning time", fmt_time(planning_time_s))
    return t


def plan_report(plan: Plan, est: Estimate, planning_time_s: float | None = None,
                ceiling_tokens_per_s: float | None = None) -> Group:
    return Group(stage_table(plan, est), summary_table(plan, est, planning_time_s, ceiling_tokens_per_s))
