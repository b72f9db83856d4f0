"""Errors for bad user input: one line naming the file, the field and the reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError


class InputError(ValueError):
    """Bad user input. ``str(err)`` is the one-line message the CLI prints (exit code 2)."""

    def __init__(self, source: str, field: str, reason: str):
        self.source, self.field, self.reason = source, field, reason
        where = f"{source}: " if source else ""
        at = f"{field}: " if field else ""
        super().__init__(f"{where}{at}{reason}")


class NoFeasiblePlanError(RuntimeError):
    """No plan fits the cluster (CLI exit code 3)."""


def field_path(loc: tuple[Any, ...]) -> str:
    """Render a pydantic error location as ``nodes[1].gpu``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def from_validation_error(source: str, err: ValidationError, prefix: str = "") -> InputError:
    """The first problem of a pydantic error as an :class:`InputError`."""
    first = err.errors()[0]
    loc = tuple(p for p in first["loc"] if p not in ("function-after", "function-before"))
    path = field_path(loc)
    if prefix:
        path = f"{prefix}.{path}" if path else prefix
    msg = first["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if first["type"] == "missing":
        msg = "required field is missing"
    elif first["type"] == "extra_forbidden":
        msg = "unknown field"
    return InputError(source, path, msg)


_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when PyYAML has it: ~10x faster


def load_yaml(text: str) -> Any:
    """``yaml.safe_load``, through libyaml when it is available."""
    return yaml.load(text, Loader=_YAML_LOADER)


def load_document(path: str | Path) -> dict[str, Any]:
    """Read a YAML or JSON mapping, or raise :class:`InputError` naming the file."""
    p = Path(path)
    if not p.exists():
        raise InputError(str(p), "", "file not found")
    if p.is_dir():
        raise InputError(str(p), "", "is a directory, expected a file")
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(str(p), "", f"cannot read file ({exc.__class__.__name__})") from None
    try:
        if p.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            data = load_yaml(text)
    except json.JSONDecodeError as exc:
        raise InputError(str(p), f"line {exc.lineno}", f"invalid JSON: {exc.msg}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"line {mark.line + 1}" if mark is not None else ""
        raise InputError(str(p), line, f"invalid YAML: {getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(data, dict):
        raise InputError(str(p), "", "expected a mapping (an object) at the top level")
    return data
