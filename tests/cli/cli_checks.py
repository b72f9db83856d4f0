"""What the CLI tests share: invoking the typer app, and the bad-input contract (one line, exit 2, no traceback).

Importable from the tests of this folder (pytest puts a test file's folder on ``sys.path``)."""

from __future__ import annotations

from typer.testing import CliRunner

from arachne.cli.app import app


def invoke(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


def one_error_line(res, code: int = 2) -> str:
    """The single ``error: ...`` line of a failed command, after checking its exit code and that nothing raised."""
    assert res.exit_code == code, (res.exit_code, res.output, res.exception)
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.output
    return lines[0]
