"""`arachne compare`: several planners side by side on one cluster, model and job."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from arachne.cli.common import console, err_console, handle_errors


def register(app: typer.Typer) -> None:
    @app.command("compare")
    @handle_errors
    def compare(
        cluster: Path = typer.Option(..., "--cluster", "-c", help="cluster YAML/JSON"),
        model: str = typer.Option(..., "--model", "-m", help="catalog model name or model YAML/JSON file"),
        global_batch_size: int = typer.Option(..., "--global-batch-size", "-b", min=1, help="sequences per iteration"),
        sequence_length: int = typer.Option(..., "--sequence-length", "-s", min=1, help="tokens per sequence"),
        planners: str | None = typer.Option(None, "--planners", help="comma-separated planner names "
                                            "(default: every installed planner, plus +ep variants for MoE)"),
        time_budget: float = typer.Option(60.0, "--time-budget", min=0.0, help="planning budget per planner, s"),
        precision: str = typer.Option("bf16", "--precision", help="bf16, fp16 or fp32"),
        profiles: Path | None = typer.Option(None, "--profiles", help="extra profile directory"),
        top_k: int = typer.Option(16, "--top-k", min=1, help="plans re-priced by the common cost model"),
        seed: int = typer.Option(0, "--seed", help="seed for randomised planners"),
        as_json: bool = typer.Option(False, "--json", help="print the results as JSON on stdout"),
        plot: Path | None = typer.Option(None, "--plot", help="write a bar chart (PNG/SVG/PDF)"),
    ) -> None:
        """Run planners side by side; every plan is priced by the same cost model."""
        import sys

        from arachne.cli.estimate_cmds import _cost_model
        from arachne.errors import InputError
        from arachne.planners.harness import parse_planners, run_compare
        from arachne.planners.protocol import SearchBudget
        from arachne.report.compare import compare_table, plot_compare
        from arachne.spec.cluster import load_cluster
        from arachne.spec.job import Job, check_precision
        from arachne.spec.model import load_model

        check_precision(precision)
        if plot is not None and (plot.is_dir() or not plot.parent.exists()):
            raise InputError(str(plot), "--plot", "expected a file path in an existing directory")
        if plot is not None and plot.suffix.lower() not in (".png", ".svg", ".pdf", ".jpg", ".jpeg"):
            raise InputError(str(plot), "--plot", "unsupported image format; use .png, .svg, .pdf or .jpg")
        cl = load_cluster(cluster)
        spec = load_model(model, "", "--model")
        names = parse_planners(planners, spec)
        job = Job(global_batch_size=global_batch_size, sequence_length=sequence_length, precision=precision)
        tty = sys.stderr.isatty()
        budget = SearchBudget(time_budget_s=time_budget, seed=seed, top_k=top_k, progress=tty)

        def started(name: str) -> None:
            if tty:
                err_console.print(f"[dim]planning with {name} ...[/dim]")

        rows = run_compare(cl, spec, job, names, budget, lambda: _cost_model(cl, profiles), started)
        title = (f"{spec.name} on {cl.name} ({cl.num_gpus} GPUs), batch {global_batch_size} x {sequence_length}, "
                 f"{precision}")
        if plot is not None:
            plot_compare(rows, plot, title)
        if as_json:
            print(json.dumps({"results": [r.to_doc() for r in rows]}, indent=2))
            return
        console.print(compare_table(rows, title))
        if plot is not None:
            console.print(f"chart written to {plot}")
