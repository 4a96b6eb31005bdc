"""`Admitted`, `split`'s good records as columns, reads as the list of `Decoded` it stands for.

The worker's fold reads its two columns; the audit, the UI, the sinks and the tests read
it as a list. Every way a list is read gives a list's answer here, on hypothesis-drawn
columns, and columns of different lengths are refused.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runwatch.schemas.events import Heartbeat, Provenance
from runwatch.schemas.records import Admitted, Decoded


def pairs(count: int) -> list[Decoded]:
    return [
        Decoded(
            Provenance(topic="runwatch.heartbeats", partition=i % 3, offset=i),
            Heartbeat(run_id=f"r{i % 2}", ts_ns=i, rank=i % 4, step=i),
        )
        for i in range(count)
    ]


@given(count=st.integers(0, 12), start=st.integers(-14, 14), stop=st.integers(-14, 14))
def test_it_reads_as_the_list_of_its_pairs(count: int, start: int, stop: int) -> None:
    items = pairs(count)
    admitted = Admitted.of(items)
    assert len(admitted) == len(items) and bool(admitted) == bool(items)
    assert list(admitted) == items and admitted == items and admitted == Admitted.of(items)
    assert [type(d) for d in admitted] == [Decoded] * count
    assert [admitted[i] for i in range(-count, count)] == [items[i] for i in range(-count, count)]
    assert admitted[start:stop] == items[start:stop]
    assert type(admitted[start:stop]) is Admitted
    assert admitted.sources == [d.source for d in items]
    assert admitted.events == [d.event for d in items]
    assert repr(admitted) == f"Admitted({items!r})"


def test_indexing_past_the_end_and_comparing_with_others_behave_as_a_list() -> None:
    admitted = Admitted.of(pairs(2))
    with pytest.raises(IndexError):
        admitted[2]
    assert admitted != pairs(3) and admitted != pairs(2)[::-1]
    assert admitted != tuple(pairs(2))  # a list is not equal to a tuple either
    with pytest.raises(TypeError, match="unhashable"):
        hash(admitted)


def test_of_an_admitted_is_itself_and_of_an_iterator_reads_it_once() -> None:
    admitted = Admitted.of(pairs(3))
    assert Admitted.of(admitted) is admitted
    assert Admitted.of(iter(pairs(3))) == pairs(3)


def test_columns_of_different_lengths_are_refused() -> None:
    items = pairs(2)
    with pytest.raises(ValueError, match="2 positions for 1 events"):
        Admitted([d.source for d in items], [items[0].event])
