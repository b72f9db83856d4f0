"""Shared CLI plumbing: clean one-line errors with exit codes, consoles."""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

import typer
from rich.console import Console

from arachne.errors import InputError, NoFeasiblePlanError
from arachne.spec.names import printable

# Markup is off: names and messages from a user's file are printed as they are ("[/]x" stays "[/]x").
# The width is rich's: COLUMNS when set, else the terminal's (of stdout, stderr or stdin), else 80; the
# tables choose a layout that fits it (arachne.report.fit). Lines on stderr are never wrapped.
console = Console(markup=False)
err_console = Console(stderr=True, markup=False, highlight=False, soft_wrap=True)


def fail(message: str, code: int = 2) -> None:
    """Print one line on stderr and exit."""
    err_console.print(f"error: {printable(message)}")
    raise typer.Exit(code)


def note(message: str) -> None:
    """One ``note: ...`` line on stderr (control characters escaped)."""
    err_console.print(f"note: {printable(message)}")


def print_assumptions(cluster: Any, source: object) -> None:
    """One note per figure the cluster file left out and arachne took from the GPU type (``Cluster.assumed``)."""
    for line in getattr(cluster, "assumed", ()):
        note(f"{source}: {line}")


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn bad input into ``error: FILE: FIELD: reason`` with exit 2 (3 when no plan fits)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except InputError as exc:
            fail(str(exc), 2)
        except NoFeasiblePlanError as exc:
            fail(str(exc), 3)
        except KeyboardInterrupt:
            fail("interrupted", 130)
        except BrokenPipeError:
            sys.exit(0)

    return wrapper
