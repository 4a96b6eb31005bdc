"""The fetch linger (`processors.engine.fetch_linger`): its rules, one test each.

Under a paced load the worker's fetch asks the broker for ``linger_s`` of the input's
recent byte rate (``fetch_min_bytes``), so rounds are fewer and larger; a trickle, a quiet
input, a rebalance and a changelog recovery are fetched as soon as a byte is there.
"""

from __future__ import annotations

import pytest

from runwatch.processors.engine import (
    FETCH_LINGER_FLOOR_BYTES,
    FETCH_MIN_BYTES_MAX,
    FETCH_PARTITION_BYTES,
    FETCH_RATE_WEIGHT,
    Fetched,
    FetchPace,
    fetch_linger,
)
from runwatch.schemas.records import RawRecord

MB = 1_000_000


def test_rule_1_a_reset_forgets_the_pace_and_asks_for_one_byte() -> None:
    pace = FetchPace(bytes_per_s=10 * MB, last_s=5.0)
    assert fetch_linger(pace, None) == (FetchPace(), 1)


def test_rule_1_a_fetch_of_changelog_records_is_not_made_to_linger() -> None:
    pace = FetchPace(bytes_per_s=10 * MB, last_s=5.0)
    assert fetch_linger(pace, Fetched(5.01, 100_000, other_records=True)) == (FetchPace(), 1)


def test_rule_1_no_linger_asks_for_one_byte() -> None:
    pace = FetchPace(bytes_per_s=10 * MB, last_s=5.0)
    assert fetch_linger(pace, Fetched(5.01, 100_000), linger_s=0.0) == (FetchPace(), 1)


def test_rule_2_a_fetch_without_records_forgets_the_pace() -> None:
    pace = FetchPace(bytes_per_s=10 * MB, last_s=5.0)
    assert fetch_linger(pace, Fetched(6.0, 0)) == (FetchPace(), 1)


def test_rule_3_the_first_fetch_with_records_only_starts_the_clock() -> None:
    assert fetch_linger(FetchPace(), Fetched(7.0, 500_000)) == (FetchPace(0.0, 7.0, 1), 1)


def test_rule_5_a_steady_load_asks_for_linger_s_of_its_rate() -> None:
    pace, _ = fetch_linger(FetchPace(), Fetched(0.0, 1))
    min_bytes = 0
    for i in range(1, 30):  # 50 KB every 5 ms: 10 MB/s
        pace, min_bytes = fetch_linger(pace, Fetched(0.005 * i, 50_000), linger_s=0.02)
    assert pace.bytes_per_s == pytest.approx(10 * MB)
    assert min_bytes == pytest.approx(200_000, rel=1e-6)  # 20 ms of 10 MB/s


def test_rule_4_a_fetch_short_of_what_was_asked_ends_the_linger_at_once() -> None:
    # A drain's backlog ran out: the fetch asked for 400 KB, the broker waited its 50 ms
    # and answered with the probes' 3 KB.
    pace = FetchPace(bytes_per_s=10 * MB, last_s=1.0, asked=400_000)
    pace, min_bytes = fetch_linger(pace, Fetched(1.05, 3_000), linger_s=0.04)
    assert pace.bytes_per_s == pytest.approx(3_000 / 0.05)  # its own rate, not smoothed
    assert min_bytes == 1


def test_rule_5_the_rate_is_smoothed_while_fetches_bring_what_they_asked_for() -> None:
    pace = FetchPace(bytes_per_s=10 * MB, last_s=1.0, asked=100_000)
    pace, min_bytes = fetch_linger(pace, Fetched(1.02, 120_000), linger_s=0.04)
    expected = FETCH_RATE_WEIGHT * 120_000 / 0.02 + (1 - FETCH_RATE_WEIGHT) * 10 * MB
    assert pace.bytes_per_s == pytest.approx(expected)
    assert pace.asked == min_bytes == pytest.approx(expected * 0.04, abs=1)


def test_rule_5_a_trickle_is_fetched_at_once() -> None:
    # An idle worker's probes: 3 KB every 50 ms, 60 KB/s; 40 ms of it is 2.4 KB.
    pace = FetchPace(bytes_per_s=60_000, last_s=1.0)
    pace, min_bytes = fetch_linger(pace, Fetched(1.05, 3_000), linger_s=0.04)
    assert pace.bytes_per_s * 0.04 < FETCH_LINGER_FLOOR_BYTES
    assert min_bytes == 1


@pytest.mark.parametrize(
    ("partitions", "cap"),
    [
        (0, FETCH_PARTITION_BYTES),  # as one partition
        (1, FETCH_PARTITION_BYTES),
        (4, 4 * FETCH_PARTITION_BYTES),
        (64, FETCH_MIN_BYTES_MAX),
    ],
    ids=["none-counted", "one-partition", "four-partitions", "sixty-four-partitions"],
)
def test_rule_5_a_backlog_asks_for_at_most_what_its_partitions_can_bring(
    partitions: int, cap: int
) -> None:
    # ``partitions``: those that brought records to the fetch. The broker counts at most
    # `FETCH_PARTITION_BYTES` of each towards min_bytes: a fleet's worker catching up one
    # hot partition of its 40 asked for more than that partition could bring, and every
    # fetch waited the broker's whole wait.
    pace = FetchPace(bytes_per_s=500 * MB, last_s=1.0)
    fetched = Fetched(1.1, 50 * MB, partitions=partitions)  # 500 MB/s: 25 MB in 50 ms
    _, min_bytes = fetch_linger(pace, fetched, linger_s=0.05)
    assert min_bytes == cap


def test_rule_5_under_the_cap_a_worker_of_four_partitions_lingers_its_whole_time() -> None:
    # 45 MB/s (this box's 80 % load): 40 ms of it is 1.8 MB, more than one partition's
    # 1 MiB but within four partitions' 4 MiB
    pace = FetchPace(bytes_per_s=45 * MB, last_s=1.0)
    fetched = Fetched(1.04, int(1.8 * MB), partitions=4)
    _, min_bytes = fetch_linger(pace, fetched, linger_s=0.04)
    assert FETCH_PARTITION_BYTES < min_bytes < 4 * FETCH_PARTITION_BYTES
    assert min_bytes == pytest.approx(1.8 * MB, rel=1e-6)


def test_rule_5_two_fetches_at_the_same_instant_do_not_divide_by_zero() -> None:
    pace = FetchPace(bytes_per_s=1 * MB, last_s=2.0)
    pace, min_bytes = fetch_linger(pace, Fetched(2.0, 10_000), linger_s=0.02)
    assert pace.bytes_per_s > 0 and 1 <= min_bytes <= FETCH_MIN_BYTES_MAX


def test_a_fetch_counts_the_partitions_that_brought_records_not_those_held() -> None:
    # One hot partition of a worker's forty brought 1 MiB; the others nothing (aiokafka
    # leaves them out of the batch or gives them an empty list).
    hot = [RawRecord("fleet.heartbeats", 11, i, b"big", b"x" * 4096) for i in range(256)]
    batch = {("fleet.heartbeats", 11): hot, ("fleet.heartbeats", 12): []}
    fetched = Fetched.of_batch(3.0, batch, other_records=False)
    assert fetched == Fetched(3.0, 256 * 4096, False, partitions=1)
    pace = FetchPace(bytes_per_s=500 * MB, last_s=2.99)
    _, min_bytes = fetch_linger(pace, fetched, linger_s=0.04)
    assert min_bytes == FETCH_PARTITION_BYTES  # what that one partition can bring


def test_a_fetch_sums_the_values_bytes_and_skips_tombstones() -> None:
    records = [
        RawRecord("t", 0, 0, b"k", b"abc"),
        RawRecord("t", 0, 1, b"k", None),
        RawRecord("t", 1, 0, b"k", b"de"),
    ]
    fetched = Fetched.of_batch(1.0, {("t", 0): records[:2], ("t", 1): records[2:]}, True)
    assert fetched == Fetched(1.0, 5, True, partitions=2)
