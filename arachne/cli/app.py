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
    "arachne.cli.policy_cmds",
    "arachne.cli.runtime_cmds",
]


def _register() -> None:
    for name in COMMAND_MODULES:
        if importlib.util.find_spec(name) is not None:  # optional command groups may be absent
            importlib.import_module(name).register(app)


_register()


def main() -> None:
    app()
