"""Errors for bad user input (one line naming the file, the field and the reason), and the one home for
reading a YAML or JSON document safely: unique keys, bounded nesting and size, finite numbers, plain values."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

MAX_DEPTH = 64  # nesting levels; the deepest real document (a Sailor table) has about 10
MAX_VALUES = 5_000_000  # values after YAML aliases are expanded (a plan for a million GPUs lists them all)
MAX_BYTES = 128 * 2**20  # file size


def one_line(text: str) -> str:
    """``text`` with every non-printable character (newline, escape, lone surrogate) written as an escape."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape", "backslashreplace").decode("ascii")
                   for c in text)


class InputError(ValueError):
    """Bad user input. ``str(err)`` is the one-line message the CLI prints (exit code 2)."""

    def __init__(self, source: str, field: str, reason: str):
        self.source, self.field, self.reason = source, field, reason
        where = f"{source}: " if source else ""
        at = f"{field}: " if field else ""
        super().__init__(one_line(f"{where}{at}{reason}"))


class NoFeasiblePlanError(RuntimeError):
    """No plan fits the cluster (CLI exit code 3). ``stats``: the search's statistics (a ``SearchStats``) when it
    ran and found nothing, for the rows that report it; None when nothing was searched."""

    def __init__(self, message: str, stats: Any = None):
        super().__init__(message)
        self.stats = stats


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


# ---- parsing --------------------------------------------------------------------------------------------------------
_BASE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when PyYAML has it: ~10x faster
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _UniqueKeyLoader(_BASE_LOADER):  # type: ignore[misc, valid-type]
    """The safe loader, recording every mapping that gives a key twice (``<<`` merges may still override)."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self.duplicates: list[tuple[dict, Any, int]] = []  # (mapping, key, line of the second key)

    def construct_unique_map(self, node: yaml.MappingNode) -> Any:
        data: dict = {}
        yield data
        merged = [v for k, v in node.value if k.tag == _MERGE_TAG]
        for part in [node] + [m for v in merged for m in (v.value if isinstance(v, yaml.SequenceNode) else [v])
                              if isinstance(m, yaml.MappingNode)]:
            self._check_unique(data, part)  # an inline mapping under ``<<`` never becomes a dict of its own
        data.update(self.construct_mapping(node))

    def _check_unique(self, data: dict, node: yaml.MappingNode) -> None:
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node)
            try:
                if key in seen:
                    self.duplicates.append((data, key, key_node.start_mark.line + 1))
                    return
                seen.add(key)
            except TypeError:  # unhashable: construct_mapping says so
                return


_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:map", _UniqueKeyLoader.construct_unique_map)


def _parse_yaml(text: str) -> tuple[Any, list[tuple[dict, Any, int]]]:
    loader = _UniqueKeyLoader(text)
    try:
        return loader.get_single_data(), loader.duplicates
    finally:
        loader.dispose()


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` (through libyaml when available) that refuses a key given twice in a mapping."""
    data, dups = _parse_yaml(text)
    if dups:
        _, key, line = dups[0]
        raise yaml.constructor.ConstructorError(problem=f"duplicate key {key!r} (line {line})")
    return data


def _parse_json(text: str) -> tuple[Any, list[tuple[dict, Any, int]]]:
    dups: list[tuple[dict, Any, int]] = []

    def pairs_hook(pairs: list[tuple[str, Any]]) -> dict:
        obj = dict(pairs)
        if len(obj) != len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    dups.append((obj, key, 0))
                    break
                seen.add(key)
        return obj

    return json.loads(text, object_pairs_hook=pairs_hook), dups


# ---- checking the parsed tree ---------------------------------------------------------------------------------------
_KINDS = {bool: "a boolean", int: "an integer", float: "a number", list: "a list", dict: "a mapping"}


def _child_path(path: str, key: Any, index: bool = False) -> str:
    if index:
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _path_to(root: Any, target: Any) -> str:
    """The path of the first occurrence of the container ``target`` in ``root`` (document order)."""
    stack: list[tuple[Any, str]] = [(root, "")]
    seen: set[int] = set()
    while stack:
        obj, path = stack.pop()
        if obj is target:
            return path
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        items = list(obj.items()) if isinstance(obj, dict) else list(enumerate(obj))
        for key, val in reversed(items):
            if isinstance(val, (dict, list)):
                stack.append((val, _child_path(path, key, isinstance(obj, list))))
    return ""


def _value_problem(value: Any) -> str | None:
    """Why a scalar is not a plain JSON value, or None."""
    if value is None or isinstance(value, (bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value} is not a finite number"
    if isinstance(value, str):
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return "invalid text (a lone surrogate code point)"
        return None
    kind = type(value).__name__
    return f"unsupported value of type {kind} (write it as a quoted string)"


def _check_tree(root: Any, dups: list[tuple[dict, Any, int]], source: str) -> None:
    """Refuse cycles, nesting deeper than MAX_DEPTH, more than MAX_VALUES values (aliases expanded),
    keys given twice, non-string keys, non-finite numbers and non-JSON values, naming the field."""
    dup_of = {id(d): (key, line) for d, key, line in dups}
    done: dict[int, tuple[int, int]] = {}  # id -> (values, depth), so shared aliases are walked once
    open_: set[int] = set()  # the containers being walked: the ancestors of the current one
    stack: list[tuple[Any, list | None, int]] = [(root, None, 0)]  # (container, its containers, its scalars)

    def fail(container: Any, key: Any, reason: str) -> InputError:
        return InputError(source, _child_path(_path_to(root, container), key, isinstance(container, list)), reason)

    while stack:
        obj, kids, scalars = stack.pop()
        oid = id(obj)
        if kids is not None:  # every child is done: size and depth of this container
            open_.discard(oid)
            size, depth = 1 + scalars, 0
            for kid in kids:
                s, d = done[id(kid)]
                size, depth = size + s, max(depth, d)
            done[oid] = (size, depth + 1)
            if size > MAX_VALUES:
                raise InputError(source, "", f"too large: more than {MAX_VALUES:,} values (YAML aliases expanded)")
            if depth + 1 > MAX_DEPTH:
                raise InputError(source, "", f"nested more than {MAX_DEPTH} levels deep")
            continue
        if oid in done:
            continue
        open_.add(oid)
        if oid in dup_of:
            key, line = dup_of[oid]
            raise fail(obj, key, "duplicate key" + (f" (given again on line {line})" if line else ""))
        is_dict = isinstance(obj, dict)
        kids, scalars = [], 0
        for key, val in (obj.items() if is_dict else enumerate(obj)):
            if is_dict and type(key) is not str:
                raise fail(obj, key, f"keys must be strings, got {_KINDS.get(type(key), type(key).__name__)}")
            if isinstance(val, (dict, list)):
                if id(val) in open_:
                    raise fail(obj, key, "a YAML alias refers to a mapping or list that contains it")
                kids.append(val)
                continue
            scalars += 1
            if (type(val) is str and val.isascii()) or type(val) is int:  # the common cases, quickly
                continue
            if (why := _value_problem(val)) is not None:
                raise fail(obj, key, why)
        stack.append((obj, kids, scalars))
        stack.extend((kid, None, 0) for kid in reversed(kids) if id(kid) not in done)
    if dups:  # a mapping given only inside a ``<<`` merge is not in the tree itself
        raise InputError(source, "", f"duplicate key {dups[0][1]!r}")


def parse_document(text: str, source: str = "", as_json: bool = False) -> Any:
    """Parse YAML (or JSON) text and check the tree; every problem is an :class:`InputError` naming ``source``."""
    kind = "JSON" if as_json else "YAML"
    try:
        data, dups = _parse_json(text) if as_json else _parse_yaml(text)
    except json.JSONDecodeError as exc:
        raise InputError(source, f"line {exc.lineno}", f"invalid JSON: {exc.msg}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"line {mark.line + 1}" if mark is not None else ""
        raise InputError(source, line, f"invalid YAML: {getattr(exc, 'problem', None) or exc}") from None
    except RecursionError:
        raise InputError(source, "", f"nested more than {MAX_DEPTH} levels deep") from None
    except (ValueError, OverflowError) as exc:  # e.g. an integer of more than 4300 digits
        reason = "a number has too many digits" if "digits" in str(exc) else str(exc)
        raise InputError(source, "", f"invalid {kind}: {reason}") from None
    if isinstance(data, (dict, list)):
        _check_tree(data, dups, source)
    return data


def _read_capped(p: Path) -> bytes:
    """The file's first ``MAX_BYTES + 1`` bytes. Opened without blocking, so that a FIFO no process writes to
    reads as empty instead of hanging the command; a pipe with a writer (``<(cmd)``) is read as usual."""
    fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    os.set_blocking(fd, True)
    with os.fdopen(fd, "rb") as f:
        return f.read(MAX_BYTES + 1)


def load_document(path: str | Path) -> dict[str, Any]:
    """Read a YAML or JSON mapping, or raise :class:`InputError` naming the file."""
    p = Path(path)
    if not p.exists():
        raise InputError(str(p), "", "file not found")
    if p.is_dir():
        raise InputError(str(p), "", "is a directory, expected a file")
    try:
        raw = _read_capped(p)
        if len(raw) > MAX_BYTES:
            raise InputError(str(p), "", f"file larger than {MAX_BYTES // 2**20} MiB")
        text = raw.decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(str(p), "", f"cannot read file ({exc.__class__.__name__})") from None
    data = parse_document(text, str(p), as_json=p.suffix.lower() == ".json")
    if not isinstance(data, dict):
        raise InputError(str(p), "", "expected a mapping (an object) at the top level")
    return data
