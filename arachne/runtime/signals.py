"""Stop signals for the launcher: SIGTERM, SIGHUP and SIGINT become one exception, :class:`Stopped`.

Slurm and Kubernetes stop a job with SIGTERM, a closed terminal sends SIGHUP, Ctrl-C SIGINT. Inside
:func:`stop_on_signals` each raises :class:`Stopped` in the main thread, so that the code holding
the processes stops them all before the program exits with ``128 + signal`` (143, 129, 130).
A signal that was ignored when the context was entered (``nohup``, a background job) stays ignored.
torch-free, so that the CLI installs it before anything slow happens.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class Stopped(BaseException):
    """A stop signal arrived. A BaseException, so that no ``except Exception`` swallows it."""

    def __init__(self, signum: int, detail: str = ""):
        super().__init__(signum)
        self.signum, self.detail = signum, detail

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def __str__(self) -> str:
        return f"stopped by {self.name}" + (f"; {self.detail}" if self.detail else "")


_stopping = False  # a Stopped was raised: later signals must not interrupt the clean-up it started
_pending: int | None = None  # the signal that raised it, until the context exits


def _handler(signum: int, frame: FrameType | None) -> None:
    global _stopping, _pending
    if _stopping:
        return
    _stopping, _pending = True, signum
    raise Stopped(signum)


def raise_if_stopped() -> None:
    """Raise :class:`Stopped` again when a stop signal arrived but its exception never reached the caller.
    A handler runs between any two bytecodes, also inside a ``__del__`` or a finalizer, where Python
    reports the exception and drops it; a loop that waits on processes calls this on every turn."""
    if _pending is not None:
        raise Stopped(_pending)


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Raise :class:`Stopped` on the first stop signal; later ones are ignored until the outermost
    context exits (the handlers it replaced are restored then). Nested contexts share the outer one."""
    global _stopping, _pending
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread can handle signals; its owner decides
        return
    mine = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    if any(h is _handler for h in mine.values()):
        yield  # an outer context is in charge
        return
    _stopping, _pending = False, None
    for s, old in mine.items():
        if old is not signal.SIG_IGN:
            signal.signal(s, _handler)
    try:
        yield
    finally:
        for s, old in mine.items():
            signal.signal(s, old if old is not None else signal.SIG_DFL)
        _stopping, _pending = False, None
