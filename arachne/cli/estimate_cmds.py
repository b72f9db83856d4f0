"""`arachne estimate`, `arachne validate-plan` and `arachne profiles import-sailor`."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from arachne.cli.common import console, err_console, handle_errors, print_assumptions

profiles_app = typer.Typer(help="Measured per-layer profiles: import and inspect.", no_args_is_help=True)


def _cost_model(cluster, profiles: Path | None):
    from arachne.cost import CostModel
    from arachne.profiles.format import default_profile_db, merged_profile_db

    return CostModel(cluster, profiles=default_profile_db() if profiles is None else merged_profile_db(profiles))


PLOT_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg")


def check_plot(plot: Path, inputs: dict[str, Path | str | None], output: Path | None = None) -> None:
    """Refuse a ``--plot`` path before any work: an input, the ``-o`` output, an unwritable path or an
    image format matplotlib is not asked to write (formats 8.10)."""
    import os

    from arachne.errors import InputError
    from arachne.fileio import check_output

    check_output(plot, inputs, field="--plot")
    if output is not None and os.path.realpath(plot) == os.path.realpath(output):
        raise InputError(str(plot), "--plot", f"is also the -o output {str(output)!r}; choose another path")
    if plot.suffix.lower() not in PLOT_SUFFIXES:
        raise InputError(str(plot), "--plot", "unsupported image format; use .png, .svg, .pdf or .jpg")


def register(app: typer.Typer) -> None:
    @app.command("estimate")
    @handle_errors
    def estimate(
        cluster: Path = typer.Option(..., "--cluster", "-c", help="cluster YAML/JSON"),
        plan: Path = typer.Option(..., "--plan", "-p", help="plan JSON (formats v1)"),
        profiles: Path | None = typer.Option(None, "--profiles", help="extra profile directory"),
        as_json: bool = typer.Option(False, "--json", help="print the estimate JSON"),
        plot: Path | None = typer.Option(None, "--plot", help="write a figure of the plan: GPUs by stage and "
                                                              "the simulated timeline (PNG/SVG/PDF/JPG)"),
    ) -> None:
        """Price a plan: per-stage time and memory, throughput, MFU, breakdown."""
        from arachne.plan import load_plan, validate_plan
        from arachne.report.tables import plan_report
        from arachne.spec.cluster import load_cluster

        if plot is not None:
            check_plot(plot, {"--cluster": cluster, "--plan": plan, "--profiles": profiles})
        cl = load_cluster(cluster)
        pl = load_plan(plan)
        model = validate_plan(pl, cl, source=str(plan))
        cm = _cost_model(cl, profiles)
        est = cm.estimate(pl.model_copy(update={"model": model.name}) if isinstance(pl.model, str) else pl,
                          validate=False, source=str(plan))
        print_assumptions(cl, cluster)
        if plot is not None:
            from arachne.fileio import replacing
            from arachne.report.plots import plot_plan

            with replacing(plot) as tmp:
                plot_plan(pl, est, cl, tmp)
        if as_json:
            print(json.dumps(est.to_doc(), indent=2))
            return
        from arachne.cost.ceiling import throughput_ceiling

        ceiling = throughput_ceiling(cm, model, pl.global_batch_size, pl.sequence_length, pl.precision)
        console.print(plan_report(pl, est, ceiling_tokens_per_s=ceiling.tokens_per_s))
        if plot is not None:
            console.print(f"figure written to {plot}")

    @app.command("validate-plan")
    @handle_errors
    def validate(
        cluster: Path = typer.Option(..., "--cluster", "-c", help="cluster YAML/JSON"),
        plan: Path = typer.Option(..., "--plan", "-p", help="plan JSON (formats v1)"),
    ) -> None:
        """Check a plan against the format rules and the cluster; exit 2 with the first problem."""
        from arachne.plan import load_plan, validate_plan
        from arachne.spec.cluster import load_cluster

        cl = load_cluster(cluster)
        pl = load_plan(plan)
        model = validate_plan(pl, cl, source=str(plan))
        console.print(f"{plan}: valid ({model.name}, {len(pl.pipelines)} pipeline(s), {len(pl.devices)} GPUs)")

    @profiles_app.command("import-sailor")
    @handle_errors
    def import_sailor_cmd(
        file: Path = typer.Argument(..., help="Sailor profiles_simulator.json or profiles_planner.json"),
        out: Path = typer.Option(..., "-o", "--out", help="output directory"),
        layer_memory: Path | None = typer.Option(None, "--layer-memory", help="Sailor layer_memory.json"),
    ) -> None:
        """Convert Sailor's per-layer profiles into arachne's profile format."""
        from arachne.fileio import check_output
        from arachne.profiles.format import PROFILE_FILE_GLOB
        from arachne.profiles.sailor import import_sailor

        check_output(out, {"Sailor": file, "--layer-memory": layer_memory}, kind="dir", names=[PROFILE_FILE_GLOB])
        result = import_sailor(file, out, layer_memory)
        for skipped in result.skipped:
            err_console.print(f"warning: {file}: skipped {skipped}", markup=False, highlight=False, soft_wrap=True)
        console.print(f"wrote {len(result.written)} profile files to {out}", markup=False, highlight=False,
                      soft_wrap=True)

    @profiles_app.command("list")
    @handle_errors
    def list_profiles(profiles: Path | None = typer.Option(None, "--profiles", help="profile directory "
                                                           "(default: the shipped ones)")) -> None:
        """List profiles: model, GPU, precision, micro-batch sizes and tp degrees."""
        from arachne.profiles.format import ProfileDB, default_profile_db
        from arachne.report.catalog import profile_table

        db = ProfileDB().load_dir(profiles) if profiles else default_profile_db()
        console.print(profile_table(list(db.sets.values())))

    app.add_typer(profiles_app, name="profiles")
