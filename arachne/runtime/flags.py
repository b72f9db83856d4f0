"""Checks of a training run's numeric settings, shared by `arachne run` and the torchrun worker.

torch-free, so that a bad value is refused (one line, exit 2) before any process starts.
"""

from __future__ import annotations

import math

from arachne.errors import InputError

MAX_TIMEOUT_S = 7 * 24 * 3600
"""The longest wait a timeout flag may ask for: one week (far beyond it torch's timeouts overflow)."""


def check_timeout(value: float, flag: str = "--timeout") -> float:
    """Seconds a collective (or a connection) may wait: a finite number above 0, at most a week."""
    if not (math.isfinite(value) and value > 0):
        raise InputError("", flag, f"expected a positive number of seconds, got {value}")
    if value > MAX_TIMEOUT_S:
        raise InputError("", flag, f"expected at most {MAX_TIMEOUT_S} seconds (one week), got {value:g}")
    return value


def check_lr(value: float, flag: str = "--lr") -> float:
    """Learning rate: a finite number, 0 or more (what torch's optimizers accept)."""
    if not (math.isfinite(value) and value >= 0):
        raise InputError("", flag, f"expected a finite learning rate of 0 or more, got {value}")
    return value
