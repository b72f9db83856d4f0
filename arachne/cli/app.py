"""The typer application. Command modules register themselves in ``COMMAND_MODULES`` order."""

from __future__ import annotations

import importlib
import importlib.util

import typer

app = typer.Typer(
    name="arachne",
    help="Plan parallel training of dense and MoE transformers on heterogeneous GPU clusters.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Each module defines ``register(app)``; heavy imports stay inside the commands.
COMMAND_MODULES = [
    "arachne.cli.catalog_cmds",
    "arachne.cli.estimate_cmds",
    "arachne.cli.plan_cmds",
    "arachne.cli.compare_cmds",
    "arachne.cli.replay_cmds",
    "arachne.cli.policy_cmds",
    "arachne.cli.runtime_cmds",
]


def _register() -> None:
    for name in COMMAND_MODULES:
        if importlib.util.find_spec(name) is not None:  # optional command groups may be absent
            importlib.import_module(name).register(app)


_register()


def empty_value(argv: list[str]) -> str | None:
    """The option (or argument position) of the first empty value in ``argv``, or None. An empty value is
    nearly always an unset shell variable (``-o "$DIR"``); as a path it would mean the current directory."""
    for i, arg in enumerate(argv):
        if arg == "":
            before = argv[i - 1] if i else ""
            return before if before.startswith("-") and before != "--" else f"argument {i + 1}"
        if arg.startswith("--") and arg.endswith("="):
            return arg[:-1]
    return None


def main() -> None:
    """Entry point: usage errors become one line on stderr with exit code 2."""
    import os
    import sys

    try:  # typer vendors click in recent versions
        from typer._click import exceptions as click_exc
    except ImportError:  # pragma: no cover
        from click import exceptions as click_exc

    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")  # tiny matrices: threads only add contention
    if (where := empty_value(sys.argv[1:])) is not None:
        print(f"error: {where}: an empty value (an unset shell variable?); give one or leave the option out",
              file=sys.stderr)
        sys.exit(2)
    try:
        code = app(standalone_mode=False)
    except click_exc.NoArgsIsHelpError as exc:
        print(exc.ctx.get_help() if exc.ctx is not None else "usage: arachne COMMAND --help")
        sys.exit(0)
    except click_exc.UsageError as exc:
        hint = f" (see `arachne {exc.ctx.info_name} --help`)" if exc.ctx is not None and exc.ctx.info_name else ""
        msg = " ".join(exc.format_message().split())
        print(f"error: {msg}{hint}", file=sys.stderr)
        sys.exit(2)
    except getattr(click_exc, "Abort", KeyboardInterrupt):
        print("error: aborted", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    sys.exit(code if isinstance(code, int) else 0)
