from __future__ import annotations

import random

import pytest

from runwatch.sinks.webhook import RetryPolicy, backoff_delays_s, is_retryable, post_json

from .recorder import Recorder


@pytest.mark.parametrize(
    ("status", "retry"),
    [(None, True), (500, True), (503, True), (429, True), (408, True), (400, False), (404, False)],
)
def test_is_retryable(status, retry):
    assert is_retryable(status) is retry


def test_backoff_grows_exponentially_with_jitter_and_a_cap():
    policy = RetryPolicy(attempts=6, base_delay_s=1.0, max_delay_s=5.0)
    delays = backoff_delays_s(policy, random.Random(1))
    assert len(delays) == 5
    for i, d in enumerate(delays):
        nominal = min(5.0, 2.0**i)
        assert 0.5 * nominal <= d <= nominal


FAST = RetryPolicy(attempts=4, base_delay_s=0.01, max_delay_s=0.02, timeout_s=5.0)


def test_post_retries_500s_then_succeeds():
    with Recorder(fail_first=2) as server:
        result = post_json(server.url, {"a": 1}, FAST)
        assert result.ok and result.attempts == 3 and result.status == 200
        assert server.bodies == [{"a": 1}] and server.attempts == 3


def test_post_gives_up_after_bounded_attempts():
    with Recorder(fail_first=100) as server:
        result = post_json(server.url, {"a": 1}, FAST)
        assert not result.ok and result.attempts == 4 and result.status == 500
        assert server.attempts == 4


def test_post_does_not_retry_a_400():
    with Recorder(fail_first=100, status_when_failing=400) as server:
        result = post_json(server.url, {}, FAST)
        assert not result.ok and result.attempts == 1


def test_post_to_nothing_reports_the_connection_error():
    with Recorder() as server:
        url = server.url
    result = post_json(url, {}, RetryPolicy(attempts=2, base_delay_s=0.0, timeout_s=1.0))
    assert not result.ok and result.status is None and result.error
