"""Writing user files safely: checked before any work, never over an input, never half-written.

Every command that writes calls :func:`check_output` first, before it loads anything large or starts
any long computation, and writes through :func:`replacing` / :func:`write_text_safely`.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from arachne.errors import InputError

PathLike = str | Path


def _real(path: PathLike) -> Path:
    """The absolute path with every symlink resolved (also for paths that do not exist yet)."""
    return Path(os.path.realpath(path))


def _same_file(a: PathLike, b: PathLike) -> bool:
    """Same file after resolving symlinks, or the same inode (hard links)."""
    if _real(a) == _real(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _is_within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _writable_dir(folder: Path, path: PathLike, field: str) -> None:
    """Probe ``folder`` by creating and removing a temporary entry: permission bits say nothing for
    root, read-only mounts or /proc."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".arachne-probe-", dir=folder))
    except OSError as exc:
        raise InputError(str(path), field, f"cannot write in directory {str(folder)!r} "
                                           f"({exc.strerror or exc.__class__.__name__})") from None


def _check_input_clash(path: PathLike, inputs: Mapping[str, PathLike | None], kind: str, field: str,
                       names: Iterable[str]) -> None:
    out = _real(path)
    patterns = tuple(names)
    for flag, given in inputs.items():
        if given is None or str(given) == "" or not os.path.exists(given):
            continue  # a missing input gets its own error when it is read
        inp = _real(given)
        if os.path.isdir(given):
            # An input directory: writing into it changes what the command (or its next run) reads.
            if _is_within(out, inp):
                raise InputError(str(path), field, f"is inside the {flag} directory {str(given)!r}, an input of "
                                                   "this command; choose another output path")
            continue
        if _same_file(path, given):
            raise InputError(str(path), field, f"is the {flag} file {str(given)!r}, an input of this command; "
                                               "choose another output path")
        if kind == "dir" and _is_within(inp, out) and inp != out:
            top = inp.relative_to(out).parts[0]
            if any(fnmatch.fnmatchcase(top, p) for p in patterns):
                raise InputError(str(path), field, f"would write over the {flag} file {str(given)!r}, an input of "
                                                   "this command; choose another output directory")


def check_output(path: PathLike, inputs: Mapping[str, PathLike | None] | None = None, kind: str = "file",
                 field: str = "-o", names: Iterable[str] = ()) -> Path:
    """Fail early, with one line naming ``path`` and ``field``, when the output cannot be written.

    ``kind="file"``: ``path`` must not be a directory, a device other than a terminal or
    ``/dev/null``, or a socket; its directory must exist and accept new files.
    ``kind="dir"``: ``path`` must be a directory or creatable as one.
    ``inputs`` maps each input's flag to its path (entries that are None or do not exist are skipped):
    the output may not be an input file, nor lie inside an input directory; a ``kind="dir"`` output
    may not hold an input whose first path component inside it matches one of ``names`` (the glob
    patterns of what the command writes there).
    """
    if kind not in ("file", "dir"):
        raise ValueError(f"kind must be 'file' or 'dir', not {kind!r}")
    p = Path(path)
    if str(path) == "":
        raise InputError("", field, "expected a path, got an empty string")
    _check_input_clash(p, inputs or {}, kind, field, names)
    if kind == "file" and os.path.isdir(p):
        raise InputError(str(p), field, "is a directory, expected a file path")
    if kind == "dir" and os.path.exists(p) and not os.path.isdir(p):
        raise InputError(str(p), field, "is not a directory")
    if kind == "dir":
        folder = _real(p)
        while not folder.exists():
            folder = folder.parent
        if not folder.is_dir():
            raise InputError(str(p), field, f"{str(folder)!r} is a file, not a directory")
        _writable_dir(folder, p, field)
        return p
    if os.path.exists(p):
        mode = os.stat(p).st_mode
        if stat.S_ISFIFO(mode):
            return p
        if stat.S_ISCHR(mode):
            if _same_file(p, os.devnull) or _is_terminal(p):
                return p
            raise InputError(str(p), field, "is a device, expected a file path")
        if not stat.S_ISREG(mode):
            raise InputError(str(p), field, "is not a regular file")
        if not os.access(p, os.W_OK):
            raise InputError(str(p), field, "file is not writable")
    parent = _real(p).parent
    if not parent.exists():
        raise InputError(str(p), field, f"directory {str(parent)!r} does not exist")
    if not parent.is_dir():
        raise InputError(str(p), field, f"{str(parent)!r} is not a directory")
    _writable_dir(parent, p, field)
    return p


def _is_terminal(path: PathLike) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return False
    try:
        return os.isatty(fd)
    finally:
        os.close(fd)


def check_writable(path: PathLike, field: str = "-o") -> Path:
    """:func:`check_output` for a file without inputs to protect."""
    return check_output(path, kind="file", field=field)


@contextlib.contextmanager
def replacing(path: PathLike) -> Iterator[Path]:
    """Yield a temporary path (same directory, same suffix) to write ``path``'s new content to; on success
    it atomically replaces ``path`` (keeping an existing file's mode), on error it is removed.

    Symlinks are followed (their target is replaced). Pipes, terminals and ``/dev/null`` are yielded
    as they are, to be written in place.
    """
    p = Path(path)
    if os.path.exists(p) and not stat.S_ISREG(os.stat(p).st_mode):
        yield p
        return
    target = _real(p)
    mode = stat.S_IMODE(os.stat(target).st_mode) if target.exists() else None
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=target.suffix, dir=target.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        if mode is None:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_safely(path: PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through :func:`replacing`: a regular file is replaced atomically."""
    with replacing(path) as tmp, open(tmp, "w") as fh:
        fh.write(text)
