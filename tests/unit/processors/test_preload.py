"""`fold_batch`'s preload per run (`_preload_plain`) is its preload per record.

What the fold reads afterwards depends on the order of things, not only on what they
hold: the store's order (a dict's is its insertion order), and each partition's set of
runs (the same members; they are inserted in the same order too, since a set's iteration
order can depend on it where hashes collide). Both ways must leave the same, and a batch
with a Tick or a sweep's offset must be left to the record-by-record way.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from runwatch.processors.core.retention import SWEEP_EVERY_RECORDS
from runwatch.processors.pipeline import _preload_each, _preload_plain
from runwatch.schemas.events import Heartbeat, Provenance, StepCompleted, Tick
from runwatch.schemas.records import Admitted, Decoded
from runwatch.schemas.topics import TopicRole

STORED = {f"run-{i}": f"state-{i}" for i in range(0, 12, 2)}  # half the runs have a state


def event(role: TopicRole, run_id: str) -> Any:
    if role == TopicRole.HEARTBEATS:
        return Heartbeat(run_id=run_id, ts_ns=1, rank=0, step=1)
    return StepCompleted(run_id=run_id, ts_ns=1, step=1, loss=1.0, step_time_s=0.1)


def preloaded(way: str, role: TopicRole, items: list[Decoded]) -> Any:
    store: dict[str, Any] = {"run-99": "kept"}
    partition_runs: dict[int, set[str]] = {1: {"run-98"}}
    loads: list[str] = []

    def load(run_id: str) -> Any:
        loads.append(run_id)
        return STORED.get(run_id)

    def runs_in(partition: int) -> list[str]:
        return [r for r in STORED if int(r.split("-")[1]) % 3 == partition]

    if way == "plain":
        sources = [i.source for i in items]
        events = [i.event for i in items]
        if not _preload_plain(store, sources, events, load, partition_runs, role):
            return None
    else:
        _preload_each(store, Admitted.of(items), load, runs_in, partition_runs, role)
    runs = {p: list(rs) for p, rs in partition_runs.items()}
    # Which runs were asked for, not how often: per record, a run with no state is asked
    # again at each of its records (the answer cannot change within a batch).
    return list(store.items()), runs, list(dict.fromkeys(loads))


@settings(max_examples=300, deadline=None)
@given(
    role=st.sampled_from([TopicRole.HEARTBEATS, TopicRole.STEPS]),
    records=st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 13), st.sampled_from(["event", "tick"])),
        max_size=60,
    ),
    first_offset=st.sampled_from([1, SWEEP_EVERY_RECORDS - 20, 5 * SWEEP_EVERY_RECORDS + 3]),
)
def test_per_run_is_per_record(
    role: TopicRole, records: list[tuple[int, int, str]], first_offset: int
) -> None:
    items = []
    for offset, (partition, run, kind) in enumerate(records, start=first_offset):
        source = Provenance(topic="t", partition=partition, offset=offset)
        made = Tick(run_id="*", ts_ns=1, partition=partition) if kind == "tick" else None
        items.append(Decoded(source, made or event(role, f"run-{run}")))
    plain = preloaded("plain", role, items)
    if any(kind == "tick" for _, _, kind in records):
        assert plain is None
        return
    swept = role == TopicRole.STEPS and any(
        (first_offset + i) % SWEEP_EVERY_RECORDS == 0 for i in range(len(records))
    )
    if swept:
        assert plain is None
        return
    assert plain == preloaded("each", role, items)
