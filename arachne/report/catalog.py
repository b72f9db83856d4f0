"""Tables of the shipped catalogs (`arachne gpus`, `arachne models`) and of loaded profiles (`profiles list`).

Each is a :class:`~arachne.report.fit.Fit`: the full table when it fits, else a compact one that keeps every
name and number whole (short headers, units in the caption, secondary columns left to ``--json``)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from arachne.report.fit import Fit, caption, column, compact_table, text, wide_table


def gpu_table(gpus: list[Any]) -> Fit:
    """Name, aliases, peak TFLOPS, memory, HBM, intra-node and network bandwidth of each GPU type."""

    def wide() -> Table:
        t = wide_table("GPU catalog (dense bf16/fp16 TFLOPS; GB; GB/s)")
        for col in ("name", "aliases", "TFLOPS", "mem GB", "HBM GB/s", "intra GB/s", "GPUs/node", "net GB/s"):
            column(t, col, "left" if col in ("name", "aliases") else "right")
        for g in gpus:
            t.add_row(text(g.name), text(", ".join(g.aliases)), f"{g.peak_tflops:g}", f"{g.memory_gb:g}",
                      f"{g.memory_bandwidth_gbps:g}", f"{g.intra_node_gbps:g} {g.intra_node_link}",
                      str(g.gpus_per_node), f"{g.inter_node_gbps:g}")
        return t

    def compact() -> Table:
        t = compact_table("GPU catalog")
        column(t, "name\naliases", "left")  # the name, then its aliases (dim) wrapped under it
        for col, just in (("peak", "right"), ("mem", "right"), ("HBM", "right"), ("intra", "right"),
                          ("link", "left"), ("node\nGPUs", "right"), ("net", "right")):
            column(t, col, just)
        for g in gpus:
            name = text(g.name)
            if g.aliases:
                name.append("\n" + ", ".join(g.aliases), style="dim")
            t.add_row(name, f"{g.peak_tflops:g}", f"{g.memory_gb:g}", f"{g.memory_bandwidth_gbps:g}",
                      f"{g.intra_node_gbps:g}", g.intra_node_link, str(g.gpus_per_node), f"{g.inter_node_gbps:g}")
        return caption(t, ["peak: dense bf16/fp16 TFLOPS; mem: GB per GPU; HBM, intra (per GPU), net (per node): GB/s"])

    return Fit(wide, compact)


def model_table(models: list[Any]) -> Fit:
    """Parameters (total and active), shape and experts of each model."""

    def row(m: Any, shape: bool) -> list[str | Any]:
        experts = f"{m.num_experts} top-{m.experts_top_k}" if m.is_moe else "-"
        cells = [text(m.name), f"{m.num_params / 1e9:.2f}B", f"{m.active_params / 1e9:.2f}B", str(m.num_layers),
                 str(m.hidden_size)]
        if shape:
            cells.append(str(m.ffn_hidden_size))
        cells += [f"{m.num_attention_heads}/{m.kv_heads}", experts]
        if shape:
            cells.append(str(m.vocab_size))
        return [*cells, str(m.max_sequence_length)]

    def build(shape: bool) -> Table:
        t = wide_table("Model catalog") if shape else compact_table("Model catalog")
        cols = ["name", "params", "active", "layers", "hidden", *(["ffn"] if shape else []), "heads/kv", "experts",
                *(["vocab"] if shape else []), "seq"]
        for col in cols:
            column(t, col, "left" if col == "name" else "right")
        for m in models:
            t.add_row(*row(m, shape))
        return t if shape else caption(t, ["ffn width and vocabulary: arachne models --json"])

    return Fit(lambda: build(True), lambda: build(False))


def profile_table(sets: list[Any]) -> Fit:
    """One row per profile set and tp degree. Sources (free text from the profile files) are numbered and
    listed in full under the table, so that a long one neither widens the table nor is cut."""
    sources: list[str] = []
    rows = []
    for s in sets:
        d = s.doc
        if d.source not in sources:
            sources.append(d.source)
        for tp in s.tps:
            rows.append((text(d.model), text(d.gpu), text(d.precision), str(d.sequence_length), str(tp),
                         ",".join(str(m) for m in sorted(s.by_tp[tp])), str(sources.index(d.source) + 1)))
    notes = [f"source {i}: {src or '(none)'}" for i, src in enumerate(sources, 1)]

    def build(wide: bool) -> Table:
        t = wide_table("Profiles") if wide else compact_table("Profiles")
        for col in ("model", "gpu", "precision", "seq", "tp", "micro-batch sizes", "source"):
            column(t, col, "right" if col in ("seq", "tp", "source") else "left")
        for r in rows:
            t.add_row(*r)
        return caption(t, notes)

    return Fit(lambda: build(True), lambda: build(False))
