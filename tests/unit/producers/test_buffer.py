"""EventBuffer: the bound, drop accounting and settlement waits."""

from __future__ import annotations

import threading

import pytest

from runwatch.producers.buffer import EventBuffer


def test_bound_counts_unsettled_events_and_reports_drops_once() -> None:
    buf: EventBuffer[str] = EventBuffer(2)
    assert buf.reserve() == 0
    buf.push("a")
    assert buf.reserve() == 0
    buf.push("b")
    assert buf.reserve() is None
    assert buf.reserve() is None
    assert buf.pop() == "a"
    assert buf.reserve() is None  # taken by the reader but not settled: still counted
    buf.settle(delivered=1)
    assert buf.reserve() == 3  # the next accepted event carries the three drops
    buf.push("c")
    buf.settle(failed=1)
    assert buf.reserve() == 0
    assert buf.counts() == (4, 1, 3, 1)
    assert len(buf) == 2  # b and c queued; the fourth was reserved but not pushed


def test_count_dropped_is_not_reported_on_later_events() -> None:
    buf: EventBuffer[int] = EventBuffer(1)
    buf.count_dropped()
    assert buf.reserve() == 0
    assert buf.counts() == (1, 0, 1, 0)


def test_max_items_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_items"):
        EventBuffer(0)


def test_wait_settled_returns_when_another_thread_settles() -> None:
    buf: EventBuffer[int] = EventBuffer(10)
    for i in range(3):
        buf.reserve()
        buf.push(i)
    assert not buf.wait_settled(3, 0.01)
    thread = threading.Thread(target=lambda: [buf.settle(delivered=1) for _ in range(3)])
    thread.start()
    assert buf.wait_settled(3, 5.0)
    thread.join()


def test_wait_for_items_wakes_on_push_and_on_wake() -> None:
    buf: EventBuffer[int] = EventBuffer(10)
    assert not buf.wait_for_items(0.01)
    pusher = threading.Timer(0.05, lambda: (buf.reserve(), buf.push(1)))
    pusher.start()
    assert buf.wait_for_items(5.0)
    assert buf.pop() == 1 and buf.pop() is None
    waker = threading.Timer(0.05, buf.wake)
    waker.start()
    assert not buf.wait_for_items(5.0)  # woken with nothing queued
    pusher.join()
    waker.join()


def test_a_wake_before_the_wait_is_not_lost() -> None:
    import time

    buf: EventBuffer[int] = EventBuffer(10)
    buf.wake()  # e.g. close() called while the reader was busy
    started = time.monotonic()
    assert not buf.wait_for_items(5.0)
    assert time.monotonic() - started < 1.0
