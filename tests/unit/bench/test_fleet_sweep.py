"""`bench/fleet.py --sweep`: the rates it takes and the CPU per event each rate adds."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from .conftest import load_script

fleet = load_script("fleet")


def _point(offered: int, cores: float) -> dict[str, Any]:
    return {"offered_events_per_s": offered, "cores": {"workers": cores}}


def test_marginal_is_the_cores_added_over_the_events_added() -> None:
    points = [_point(0, 0.1), _point(20_000, 0.26), _point(60_000, 0.48), _point(180_000, 0.96)]

    assert fleet.marginal(points) == [8.0, 5.5, 4.0]


def test_marginal_of_no_added_events_is_none() -> None:
    """A generator that fell short of the rate before it: no slope to report."""
    assert fleet.marginal([_point(50_000, 0.4), _point(50_000, 0.5)]) == [None]


@pytest.mark.parametrize(
    ("text", "rates"),
    [
        pytest.param("0,20000,180000", [0.0, 20_000.0, 180_000.0], id="with-idle"),
        pytest.param("1.5e5", [150_000.0], id="one"),
    ],
)
def test_rates_parse(text: str, rates: list[float]) -> None:
    assert fleet.rates(text) == rates


@pytest.mark.parametrize(
    ("text", "says"),
    [
        pytest.param("1,x", "comma-separated", id="not-a-number"),
        pytest.param("0,-5", "0 or more", id="negative"),
    ],
)
def test_rates_refuse(text: str, says: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=says):
        fleet.rates(text)
