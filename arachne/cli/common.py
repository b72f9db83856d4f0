"""Shared CLI plumbing: clean one-line errors with exit codes, consoles."""

from __future__ import annotations

import functools
import sys
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import typer
from rich.console import Console

from arachne.errors import InputError, NoFeasiblePlanError
from arachne.spec.names import printable

# Markup and emoji codes are off: names and messages from a user's file are printed as they are ("[/]x" stays
# "[/]x", "a:b:c.yaml" stays "a:b:c.yaml"). The width is rich's: COLUMNS when set, else the terminal's (of stdout,
# stderr or stdin), else 80; the tables choose a layout that fits it (arachne.report.fit). Lines on stderr are
# never wrapped.
console = Console(markup=False, emoji=False)
err_console = Console(stderr=True, markup=False, emoji=False, highlight=False, soft_wrap=True)


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


@contextmanager
def work_progress(label: str, total: int, step_share: float = 0.05) -> Iterator[Callable[[int], None]]:
    """Progress of long work (training runs of tens of minutes) on stderr; yields ``advance(n)``. A bar on a
    terminal; elsewhere (a batch job's log) one plain line at every ``step_share`` of ``total`` and at the end,
    so a log shows how far the work is and how long it has taken. Nothing when ``total`` is 0."""
    if total <= 0:
        yield lambda n: None
        return
    if err_console.is_terminal:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err_console) as prog:
            task = prog.add_task(label, total=total)
            yield lambda n: prog.update(task, advance=n)
        return
    t0, done, shown = time.monotonic(), 0, 0
    every = max(1, round(total * step_share))

    def advance(n: int) -> None:
        nonlocal done, shown
        done += n
        if done // every > shown // every or done >= total > shown:
            shown = done
            secs = int(time.monotonic() - t0)
            err_console.print(f"{label}: {done}/{total} ({100 * done // total}%), {secs // 60}:{secs % 60:02d} elapsed")

    yield advance
