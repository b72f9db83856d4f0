"""`arachne compare`: several planners side by side on one cluster, model and job."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from arachne.cli.common import console, err_console, handle_errors, print_assumptions
from arachne.spec.job import MAX_GLOBAL_BATCH_SIZE


def register(app: typer.Typer) -> None:
    @app.command("compare")
    @handle_errors
    def compare(
        cluster: Path = typer.Option(..., "--cluster", "-c", help="cluster YAML/JSON"),
        model: str = typer.Option(..., "--model", "-m", help="catalog model name or model YAML/JSON file"),
        global_batch_size: int = typer.Option(..., "--global-batch-size", "-b", min=1, max=MAX_GLOBAL_BATCH_SIZE,
                                              help="sequences per iteration"),
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
        objective: str = typer.Option("throughput", "--objective", help="throughput or cost (as for plan)"),
        runtime: str = typer.Option("arachne", "--runtime", help="arachne, megatron, torchtitan or deepspeed"),
        constraints: Path | None = typer.Option(None, "--constraints", help="YAML/JSON limits (as for plan)"),
    ) -> None:
        """Run planners side by side; every plan is priced by the same cost model."""
        import sys

        from arachne.cli.estimate_cmds import _cost_model
        from arachne.errors import InputError, NoFeasiblePlanError
        from arachne.planners.harness import parse_planners, run_compare
        from arachne.planners.protocol import SearchBudget
        from arachne.report.compare import compare_table, plot_compare
        from arachne.spec.cluster import load_cluster
        from arachne.spec.job import Job, check_precision, sequence_error
        from arachne.spec.model import load_model

        check_precision(precision)
        if plot is not None:
            from arachne.fileio import check_output

            check_output(plot, {"--cluster": cluster, "--model": model, "--profiles": profiles,
                                "--constraints": constraints}, field="--plot")
        if plot is not None and plot.suffix.lower() not in (".png", ".svg", ".pdf", ".jpg", ".jpeg"):
            raise InputError(str(plot), "--plot", "unsupported image format; use .png, .svg, .pdf or .jpg")
        cl = load_cluster(cluster)
        spec = load_model(model, "", "--model")
        names = parse_planners(planners, spec)
        job = Job(global_batch_size=global_batch_size, sequence_length=sequence_length, precision=precision)
        if (why := sequence_error(sequence_length, spec)) is not None:
            raise InputError("", "--sequence-length", why)
        from arachne.planners.objective import Objective
        from arachne.spec.constraints import load_constraints
        from arachne.spec.runtimes import Legality

        legality = Legality.of(runtime, load_constraints(constraints) if constraints is not None else None,
                               str(constraints or ""))
        goal = Objective(objective)  # type: ignore[arg-type]
        goal.check_prices(cl)
        tty = sys.stderr.isatty()
        budget = SearchBudget(time_budget_s=time_budget, seed=seed, top_k=top_k, progress=tty)

        def started(name: str) -> None:
            if tty:
                err_console.print(f"planning with {name} ...", style="dim")

        rows = run_compare(cl, spec, job, names, budget, lambda: _cost_model(cl, profiles), started, legality, goal)
        if any(r.plan is not None for r in rows):
            print_assumptions(cl, cluster)
        title = (f"{spec.name} on {cl.name} ({cl.num_gpus} GPUs), batch {global_batch_size} x {sequence_length}, "
                 f"{precision}")
        found = any(r.plan is not None for r in rows)
        if plot is not None and found:
            from arachne.fileio import replacing

            with replacing(plot) as tmp:
                plot_compare(rows, tmp, title)
        if as_json:
            print(json.dumps({"results": [r.to_doc() for r in rows]}, indent=2))
        else:
            console.print(compare_table(rows, title))
            from arachne.planners.objective import usd_per_million_tokens

            usd = [(r.planner, usd_per_million_tokens(r.estimate)) for r in rows if r.estimate is not None]
            if usd and all(u is not None for _, u in usd):
                console.print("USD per million tokens: " + ", ".join(f"{n} {u:,.4f}" for n, u in usd))
            if plot is not None and found:
                console.print(f"chart written to {plot}")
        if not found:  # the rows say why for each planner; the exit code agrees with `plan`
            why = f" ({rows[0].planner}: {rows[0].error})" if rows else ""
            raise NoFeasiblePlanError(f"none of the {len(rows)} planner(s) found a plan that fits{why}")
