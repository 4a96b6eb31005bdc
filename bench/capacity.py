"""Capacity under load: the highest offered rate the workers keep up with, the load beside them.

A drain measures what the workers fold of a backlog with nothing else on the box. Under
a paced load they share the box with the load generator and the broker's produce path,
and fold in rounds of what arrived since the last: what the stream-processing benchmarks
call the sustainable throughput is the highest rate at which the lag stops growing under
those conditions. `search` finds it among a few rates: the drain's, then `STEP` of the
last, up to `TRIES`. Each is offered for a window after `WARM_S` of start; it is kept up
with when no round in the window's second half began with a record older than
`KEPT_UP_AGE_MS` (`window_age_max_ms`: a worker falling behind grows that age by the
window's length). `bench/fleet.py` (two workers, a fleet) and `bench/latency.py` (one
worker) load a share of it.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

TRIES = 5
"""Offered rates a search tries at most: the drain's, then each `STEP` of the last."""
STEP = 0.85
WARM_S = 3.0
"""Seconds of each offered rate before its window: the generator's start, the rounds' pace."""
KEPT_UP_AGE_MS = 1000.0
"""A rate is kept up with when no round in the second half of its window began with a record
older than this (a worker behind grows it by the window's length: 7.8 s was seen)."""


class Offered(NamedTuple):
    """What one offered rate gave (a tuple: the benches load this file by path, unregistered).

    Attributes:
        events_per_s: The rate the generator achieved over its window.
        age_max_ms: The oldest record any round began with in the window's second half
            (None: no round there).
    """

    events_per_s: float
    age_max_ms: float | None

    @property
    def kept_up(self) -> bool:
        """Whether the workers kept up with this rate (`KEPT_UP_AGE_MS`)."""
        return self.age_max_ms is not None and self.age_max_ms < KEPT_UP_AGE_MS


def search(offer: Callable[[float], Offered], first_rate: float) -> dict[str, Any]:
    """Offers `first_rate`, then `STEP` of the last, until one is kept up with (`TRIES`).

    Args:
        offer: Offers a target rate (events/s) for one window, lets the workers work off
            what is left, and says what it gave.
        first_rate: The first rate: the drain's.

    Returns:
        ``capacity_under_load_events_per_s``: the achieved rate of the first rate kept up
        with (None: none was); ``capacity_lowest_tried_events_per_s``; ``capacity_tries``:
        each try's achieved rate, oldest record and verdict.
    """
    rate, tries = first_rate, []
    capacity = None
    for _ in range(TRIES):
        got = offer(rate)
        tries.append({"offered_events_per_s": round(got.events_per_s),
                      "age_max_ms": got.age_max_ms, "kept_up": got.kept_up})  # fmt: skip
        if got.kept_up:
            capacity = round(got.events_per_s)
            break
        rate *= STEP
    return {
        "capacity_under_load_events_per_s": capacity,
        "capacity_lowest_tried_events_per_s": min(t["offered_events_per_s"] for t in tries),
        "capacity_tries": tries,
    }


def describe(searched: dict[str, Any], basis_events_per_s: int) -> str:
    """A `search`'s result in one line: each try, and the rate the load is a share of."""
    tries = "; ".join(
        f"{t['offered_events_per_s']:,} events/s: oldest record {t['age_max_ms']} ms"
        f"{' (kept up)' if t['kept_up'] else ''}"
        for t in searched["capacity_tries"]
    )
    found = searched["capacity_under_load_events_per_s"] is not None
    return (
        f"capacity under load: {tries} -> {basis_events_per_s:,} events/s"
        f"{'' if found else ' (none kept up with: the lowest rate tried, an upper bound)'}"
    )


def window_age_max_ms(logs: list[Path], start_s: float, end_s: float) -> float | None:
    """The oldest record any round began with, over the workers' stats lines in a window.

    Each `RoundStats` line of a worker (written at ``t``, epoch seconds) holds its rounds'
    ``age_ms``: how old the round's oldest record was when the round began. None when no
    line of the window has one.
    """
    ages = [float(line["age_ms"]["max"]) for line in _window(logs, start_s, end_s)]
    return max(ages) if ages else None


def window_oldest(logs: list[Path], start_s: float, end_s: float) -> tuple[float, str] | None:
    """The oldest record any round began with in a window, and its ``topic:partition``.

    From the stats lines' ``age_ms`` and ``age_max_at`` (`RoundStats`): where a worker fell
    behind, or one partition stalled while the rest kept up. None when no line of the
    window has both.
    """
    found = [
        (float(line["age_ms"]["max"]), str(line["age_max_at"]))
        for line in _window(logs, start_s, end_s)
        if "age_max_at" in line
    ]
    return max(found) if found else None


def _window(logs: list[Path], start_s: float, end_s: float) -> Iterator[dict[str, Any]]:
    """The workers' stats lines written in ``[start_s, end_s]`` that have an ``age_ms``."""
    for log in logs:
        for line in _processors().stats_lines(log):
            if "age_ms" in line and start_s <= float(line["t"]) <= end_s:
                yield line


@functools.cache
def _processors() -> Any:
    """``bench/processors.py`` (its stats lines' reader), loaded once by path."""
    spec = importlib.util.spec_from_file_location(
        "bench_processors", Path(__file__).with_name("processors.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
