"""`arachne plan`: plan a job on a cluster with any registered planner."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.text import Text

from arachne.cli.common import console, handle_errors, note, print_assumptions
from arachne.spec.job import MAX_GLOBAL_BATCH_SIZE


def register(app: typer.Typer) -> None:
    @app.command("plan")
    @handle_errors
    def plan(
        cluster: Path = typer.Option(..., "--cluster", "-c", help="cluster YAML/JSON"),
        model: str = typer.Option(..., "--model", "-m", help="catalog model name or model YAML/JSON file"),
        global_batch_size: int = typer.Option(..., "--global-batch-size", "-b", min=1, max=MAX_GLOBAL_BATCH_SIZE,
                                              help="sequences per iteration"),
        sequence_length: int = typer.Option(..., "--sequence-length", "-s", min=1, help="tokens per sequence"),
        planner: str = typer.Option("arachne", "--planner", help="arachne (default) or a baseline"),
        time_budget: float = typer.Option(60.0, "--time-budget", min=0.0,
                                          help="planning time budget, s (arachne counts its CPU seconds)"),
        precision: str = typer.Option("bf16", "--precision",
                                      help="bf16, fp16, fp32 or fp8 (FP8 GEMMs where every GPU of a plan has "
                                           "an FP8 rate, bf16 elsewhere; needs --runtime megatron or torchtitan)"),
        profiles: Path | None = typer.Option(None, "--profiles", help="extra profile directory"),
        output: Path | None = typer.Option(None, "-o", "--output", help="write the plan JSON here"),
        as_json: bool = typer.Option(False, "--json", help="print the plan JSON on stdout"),
        plot: Path | None = typer.Option(None, "--plot", help="write a figure of the plan: GPUs by stage and "
                                                              "the simulated timeline (PNG/SVG/PDF/JPG)"),
        top_k: int = typer.Option(16, "--top-k", min=1, help="plans re-priced by the common cost model"),
        seed: int = typer.Option(0, "--seed", help="seed for randomised planners"),
        target: float | None = typer.Option(
            None, "--target", min=0.05,
            help="arachne only: seconds the search aims to finish in (default 1.2, times GPUs / 1,024 past 1,024 "
                 "GPUs, at most 12; capped by --time-budget), "
                 "counted in work done (seconds on a 2-core reference machine), so the same input gets the "
                 "same plan under any load; a target above 0.8 runs the base search first, then keeps "
                 "improving on it"),
        one_process: bool = typer.Option(False, "--one-process",
                                         help="arachne only: no second search in a forked process (on up to 768 "
                                              "GPUs it runs on a second core; the faster plan wins)"),
        objective: str = typer.Option("throughput", "--objective",
                                      help="throughput (default: most tokens/s) or cost (least USD per token; "
                                           "may leave GPUs idle); needs prices (cluster or GPU catalog)"),
        max_cost_per_hour: float | None = typer.Option(None, "--max-cost-per-hour",
                                                       help="hard limit: USD per hour of the GPUs used"),
        min_tokens_per_s: float | None = typer.Option(None, "--min-tokens-per-s", help="hard limit: tokens/s"),
        runtime: str = typer.Option("arachne", "--runtime",
                                    help="what must run the plan: arachne (default), megatron, torchtitan or "
                                         "deepspeed (docs/planner.md lists each preset's rules)"),
        constraints: Path | None = typer.Option(None, "--constraints",
                                                help="YAML/JSON limits narrowing the runtime's (formats v2 10)"),
    ) -> None:
        """Find a fast plan that fits, print it with its estimate, optionally write the plan JSON."""
        import sys

        from arachne.cli.estimate_cmds import _cost_model
        from arachne.errors import InputError
        from arachne.planners.harness import run_planner
        from arachne.planners.protocol import SearchBudget
        from arachne.report.tables import plan_report
        from arachne.spec.cluster import load_cluster
        from arachne.spec.job import Job, check_precision, sequence_error
        from arachne.spec.model import load_model

        check_precision(precision, fp8=True)
        reads = {"--cluster": cluster, "--model": model, "--profiles": profiles, "--constraints": constraints}
        if output is not None:
            from arachne.fileio import check_output

            check_output(output, reads)
        if plot is not None:
            from arachne.cli.estimate_cmds import check_plot

            check_plot(plot, reads, output)
        cl = load_cluster(cluster)
        spec = load_model(model, "", "--model")
        job = Job(global_batch_size=global_batch_size, sequence_length=sequence_length, precision=precision)
        if (why := sequence_error(sequence_length, spec)) is not None:
            raise InputError("", "--sequence-length", why)
        if target is not None and planner != "arachne":
            raise InputError("", "--target", f"only the arachne planner takes a latency target, not {planner!r}")
        from arachne.planners.objective import Objective
        from arachne.spec.constraints import load_constraints
        from arachne.spec.runtimes import Legality

        legality = Legality.of(runtime, load_constraints(constraints) if constraints is not None else None,
                               str(constraints or ""))
        if job.fp8 and legality.constraints.fp8 is False:
            why = (f"the {runtime} runtime runs no fp8 plan (--runtime megatron or torchtitan does)"
                   if legality.runtime.constraints.fp8 is False else f"{constraints} says fp8: false")
            raise InputError("", "--precision", f"fp8 is not allowed: {why}")
        goal = Objective(objective, max_cost_per_hour, min_tokens_per_s)  # type: ignore[arg-type]
        goal.check_prices(cl)
        cm = _cost_model(cl, profiles)
        budget = SearchBudget(time_budget_s=time_budget, seed=seed, top_k=top_k, progress=sys.stderr.isatty())
        if one_process and planner != "arachne":
            raise InputError("", "--one-process", f"only the arachne planner runs a second search, not {planner!r}")
        options = ({"target_s": target} if target is not None else {}) | ({"second_look": False} if one_process
                                                                          else {})
        plan_doc, est, result = run_planner(planner, cl, spec, job, cm, budget, legality, goal, **options)
        print_assumptions(cl, cluster)
        if result.stats.notes.get("guard_expired"):
            note("planning stopped at its CPU-time guard (--time-budget, or 4x --target plus 1 s) before its work "
                 "target: this plan depends on how fast this machine is")
        if output is not None:
            plan_doc.save(output)
        if plot is not None:
            from arachne.fileio import replacing
            from arachne.report.plots import plot_plan

            with replacing(plot) as tmp:
                plot_plan(plan_doc, est, cl, tmp)
        if as_json:
            print(json.dumps(plan_doc.to_doc(), indent=2))
            return
        console.print(Text.assemble((planner, "bold"), f" plan for {spec.name} on {cl.name} ({cl.num_gpus} GPUs): "
                                    f"{result.stats.candidates} candidates, {result.stats.plans_priced} plans priced"))
        from arachne.cost.ceiling import throughput_ceiling

        ceiling = throughput_ceiling(cm, spec, global_batch_size, sequence_length, precision).tokens_per_s
        console.print(plan_report(plan_doc, est, plan_doc.planning_time_s, ceiling, result.stats.notes.get("work_s")))
        if (second := result.stats.notes.get("second_look")) is not None:  # (arachne's, in a forked process)
            console.print(Text(f"second search: {second['error']}" if second.get("error") else
                               f"second search, another process: {second.get('work_s') or 0:.2f} s on the work clock, "
                               + ("found this plan" if second.get("won") else "no faster plan")))
        from arachne.planners.objective import usd_per_million_tokens

        if (usd := usd_per_million_tokens(est)) is not None:
            console.print(f"cost ${est.cost_per_hour:,.2f} per hour for {len(plan_doc.devices)} of {cl.num_gpus} "
                          f"GPUs, ${usd:,.4f} per million tokens")
        if runtime != "arachne" or constraints is not None:
            console.print(f"runtime {runtime}" + (f", constraints {constraints}" if constraints else "") +
                          ": every rule holds")
        if output is not None:
            console.print(f"plan written to {output}")
        if plot is not None:
            console.print(Text(f"figure written to {plot}"))

    @app.command("replan")
    @handle_errors
    def replan_cmd(
        cluster: Path = typer.Option(..., "--cluster", "-c", help="the changed cluster, YAML/JSON"),
        plan: Path = typer.Option(..., "--plan", "-p", help="the running plan JSON (formats v1)"),
        planner: str = typer.Option("arachne", "--planner", help="arachne (default) or a baseline"),
        time_budget: float = typer.Option(60.0, "--time-budget", min=0.0,
                                          help="planning time budget, s (arachne counts its CPU seconds)"),
        target: float | None = typer.Option(None, "--target", min=0.05, help="arachne only: latency target, s of work"),
        profiles: Path | None = typer.Option(None, "--profiles", help="extra profile directory"),
        output: Path | None = typer.Option(None, "-o", "--output", help="write the new plan JSON here"),
        as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
    ) -> None:
        """Re-plan a running job for a changed cluster: the new plan, the old plan's fate, what moving costs."""
        from arachne.cli.estimate_cmds import _cost_model
        from arachne.dynamic import replan
        from arachne.errors import InputError
        from arachne.plan import load_plan
        from arachne.planners.protocol import SearchBudget
        from arachne.report.tables import fmt_bytes, fmt_time, plan_report
        from arachne.spec.cluster import load_cluster
        from arachne.spec.job import sequence_error

        if target is not None and planner != "arachne":
            raise InputError("", "--target", f"only the arachne planner takes a latency target, not {planner!r}")
        if output is not None:
            from arachne.fileio import check_output

            check_output(output, {"--cluster": cluster, "--plan": plan, "--profiles": profiles})
        cl = load_cluster(cluster)
        old = load_plan(plan)
        model = old.resolve_model(str(plan))
        if (why := sequence_error(old.sequence_length, model)) is not None:  # the job itself cannot run
            raise InputError(str(plan), "sequence_length", why)
        options = {"target_s": target} if target is not None else {}
        res = replan(old, cl, SearchBudget(time_budget_s=time_budget), planner, _cost_model(cl, profiles), model,
                     **options)
        print_assumptions(cl, cluster)
        new = res.plan.model_copy(update={"planner": old.planner if res.kept_old else planner,
                                          "planning_time_s": old.planning_time_s if res.kept_old
                                          else round(res.planning_time_s, 6),
                                          "estimate": res.estimate.to_doc(details=False)})
        if output is not None:
            new.save(output)
        if as_json:
            print(json.dumps({**res.to_doc(), "plan": new.to_doc()}, indent=2))
            return
        mig = res.migration
        if res.old_problem:
            console.print(f"the running plan cannot continue on {cl.name}: {res.old_problem}")
        else:
            console.print(f"the running plan still runs on {cl.name}: {res.old_estimate.tokens_per_s:,.0f} tokens/s")
        if res.kept_old:
            console.print(f"keep it: {planner} found nothing faster in {fmt_time(res.planning_time_s)} (wall clock)")
        else:
            console.print(f"new {planner} plan: {res.estimate.tokens_per_s:,.0f} tokens/s, planned in "
                          f"{fmt_time(res.planning_time_s)} (wall clock); moving to it sends "
                          f"{fmt_bytes(mig.bytes_moved)} of "
                          f"model state ({mig.devices_unchanged} of {mig.devices} GPUs keep theirs), about "
                          f"{fmt_time(mig.seconds)} at the receiving nodes' network bandwidth")
            if res.break_even_iterations is not None:
                console.print(f"the move pays for itself after {res.break_even_iterations:,.1f} iterations")
            console.print(plan_report(new, res.estimate, res.planning_time_s))
        if output is not None:
            console.print(f"plan written to {output}")
