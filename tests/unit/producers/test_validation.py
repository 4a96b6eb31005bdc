"""The hot path's argument checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from runwatch.producers.validation import as_bool, as_duration_s, as_float, as_int, as_step, as_str


@pytest.mark.parametrize("value", [3, np.int64(3), np.int32(3)])
def test_as_int_accepts_integers(value: object) -> None:
    assert as_int("x", value) == 3 and type(as_int("x", value)) is int


@pytest.mark.parametrize("value", [3.0, "3", True, None, b"3", np.float64(3.0)])
def test_as_int_refuses_the_rest(value: object) -> None:
    with pytest.raises(TypeError, match="x must be an int"):
        as_int("x", value)


def test_as_step_refuses_negatives() -> None:
    with pytest.raises(ValueError, match="x must be >= 0"):
        as_step("x", -1)


@pytest.mark.parametrize("value", [2.5, 2, np.float32(2.5), math.inf, -math.inf])
def test_as_float_accepts_numbers_and_infinities(value: object) -> None:
    assert as_float("x", value) == float(value)  # type: ignore[arg-type]


def test_as_float_keeps_nan() -> None:
    assert math.isnan(as_float("x", math.nan))
    assert math.isnan(as_float("x", np.float32("nan")))


@pytest.mark.parametrize("value", ["2.5", "nan", None, True, b"1", object()])
def test_as_float_refuses_strings_bools_and_objects(value: object) -> None:
    with pytest.raises(TypeError, match="x must be a float"):
        as_float("x", value)


@pytest.mark.parametrize("value", [-0.001, math.nan, -math.inf])
def test_as_duration_refuses_negative_and_nan(value: float) -> None:
    with pytest.raises(ValueError, match="x must be >= 0 seconds"):
        as_duration_s("x", value)


def test_as_duration_accepts_zero_and_ints() -> None:
    assert as_duration_s("x", 0) == 0.0 and as_duration_s("x", math.inf) == math.inf


@pytest.mark.parametrize(("value", "expected"), [(True, True), (0, False), (np.bool_(True), True)])
def test_as_bool(value: object, expected: bool) -> None:
    assert as_bool("x", value) is expected


@pytest.mark.parametrize("value", ["False", 2, None, 1.0])
def test_as_bool_refuses(value: object) -> None:
    with pytest.raises(TypeError, match="x must be a bool"):
        as_bool("x", value)


def test_as_str() -> None:
    assert as_str("x", "a") == "a"
    with pytest.raises(TypeError):
        as_str("x", 1)
    with pytest.raises(ValueError, match="must not be empty"):
        as_str("x", "", allow_empty=False)
