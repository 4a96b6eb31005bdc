"""A round's share of the bulk topics (`processors.engine.bulk_share`): its rules, one test each.

A round takes every buffered step, checkpoint and anomaly, and about `ROUND_BULK_S` of the
heartbeats, sized from what rounds cost per record so far; what is over stays buffered
for the next round (`compat._fetched`'s limits: tests/unit/processors/test_raw_records.py).
"""

from __future__ import annotations

import pytest

from runwatch.processors.engine import (
    ROUND_BULK_MIN_RECORDS,
    ROUND_BULK_S,
    ROUND_COST_WEIGHT,
    BulkShare,
    bulk_share,
)

KNOWN = BulkShare(s_per_record=100e-6, records=500)  # 100 µs a record: 50 ms is 500 records


def test_rule_1_no_budget_no_limit() -> None:
    assert bulk_share(KNOWN, 1.0, 10_000, budget_s=0.0) == BulkShare()


@pytest.mark.parametrize("records", [0, 1, ROUND_BULK_MIN_RECORDS - 1])
def test_rule_2_a_small_round_leaves_the_share_as_it_was(records: int) -> None:
    assert bulk_share(KNOWN, 0.2, records) == KNOWN
    assert bulk_share(BulkShare(), 0.2, records) == BulkShare()  # and sets no limit


def test_rule_3_the_first_rounds_cost_sets_the_limit() -> None:
    share = bulk_share(BulkShare(), 0.5, 10_000)  # 50 µs a record
    assert share.s_per_record == pytest.approx(50e-6)
    assert share.records == int(ROUND_BULK_S / 50e-6)


def test_rule_3_the_cost_is_smoothed() -> None:
    share = bulk_share(KNOWN, 0.3, 1000)  # this round: 300 µs a record
    cost = ROUND_COST_WEIGHT * 300e-6 + (1 - ROUND_COST_WEIGHT) * 100e-6
    assert share == BulkShare(pytest.approx(cost), int(ROUND_BULK_S / cost))


def test_rule_3_a_dearer_round_takes_fewer_next_time_a_cheaper_more() -> None:
    dearer, cheaper = bulk_share(KNOWN, 0.5, 1000), bulk_share(KNOWN, 0.01, 1000)
    assert dearer.records is not None and cheaper.records is not None
    assert dearer.records < KNOWN.records < cheaper.records  # type: ignore[operator]


def test_rule_3_never_fewer_than_the_floor() -> None:
    share = bulk_share(BulkShare(), 100.0, ROUND_BULK_MIN_RECORDS)  # 1.5 s a record
    assert share.records == ROUND_BULK_MIN_RECORDS


def test_the_budget_is_what_the_limit_is_sized_to() -> None:
    assert bulk_share(BulkShare(), 0.5, 10_000, budget_s=0.1).records == 2000
