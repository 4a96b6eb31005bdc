"""RateLimitedLog: one record per key and interval, counting what it held back."""

from __future__ import annotations

import logging

import pytest

from runwatch.producers.ratelimit import RateLimitedLog


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


def test_thread_noise_filter_only_quiets_matching_threads() -> None:
    import threading

    from runwatch.producers.ratelimit import ThreadNoiseFilter

    now = [0.0]
    noise = ThreadNoiseFilter("runwatch-emitter-", 60.0, clock=lambda: now[0])

    def record(thread: str, msg: str, level: int = logging.ERROR) -> logging.LogRecord:
        rec = logging.LogRecord("kafka.net", level, __file__, 1, msg, ("x",), None)
        rec.threadName = thread
        return rec

    assert noise.filter(record("runwatch-emitter-r-rank0", "Connection failed: %s"))
    assert not noise.filter(
        record("runwatch-emitter-r-rank0-network-thread", "Connection failed: %s")
    )
    assert noise.filter(record("runwatch-emitter-r-rank0", "Bootstrap failed: %s"))
    assert noise.filter(record("MainThread", "Connection failed: %s"))
    assert noise.filter(record("runwatch-emitter-r", "Connection failed: %s", logging.CRITICAL))
    now[0] = 61.0
    assert noise.filter(record("runwatch-emitter-r-rank0", "Connection failed: %s"))
    assert threading.current_thread().name == "MainThread"


def test_quiet_library_loggers_attaches_once_to_each_existing_logger() -> None:
    from runwatch.producers.ratelimit import ThreadNoiseFilter, quiet_library_loggers

    child = logging.getLogger("fakelib.net.manager")
    quiet_library_loggers("fakelib", "runwatch-emitter-")
    quiet_library_loggers("fakelib", "runwatch-emitter-")
    for name in ("fakelib", "fakelib.net.manager"):
        filters = [f for f in logging.getLogger(name).filters if isinstance(f, ThreadNoiseFilter)]
        assert len(filters) == 1
    assert child.filters
