"""`arachne gpus` and `arachne models`: the shipped catalogs."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from arachne.cli.common import console, handle_errors


def register(app: typer.Typer) -> None:
    @app.command("gpus")
    @handle_errors
    def gpus(as_json: bool = typer.Option(False, "--json", help="print the catalog as JSON")) -> None:
        """List the GPU catalog (names, aliases, peak FLOP/s, memory, links)."""
        from arachne.spec.gpus import gpu_catalog

        cat = gpu_catalog()
        if as_json:
            print(json.dumps([g.model_dump() for g in cat.gpus], indent=2))
            return
        t = Table(title="GPU catalog (dense bf16/fp16 TFLOPS; GB; GB/s)")
        for col in ("name", "aliases", "TFLOPS", "mem GB", "HBM GB/s", "intra GB/s", "GPUs/node", "net GB/s"):
            t.add_column(col, justify="right" if col not in ("name", "aliases") else "left")
        for g in cat.gpus:
            t.add_row(g.name, ", ".join(g.aliases), f"{g.peak_tflops:g}", f"{g.memory_gb:g}",
                      f"{g.memory_bandwidth_gbps:g}", f"{g.intra_node_gbps:g} {g.intra_node_link}",
                      str(g.gpus_per_node), f"{g.inter_node_gbps:g}")
        console.print(t)

    @app.command("models")
    @handle_errors
    def models(as_json: bool = typer.Option(False, "--json", help="print the catalog as JSON")) -> None:
        """List the model catalog with parameter counts."""
        from arachne.spec.model import model_catalog

        cat = model_catalog()
        if as_json:
            print(json.dumps([m.model_dump(exclude_defaults=True) | {"num_params": m.num_params}
                              for m in cat.models], indent=2))
            return
        t = Table(title="Model catalog")
        for col in ("name", "params", "active", "layers", "hidden", "ffn", "heads/kv", "experts", "vocab", "seq"):
            t.add_column(col, justify="left" if col == "name" else "right")
        for m in cat.models:
            experts = f"{m.num_experts} top-{m.experts_top_k}" if m.is_moe else "-"
            t.add_row(m.name, f"{m.num_params / 1e9:.2f}B", f"{m.active_params / 1e9:.2f}B", str(m.num_layers),
                      str(m.hidden_size), str(m.ffn_hidden_size), f"{m.num_attention_heads}/{m.kv_heads}",
                      experts, str(m.vocab_size), str(m.max_sequence_length))
        console.print(t)
