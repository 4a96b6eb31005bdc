"""`common.isolate.BadRecords`: a record that raises is counted, logged once per reason."""

from __future__ import annotations

import logging

import pytest

from runwatch.common.isolate import MAX_REASONS, BadRecords


def _boom(exc: Exception) -> None:
    raise exc


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_each_reason_is_counted_and_logged_once() -> None:
    # A logger of its own: other tests may reconfigure the runwatch loggers.
    logger = logging.getLogger("tests.isolate.once")
    logger.propagate = False
    handler = _Lines()
    logger.addHandler(handler)
    try:
        bad = BadRecords("sinks", logger)
        for i in range(5):
            ok, value = bad.guard("fold", lambda i=i: _boom(ValueError(f"bad {i}")), ("t", 0, i))
            assert (ok, value) == (False, None)
        bad.guard("fold", lambda: _boom(KeyError("k")))
    finally:
        logger.removeHandler(handler)
    assert bad.counts == {"fold: ValueError": 5, "fold: KeyError": 1}
    assert bad.total == 6
    assert len(handler.lines) == 2, handler.lines
    assert "('t', 0, 0)" in handler.lines[0] and "bad 0" in handler.lines[0]


def test_a_good_record_returns_its_result() -> None:
    assert BadRecords("x").guard("fold", lambda: 7) == (True, 7)


def test_reasons_are_bounded() -> None:
    bad = BadRecords("x", logging.getLogger("quiet"))
    for i in range(MAX_REASONS + 50):
        bad.guard(f"where {i}", lambda: _boom(ValueError()))
    assert len(bad.counts) == MAX_REASONS + 1  # the last is "other"
    assert bad.counts["other"] == 50


def test_base_exceptions_still_stop() -> None:
    with pytest.raises(KeyboardInterrupt):
        BadRecords("x").guard("fold", lambda: _boom(KeyboardInterrupt()))  # type: ignore[arg-type]
