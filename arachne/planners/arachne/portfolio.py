"""A second search beside the planner's own, in a forked process on the machine's other core.

The search is path dependent: on a large cluster its fixed costs (the rule pool, the ranking) leave the
screening a few templates, and which ones the learned order puts first decides the plan. A second search that
screens the pool in the policy's and the rules' own order, and further, finds what the first misses on some
cases; the faster plan of the two wins. Each search keeps to its own work clock, so the same input gets the
same plan under any load; where a process cannot be forked the second search runs after the first, in this
process (the same plan, later). A search that fails in the child is reported, not raised: the first search's
plans stand."""

from __future__ import annotations

import os
import pickle
import signal
import time
import traceback
from collections.abc import Callable
from typing import Any

SECOND_LOOK: dict[str, Any] = {"use_ranker": False, "min_screened": 16, "seed_share": 0.3, "target_s": 0.9,
                               "same_gpus_first": True, "whole_block_mix": True}
"""The second search's options (flat keywords of :class:`~.options.ArachneOptions`): the proposals and the rules
screened in their own order, at least 16 of them (the first search: the learned order, at least 8), with 0.3 of
its target for the seeds (the first: 0.08), the seeds' grid next to the incumbent in another order
(``same_gpus_first``), a last pass over the mixed rules in whole blocks per stage (``whole_block_mix``, decision
0048), and a shorter target (0.9 s of work against 1.2 s): its longer screening and seed passes
overrun their target on large clusters, and it should end when the first does."""
SECOND_LOOK_MAX_GPUS = 768
"""Only on clusters of at most this many GPUs: on larger ones both searches' fixed costs (the rule pool, the
floor's templates: 0.4-0.6 s of work each at 1,024 GPUs) and the two processes sharing the machine took the
median planning time at 1,024 GPUs from 0.5-0.65 s to 1.07 s, past the 1 s target
(``python -m benchmarks arachne latency``)."""


class Forked:
    """``fn()`` run in a forked child from construction; :meth:`result` waits for it and returns ``(value,
    cpu_s, error)``: ``fn``'s value (None if it raised or the child died), the child's CPU seconds, and the error in
    one line (None when it ran). Without ``os.fork`` (or if forking fails), and with ``fork`` False (the other
    core is taken), :meth:`result` runs ``fn`` itself."""

    def __init__(self, fn: Callable[[], Any], fork: bool = True):
        self.fn, self.pid, self.fd = fn, None, None
        if not fork or not hasattr(os, "fork"):
            return
        try:
            r, w = os.pipe()
        except OSError:
            return
        try:
            pid = os.fork()
        except OSError:
            os.close(r)
            os.close(w)
            return
        if pid == 0:  # the child: never returns
            os.close(r)
            _child(fn, w)
        os.close(w)
        self.pid, self.fd = pid, r

    def result(self) -> tuple[Any, float, str | None]:
        if self.pid is None:
            return _run(self.fn)
        chunks = []
        with os.fdopen(self.fd, "rb") as f:
            self.fd = None
            while chunk := f.read(1 << 20):
                chunks.append(chunk)
        _, status = os.waitpid(self.pid, 0)
        self.pid = None
        try:
            return pickle.loads(b"".join(chunks))
        except Exception:
            return None, 0.0, f"second search ended without a result (wait status {status})"

    def cancel(self) -> None:
        """Stop the child (the caller gave up on it: an error or an interrupt in the first search)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            self.pid = None


def _run(fn: Callable[[], Any]) -> tuple[Any, float, str | None]:
    c0 = time.process_time()
    try:
        value, error = fn(), None
    except Exception as e:
        value, error = None, f"second search failed: {type(e).__name__}: {e}".splitlines()[0]
    return value, time.process_time() - c0, error


def _child(fn: Callable[[], Any], w: int) -> None:
    """The forked child: default signal handlers (the parent's, e.g. a CLI's, are not its own), no output on the
    parent's terminal, ``fn``'s result pickled into ``w``, then exit without running the parent's exit handlers."""
    code = 1
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        out = _run(fn)
        try:
            data = pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            data = pickle.dumps((None, out[1], "second search's result could not be sent: "
                                 + traceback.format_exc().splitlines()[-1]))
        with os.fdopen(w, "wb") as f:
            f.write(data)
        code = 0
    finally:
        os._exit(code)
