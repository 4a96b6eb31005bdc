"""`bench/fleet_age.py`: one worker's half of the fleet's records, and its paced rounds."""

from __future__ import annotations

from .conftest import load_script

age = load_script("fleet_age")


def test_a_worker_takes_its_half_of_the_partitions_in_offset_order() -> None:
    worker = age.Worker(runs=6)

    first, events_first = worker.records(1, 2)
    later, _ = worker.records(3, 3)

    records = [r for _, r, _ in first + later]
    assert records and all(r.partition % 2 == 0 for r in records)
    by_partition: dict[tuple[str, int], list[int]] = {}
    for r in records:
        by_partition.setdefault((r.topic, r.partition), []).append(r.offset)
    for offsets in by_partition.values():
        assert offsets == list(range(len(offsets)))  # consecutive across the two calls
    assert events_first == sum(n for _, _, n in first)


def test_rounds_hold_about_the_events_asked_each_role_in_partition_order() -> None:
    worker = age.Worker(runs=6)
    records, _ = worker.records(1, 3)
    weight = {(r.topic, r.partition, r.offset): n for _, r, n in records}

    rounds = age._rounds(records, 50)

    sizes = [sum(len(batch) for batch in taken.values()) for taken in rounds]
    assert sum(sizes) == len(records)
    for i, taken in enumerate(rounds):
        assert list(taken) == [role for role in age.FOLD_ORDER if role in taken]
        events = [weight[(r.topic, r.partition, r.offset)] for b in taken.values() for r in b]
        if i < len(rounds) - 1:
            assert sum(events) >= 50  # a round ends at the record that reaches the size
        for batch in taken.values():
            order = [(r.partition, r.offset) for r in batch]
            assert order == sorted(order)


def test_the_fold_carries_every_run_s_states_from_slice_to_slice() -> None:
    worker = age.Worker(runs=4)
    for first in (1, 3):
        records, _ = worker.records(first, first + 1)
        decode_s, fold_s = worker.fold(records, 40)
        assert decode_s >= 0 and fold_s > 0

    steps = worker.states[age.TopicRole.STEPS]
    assert steps and all(state.last_step == 4 for state in steps.values())
