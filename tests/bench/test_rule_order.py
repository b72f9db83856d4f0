"""The screening-order benchmark's interval of a mean over cases."""

from __future__ import annotations

import statistics

from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.rule_order import mean_interval


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=2, max_size=80))
def test_the_interval_holds_the_mean_and_repeats(xs):
    lo, hi = mean_interval(xs)
    m = statistics.mean(xs)
    assert lo - 1e-9 <= m <= hi + 1e-9 and min(xs) - 1e-9 <= lo and hi <= max(xs) + 1e-9
    assert mean_interval(xs) == (lo, hi)


def test_it_narrows_with_more_cases_and_is_a_point_without_spread():
    few = [1.0, 0.9] * 10
    many = few * 10
    lo_f, hi_f = mean_interval(few)
    lo_m, hi_m = mean_interval(many)
    assert hi_m - lo_m < (hi_f - lo_f) / 2
    lo, hi = mean_interval([0.98] * 30)
    assert abs(lo - 0.98) < 1e-12 and abs(hi - 0.98) < 1e-12
