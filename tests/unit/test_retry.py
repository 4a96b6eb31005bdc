"""`common.retry`: the one backoff policy and its counter of failures in a row."""

from __future__ import annotations

import itertools
import random

import pytest

from runwatch.common.retry import Backoff, Retrying


@pytest.mark.parametrize(
    ("backoff", "waits"),
    [
        pytest.param(Backoff(0.1, 2.0), [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0], id="doubling-capped"),
        pytest.param(Backoff(0.05, 1.0), [0.05, 0.1, 0.2, 0.4, 0.8, 1.0], id="metadata-wait"),
        pytest.param(Backoff(0.5, 0.5), [0.5, 0.5, 0.5], id="constant-at-the-cap"),
        pytest.param(Backoff(1.0, 10.0, factor=1.0), [1.0, 1.0, 1.0], id="factor-1"),
        pytest.param(Backoff(1.0, 100.0, factor=3.0), [1.0, 3.0, 9.0, 27.0, 81.0, 100.0], id="x3"),
    ],
)
def test_waits_grow_by_the_factor_up_to_the_ceiling(backoff, waits):
    assert list(itertools.islice(backoff.delays_s(), len(waits))) == pytest.approx(waits)


def test_a_counter_that_ran_for_days_stays_at_the_ceiling():
    assert Backoff(0.1, 2.0).delay_s(10**9) == 2.0


def test_jitter_shortens_each_wait_within_its_fraction():
    backoff = Backoff(1.0, 8.0, jitter=0.5)
    rng = random.Random(7)
    for failures in range(1, 30):
        exact = min(8.0, 2.0 ** (failures - 1))
        assert exact * 0.5 <= backoff.delay_s(failures, rng) <= exact
    again = [Backoff(1.0, 8.0, jitter=0.5).delay_s(3, random.Random(7)) for _ in range(2)]
    assert again[0] == again[1]  # a seeded source reproduces the waits


def test_the_counter_resets_on_success():
    retrying = Retrying(Backoff(0.1, 1.0))
    assert [retrying.failed() for _ in range(3)] == pytest.approx([0.1, 0.2, 0.4])
    assert retrying.failures == 3
    retrying.succeeded()
    assert retrying.failures == 0 and retrying.failed() == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"first_s": 0.0, "max_s": 1.0}, "first_s must be > 0", id="first-zero"),
        pytest.param({"first_s": 2.0, "max_s": 1.0}, "must be >= first_s", id="max-below-first"),
        pytest.param({"first_s": 1.0, "max_s": 2.0, "factor": 0.5}, "factor", id="shrinking"),
        pytest.param({"first_s": 1.0, "max_s": 2.0, "jitter": 1.5}, "jitter", id="jitter-over-1"),
    ],
)
def test_a_policy_that_exists_is_valid(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Backoff(**kwargs)


def test_failures_count_from_one():
    with pytest.raises(ValueError, match="failures must be >= 1"):
        Backoff(0.1, 1.0).delay_s(0)
