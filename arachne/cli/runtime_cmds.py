"""`arachne run`, `arachne profile` and `arachne export`: execute, measure and hand off plans.

torch is imported only inside `run` and `profile`, so `arachne --help` stays light.
"""

from __future__ import annotations

import functools
import json
import math
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from arachne.cli.common import console, err_console, fail, handle_errors
from arachne.errors import InputError


def _profile_db(profiles: Path | None) -> Any:
    """The shipped profiles plus those of ``profiles`` (later files override)."""
    from arachne.profiles.format import merged_profile_db

    return merged_profile_db(profiles)


def _need_torch(command: str) -> None:
    """Fail with one line when torch (the ``runtime`` extra) is missing."""
    try:
        import torch  # noqa: F401
    except ImportError:
        fail(f"`arachne {command}` needs PyTorch: pip install 'arachne[runtime]'", 2)


# What each command writes inside its output directory (glob patterns), so that an input there is never
# written over: arachne.runtime.checkpoint's layout, and export's files per format.
CHECKPOINT_NAMES = ("latest", "latest.tmp", "step-*", ".tmp-step-*", ".staging-step-*", ".lock")
MAX_THREADS = 1024  # profile --threads (far more makes OpenMP crash)
EXPORT_NAMES = {"megatron": ("megatron_args.txt", "megatron.json"), "torchrun": ("rank_map.json", "launch_*.sh"),
                "torchrun-elastic": ("elastic.json", "elastic_store.sh", "launch_*.sh")}


def _export_elastic(pl: Any, cl: Any, plan: Path, cluster: Path, out: Path | None, as_json: bool,
                    store_host: str | None, store_port: int, job: Any) -> None:
    """``export --format torchrun --elastic``: the store host's command and one agent command per node."""
    from arachne.fileio import write_text_safely
    from arachne.runtime.elastic_export import elastic_export, elastic_files, elastic_text
    from arachne.runtime.export import output_path

    doc = elastic_export(pl, cl, str(plan), str(cluster), job, store_host, store_port)
    if out is None:
        print(json.dumps(doc, indent=1) if as_json else elastic_text(doc))
        return
    # every name and value checked, and every path kept inside out/, before anything is written (or exit 2)
    files = [(output_path(out, name), text, executable) for name, text, executable in elastic_files(doc)]
    out.mkdir(parents=True, exist_ok=True)
    for path, text, executable in files:
        write_text_safely(path, text)
        if executable:
            path.chmod(0o755)
    console.print(f"wrote {out / 'elastic.json'}, {out / 'elastic_store.sh'} (run it on {doc['store_host']}) and "
                  f"{len(doc['nodes'])} agent launch script(s)", markup=False, highlight=False, soft_wrap=True)


def _int_list(text: str, flag: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise InputError("", flag, f"expected comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise InputError("", flag, f"expected positive integers, got {text!r}")
    return vals


def _stoppable(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``fn`` under :func:`arachne.runtime.signals.stop_on_signals`: SIGTERM, SIGHUP and SIGINT end
    it with one line and exit code 128 + the signal, once everything it started has stopped."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from arachne.runtime.signals import Stopped, stop_on_signals

        with stop_on_signals():
            try:
                return fn(*args, **kwargs)
            except Stopped as exc:
                fail(str(exc), exc.exit_code)

    return wrapper


def register(app: typer.Typer) -> None:
    @app.command("run")
    @handle_errors
    @_stoppable
    def run(
        cluster: Path = typer.Option(..., "--cluster", "-c", help="cluster YAML/JSON"),
        plan: Path = typer.Option(..., "--plan", "-p", help="plan JSON (formats v1)"),
        steps: int = typer.Option(3, "--steps", min=1,
                                  help="iterations to run now (after a resume: this many more, not a total)"),
        as_json: bool = typer.Option(False, "--json", help="one JSON object per step on stdout"),
        seed: int = typer.Option(0, "--seed", help="seed of the initial weights and the synthetic data"),
        simulate_devices: bool = typer.Option(False, "--simulate-devices",
                                              help="one CPU process (gloo) per plan device"),
        checkpoint_dir: Path | None = typer.Option(None, "--checkpoint-dir",
                                                   help="save state every step; resume from it if present"),
        measure: bool = typer.Option(False, "--measure", help="report measured vs estimated iteration time"),
        profiles: Path | None = typer.Option(None, "--profiles", help="extra profile directory for --measure"),
        lr: float = typer.Option(1e-3, "--lr", help="learning rate"),
        timeout: float = typer.Option(300.0, "--timeout",
                                      help="seconds a collective may wait before failing (at most a week)"),
        elastic: bool = typer.Option(False, "--elastic", help="elastic: each node a torch elastic agent; re-plan "
                                                               "when nodes leave or join (needs --simulate-devices)"),
        min_nodes: int = typer.Option(1, "--min-nodes", min=1, help="--elastic: fewest nodes to run with"),
        max_nodes: int | None = typer.Option(None, "--max-nodes", min=1, help="--elastic: most nodes (default: all)"),
        checkpoint_every: int = typer.Option(1, "--checkpoint-every", min=1, help="--elastic: save every N steps"),
        horizon_steps: int = typer.Option(1000, "--horizon-steps", min=1,
                                          help="--elastic: take a joining node only if that pays within N steps"),
        store: str | None = typer.Option(None, "--store", metavar="HOST:PORT",
                                         help="--elastic on a cluster: host the job's store here, reached at "
                                              "HOST:PORT by the agents (export --format torchrun --elastic)"),
        initial_nodes: str | None = typer.Option(None, "--initial-nodes", metavar="N1,N2",
                                                 help="--elastic: nodes admitted together at the start "
                                                      "(default: all simulated nodes; with --store the plan's)"),
    ) -> None:
        """Train a plan for real: one process per plan device, synthetic data, PyTorch distributed."""
        from arachne.plan import load_plan, validate_plan
        from arachne.plan_rules import refuse_v2, same_math_plan
        from arachne.runtime.flags import check_lr, check_timeout
        from arachne.spec.cluster import load_cluster

        check_timeout(timeout)
        check_lr(lr)
        if not elastic and (store is not None or initial_nodes is not None):
            raise InputError("", "--store" if store is not None else "--initial-nodes", "only with --elastic")
        if checkpoint_dir is not None:
            from arachne.fileio import check_output

            check_output(checkpoint_dir, {"--cluster": cluster, "--plan": plan, "--profiles": profiles}, kind="dir",
                         field="--checkpoint-dir", names=CHECKPOINT_NAMES)
        cl = load_cluster(cluster)
        if elastic:  # its flags, before anything slow
            from arachne.runtime.elastic_export import check_elastic_run, parse_nodes

            check_elastic_run(cl, simulate_devices, store, checkpoint_dir, min_nodes, max_nodes)
            parse_nodes(initial_nodes, cl)
        pl = load_plan(plan)
        model = validate_plan(pl, cl, source=str(plan))
        pl, notes = same_math_plan(pl)  # v2 settings that leave the computed values alone run as v1 equivalents
        for note in notes:
            print(f"note: {plan}: {note}", file=sys.stderr)
        refuse_v2(pl, model, str(plan), "arachne run")  # formats v2 features the runtime does not run yet
        db = _profile_db(profiles) if measure else None
        _need_torch("run")
        if elastic:  # arachne/runtime/elastic_agent.py
            from arachne.runtime.elastic_agent import ElasticConfig, run_from_cli
            from arachne.runtime.elastic_export import parse_nodes

            run_from_cli(pl, model, cl, ElasticConfig(
                steps=steps, checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,  # type: ignore[arg-type]
                horizon_steps=horizon_steps, min_nodes=min_nodes, max_nodes=max_nodes, seed=seed, lr=lr,
                timeout_s=timeout, initial_nodes=parse_nodes(initial_nodes, cl)), simulate_devices, as_json, store)
            return

        from arachne.runtime.launch import JobError, RunConfig, StepRecord, run_plan

        def show(rec: StepRecord) -> None:
            if as_json:
                print(json.dumps(rec.to_dict()), flush=True)
            else:
                console.print(f"step {rec.step:>4}  loss {rec.loss:.6f}  time {rec.time_s:.4f} s")

        cfg = RunConfig(steps=steps, seed=seed, lr=lr, simulate_devices=simulate_devices,
                        checkpoint_dir=checkpoint_dir, timeout_s=timeout)
        try:
            result = run_plan(pl, model, cfg, on_step=show,
                              log=lambda m: err_console.print(m, markup=False, highlight=False, soft_wrap=True))
        except JobError as exc:
            fail(str(exc), 1)
            return
        if measure:
            from arachne.runtime.measure import measure as do_measure

            m = do_measure(pl, cl, [r.time_s for r in result.records], db)
            if as_json:
                print(json.dumps(m.to_dict()), flush=True)
            else:
                console.print(m.line(), markup=False, highlight=False)

    @app.command("profile")
    @handle_errors
    def profile(
        model: str = typer.Option(..., "--model", "-m", help="catalog name or model YAML/JSON"),
        out: Path = typer.Option(..., "-o", "--out", help="output directory"),
        micro_batch_sizes: str = typer.Option("1,2,4", "--micro-batch-sizes", help="comma-separated"),
        tp: str = typer.Option("1", "--tp", help="comma-separated TP degrees (tp > 1 runs tp processes)"),
        sequence_length: int | None = typer.Option(None, "--sequence-length", min=1,
                                                   help="default: min(2048, max_sequence_length)"),
        precision: str = typer.Option("fp32", "--precision", help="fp32, bf16 or fp16"),
        gpu: str | None = typer.Option(None, "--gpu", help="GPU type name to file the profile under"),
        blocks: int = typer.Option(2, "--blocks", min=1, help="blocks of each kind to measure (rest copied)"),
        repeats: int = typer.Option(3, "--repeats", min=1, help="timed repetitions (median)"),
        threads: int | None = typer.Option(None, "--threads", min=1, help="CPU threads for compute (1 to 1024)"),
        num_layers: int | None = typer.Option(None, "--num-layers", min=1, help="override (a quick profile)"),
        hidden_size: int | None = typer.Option(None, "--hidden-size", min=1, help="override"),
        ffn_hidden_size: int | None = typer.Option(None, "--ffn-hidden-size", min=1, help="override"),
        num_attention_heads: int | None = typer.Option(None, "--num-attention-heads", min=1, help="override"),
        vocab_size: int | None = typer.Option(None, "--vocab-size", min=1, help="override"),
    ) -> None:
        """Measure per-layer forward/backward time, optimizer step and activation memory on this machine.

        Overriding shapes renames the model (e.g. ``OPT-350M.hidden-256``) so that the profile
        is never taken for the real model's.
        """
        from arachne.fileio import check_output
        from arachne.profiles.format import PROFILE_FILE_GLOB
        from arachne.spec.job import check_precision, sequence_error
        from arachne.spec.model import load_model, model_from_dict

        if threads is not None and not 1 <= threads <= MAX_THREADS:
            raise InputError("", "--threads", f"expected 1 to {MAX_THREADS} CPU threads, got {threads}")
        check_output(out, {"--model": model}, kind="dir", names=[PROFILE_FILE_GLOB])
        check_precision(precision)
        if gpu is not None:  # the profile is filed under a GPU type the planner knows (or CPU)
            from arachne.spec.gpus import gpu_catalog

            known = gpu_catalog().get(gpu)
            if known is None and gpu.upper() != "CPU":
                raise InputError("", "--gpu", f"unknown GPU type {gpu!r} (see `arachne gpus`)")
            gpu = known.name if known is not None else "CPU"
        spec = load_model(model, "", "--model")
        over = {k: v for k, v in (("num_layers", num_layers), ("hidden_size", hidden_size),
                                  ("ffn_hidden_size", ffn_hidden_size), ("num_attention_heads", num_attention_heads),
                                  ("vocab_size", vocab_size)) if v is not None}
        if over:
            doc = spec.model_dump() | over
            if "num_attention_heads" in over or "hidden_size" in over:
                heads = doc["num_attention_heads"]
                doc["num_kv_heads"] = None if spec.num_kv_heads is None else math.gcd(spec.kv_heads, heads)
            short = {"num_layers": "layers", "hidden_size": "hidden", "ffn_hidden_size": "ffn",
                     "num_attention_heads": "heads", "vocab_size": "vocab"}  # a safe name (spec/names.py)
            doc["name"] = spec.name + "".join(f".{short[k]}-{v}" for k, v in over.items())
            doc["aliases"] = ()
            spec = model_from_dict(doc, "", "--model")
        seq = sequence_length or min(2048, spec.max_sequence_length)
        if (why := sequence_error(seq, spec)) is not None:
            raise InputError("", "--sequence-length", why)
        tps = _int_list(tp, "--tp")
        for t in tps:
            if (why := spec.tp_error(t)) is not None:
                raise InputError("", "--tp", why)

        _need_torch("profile")
        import torch

        from arachne.profiles.format import profile_filename, write_profile
        from arachne.runtime.profiler import (
            ProfileSettings,
            available_memory_bytes,
            profile_memory_bytes,
            profile_model,
        )

        if threads:
            torch.set_num_threads(threads)
        settings = ProfileSettings(micro_batch_sizes=_int_list(micro_batch_sizes, "--micro-batch-sizes"), tps=tps,
                                   sequence_length=seq, precision=precision, blocks=blocks, repeats=repeats)
        use_cuda = torch.cuda.is_available()
        need, have = profile_memory_bytes(spec, settings, use_cuda), available_memory_bytes(use_cuda)
        if have is not None and need > 0.8 * have:  # measure what fits instead of swapping or being killed
            what = (f"profiling {spec.name} ({blocks} block(s) of each kind, micro-batch "
                    f"{max(settings.micro_batch_sizes)}, sequence {seq}, tp {','.join(map(str, tps))}) needs about "
                    f"{need / 1e9:.1f} GB")
            where = "free on CUDA device 0" if use_cuda else "available on this machine"
            if need > have:
                raise InputError("", "--model", f"{what}, but only {have / 1e9:.1f} GB is {where}; profile a smaller "
                                                "copy (--num-layers, --hidden-size, --vocab-size), fewer --blocks or "
                                                "smaller --micro-batch-sizes")
            err_console.print(f"warning: {what}, close to the {have / 1e9:.1f} GB {where}", markup=False,
                              highlight=False, soft_wrap=True)
        try:
            doc = profile_model(spec, settings, gpu, log=lambda m: err_console.print(m, markup=False, highlight=False))
        except RuntimeError as exc:
            fail(str(exc), 1)
            return
        path = out / profile_filename(doc.model, doc.gpu, doc.precision)
        write_profile(doc, path)
        console.print(f"wrote {path} ({len(doc.entries)} entries, model {doc.model}, gpu {doc.gpu}, "
                      f"device {doc.device})", markup=False, highlight=False)

    @app.command("export")
    @handle_errors
    def export(
        plan: Path = typer.Option(..., "--plan", "-p", help="plan JSON (formats v1)"),
        cluster: Path = typer.Option(..., "--cluster", "-c", help="cluster YAML/JSON"),
        fmt: str = typer.Option(..., "--format", "-f", help="torchrun or megatron"),
        out: Path | None = typer.Option(None, "-o", "--out", help="output directory (default: stdout)"),
        port: int | None = typer.Option(None, "--master-port", min=1, max=65535,
                                        help="torchrun rendezvous port (default 29500)"),
        steps: int = typer.Option(100, "--steps", min=1, help="iterations the torchrun workers run"),
        as_json: bool = typer.Option(False, "--json", help="torchrun: print the rank map JSON (with commands)"),
        elastic: bool = typer.Option(False, "--elastic", help="torchrun: an elastic job's commands: one agent per "
                                                               "node of the cluster and the store host's"),
        store_host: str | None = typer.Option(None, "--store-host",
                                              help="--elastic: the job's store host (default: the plan's first node)"),
        store_port: int = typer.Option(29400, "--store-port", min=1, max=65535, help="--elastic: its port"),
        checkpoint_dir: str | None = typer.Option(None, "--checkpoint-dir",
                                                  help="--elastic: a directory every node sees at this path"),
        checkpoint_every: int = typer.Option(1, "--checkpoint-every", min=1, help="--elastic: save every N steps"),
        horizon_steps: int = typer.Option(1000, "--horizon-steps", min=1,
                                          help="--elastic: take a joining node only if that pays within N steps"),
        min_nodes: int = typer.Option(1, "--min-nodes", min=1, help="--elastic: fewest nodes to run with"),
        max_nodes: int | None = typer.Option(None, "--max-nodes", min=1, help="--elastic: most nodes (default: all)"),
        initial_nodes: str | None = typer.Option(None, "--initial-nodes", metavar="N1,N2",
                                                 help="--elastic: nodes admitted at the start (default: the plan's)"),
    ) -> None:
        """Write torchrun launch commands and a rank map, or Megatron-LM arguments, for a plan."""
        from arachne.fileio import write_text_safely
        from arachne.plan import load_plan, validate_plan
        from arachne.plan_rules import refuse_v2, refuse_v2_model, same_math_plan
        from arachne.runtime.elastic_export import ElasticJobFlags, parse_nodes
        from arachne.runtime.export import (
            launch_script,
            launch_script_name,
            megatron_export,
            output_path,
            torchrun_export,
        )
        from arachne.spec.cluster import load_cluster

        if fmt not in ("torchrun", "megatron"):
            raise InputError("", "--format", f"expected torchrun or megatron, got {fmt!r}")
        if elastic and fmt != "torchrun":
            raise InputError("", "--elastic", "only with --format torchrun")
        if elastic and port is not None:
            raise InputError("", "--master-port", "not with --elastic (its agents meet at --store-port)")
        if not elastic:
            given = [f for f, v in (("--store-host", store_host), ("--checkpoint-dir", checkpoint_dir),
                                    ("--max-nodes", max_nodes), ("--initial-nodes", initial_nodes)) if v is not None]
            if given:
                raise InputError("", given[0], "only with --elastic")
        if elastic and not checkpoint_dir:
            raise InputError("", "--checkpoint-dir", "--elastic restores every restart from it: give a directory "
                                                     "every node sees at the same path")
        from arachne.spec.names import has_control

        for flag, value in (("--plan", plan), ("--cluster", cluster), ("-o", out),
                            ("--checkpoint-dir", checkpoint_dir), ("--store-host", store_host)):
            if value is not None and has_control(value):  # it goes into the commands printed or written
                raise InputError("", flag, "contains a control character (a newline, an escape, ...): rename it")
        if out is not None:
            from arachne.fileio import check_output

            names = EXPORT_NAMES["torchrun-elastic" if elastic else fmt]
            check_output(out, {"--plan": plan, "--cluster": cluster}, kind="dir", names=names)
        cl = load_cluster(cluster)
        pl = load_plan(plan)
        model = validate_plan(pl, cl, source=str(plan))
        notes: list[str] = []
        if fmt == "torchrun":  # launches arachne's own runtime: the same-math equivalents, as `arachne run`
            pl, notes = same_math_plan(pl)
            refuse_v2(pl, model, str(plan), "export")  # what arachne's runtime does not run yet
        else:  # Megatron-LM's flags say the plan's v2 settings (megatron_export lists what they cannot)
            refuse_v2_model(model, str(plan), "export")
        from arachne.runtime.export import runtime_refusal

        mx = megatron_export(pl, model) if fmt == "megatron" else None
        if mx is not None and not mx.ok:
            fail(f"{plan}: Megatron-LM cannot express this plan: {'; '.join(mx.reasons)}", 2)
        if (why := runtime_refusal(pl, cl, fmt)) is not None:  # the rules `plan --runtime` plans under
            raise InputError(str(plan), why[0], why[1])
        for note in notes:  # what the export changes, once it is sure to export (a refusal stays one line)
            err_console.print(f"note: {plan}: {note}", markup=False, highlight=False)
        if mx is not None:
            if out is None:
                print(shlex.join(mx.args))
                for n in mx.notes:
                    err_console.print(f"note: {n}", markup=False, highlight=False)
                return
            out.mkdir(parents=True, exist_ok=True)
            write_text_safely(output_path(out, "megatron_args.txt"), "\n".join(mx.args) + "\n")
            write_text_safely(output_path(out, "megatron.json"), json.dumps(mx.to_doc(), indent=1) + "\n")
            console.print(f"wrote {out / 'megatron_args.txt'} and {out / 'megatron.json'}", markup=False,
                          highlight=False)
            return
        if elastic:
            _export_elastic(pl, cl, plan, cluster, out, as_json, store_host, store_port, ElasticJobFlags(
                checkpoint_dir=checkpoint_dir or "", steps=steps, checkpoint_every=checkpoint_every,
                horizon_steps=horizon_steps, min_nodes=min_nodes, max_nodes=max_nodes,
                initial_nodes=parse_nodes(initial_nodes, cl)))
            return
        doc = torchrun_export(pl, model, cl, str(plan), str(cluster), port or 29500, steps)
        if out is None and as_json:
            print(json.dumps(doc, indent=1))
            return
        if out is None:
            for n in doc["nodes"]:
                print(f"# node {n['node']} (ranks {n['first_rank']}..{n['first_rank'] + n['nproc_per_node'] - 1})")
                print(n["command"])
            for r in doc["ranks"]:
                print(f"# rank {r['rank']}: {r['device']} pipeline {r['pipeline']} stage {r['stage']} "
                      f"dp group {r['dp_group']} tp rank {r['tp_rank']} layers [{r['layers'][0]}, {r['layers'][1]})")
            return
        out.mkdir(parents=True, exist_ok=True)
        write_text_safely(output_path(out, "rank_map.json"), json.dumps(doc, indent=1) + "\n")
        for n in doc["nodes"]:
            script = output_path(out, launch_script_name(n))  # stays inside out/, or exit 2
            write_text_safely(script, launch_script(n))
            script.chmod(0o755)
        console.print(f"wrote {out / 'rank_map.json'} and {len(doc['nodes'])} launch script(s)", markup=False,
                      highlight=False)

    @app.command("elastic-agent")
    @handle_errors
    def elastic_agent(
        store: str = typer.Option(..., "--store", metavar="HOST:PORT", help="the job's store (its elastic_store.sh)"),
        node: str = typer.Option(..., "--node", help="this node's name in the job's cluster file"),
        local_addr: str | None = typer.Option(None, "--local-addr", help="the address other nodes reach this one at "
                                                                         "(default: its host name)"),
        connect_timeout: float = typer.Option(600.0, "--connect-timeout", min=1,
                                              help="seconds to wait for the store host (at most a week)"),
    ) -> None:
        """Run one node's torch elastic agent for `arachne run --elastic --store` (the launch_NODE.sh that
        `arachne export --format torchrun --elastic` writes)."""
        from arachne.runtime.elastic_export import check_host, parse_store
        from arachne.runtime.flags import check_timeout
        from arachne.spec.names import check_name

        parse_store(store)
        check_timeout(connect_timeout, "--connect-timeout")
        check_name(node, field="--node")
        if local_addr is not None:
            check_host(local_addr, field="--local-addr")
        _need_torch("elastic-agent")
        from arachne.runtime.elastic_agent import exit_now, run_agent
        from arachne.runtime.launch import JobError

        try:
            code = run_agent(store, node, local_addr, connect_timeout)
        except JobError as exc:
            fail(str(exc), 1)
            return
        exit_now(code)
