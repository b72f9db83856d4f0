"""`arachne gpus` and `arachne models`: the shipped catalogs."""

from __future__ import annotations

import json

import typer

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
        from arachne.report.catalog import gpu_table

        console.print(gpu_table(cat.gpus))

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
        from arachne.report.catalog import model_table

        console.print(model_table(cat.models))
