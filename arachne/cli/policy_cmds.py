"""`arachne train-policy`, `arachne train-ranker` and `arachne policy-info`."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from arachne.cli.common import console, err_console, handle_errors, work_progress
from arachne.errors import InputError


def _regular_file(path: Path, flag: str) -> None:
    """An input archive must be a regular file: a FIFO would block ``np.load``, a directory is a mistake."""
    if not path.exists():
        raise InputError(str(path), flag, "file not found")
    if not path.is_file():
        raise InputError(str(path), flag, "not a regular file")


def register(app: typer.Typer) -> None:
    @app.command("train-policy")
    @handle_errors
    def train_policy_cmd(
        clusters: int = typer.Option(400, "--clusters", min=2, help="training problems (cluster + model + job)"),
        val_clusters: int = typer.Option(40, "--val-clusters", min=1, help="validation problems"),
        rounds: int = typer.Option(2, "--rounds", min=1, help="1 = teacher states only; more adds DAgger rounds"),
        workers: int = typer.Option(1, "--workers", min=1, help="parallel teacher workers (Ray when > 1)"),
        address: str | None = typer.Option(None, "--address", help="Ray cluster address (e.g. ray://head:10001)"),
        seed: int = typer.Option(0, "--seed"),
        epochs: int = typer.Option(40, "--epochs", min=1),
        teacher_seconds: float = typer.Option(15.0, "--teacher-seconds", min=0.1, help="teacher budget per problem"),
        teacher_beam: int = typer.Option(3, "--teacher-beam", min=1),
        out: Path = typer.Option(Path("results/policy"), "-o", "--out", help="output directory"),
        install: bool = typer.Option(False, "--install", help="also replace the shipped checkpoint"),
        data: Path | None = typer.Option(None, "--data", help="retrain from a saved data.npz (no teacher run)"),
    ) -> None:
        """Train the template policy offline (teacher labels, imitation + reward ranking, DAgger)."""
        from arachne.planners.arachne.train.pipeline import DATA_FILE, OUTPUT_FILES

        # retraining (--data) rewrites only the outputs; report.json next to --data is read first, then replaced
        _check_outputs(out, {"--data": data}, OUTPUT_FILES + (() if data is not None else (DATA_FILE,)),
                       "--install" if install else None)
        from arachne.planners.arachne.train.learn import TrainConfig
        from arachne.planners.arachne.train.pipeline import PipelineConfig

        cfg = PipelineConfig(clusters=clusters, val_clusters=val_clusters, rounds=rounds, workers=workers,
                             address=address, seed=seed, teacher_seconds=teacher_seconds, teacher_beam=teacher_beam,
                             train=TrainConfig(epochs=epochs, seed=seed))
        if data is not None:
            import json as _json

            from arachne.planners.arachne.train.pipeline import retrain

            _regular_file(data, "--data")
            prev = data.parent / "report.json"
            policy, info = retrain(data, cfg, out, _json.loads(prev.read_text()) if prev.is_file() else None)
        else:
            policy, info = _run(cfg, out, clusters, val_clusters, rounds)
        last = info["rounds"][-1]["curve"]
        best = min(last, key=lambda r: r.get("val_loss", r["train_loss"]))
        console.print(f"trained on {info.get('training_problems')} problems, {info['decisions']} decisions; "
                      f"kept epoch {best['epoch']} (validation top-1 {best.get('val_top1', float('nan')):.2f}); "
                      f"wrote {out}/policy.npz, report.json, curve.png")
        if install:
            _install(out, OUTPUT_FILES)
            err_console.print("the shipped ranker orders the previous policy's proposals: retrain it with "
                              "`arachne train-ranker --install`")

    def _check_outputs(out: Path, inputs: dict[str, Path | None], names: tuple[str, ...],
                       install_flag: str | None) -> None:
        """The output folder (and the shipped weights' folder with --install/--add) can take the files,
        checked before any training starts."""
        from arachne.fileio import check_output

        check_output(out, inputs, kind="dir", names=names)
        if install_flag is not None:
            from arachne.planners.arachne.learned.policy import weights_dir

            check_output(weights_dir(), kind="dir", field=install_flag)

    def _install(out: Path, files: tuple[str, ...]) -> None:
        """Copy a training run's checkpoint, report and curve over the shipped ones."""
        import shutil

        from arachne.planners.arachne.learned.policy import weights_dir

        target = weights_dir()
        for f in files:
            shutil.copy(out / f, target / f)
        console.print(f"installed into {target}")

    def _run(cfg, out, clusters, val_clusters, rounds):
        from arachne.planners.arachne.train.pipeline import run_pipeline

        total = clusters + val_clusters + (rounds - 1) * max(1, clusters // 2)
        with work_progress("teacher labelling", total) as advance:
            return run_pipeline(cfg, out, advance, log=lambda s: err_console.print(s))

    @app.command("train-ranker")
    @handle_errors
    def train_ranker_cmd(
        clusters: int = typer.Option(1500, "--clusters", min=2, help="training problems (cluster + model + job)"),
        val_clusters: int = typer.Option(150, "--val-clusters", min=1, help="validation problems"),
        production: int = typer.Option(0, "--production", min=0,
                                       help="also this many production-like problems (as the sweeps draw them), "
                                            "a tenth more to validate"),
        production_seed: int = typer.Option(1000, "--production-seed", min=1000,
                                            help="their first seed, 30 problems per seed (hold-out sweeps: below "
                                                 "1000)"),
        pools: Path | None = typer.Option(None, "--pools", help="train from the pools an earlier run screened "
                                          "(its ranker_pools.npz); the problem options are then the file's"),
        workers: int = typer.Option(1, "--workers", min=1, help="parallel workers (Ray when > 1)"),
        address: str | None = typer.Option(None, "--address", help="Ray cluster address (e.g. ray://head:10001)"),
        seed: int = typer.Option(11, "--seed"),
        epochs: int = typer.Option(60, "--epochs", min=1),
        out: Path = typer.Option(Path("results/ranker"), "-o", "--out", help="output directory"),
        install: bool = typer.Option(False, "--install", help="also replace the shipped rankers with this one"),
        add: bool = typer.Option(False, "--add", help="also install it as one more member of the shipped ensemble"),
    ) -> None:
        """Train the screening order: rank the policy's proposals and the rule templates together."""
        if install and add:
            raise InputError("", "--install/--add", "choose one (replace the shipped rankers, or add a member)")
        from arachne.planners.arachne.learned.ranker import RANKER_OUTPUTS
        from arachne.planners.arachne.train.ranker import POOLS_FILE, Pools

        _check_outputs(out, {"--pools": pools}, (*RANKER_OUTPUTS, POOLS_FILE),
                       "--install" if install else "--add" if add else None)
        screened = None
        if pools is not None:
            _regular_file(pools, "--pools")
            try:
                screened = Pools.load(pools)
            except (OSError, ValueError, KeyError) as e:
                raise InputError(str(pools), "--pools", f"not a ranker_pools.npz file ({e})") from None
        from arachne.planners.arachne.train.learn import TrainConfig
        from arachne.planners.arachne.train.ranker import (
            RankerConfig,
            run_ranker_pipeline,
        )

        cfg = RankerConfig(clusters=clusters, val_clusters=val_clusters, production=production,
                           production_seed=production_seed, workers=workers, address=address, seed=seed,
                           train=TrainConfig(hidden=128, epochs=epochs, batch_decisions=64, tau=0.05, seed=seed))
        total = 0 if screened is not None else clusters + val_clusters + production + (production and
                                                                                     max(1, production // 10))
        with work_progress("screening template pools", total) as advance:
            _, info = run_ranker_pipeline(cfg, out, advance, log=lambda s: err_console.print(s), pools=screened)
        curve = info["rounds"][-1]["curve"]
        best = min(curve, key=lambda r: r.get("val_loss", r["train_loss"]))
        console.print(f"trained on {info['training_problems']} pools, {info['templates']} templates; kept epoch "
                      f"{best['epoch']} (validation top-1 {best.get('val_top1', float('nan')):.2f}); "
                      f"wrote {out}/ranker.npz, ranker_report.json, ranker_curve.png"
                      f"{'' if screened is not None else ', ' + POOLS_FILE}")
        if install or add:
            from arachne.planners.arachne.learned.policy import weights_dir
            from arachne.planners.arachne.learned.ranker import install_ranker

            target = weights_dir()
            n = install_ranker(out, target, add)
            console.print(f"installed into {target} as ranker member {n}")

    def _production_row(rinfo: dict, rcfg: dict) -> str:
        """How many of a ranker's training problems were production-like, from which seeds."""
        n = rinfo.get("production_problems", 0)
        if not n:
            return "none"
        from arachne.planners.arachne.train.production import CASES_PER_SEED

        first = rcfg.get("production_seed", 1000)
        last = first + (rcfg.get("production", n) - 1) // CASES_PER_SEED
        return (f"{n} (seeds {first}-{last}; every GPU type of the "
                f"sweeps, those the policy holds out included)")

    @app.command("policy-info")
    @handle_errors
    def policy_info(as_json: bool = typer.Option(False, "--json")) -> None:
        """What the shipped policy and ranker checkpoints were trained on."""
        from arachne.planners.arachne.learned.policy import shipped_policy

        pol = shipped_policy()
        if pol is None:
            err_console.print("no policy checkpoint is shipped; `arachne plan` uses the priced teacher search")
            raise typer.Exit(1)
        info = dict(pol.info)
        if as_json:
            from arachne.planners.arachne.learned.ranker import shipped_ranker

            rk = shipped_ranker()
            members = [m.info for m in rk.members] if rk is not None else []
            print(json.dumps({**info, "ranker": rk.info if rk is not None else None, "ranker_members": members},
                             indent=1))
            return
        cfg = info.get("config", {})
        params = sum(w.size + b.size for w, b in pol.layers)
        kept = min(info["rounds"][-1]["curve"], key=lambda r: r.get("val_loss", r["train_loss"]))
        rows = [
            ("trained", info.get("trained_at", "?")),
            ("problems / decisions", f"{info.get('training_problems')} / {info.get('decisions')}"),
            ("rounds", str(len(info.get("rounds", [])))),
            ("seed", str(cfg.get("seed"))),
            ("network", f"{len(pol.layers)} layers, {params:,} parameters, input {pol.mean.shape[0]} features"),
            ("GPU types seen", ", ".join(info.get("gpu_types_seen", [])) + " + synthetic types"),
            ("GPU types held out", ", ".join(cfg.get("problems", {}).get("exclude_gpus", []))),
            ("node sizes seen", ", ".join(map(str, info.get("node_sizes_seen", [])))),
            ("largest training cluster", f"{info.get('max_gpus_seen')} GPUs"),
            ("pooled mixed actions", "offered (its teacher had them)" if pol.pooled_actions
             else "not offered (trained before them; rules and refinement still pool)"),
            ("validation top-1 (kept epoch)", f"{kept.get('val_top1', float('nan')):.3f} (epoch {kept['epoch']})"),
            ("training wall time", f"{info.get('wall_time_s', 0):.0f} s"),
        ]
        from rich.table import Table

        t = Table(title="arachne policy checkpoint", show_header=False)
        t.add_column("what")
        t.add_column("value")
        for k, v in rows:
            t.add_row(k, v)
        console.print(t)
        from arachne.planners.arachne.learned.ranker import shipped_ranker

        rk = shipped_ranker()
        if rk is None:
            console.print("no ranker checkpoint is shipped: proposals and rules are screened interleaved")
            return
        for n, member in enumerate(rk.members, 1):
            rinfo, rcfg = member.info, member.info.get("config", {})
            kept = min(rinfo["rounds"][-1]["curve"], key=lambda r: r.get("val_loss", r["train_loss"]))
            title = "arachne ranker checkpoint (the screening order)"
            r = Table(title=title + (f", member {n} of {len(rk.members)}" if len(rk.members) > 1 else ""),
                      show_header=False)
            r.add_column("what")
            r.add_column("value")
            for k, v in (("trained", rinfo.get("trained_at", "?")),
                         ("problems / templates", f"{rinfo.get('training_problems')} / {rinfo.get('templates')}"),
                         ("seed", str(rcfg.get("seed"))),
                         ("production-like problems", _production_row(rinfo, rcfg)),
                         ("policy ranked", (rinfo.get("policy_sha256") or "?")[:12]),
                         ("network", f"{len(member.layers)} layers, "
                                     f"{sum(w.size + b.size for w, b in member.layers):,} parameters, "
                                     f"input {member.mean.shape[0]} features"),
                         ("validation top-1 (kept epoch)", f"{kept.get('val_top1', float('nan')):.3f} "
                                                           f"(epoch {kept['epoch']})"),
                         ("training wall time", f"{rinfo.get('wall_time_s', 0):.0f} s" + (
                             " (from pools screened before)" if "pools_screened_with_seed" in rinfo else ""))):
                r.add_row(k, v)
            console.print(r)
        from arachne.planners.arachne.learned.policy import shipped_sha256

        if any(m.info.get("policy_sha256") != shipped_sha256() for m in rk.members):
            err_console.print("warning: a ranker was trained on the proposals of another policy checkpoint; "
                              "retrain it with `arachne train-ranker`")
