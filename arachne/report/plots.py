"""A plan a person can see: one figure with the cluster's GPUs coloured by the stage they serve and the
cost model's own simulated timeline of one iteration per pipeline.

Render only: :func:`plot_plan` takes a plan, its estimate and the cluster and draws; the timeline comes
from :mod:`arachne.cost.timeline` (the same schedule simulation the cost model prices). matplotlib is
imported inside the drawing function, with the Agg backend.

Readable at 1,000 GPUs: pipelines with the same shape and the same simulated times share a colour family
and one timeline group (``pipelines 0-7 (x8)``); at most ``max_pipelines`` groups are drawn (the slowest),
the other pipelines' GPUs are drawn in one neutral colour; at most about ``max_node_rows`` node rows are
drawn, runs of identical nodes shown as one row (``a100-0..63 (x64)``) and, if that is still too many,
runs of nodes of one GPU type and size as one row whose GPU boxes are split by the share of nodes
serving each stage.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from arachne.cost.timeline import (
    PipelineTimeline,
    exposed_sync_time,
    plan_timelines,
    schedule_time,
)

if TYPE_CHECKING:  # pragma: no cover
    from arachne.cost.model import Estimate, StageEstimate
    from arachne.plan import Plan
    from arachne.spec.cluster import Cluster

FAMILIES = ("Blues", "Oranges", "Greens", "Purples", "Reds", "YlOrBr", "RdPu", "GnBu")
IDLE = "#dcdcdc"
OTHER = "#a89f91"  # GPUs of pipelines not drawn in the timeline
KIND_COLOURS = {"fwd": "#3a76b5", "bwd": "#ee8a3c", "send": "#555555", "bubble": "#f6d3d3",
                "sync": "#4d9e4b", "opt": "#9a5fb0", "steady": "#d9d9d9"}
CHUNK_TINT = 0.45  # an interleaved stage's chunks 1, 3, ...: fwd/bwd mixed this much with white
MAX_TIMELINE_ROWS = 64  # stage rows in the timeline panel

Key = tuple  # (class index, stage), ("other", stage) or None for an idle GPU


def _text(s: object) -> str:
    """User text as matplotlib shows it literally (no mathtext)."""
    from arachne.spec.names import printable

    text = printable(s).encode("utf-8", "backslashreplace").decode("utf-8")  # lone surrogates as escapes
    return text.replace("$", r"\$")


def _ranges(xs: list[int]) -> str:
    """``0-7, 9, 12-13``."""
    out: list[str] = []
    start = prev = xs[0]
    for x in [*xs[1:], None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if x is not None:
            start = prev = x
    text = ", ".join(out)
    return text if len(text) <= 28 else f"{out[0]}, ..., {out[-1]}"


@dataclass
class PipelineClass:
    """Pipelines with the same shape and simulated times: one colour family, one timeline group."""

    members: list[int]
    timeline: PipelineTimeline | None = None

    @property
    def label(self) -> str:
        if len(self.members) == 1:
            return f"pipeline {self.members[0]}"
        return f"pipelines {_ranges(self.members)} (x{len(self.members)})"


def pipeline_classes(plan: Plan, est: Estimate, cluster: Cluster) -> list[PipelineClass]:
    """Group the plan's pipelines by shape (stages' layers, degrees and GPU types, micro-batches) and
    per-stage times, in plan order."""
    devs = cluster.devices
    rows: dict[int, list[StageEstimate]] = {}
    for r in est.stages:
        rows.setdefault(r.pipeline, []).append(r)
    groups: dict[tuple, PipelineClass] = {}
    for pi, p in enumerate(plan.pipelines):
        sig = (p.micro_batches, plan.mbs(p), tuple(
            (st.ranges, st.tp, st.dp_size,
             st.ep, tuple(sorted(Counter(devs[d].gpu.name for d in st.devices).items())),
             round(r.fwd_s, 12), round(r.bwd_s, 12), round(r.send_fwd_s, 12), round(r.send_bwd_s, 12))
            for st, r in zip(p.stages, sorted(rows[pi], key=lambda r: r.stage))))
        groups.setdefault(sig, PipelineClass([])).members.append(pi)
    return list(groups.values())


def choose_shown(classes: list[PipelineClass], makespans: dict[int, float], stages: dict[int, int],
                 max_pipelines: int, max_rows: int = MAX_TIMELINE_ROWS) -> list[int]:
    """Indices of the classes drawn in the timeline: the slowest first while at most ``max_pipelines``
    groups and about ``max_rows`` stage rows fit (always at least the slowest), returned in plan order."""
    order = sorted(range(len(classes)), key=lambda c: (-makespans[classes[c].members[0]], c))
    shown: list[int] = []
    rows = 0
    for c in order:
        n = stages[classes[c].members[0]]
        if shown and (len(shown) >= max_pipelines or rows + n > max_rows):
            break
        shown.append(c)
        rows += n
    return sorted(shown)


@dataclass
class NodeRow:
    """One row of the cluster panel: one node, or a run of nodes of one GPU type and size."""

    names: list[str]
    gpu: str
    gpus: int
    slots: list[Counter] = field(default_factory=list)  # per local GPU index: Key -> nodes

    @property
    def mixed(self) -> bool:
        return any(len(c) > 1 for c in self.slots)

    @property
    def label(self) -> str:
        first, last = self.names[0], self.names[-1]
        if len(self.names) == 1:
            name = first
        else:
            prefix = re.sub(r"\d+$", "", _common_prefix(first, last))
            a, b = first[len(prefix):], last[len(prefix):]
            name = f"{first}..{b}" if prefix and a.isdigit() and b.isdigit() else f"{first} .. {last}"
            name += f" (x{len(self.names)})"
        return f"{name}  {self.gpu}"


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def node_rows(cluster: Cluster, key_of: dict[str, Key], max_rows: int = 40) -> list[NodeRow]:
    """The cluster panel's rows. Every node gets a row when there are at most ``max_rows`` nodes;
    otherwise consecutive identical nodes (same GPU type, size and stage of every GPU) share a row, and
    if that is still too many, the longest runs of consecutive nodes of one GPU type and size are
    collapsed into one row each (their boxes split by share)."""
    exact: list[NodeRow] = []
    for node in cluster.nodes:
        slots = [Counter({key_of.get(f"{node.name}:{i}"): 1}) for i in range(node.num_gpus)]
        exact.append(NodeRow([node.name], node.gpu.name, node.num_gpus, slots))
    if len(exact) <= max_rows:
        return exact
    merged: list[NodeRow] = []
    for row in exact:
        prev = merged[-1] if merged else None
        if prev is not None and (prev.gpu, prev.gpus) == (row.gpu, row.gpus) and _same_keys(prev, row):
            prev.names.append(row.names[0])
            for c, r in zip(prev.slots, row.slots):
                c.update(r)
            continue
        merged.append(NodeRow(list(row.names), row.gpu, row.gpus, [Counter(c) for c in row.slots]))
    if len(merged) <= max_rows:
        return merged
    # runs of one GPU type and size
    runs: list[list[NodeRow]] = []
    for row in merged:
        if runs and (runs[-1][-1].gpu, runs[-1][-1].gpus) == (row.gpu, row.gpus):
            runs[-1].append(row)
        else:
            runs.append([row])
    total = sum(len(r) for r in runs)
    for i in sorted(range(len(runs)), key=lambda i: -len(runs[i])):
        if total <= max_rows:
            break
        if len(runs[i]) > 1:
            total -= len(runs[i]) - 1
            runs[i] = [_collapse(runs[i])]
    out = [row for run in runs for row in run]
    if len(out) > max_rows:  # more GPU-type runs than rows: keep the first, say how many are left out
        rest = out[max_rows - 1:]
        names = [n for r in rest for n in r.names]
        out = out[:max_rows - 1] + [NodeRow(names, f"and {len(names)} more nodes not drawn", 0, [])]
    return out


def _same_keys(a: NodeRow, b: NodeRow) -> bool:
    return [list(c) for c in a.slots] == [list(c) for c in b.slots]


def _collapse(rows: list[NodeRow]) -> NodeRow:
    out = NodeRow([n for r in rows for n in r.names], rows[0].gpu, rows[0].gpus,
                  [Counter() for _ in range(rows[0].gpus)])
    for r in rows:
        for c, s in zip(out.slots, r.slots):
            c.update(s)
    return out


def _stage_gpus(plan: Plan, cluster: Cluster, pi: int, si: int) -> str:
    devs = cluster.devices
    counts = Counter(devs[d].gpu.name for d in plan.pipelines[pi].stages[si].devices)
    return " + ".join(f"{n}x{g}" for g, n in counts.items())


def _layers(st) -> str:
    return ", ".join(f"[{a}, {b})" for a, b in st.ranges)


def _tint(colour: str, amount: float) -> str:
    """``colour`` (``#rrggbb``) mixed with white by ``amount`` (0: itself)."""
    rgb = [int(colour[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(x + (255 - x) * amount):02x}" for x in rgb)


def _fmt_s(s: float) -> str:
    if s == 0:
        return "0 s"
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


def _si(x: float) -> str:
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def plot_plan(plan: Plan, est: Estimate, cluster: Cluster, path: str | Path, max_node_rows: int = 40,
              max_pipelines: int = 8) -> None:
    """Write the figure of ``plan`` (priced as ``est`` on ``cluster``) to ``path`` (PNG, SVG, PDF or JPG,
    by suffix)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle
    from matplotlib.transforms import blended_transform_factory

    classes = pipeline_classes(plan, est, cluster)
    drawable = list(range(len(classes)))
    reps = [classes[ci].members[0] for ci in drawable]
    timelines = {t.pipeline: t for t in plan_timelines(plan, est, reps)}
    for ci in drawable:
        classes[ci].timeline = timelines[classes[ci].members[0]]
    makespans = {pi: t.makespan for pi, t in timelines.items()}
    n_stages = {pi: len(plan.pipelines[pi].stages) for pi in reps}
    picked = choose_shown([classes[ci] for ci in drawable], makespans, n_stages, max_pipelines) if drawable else []
    shown = [drawable[k] for k in picked]
    family_of = {c: FAMILIES[k % len(FAMILIES)] for k, c in enumerate(shown)}

    def stage_colour(ci: int, si: int, S: int):
        cmap = matplotlib.colormaps[family_of[ci]]
        return cmap(0.45 + 0.45 * (si / (S - 1) if S > 1 else 0.5))

    key_of: dict[str, Key] = {}
    where: dict[str, tuple[int, int]] = {}  # device -> (pipeline, stage)
    colour_of: dict[Key, object] = {None: IDLE}
    for ci, c in enumerate(classes):
        for pi in c.members:
            S = len(plan.pipelines[pi].stages)
            for si, st in enumerate(plan.pipelines[pi].stages):
                k: Key = (ci, si) if ci in family_of else ("other", si)
                colour_of[k] = stage_colour(ci, si, S) if ci in family_of else OTHER
                for d in st.devices:
                    key_of[d] = k
                    where[d] = (pi, si)
    rows = node_rows(cluster, key_of, max_node_rows)

    # ---- layout -----------------------------------------------------------------------------------
    t_pipe = schedule_time(est)
    sync = exposed_sync_time(est)
    opt = est.breakdown.get("optimizer_s", 0.0)
    t_iter = est.iteration_time_s
    tl_rows: list[tuple[str, int, int] | tuple[str, int]] = []  # ("head", ci) / ("stage", ci, si)
    for ci in shown:
        tl_rows.append(("head", ci))
        for si in range(n_stages[classes[ci].members[0]]):
            tl_rows.append(("stage", ci, si))
    top_h = 0.9 + 0.3 * len(rows)
    bot_h = 1.2 + 0.26 * len(tl_rows)
    fig = plt.figure(figsize=(15, top_h + bot_h + 1.3))  # inches
    fig_h = top_h + bot_h + 1.3
    gs = fig.add_gridspec(2, 1, height_ratios=[top_h, bot_h], hspace=0.12 + 0.6 / (top_h + bot_h),
                          left=0.27, right=0.80, top=1 - 1.05 / fig_h, bottom=0.55 / fig_h)
    ax_n = fig.add_subplot(gs[0])
    ax_t = fig.add_subplot(gs[1])

    used = len(key_of)
    fits = "" if est.fits else "  (does NOT fit in memory)"
    title = (f"{_text(plan.model_name)} on {_text(cluster.name)}: {used} of {cluster.num_gpus} GPUs, "
             f"batch {plan.global_batch_size} x {plan.sequence_length}, {plan.precision}, {plan.schedule}{fits}\n"
             f"{_si(est.tokens_per_s)} tokens/s, {est.samples_per_s:.3g} samples/s, iteration {_fmt_s(t_iter)} "
             f"(pipeline {_fmt_s(t_pipe)} + gradient sync {_fmt_s(sync)} + optimizer {_fmt_s(opt)}), "
             f"MFU {est.mfu:.0%}")
    fig.suptitle(title, fontsize=11, y=1 - 0.12 / fig_h, va="top")

    # ---- cluster panel ----------------------------------------------------------------------------
    maxg = max((r.gpus for r in rows), default=1) or 1
    fig_w_in = 15 * (0.80 - 0.27)
    box_in = fig_w_in / maxg
    label_boxes = box_in >= 0.35 and len(rows) <= 40
    for y, row in enumerate(rows):
        for i, slot in enumerate(row.slots):
            n = sum(slot.values())
            by_colour: Counter = Counter()  # segments of one colour drawn as one
            for k, cnt in sorted(slot.items(), key=lambda kv: (kv[0] is None, str(kv[0]))):
                by_colour[matplotlib.colors.to_hex(colour_of[k])] += cnt
            top = y - 0.4
            for colour, cnt in by_colour.items():
                h = 0.8 * cnt / n
                ax_n.add_patch(Rectangle((i + 0.05, top), 0.9, h, facecolor=colour, edgecolor="white",
                                         linewidth=0.6))
                top += h
            if label_boxes and len(slot) == 1:
                k = next(iter(slot))
                if k is not None:
                    txt = f"s{k[1]}"
                    if len(row.names) == 1 and box_in >= 0.6:  # one node: its GPU's own pipeline
                        pi, si = where[f"{row.names[0]}:{i}"]
                        txt = f"p{pi} s{si}"
                    ax_n.text(i + 0.5, y, txt, ha="center", va="center", fontsize=7,
                              color="white" if k[0] != "other" and k[1] > 0 else "#222")
    ax_n.set_xlim(0, maxg)
    ax_n.set_ylim(len(rows) - 0.5, -0.5)
    ax_n.set_yticks(range(len(rows)))
    ax_n.set_yticklabels([_text(r.label) + ("  (mixed)" if r.mixed else "") for r in rows], fontsize=8)
    ax_n.set_xticks([i + 0.5 for i in range(maxg)] if maxg <= 16 else [])
    ax_n.set_xticklabels([str(i) for i in range(maxg)] if maxg <= 16 else [], fontsize=7)
    ax_n.tick_params(length=0)
    for s in ax_n.spines.values():
        s.set_visible(False)
    ax_n.set_title("GPUs by node, coloured by the pipeline stage they serve", fontsize=10, loc="left")
    handles = []
    for ci in shown:
        S = n_stages[classes[ci].members[0]]
        if len(shown) * S <= 24:
            for si in range(S):
                handles.append(Patch(facecolor=colour_of[(ci, si)], label=f"{classes[ci].label}, stage {si}"))
        else:
            handles.append(Patch(facecolor=stage_colour(ci, S // 2, S),
                                 label=f"{classes[ci].label}, stages 0-{S - 1} light to dark"))
    others = [pi for ci, c in enumerate(classes) if ci not in family_of for pi in c.members]
    if others:
        handles.append(Patch(facecolor=OTHER, label=f"{len(others)} other pipelines (not in the timeline)"))
    n_idle = cluster.num_gpus - used
    handles.append(Patch(facecolor=IDLE, label=f"idle ({n_idle} GPUs)"))
    ax_n.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7.5, frameon=False,
                borderaxespad=0)

    # ---- timeline panel ---------------------------------------------------------------------------
    stage_rows = {(r.pipeline, r.stage): r for r in est.stages}
    trans = blended_transform_factory(ax_t.transAxes, ax_t.transData)
    labels = []
    h = 0.72
    for y, row in enumerate(tl_rows):
        ci = row[1]
        c = classes[ci]
        rep = c.members[0]
        tl = c.timeline
        assert tl is not None
        if row[0] == "head":
            slow = "  <- slowest" if tl.makespan >= max(makespans.values()) else ""
            labels.append("")
            v = plan.pipelines[rep].virtual_stages
            inter = f", interleaved x{v}" if v > 1 else ""
            ax_t.text(-0.005, y + 0.15, f"{c.label}: {tl.micro_batches} micro-batches of "
                      f"{plan.mbs(plan.pipelines[rep])}{inter}, {_fmt_s(tl.makespan)}{slow}",
                      transform=trans, ha="right", va="center", fontsize=8, fontweight="bold")
            continue
        si = row[2]
        st = plan.pipelines[rep].stages[si]
        r = stage_rows[(rep, si)]
        labels.append(f"s{si}: {_stage_gpus(plan, cluster, rep, si)}, tp{st.tp}, layers {_layers(st)}, "
                      f"f+b {_fmt_s(r.fwd_s + r.bwd_s)}")
        ax_t.add_patch(Rectangle((-0.016, y - 0.35), 0.01, 0.7, transform=trans, clip_on=False,
                                 facecolor=colour_of[(ci, si)], edgecolor="none"))
        ax_t.broken_barh([(0, t_pipe)], (y - h / 2, h), facecolors=KIND_COLOURS["bubble"], linewidth=0)
        evs = [e for e in tl.events if e.stage == si]
        for kind in ("fwd", "bwd"):
            for odd in (0, 1):  # an interleaved stage's odd chunks in a lighter shade
                bars = [(e.start, e.end - e.start) for e in evs if e.kind == kind and e.chunk % 2 == odd]
                if bars:
                    ax_t.broken_barh(bars, (y - h / 2, h), facecolors=_tint(KIND_COLOURS[kind], odd * CHUNK_TINT),
                                     linewidth=0)
        for stage, t0, t1, _ in tl.steady:  # the steady state the timeline does not list, one band
            if stage == si:
                ax_t.broken_barh([(t0, t1 - t0)], (y - h / 2, h), facecolors=KIND_COLOURS["steady"],
                                 edgecolors="#888", hatch="xx", linewidth=0.3)
        sends = [(e.start, e.end - e.start) for e in evs if e.kind == "send"]
        if sends and len(sends) <= 120:
            ax_t.broken_barh(sends, (y - 0.14, 0.28), facecolors="white", edgecolors=KIND_COLOURS["send"],
                             hatch="////", linewidth=0.3)
        elif sends:  # too many to hatch: a thin solid bar each
            ax_t.broken_barh(sends, (y - 0.1, 0.2), facecolors=KIND_COLOURS["send"], linewidth=0)
        if sync > 0:
            ax_t.broken_barh([(t_pipe, sync)], (y - h / 2, h), facecolors=KIND_COLOURS["sync"], linewidth=0)
        if opt > 0:
            ax_t.broken_barh([(t_pipe + sync, opt)], (y - h / 2, h), facecolors=KIND_COLOURS["opt"], linewidth=0)
    ax_t.set_ylim(len(tl_rows) - 0.5, -0.6)
    ax_t.set_yticks(range(len(tl_rows)))
    ax_t.set_yticklabels([_text(x) for x in labels], fontsize=7.5)
    ax_t.tick_params(axis="y", length=0, pad=16)
    ax_t.set_xlim(0, t_iter * 1.005)
    ax_t.set_xlabel("time in one iteration (s)", fontsize=9)
    ax_t.axvline(t_pipe, color="#444", linestyle="--", linewidth=0.8)
    ax_t.axvline(t_iter, color="#444", linestyle=":", linewidth=0.8)
    for s in ("top", "right", "left"):
        ax_t.spines[s].set_visible(False)
    n_pipes = len(plan.pipelines)
    what = (f"all {n_pipes} pipeline{'s' if n_pipes > 1 else ''}" if len(shown) == len(classes) else
            f"{len(shown)} of {len(classes)} pipeline shapes ({sum(len(classes[c].members) for c in shown)} of "
            f"{n_pipes} pipelines, the slowest)")
    ax_t.set_title(f"the cost model's simulated timeline of one iteration: {what}", fontsize=10, loc="left")
    b = est.breakdown
    kinds = [Patch(facecolor=KIND_COLOURS["fwd"], label="forward"),
             Patch(facecolor=KIND_COLOURS["bwd"], label="backward" + (" (with recompute)" if any(
                 st.recompute for p in plan.pipelines for st in p.stages) else "")),
             Patch(facecolor="white", edgecolor=KIND_COLOURS["send"], hatch="////", label="send (p2p)"),
             Patch(facecolor=KIND_COLOURS["bubble"], label="idle: bubble, waiting"),
             Patch(facecolor=KIND_COLOURS["sync"], label=f"gradient sync {_fmt_s(sync)}"
                   + (" (exposed)" if "dp_sync_exposed_s" in b and sync != b.get("dp_sync_s") else "")),
             Patch(facecolor=KIND_COLOURS["opt"], label=f"optimizer {_fmt_s(opt)}")]
    cut = max((c.timeline.steady[0][3] for ci in shown if (c := classes[ci]).timeline and c.timeline.steady),
              default=0)
    if cut:
        kinds.append(Patch(facecolor=KIND_COLOURS["steady"], edgecolor="#888", hatch="xx",
                           label=f"steady state: {cut:,} micro-batches"))
    if any(plan.pipelines[classes[ci].members[0]].virtual_stages > 1 for ci in shown):
        kinds[2:2] = [Patch(facecolor=_tint(KIND_COLOURS["fwd"], CHUNK_TINT), label="forward, odd chunks"),
                      Patch(facecolor=_tint(KIND_COLOURS["bwd"], CHUNK_TINT), label="backward, odd chunks")]
    leg = ax_t.legend(handles=kinds, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7.5, frameon=False,
                      borderaxespad=0)
    crit = (f"slowest pipeline's bottleneck stage:\n"
            f"compute {_fmt_s(b.get('compute_s', 0.0))}\n"
            f"bubble {_fmt_s(b.get('pipeline_bubble_s', 0.0))}"
            + (f"\np2p {_fmt_s(b['p2p_s'])}" if b.get("p2p_s") else "")
            + (f"\ntp comm {_fmt_s(b['tp_comm_s'])}" if b.get("tp_comm_s") else "")
            + (f"\nep comm {_fmt_s(b['ep_comm_s'])}" if b.get("ep_comm_s") else ""))
    ax_t.add_artist(leg)
    ax_t.text(1.01, 0.0, crit, transform=ax_t.transAxes, fontsize=7.5, va="bottom", ha="left", color="#333")
    fig.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.25)
    plt.close(fig)
