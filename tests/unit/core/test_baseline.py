"""RollingBaseline: causal median/MAD, warmup, zero MAD, rollback, snapshot round trip."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runwatch.processors.core.baseline import (
    MAD_TO_SIGMA,
    RollingBaseline,
    mad_lower_bound,
    mad_of_sorted,
    median_of_sorted,
    robust_scale,
)

finite = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False, allow_infinity=False)
quantised = st.integers(min_value=-3, max_value=3).map(float)


def filled(values: list[float], window: int = 50, min_periods: int = 10) -> RollingBaseline:
    b = RollingBaseline(window, min_periods)
    for i, v in enumerate(values):
        b = b.with_value(v, i)
    return b


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(finite, quantised), min_size=1, max_size=80))
def test_median_and_mad_match_numpy_exactly(values: list[float]) -> None:
    ordered = sorted(values)
    m = median_of_sorted(ordered)
    arr = np.array(values)
    assert m == np.median(arr)
    assert mad_of_sorted(ordered, m) == np.median(np.abs(arr - np.median(arr)))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(finite, quantised), min_size=1, max_size=80))
def test_mad_lower_bound_never_exceeds_the_mad(values: list[float]) -> None:
    ordered = sorted(values)
    m = median_of_sorted(ordered)
    assert 0.0 <= mad_lower_bound(ordered, m) <= mad_of_sorted(ordered, m)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(finite, quantised), min_size=1, max_size=120), st.integers(1, 60))
def test_window_matches_numpy_on_its_last_values(values: list[float], window: int) -> None:
    b = filled(values, window=window, min_periods=1)
    tail = np.array(values[-window:])
    m, scale = b.baseline() or (math.nan, math.nan)
    assert m == np.median(tail)
    mad = float(np.median(np.abs(tail - np.median(tail))))
    if mad > 0:
        assert scale == MAD_TO_SIGMA * mad
    assert scale > 0 and math.isfinite(scale)
    assert list(b.ordered) == sorted(values[-window:])


@pytest.mark.parametrize(
    ("values", "probe", "expected"),
    [
        pytest.param([1.0] * 9, 5.0, None, id="warmup-before-min-periods"),
        pytest.param([1.0, 2.0, 3.0, 4.0, 5.0] * 2, 3.0, 0.0, id="at-median"),
        pytest.param([1.0, 2.0, 3.0, 4.0, 5.0] * 2, 3.0 + MAD_TO_SIGMA, 1.0, id="one-sigma"),
        pytest.param([1.0, 2.0, 3.0, 4.0, 5.0] * 2, math.nan, None, id="nan-probe"),
    ],
)
def test_z_score_table(values: list[float], probe: float, expected: float | None) -> None:
    z = filled(values).z_score(probe)
    if expected is None:
        assert z is None
    else:
        assert z == pytest.approx(expected)


@pytest.mark.parametrize(
    ("values", "probe", "max_abs_z"),
    [
        pytest.param([2.0] * 20, 2.002, 1.0 + 1e-9, id="constant-window-relative-floor"),
        pytest.param([0.0] * 20, 1.0, 1000.0 + 1e-6, id="all-zero-window-unit-floor"),
        pytest.param([1.0] * 15 + [1.1] * 5, 1.1, 10.0, id="mad-zero-mean-ad-fallback"),
    ],
)
def test_zero_mad_gives_finite_bounded_z(
    values: list[float], probe: float, max_abs_z: float
) -> None:
    b = filled(values)
    z = b.z_score(probe)
    assert z is not None and math.isfinite(z)
    assert abs(z) <= max_abs_z
    assert b.z_score(values[-1]) is not None


def test_robust_scale_fallbacks() -> None:
    assert robust_scale([3.0, 3.0, 3.0], 3.0, 1e-3) == pytest.approx(3e-3)
    assert robust_scale([1.0, 1.0, 1.0, 4.0], 1.0, 1e-3) == pytest.approx(1.2533 * 0.75)


def test_scoring_is_causal_and_with_value_returns_a_new_value() -> None:
    b = filled([1.0, 2.0, 3.0, 4.0, 5.0] * 4)
    before = b.baseline()
    z = b.z_score(100.0)
    after = b.with_value(100.0, 99)
    assert b.baseline() == before, "with_value must not change the original"
    assert z is not None and z > 10
    assert after.values[-1] == 100.0 and 100.0 not in b.values


def test_rollback_drops_values_after_the_step() -> None:
    b = RollingBaseline(10, 3)
    for s in range(20):
        b = b.with_value(float(s), s)
    rolled = b.rollback(14)
    assert rolled.steps == tuple(range(10, 15))
    assert list(rolled.ordered) == [10.0, 11.0, 12.0, 13.0, 14.0]
    assert b.rollback(100) is b


def test_from_pairs_keeps_last_finite_values() -> None:
    pairs = [(i, float(i)) for i in range(10)] + [(10, math.nan)]
    b = RollingBaseline.from_pairs(5, 2, pairs)
    assert b.steps == (5, 6, 7, 8, 9)


def test_state_restore_round_trip() -> None:
    b = filled([0.5, 1.5, 2.5, 9.0, -3.0] * 3, window=7, min_periods=2)
    again = RollingBaseline.restore(b.state())
    assert again == b
    assert again.baseline() == b.baseline()


@pytest.mark.parametrize(("window", "min_periods"), [(0, 1), (5, 0), (5, 6)])
def test_bad_window_rejected(window: int, min_periods: int) -> None:
    with pytest.raises(ValueError):
        RollingBaseline(window, min_periods)


def test_nonfinite_values_are_refused() -> None:
    with pytest.raises(ValueError):
        RollingBaseline().with_value(math.inf)


def test_update_fails_loudly_naming_the_alternatives() -> None:
    """Seed code ``b.update(v); b.z_score(x)`` must not stay in warmup without a word."""
    b = filled([1.0, 2.0, 3.0] * 4)
    with pytest.raises(TypeError, match=r"with_value.*monitor\.RollingBaseline"):
        b.update(5.0)
    with pytest.raises(TypeError, match="immutable"):
        b.update(5.0, step=3)
    assert b == filled([1.0, 2.0, 3.0] * 4), "the failed call changed nothing"
