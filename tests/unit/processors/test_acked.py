"""`AckedRanges` answers what faust's own ``Consumer._new_offset`` answers, by ranges.

The reference is faust's real method, called on the attributes it reads (a list of
acknowledged offsets per partition, its gap tree, the committed offsets), fed the same
acknowledgements one offset at a time.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import pairwise
from types import SimpleNamespace
from typing import Any

import pytest
from faust.transport.consumer import Consumer as FaustConsumer
from faust.types import TP
from hypothesis import given, settings
from hypothesis import strategies as st
from intervaltree import IntervalTree

from runwatch.processors.acked import AckedRanges

PART = TP("runwatch.heartbeats", 0)


class FaustTracking:
    """faust 0.15.3's offset tracking: what its ``ack`` writes, what ``_new_offset`` reads."""

    def __init__(self) -> None:
        self.state = SimpleNamespace(
            _acked=defaultdict(list),
            _acked_index=defaultdict(set),
            _gap=defaultdict(IntervalTree),
            _committed_offset=defaultdict(lambda: None),
        )

    def ack(self, first: int, last: int) -> None:
        for offset in range(first, last + 1):
            self.state._acked[PART].append(offset)
            self.state._acked_index[PART].add(offset)

    def next_commit(self) -> int | None:
        return FaustConsumer._new_offset(self.state, PART)  # type: ignore[arg-type]


def commit_both(ours: AckedRanges, faust: FaustTracking) -> tuple[int | None, int | None]:
    committed = faust.state._committed_offset[PART]
    mine = ours.next_commit(PART, committed)
    theirs = faust.next_commit()
    if theirs is not None and (committed is None or theirs > committed):
        faust.state._committed_offset[PART] = theirs  # as faust's commit, once it is done
    return mine, theirs


@pytest.mark.parametrize(
    ("committed", "acks", "expected"),
    [
        pytest.param(None, [], None, id="nothing-acknowledged"),
        pytest.param(None, [(0, 9)], 10, id="one-range"),
        pytest.param(None, [(0, 4), (5, 9)], 10, id="adjacent-ranges-are-one-run"),
        pytest.param(None, [(5, 9), (0, 4)], 10, id="out-of-order"),
        pytest.param(None, [(0, 4), (6, 9)], 5, id="a-gap-ends-the-run"),
        pytest.param(10, [(12, 20)], None, id="a-gap-after-the-commit"),
        pytest.param(10, [(11, 20)], 21, id="one-past-the-commit-as-faust"),
        pytest.param(10, [(10, 20)], 21, id="from-the-commit"),
        pytest.param(0, [(5, 9)], 10, id="faust-reads-a-commit-of-zero-as-none"),
    ],
)
def test_next_commit_is_fausts(
    committed: int | None, acks: list[tuple[int, int]], expected: int | None
) -> None:
    ours, faust = AckedRanges(), FaustTracking()
    faust.state._committed_offset[PART] = committed
    for first, last in acks:
        ours.add(PART, first, last)
        faust.ack(first, last)
    mine, theirs = commit_both(ours, faust)
    assert mine == theirs == expected


def test_a_run_is_taken_and_the_next_waits_for_its_gap() -> None:
    ours = AckedRanges()
    ours.add(PART, 0, 4)
    ours.add(PART, 8, 9)
    assert ours.next_commit(PART, None) == 5
    assert ours.next_commit(PART, 5) is None  # 5..7 not acknowledged
    ours.add(PART, 5, 7)
    assert ours.next_commit(PART, 5) == 10
    assert ours.next_commit(PART, 10) is None


def test_overlaps_merge_and_forget_drops_a_partition() -> None:
    ours = AckedRanges()
    ours.add(PART, 10, 20)
    ours.add(PART, 0, 5)
    ours.add(PART, 4, 12)
    assert ours.by_tp[PART] == [(0, 20)]
    ours.add(PART, 9, 3)  # empty
    assert ours.by_tp[PART] == [(0, 20)]
    ours.forget([PART])
    assert not ours.holds(PART)
    assert ours.next_commit(PART, None) is None


@st.composite
def acknowledgements(draw: Any) -> list[tuple[str, int, int]]:
    """Disjoint ranges over 0..N in a random order, with commits between them."""
    cuts = sorted(draw(st.sets(st.integers(1, 199), max_size=12)))
    bounds = [0, *cuts, 200]
    ranges = [(lo, hi - 1) for lo, hi in pairwise(bounds)]
    kept = [r for r in ranges if draw(st.booleans()) or r[0] == 0]
    order = draw(st.permutations(kept))
    ops: list[tuple[str, int, int]] = []
    for lo, hi in order:
        ops.append(("ack", lo, hi))
        if draw(st.booleans()):
            ops.append(("commit", 0, 0))
    return [*ops, ("commit", 0, 0)]


@settings(max_examples=300, deadline=None)
@given(ops=acknowledgements(), committed=st.sampled_from([None, 0]))
def test_any_order_of_acknowledgements_commits_as_faust(
    ops: list[tuple[str, int, int]], committed: int | None
) -> None:
    ours, faust = AckedRanges(), FaustTracking()
    faust.state._committed_offset[PART] = committed
    for op, first, last in ops:
        if op == "ack":
            ours.add(PART, first, last)
            faust.ack(first, last)
        else:
            mine, theirs = commit_both(ours, faust)
            assert mine == theirs
