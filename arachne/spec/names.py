"""The one home of the safe-name rule, and of showing untrusted text on a terminal.

Node, model and GPU type names read from a user's file reach file names (``launch_NODE.sh``,
``MODEL__GPU__PRECISION.json``), shell command lines (``--node-name``, ``--master-addr``) and every table.
They are restricted to a safe set: letters, digits, ``-``, ``_`` and ``.``, not starting with ``.``, without
``..``, at most :data:`MAX_NAME_LENGTH` characters (docs/formats.md, "Safe names"). A cluster's name is
only shown (benchmark clusters are called ``mit_v1/OPT-350/N2_D1``): it is a *display name*, any one line
of text. Text that is free by design (a profile's ``source``, an error message) is shown through
:func:`printable`.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

from arachne.errors import InputError, one_line

MAX_NAME_LENGTH = 100  # launch_NAME.sh and MODEL__GPU__PRECISION.json stay under 255 bytes
_SAFE = re.compile(r"[A-Za-z0-9_.-]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
RULE = "use letters, digits, '-', '_' and '.', not starting with '.' and without '..'"


def _shown(name: str, limit: int = 40) -> str:
    """``name`` quoted for a one-line message: control characters escaped, long names shortened."""
    text = repr(name if len(name) <= limit else name[:limit])
    return text if len(name) <= limit else f"{text}... ({len(name)} characters)"


def name_error(name: object) -> str | None:
    """Why ``name`` is not a safe name, or None when it is."""
    if not isinstance(name, str) or not name:
        return "a name must be a non-empty string"
    if len(name) > MAX_NAME_LENGTH:
        return f"name {_shown(name)} is longer than {MAX_NAME_LENGTH} characters"
    if not _SAFE.fullmatch(name) or name.startswith(".") or ".." in name:
        return f"name {_shown(name)} is not allowed: {RULE}"
    return None


def check_name(name: object, source: str = "", field: str = "name") -> str:
    """``name`` when it is safe, else :class:`InputError` naming ``source`` and ``field``."""
    why = name_error(name)
    if why is not None:
        raise InputError(source, field, why)
    return name  # type: ignore[return-value]


def safe_name(name: str) -> str:
    """A pydantic ``AfterValidator``: the name, or ``ValueError`` saying why it is refused."""
    why = name_error(name)
    if why is not None:
        raise ValueError(why)
    return name


SafeName = Annotated[str, AfterValidator(safe_name)]
"""A document field holding a name that must follow the rule (the error names the field)."""

MAX_DISPLAY_LENGTH = 200


def display_name(name: str) -> str:
    """A pydantic ``AfterValidator`` for a name that is only shown: one line of printable text."""
    if not name or len(name) > MAX_DISPLAY_LENGTH:
        raise ValueError(f"a name must have 1 to {MAX_DISPLAY_LENGTH} characters")
    if _CONTROL.search(name) or not name.isprintable():
        raise ValueError(f"name {_shown(name)} contains a control character (a newline, an escape, ...) or "
                         "a character that cannot be shown")
    return name


DisplayName = Annotated[str, AfterValidator(display_name)]
"""A document field holding a name that is only shown (printed as text, never as markup)."""


def has_control(text: object) -> bool:
    """Whether ``text`` holds a control character (a newline, an escape, ...): such a path or name must not go
    into a command arachne prints or writes."""
    return _CONTROL.search(str(text)) is not None


def printable(text: object) -> str:
    """``text`` with every control character (newline, escape, bell ...) shown as an escape such as ``\\n``,
    so that a user's file cannot move the cursor, recolour or rewrite a terminal. Print the result as
    plain text (markup off): brackets are kept as they are."""
    return one_line(str(text))
