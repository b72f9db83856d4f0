"""Shared CLI plumbing: clean one-line errors with exit codes, consoles."""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

import typer
from rich.console import Console

from arachne.errors import InputError, NoFeasiblePlanError

console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 200)


def fail(message: str, code: int = 2) -> None:
    """Print one line on stderr and exit."""
    err_console.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


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
