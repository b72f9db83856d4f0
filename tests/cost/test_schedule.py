"""The pipeline simulators replay a precomputed order of operations (``positions``, ``interleaved_run_order``):
every operation must start exactly when its stage is free and its input has arrived (the as-soon-as-possible
timeline of each stage's fixed order is unique), whatever the durations."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arachne.cost.schedule import (
    BWD,
    FWD,
    interleaved_ops,
    positions,
    simulate,
    simulate_interleaved,
    stage_ops,
)

TIME = st.floats(0.0, 5.0, allow_nan=False, allow_infinity=False)


@st.composite
def pipelines(draw):
    S = draw(st.integers(1, 9))
    m = draw(st.integers(1, 24))
    fwd = tuple(draw(st.lists(TIME, min_size=S, max_size=S)))
    bwd = tuple(draw(st.lists(TIME, min_size=S, max_size=S)))
    sf = tuple(draw(st.lists(TIME, min_size=S - 1, max_size=S - 1))) + (0.0,)
    sb = (0.0,) + tuple(draw(st.lists(TIME, min_size=S - 1, max_size=S - 1)))
    return fwd, bwd, sf, sb, m, draw(st.sampled_from(["1f1b", "gpipe"]))


@settings(max_examples=150, deadline=None)
@given(pipelines())
def test_each_operation_starts_as_soon_as_its_stage_and_input_allow(p):
    fwd, bwd, sf, sb, m, schedule = p
    S, record = len(fwd), []
    span = simulate(fwd, bwd, sf, sb, m, schedule, record)
    assert len(record) == 2 * S * m
    done = {(s, kind, j): (t0, t2) for s, kind, _, j, t0, _, t2 in record}
    for s, ops in enumerate(stage_ops(S, m, schedule)):
        free = 0.0
        for kind, j in ops:  # the stage's own order, each op's compute then its blocking send
            t0, t2 = done[s, kind, j]
            ready = 0.0
            if kind == FWD and s:
                ready = done[s - 1, FWD, j][1]
            elif kind == BWD and s < S - 1:
                ready = done[s + 1, BWD, j][1]
            assert t0 == max(free, ready)
            assert t2 == pytest.approx(t0 + (fwd[s] + sf[s] if kind == FWD else bwd[s] + sb[s]), abs=1e-12)
            free = t2
    assert span == max(t2 for t0, t2 in done.values())


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_position_order_puts_every_input_first(schedule):
    for S in range(1, 12):
        for m in range(1, 3 * S + 3):
            seen = set()
            for p, column in enumerate(positions(S, m, schedule)):
                for s in range(S) if p < m else reversed(range(S)):
                    kind, j = column[s]
                    if kind == FWD and s:
                        assert (s - 1, FWD, j) in seen
                    if kind == BWD and s < S - 1:
                        assert (s + 1, BWD, j) in seen
                    seen.add((s, kind, j))
            assert len(seen) == 2 * S * m


@st.composite
def interleaved(draw):
    S, v = draw(st.integers(1, 5)), draw(st.integers(2, 4))
    m = S * draw(st.integers(1, 4))

    def grid():
        return tuple(tuple(draw(st.lists(TIME, min_size=v, max_size=v))) for _ in range(S))

    return grid(), grid(), grid(), grid(), m


@settings(max_examples=100, deadline=None)
@given(interleaved())
def test_interleaved_operations_start_as_soon_as_their_stage_and_input_allow(p):
    fwd, bwd, sf, sb, m = p
    S, v, record = len(fwd), len(fwd[0]), []
    span = simulate_interleaved(fwd, bwd, sf, sb, m, record)
    assert len(record) == 2 * S * v * m
    done = {(s, kind, c, j): (t0, t1, t2) for s, kind, c, j, t0, t1, t2 in record}
    for s, ops in enumerate(interleaved_ops(S, v, m)):
        free = 0.0
        for kind, c, j in ops:  # sends overlap compute: the stage is free at the end of its compute
            t0, t1, _ = done[s, kind, c, j]
            ready = 0.0
            if kind == FWD and (s or c):
                ready = done[(s - 1, FWD, c, j) if s else (S - 1, FWD, c - 1, j)][2]
            elif kind == BWD and (s < S - 1 or c < v - 1):
                ready = done[(s + 1, BWD, c, j) if s < S - 1 else (0, BWD, c + 1, j)][2]
            assert t0 == max(free, ready)
            assert t1 == pytest.approx(t0 + (fwd[s][c] if kind == FWD else bwd[s][c]), abs=1e-12)
            free = t1
    assert span == max(t1 for _, t1, _ in done.values())
