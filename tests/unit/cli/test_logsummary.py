"""Repeated errors summarised, and the worker's own view of a broker outage."""

from __future__ import annotations

import logging
import threading

from runwatch.logsummary import BrokerWatch, RepeatSummary


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _record(msg: str, *args: object, level: int = logging.ERROR, name: str = "aiokafka"):
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_repeats_within_the_window_are_counted_into_the_next_line():
    clock = Clock()
    summary = RepeatSummary(window_s=10.0, clock=clock)
    template = "Unable connect to node with id %s: %s"
    shown = []
    # 1,300 attempts a second for 15 s, the outage of the issue
    for i in range(15 * 1300):
        clock.now = i / 1300
        record = _record(template, 1, "refused")
        if summary.filter(record):
            shown.append(record.getMessage())
    assert len(shown) == 2  # t=0 and the first after 10 s
    assert shown[0] == "Unable connect to node with id 1: refused"
    assert shown[1].endswith(f"[+{10 * 1300 - 1} like this in the last 10 s]")


def test_kinds_are_summarised_apart_and_info_passes():
    clock = Clock()
    summary = RepeatSummary(window_s=10.0, clock=clock)
    assert summary.filter(_record("a %s", 1))
    assert summary.filter(_record("b %s", 1))
    assert summary.filter(_record("a %s", 1, name="kafka"))  # another logger
    assert summary.filter(_record("a %s", 1, level=logging.WARNING))  # another level
    assert not summary.filter(_record("a %s", 2))
    assert all(summary.filter(_record("a %s", 1, level=logging.INFO)) for _ in range(5))


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.back = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        if "answers again" in record.getMessage():
            self.back.set()


def test_broker_watch_says_down_once_and_back_once():
    out = Lines()
    watch_log = logging.getLogger("runwatch.broker_watch")
    watch_log.addHandler(out)
    watch_log.setLevel(logging.INFO)
    answers = threading.Event()
    watch = BrokerWatch("h:1", probe=answers.is_set, probe_s=0.01, remind_s=3600.0)
    try:
        for _ in range(500):
            watch.handle(_record("Unable connect to node with id %s: %s", 1, "refused"))
        watch.handle(_record("Heartbeat session expired"))  # not a connection error
        assert len(out.lines) == 1 and "does not answer" in out.lines[0]
        answers.set()
        assert out.back.wait(30.0)
        assert "500 client connection errors" in out.lines[-1]
        assert len(out.lines) == 2
    finally:
        watch.close()
        watch_log.removeHandler(out)
