"""`arachne replay`: every planner follows a trace of a changing cluster; tokens trained, downtime, a figure."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from arachne.cli.common import console, err_console, handle_errors
from arachne.spec.job import MAX_GLOBAL_BATCH_SIZE

DEFAULT_BUDGET_S = 10.0


def register(app: typer.Typer) -> None:
    @app.command("replay")
    @handle_errors
    def replay_cmd(
        trace: str = typer.Option(..., "--trace", "-t", help="trace file (arachne-trace/1 YAML/JSON, or a Sailor "
                                                             "trace JSON), or sailor:spot / sailor:grow"),
        model: str | None = typer.Option(None, "--model", "-m", help="catalog model name or model YAML/JSON file "
                                                                      "(default: the trace's job.model)"),
        global_batch_size: int | None = typer.Option(None, "--global-batch-size", "-b", min=1,
                                                     max=MAX_GLOBAL_BATCH_SIZE,
                                                     help="sequences per iteration (default: the trace's)"),
        sequence_length: int | None = typer.Option(None, "--sequence-length", "-s", min=1,
                                                   help="tokens per sequence (default: the trace's)"),
        planners: str | None = typer.Option(None, "--planners", help="comma-separated planner names (default: "
                                            "every installed planner but the exhaustive oracle, plus +ep "
                                            "variants for MoE)"),
        time_budget: float = typer.Option(DEFAULT_BUDGET_S, "--time-budget", min=0.0,
                                          help="planning budget per planning call, s"),
        precision: str = typer.Option("bf16", "--precision", help="bf16, fp16 or fp32"),
        seed: int = typer.Option(0, "--seed", help="seed for randomised planners and for which of Sailor's spot "
                                                   "VMs leave"),
        output: Path | None = typer.Option(None, "-o", "--output", help="write the result JSON here"),  # noqa: B008
        as_json: bool = typer.Option(False, "--json", help="print the result as one JSON object on stdout"),
        plot: Path | None = typer.Option(  # noqa: B008
            None, "--plot", help="write tokens/s over time, one line per planner (PNG/SVG/PDF/JPG)"),
    ) -> None:
        """Replay a trace of GPUs joining and leaving: every planner re-plans at each change (keep or move),
        paying its measured planning time and the migration model's time as downtime; tokens trained per
        planner."""
        import sys

        from arachne.dynamic.trace import load_trace
        from arachne.errors import InputError, NoFeasiblePlanError
        from arachne.planners.harness import parse_planners
        from arachne.planners.protocol import SearchBudget
        from arachne.spec.job import Job, check_precision, sequence_error
        from arachne.spec.model import load_model

        check_precision(precision)
        tr = load_trace(trace, seed)  # quick: read and resolved, nothing planned yet
        inputs = {"--trace": None if trace.startswith("sailor:") else trace, "--model": model,
                  "--trace cluster": tr.cluster_file}
        if output is not None:
            from arachne.fileio import check_output

            check_output(output, inputs)
        if plot is not None:
            from arachne.cli.estimate_cmds import check_plot

            check_plot(plot, inputs, output)
        model_ref = model or tr.job.model
        gbs = global_batch_size or tr.job.global_batch_size
        seq = sequence_length or tr.job.sequence_length
        for value, flag in ((model_ref, "--model"), (gbs, "--global-batch-size"), (seq, "--sequence-length")):
            if value is None:
                raise InputError("", flag, f"required: the trace {trace!r} does not suggest one")
        if model:
            spec = load_model(model, "", "--model")
        else:  # a trace names catalog models only: it may not make arachne read other files
            spec = load_model(model_ref, trace, "job.model", allow_files=False)
        job = Job(global_batch_size=gbs, sequence_length=seq, precision=precision)
        if (why := sequence_error(seq, spec)) is not None:  # blame the flag, or the trace that suggested it
            raise InputError(*(("", "--sequence-length") if sequence_length else (str(trace), "job.sequence_length")),
                             why)
        names = parse_planners(planners, spec)
        if planners is None:
            names = [n for n in names if n != "exhaustive"]
        budget = SearchBudget(time_budget_s=time_budget, seed=seed)
        result = _run(tr, spec, job, names, budget, sys.stderr.isatty() and not as_json)
        doc = result.to_doc()
        if output is not None:
            from arachne.fileio import write_text_safely

            write_text_safely(output, json.dumps(doc, indent=1) + "\n")
        if plot is not None:
            from arachne.fileio import replacing
            from arachne.report.replay import plot_replay

            with replacing(plot) as tmp:
                plot_replay(result, tmp)
        if as_json:
            print(json.dumps(doc, indent=2))
        else:
            from arachne.report.replay import replay_table

            console.print(replay_table(result))
            if output is not None:
                console.print(f"result written to {output}")
            if plot is not None:
                console.print(f"figure written to {plot}")
        if not any(p.tokens > 0 for p in result.planners):  # the exit code agrees with `compare`
            raise NoFeasiblePlanError(f"none of the {len(names)} planner(s) found a plan that fits at any time "
                                      "of the trace")


def _run(trace, model, job, names, budget, progress: bool):
    """The replay, with a progress bar on a terminal (one step per planning call)."""
    from arachne.cost import CostModel
    from arachne.dynamic.replay import replay

    if not progress:
        return replay(trace, model, job, names, budget, CostModel)
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    total = len(names) * len(trace.snapshots)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console, transient=True) as bar:
        task = bar.add_task(f"replaying with {names[0]}", total=total)

        def step(planner: str, seg) -> None:
            bar.advance(task)
            done = int(bar.tasks[0].completed)
            nxt = names[min(done // len(trace.snapshots), len(names) - 1)]
            bar.update(task, description=f"replaying with {nxt}")

        return replay(trace, model, job, names, budget, CostModel, step)
