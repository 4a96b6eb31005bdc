"""A round's share of the bulk topics (`processors.engine.bulk_share`): its rules, one test each.

A round takes every buffered step, checkpoint and anomaly, and about `ROUND_BULK_S` of the
heartbeats, sized in value bytes from what rounds cost per byte so far; what is over stays
buffered for the next round (`compat._fetched`'s limits: tests/unit/processors/test_raw_records.py).
"""

from __future__ import annotations

import pytest

from runwatch.processors.engine import (
    ROUND_BULK_MIN_BYTES,
    ROUND_BULK_S,
    ROUND_COST_WEIGHT,
    BulkShare,
    bulk_share,
)

KNOWN = BulkShare(s_per_byte=1e-6, most_bytes=50_000)  # 1 µs a byte: 50 ms is 50 KB


def test_rule_1_no_budget_no_limit() -> None:
    assert bulk_share(KNOWN, 1.0, 1_000_000, budget_s=0.0) == BulkShare()


@pytest.mark.parametrize("size", [0, 1, ROUND_BULK_MIN_BYTES - 1])
def test_rule_2_a_small_round_leaves_the_share_as_it_was(size: int) -> None:
    assert bulk_share(KNOWN, 0.2, size) == KNOWN
    assert bulk_share(BulkShare(), 0.2, size) == BulkShare()  # and sets no limit


def test_rule_3_the_first_rounds_cost_sets_the_limit() -> None:
    share = bulk_share(BulkShare(), 0.5, 1_000_000)  # 0.5 µs a byte
    assert share.s_per_byte == pytest.approx(0.5e-6)
    assert share.most_bytes == int(ROUND_BULK_S / 0.5e-6)


def test_rule_3_the_cost_is_smoothed() -> None:
    share = bulk_share(KNOWN, 0.3, 100_000)  # this round: 3 µs a byte
    cost = ROUND_COST_WEIGHT * 3e-6 + (1 - ROUND_COST_WEIGHT) * 1e-6
    assert share == BulkShare(pytest.approx(cost), int(ROUND_BULK_S / cost))


def test_rule_3_a_dearer_round_takes_fewer_next_time_a_cheaper_more() -> None:
    dearer, cheaper = bulk_share(KNOWN, 0.5, 100_000), bulk_share(KNOWN, 0.01, 100_000)
    assert dearer.most_bytes is not None and cheaper.most_bytes is not None
    assert dearer.most_bytes < KNOWN.most_bytes < cheaper.most_bytes  # type: ignore[operator]


def test_rule_3_never_fewer_than_the_floor() -> None:
    share = bulk_share(BulkShare(), 100.0, ROUND_BULK_MIN_BYTES)  # ~6 ms a byte
    assert share.most_bytes == ROUND_BULK_MIN_BYTES


def test_the_budget_is_what_the_limit_is_sized_to() -> None:
    assert bulk_share(BulkShare(), 0.5, 1_000_000, budget_s=0.1).most_bytes == 200_000
