"""`bench/fold_path.py`'s backlogs: every event of the load in rounds, packs counted by event."""

from __future__ import annotations

import pytest

from runwatch.schemas.codec import decode
from runwatch.schemas.events import EventPack
from runwatch.schemas.topics import TopicRole

from .conftest import load_script

fold_path = load_script("fold_path")


@pytest.mark.parametrize(
    ("world", "round_records"),
    [
        pytest.param(0, 50, id="loose-small-rounds"),
        pytest.param(0, 20_000, id="loose-one-round"),
        pytest.param(4, 7, id="packed-small-rounds"),
        pytest.param(4, 20_000, id="packed-one-round"),
    ],
)
def test_rounds_hold_every_record_once_in_partition_order(world, round_records):
    runs, steps = 3, 5
    taken, events = fold_path.rounds(runs, steps, round_records, world)
    per_step = 1 + (world or 8)  # the loose backlog's runs have 8 ranks
    assert events == 2 * runs + runs * steps * per_step
    records = [r for round_ in taken for rs in round_.values() for r in rs]
    assert len(records) == 2 * runs + runs * steps * (2 if world else per_step)
    assert len({(r.topic, r.partition, r.offset) for r in records}) == len(records)
    for round_ in taken:
        assert set(round_) <= {TopicRole.STEPS, TopicRole.HEARTBEATS}
    offsets: dict[tuple[str, int], list[int]] = {}
    for r in records:
        offsets.setdefault((r.topic, r.partition), []).append(r.offset)
    assert all(o == list(range(len(o))) for o in offsets.values())


def test_packed_backlog_packs_every_rank_of_a_step():
    backlog, events = fold_path.packed_backlog(2, 3, 4)
    packs = [decode(value) for role, _, value in backlog if role == "heartbeats"][2:]
    assert len(packs) == 2 * 3 and all(isinstance(p, EventPack) for p in packs)
    assert events == 2 * 2 + 2 * 3 * (1 + 4)
