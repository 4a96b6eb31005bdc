"""Per-run liveness state is evicted after its retention, in log time (`processors.core.retention`)."""

from __future__ import annotations

from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.replay import Record, Replayer
from runwatch.processors.core.retention import (
    ENDED_RETENTION_NS,
    HOUR_NS,
    SILENT_RETENTION_NS,
)
from runwatch.processors.pipeline import fold_chunks
from runwatch.schemas.events import Event, Provenance
from runwatch.schemas.records import Decoded
from runwatch.schemas.topics import StateKind, TopicRole
from tests.unit.core.factories import S, ended, hb, started, tick

CFG = DetectorConfig()


def _records(events: list[Event], first: int = 0) -> list[Record]:
    return [
        (TopicRole.HEARTBEATS, Provenance(topic="t.hb", partition=0, offset=first + i), e)  # type: ignore[misc]
        for i, e in enumerate(events)
    ]


def test_an_ended_run_is_kept_a_day_then_evicted_and_a_late_record_starts_fresh() -> None:
    end_ns = 10 * S
    events: list[Event] = [
        started("done", world_size=2),
        hb(0, 1, 1 * S, run="done"),
        ended("done", ts_ns=end_ns),
        tick(end_ns + ENDED_RETENTION_NS),  # exactly a day: kept
    ]
    replayer = Replayer(CFG).feed(_records(events))
    assert "done" in replayer.liveness and replayer.evicted[StateKind.LIVENESS] == set()
    replayer.feed(_records([tick(end_ns + ENDED_RETENTION_NS + 1)], first=len(events)))
    assert "done" not in replayer.liveness
    assert replayer.evicted[StateKind.LIVENESS] == {"done"}
    assert "done" not in replayer.encoded[StateKind.LIVENESS]
    # a record of the run after its eviction starts a fresh state, as for a run never seen
    late = hb(0, 2, end_ns + ENDED_RETENTION_NS + 2 * S, run="done")
    replayer.feed(_records([late], first=len(events) + 1))
    state = replayer.liveness["done"]
    assert state.heartbeats == 1 and state.live
    assert replayer.evicted[StateKind.LIVENESS] == set()
    assert "done" in replayer.encoded[StateKind.LIVENESS]


def test_many_silent_runs_are_evicted_a_week_after_their_last_record() -> None:
    runs = [f"r{i}" for i in range(500)]
    events: list[Event] = [started(run, ts_ns=S, world_size=1) for run in runs]
    events += [hb(0, 1, 2 * S, run=run) for run in runs[:250]]
    events += [started("busy", ts_ns=S, world_size=1)]
    events += [hb(0, n, n * HOUR_NS, run="busy") for n in range(1, 24 * 7 + 2)]
    events.append(tick(2 * S + SILENT_RETENTION_NS + 1))
    replayer = Replayer(CFG).feed(_records(events))
    assert set(replayer.liveness) == {"busy"}  # the one run still reporting stays
    assert replayer.evicted[StateKind.LIVENESS] == set(runs)
    assert replayer.partition_runs[0] == {"busy"}


def test_live_and_chunked_folds_evict_alike() -> None:
    # The agents fold a round in chunks; a run evicted in one chunk is not loaded back
    # from the table in the next (it is deleted with the round's writes).
    end_ns = 5 * S
    earlier: list[Event] = [started("gone", world_size=1), ended("gone", ts_ns=end_ns)]
    stored = Replayer(CFG).feed(_records(earlier))
    table = {"gone": stored.liveness["gone"]}
    now: list[Event] = [
        tick(end_ns + ENDED_RETENTION_NS + 1),
        tick(end_ns + ENDED_RETENTION_NS + 2),
    ]
    items = [Decoded(source, event) for _, source, event in _records(now, first=10)]
    results = list(
        fold_chunks(
            TopicRole.HEARTBEATS, items, table.get, lambda _: list(table), CFG, chunk_events=1
        )
    )
    assert [sorted(r.evicted) for r in results] == [["gone"], ["gone"]]
    assert "gone" not in results[-1].states and "gone" not in results[-1].encoded
