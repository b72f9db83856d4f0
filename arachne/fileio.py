"""Writing user files safely: never half-written, never replacing a device or a symlink."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from arachne.errors import InputError


def check_writable(path: str | Path, field: str = "-o") -> Path:
    """Fail early (before any long work) when ``path`` cannot be written."""
    p = Path(path)
    if p.is_dir():
        raise InputError(str(p), field, "is a directory, expected a file path")
    target = p.resolve() if p.is_symlink() else p
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(str(p), field, f"directory {str(parent)!r} does not exist")
    if target.exists():
        if not os.access(target, os.W_OK):
            raise InputError(str(p), field, "file is not writable")
    elif not os.access(parent, os.W_OK):
        raise InputError(str(p), field, f"directory {str(parent)!r} is not writable")
    return p


def write_text_safely(path: str | Path, text: str) -> None:
    """Regular files are replaced atomically (keeping their mode); symlinks are followed; devices and
    pipes are written in place."""
    p = Path(path)
    target = p.resolve() if p.is_symlink() else p
    if target.exists() and not stat.S_ISREG(target.stat().st_mode):
        with open(target, "w") as fh:
            fh.write(text)
        return
    mode = stat.S_IMODE(target.stat().st_mode) if target.exists() else None
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        if mode is not None:
            os.chmod(tmp, mode)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
