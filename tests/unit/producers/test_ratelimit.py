"""RateLimitedLog: one record per key and interval, counting what it held back."""

from __future__ import annotations

import logging

import pytest

from producers.ratelimit import RateLimitedLog


def test_one_record_per_interval_and_key(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    log = RateLimitedLog(logging.getLogger("t.rate"), 10.0, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="t.rate")
    assert log.warning("a", "first %d", 1)
    assert not log.warning("a", "again")
    assert not log.warning("a", "again")
    assert log.error("b", "other key")
    now[0] = 10.5
    assert log.warning("a", "later")
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["first 1", "other key", "later (2 similar message(s) suppressed)"]
