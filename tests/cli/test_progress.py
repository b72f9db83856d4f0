"""Progress of long training work in a log (stderr not a terminal): plain lines at every twentieth."""

from __future__ import annotations

import re

from arachne.cli.common import work_progress


def test_a_log_gets_a_line_at_every_twentieth_and_at_the_end(capsys):
    with work_progress("screening template pools", 100) as advance:
        for _ in range(99):
            advance(1)
        assert len(capsys.readouterr().err.splitlines()) == 19  # 5, 10, ..., 95
        advance(1)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and re.fullmatch(r"screening template pools: 100/100 \(100%\), \d+:\d\d elapsed", lines[0])


def test_large_steps_print_once_each_and_the_end_is_always_shown(capsys):
    with work_progress("teacher labelling", 1000) as advance:
        advance(120)
        advance(10)  # still inside the same twentieth
        advance(869)
        advance(1)
    lines = capsys.readouterr().err.splitlines()
    assert [re.match(r"teacher labelling: (\d+)/1000 \((\d+)%\), \d+:\d\d elapsed$", s).groups() for s in lines] == [
        ("120", "12"), ("999", "99"), ("1000", "100")]


def test_no_work_prints_nothing(capsys):
    with work_progress("screening template pools", 0) as advance:
        advance(1)
    assert capsys.readouterr().err == ""
