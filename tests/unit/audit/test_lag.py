"""The lag half of the audit: which offsets it relies on, what is pending, the verdict."""

from __future__ import annotations

import msgspec
import pytest
from kafka import TopicPartition

from runwatch.cmd.audit import (
    EXIT_AGREES,
    EXIT_DISAGREES,
    EXIT_PENDING,
    exit_status,
    render,
    render_table,
)
from runwatch.processors.audit import (
    AuditReceipt,
    Verdict,
    audit,
    records_of_run,
    relied_offsets,
)
from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.replay import replay
from runwatch.processors.lag import PartitionLag, Progress, lag_of
from runwatch.processors.verdict_diff import Comparison
from runwatch.schemas.codec import encode
from runwatch.schemas.events import Event
from runwatch.schemas.records import RawRecord
from runwatch.schemas.topics import names
from tests.unit.sinks.events import anomaly, heartbeat, started, step, tick

T = names("p")
TP = TopicPartition(T.steps, 3)


def raw(topic: str, offset: int, key: bytes, event: Event | None = None, partition: int = 0):
    return RawRecord(topic, partition, offset, key, encode(event) if event else b"x", 0)


def test_nothing_committed_means_everything_relied_on_is_pending():
    (lag,) = lag_of({TP: [4, 7, 9]}, {})
    assert lag == PartitionLag(topic=T.steps, partition=3, committed=None, target=10, pending=3)


@pytest.mark.parametrize(
    ("committed", "pending"), [(0, 3), (4, 3), (5, 2), (7, 2), (8, 1), (9, 1), (10, 0), (99, 0)]
)
def test_records_at_or_after_the_committed_offset_are_pending(committed, pending):
    # the committed offset is the next one the group will process
    (lag,) = lag_of({TP: [4, 7, 9]}, {TP: committed})
    assert lag.pending == pending
    assert lag.target == 10


def test_a_partition_relied_on_for_nothing_is_never_pending():
    (lag,) = lag_of({TP: []}, {})
    assert (lag.pending, lag.target) == (0, 0)


def test_lag_sums_over_partitions_and_sorts_them():
    other = TopicPartition(T.anomalies, 3)
    lags = lag_of({TP: [1, 2], other: [5]}, {TP: 2})
    assert [(p.topic, p.pending) for p in lags] == [(T.anomalies, 1), (T.steps, 1)]
    assert Progress(group="g", group_found=True, partitions=lags).pending == 2


def test_ticks_count_only_after_the_runs_first_record():
    records = [
        raw(T.heartbeats, 0, b"*"),
        raw(T.heartbeats, 1, b"other"),
        raw(T.heartbeats, 2, b"r1"),
        raw(T.heartbeats, 3, b"*"),
        raw(T.heartbeats, 4, b"other"),
        raw(T.heartbeats, 5, b"r1"),
    ]
    assert relied_offsets(records, frozenset({b"r1"})) == ([2, 5], [3])
    # the whole log: every keyed record, and the ticks after the first of them
    assert relied_offsets(records, None) == ([1, 2, 4, 5], [3])


def _history(first_tick_offsets: list[int]) -> dict[str, list[RawRecord]]:
    hb = [raw(T.heartbeats, o, b"*", tick(0, ts_s=o)) for o in first_tick_offsets]
    hb += [
        raw(T.heartbeats, 10, b"r1", started(ts_s=10)),
        raw(T.heartbeats, 11, b"r1", heartbeat(n=1, ts_s=11)),
        raw(T.heartbeats, 12, b"*", tick(0, ts_s=12)),
    ]
    return {T.heartbeats: hb, T.steps: [raw(T.steps, 0, b"r1", step(n=1, ts_s=11))]}


def test_where_reading_starts_before_the_run_changes_nothing():
    # ticks before the run's first heartbeat-topic event touch none of its state
    early = records_of_run("r1", _history([5, 6, 7]), T)
    late = records_of_run("r1", _history([]), T)
    assert early == late
    assert [s.offset for role, s, _ in late.inputs if role == "heartbeats"] == [10, 11, 12]
    cfg = DetectorConfig()
    assert audit(early, cfg) == audit(late, cfg)


def _receipt(progress: Progress | None, *, agrees: bool = True) -> AuditReceipt:
    anomalies = Comparison() if agrees else Comparison(unexpected=(encode(anomaly()),))
    return AuditReceipt(
        run_id="r1",
        config_hash="c",
        recorded_config_hashes=(),
        input_records=3,
        anomalies=anomalies,
        commands=Comparison(),
        dead_letters=0,
        progress=progress,
    )


BEHIND = Progress(
    group="g",
    group_found=True,
    partitions=(PartitionLag(topic=T.steps, partition=0, committed=2, target=5, pending=3),),
)
CAUGHT_UP = msgspec.structs.replace(BEHIND, partitions=())
NO_GROUP = Progress(group="g", group_found=False, other_groups=("p-app",))


@pytest.mark.parametrize(
    ("progress", "agrees", "verdict"),
    [
        (None, True, Verdict.AGREES),
        (None, False, Verdict.DISAGREES),
        (CAUGHT_UP, False, Verdict.DISAGREES),
        (BEHIND, False, Verdict.PENDING),  # behind: a difference is not a disagreement
        (BEHIND, True, Verdict.PENDING),
        (NO_GROUP, True, Verdict.AGREES),  # lag unknown: audit what is there, say so
        (NO_GROUP, False, Verdict.DISAGREES),
    ],
)
def test_verdict(progress, agrees, verdict):
    assert _receipt(progress, agrees=agrees).verdict is verdict


def test_exit_status_disagreement_wins_then_pending():
    ok, bad, pending = _receipt(None), _receipt(None, agrees=False), _receipt(BEHIND)
    assert exit_status([ok, ok]) == EXIT_AGREES == 0
    assert exit_status([ok, pending]) == EXIT_PENDING == 3
    assert exit_status([pending, bad, ok]) == EXIT_DISAGREES == 1


def test_receipts_say_pending_and_unknown_lag():
    assert "PENDING: 3 of the run's records not yet processed by g" in render(_receipt(BEHIND))
    text = render(_receipt(NO_GROUP))
    assert "no consumer group 'g'" in text and "p-app" in text and "cannot tell lag" in text


def test_table_names_the_disagreeing_run():
    receipts = [
        msgspec.structs.replace(_receipt(None), run_id="run-a"),
        msgspec.structs.replace(_receipt(None, agrees=False), run_id="run-b"),
        msgspec.structs.replace(_receipt(BEHIND), run_id="run-c"),
    ]
    table = render_table(receipts).splitlines()
    rows = {line.split()[0]: line for line in table[2:5]}
    assert rows["run-a"].endswith("AGREES")
    assert "0/0/1" in rows["run-b"] and rows["run-b"].endswith("DISAGREES")
    assert "PENDING (3 unprocessed)" in rows["run-c"]
    assert "audit of run run-b" in "\n".join(table)


def _stalled_run() -> dict[str, list[RawRecord]]:
    """Two ranks heartbeat 5 steps, then only the clock: ticks raise dead_rank and hang."""
    hb = [raw(T.heartbeats, 0, b"r1", started(ts_s=1))]
    for n in range(1, 6):
        for rank in (0, 1):
            hb.append(raw(T.heartbeats, len(hb), b"r1", heartbeat(rank=rank, n=n, ts_s=1 + n)))
    for k in range(1, 30):  # offsets 11..39, a minute apart
        hb.append(raw(T.heartbeats, len(hb), b"*", tick(0, ts_s=6 + 60 * k)))
    return {T.heartbeats: hb}


def _with_record(history: dict[str, list[RawRecord]], events: list[Event], topic: str):
    out = dict(history)
    out[topic] = [raw(topic, i, b"r1", e) for i, e in enumerate(events)]
    return out


def _ticks_behind(committed: int) -> Progress:
    return Progress(
        group="g",
        group_found=True,
        partitions=(
            PartitionLag(
                topic=T.heartbeats, partition=0, committed=committed, target=11, pending=0
            ),
        ),
        ticks=(
            PartitionLag(
                topic=T.heartbeats,
                partition=0,
                committed=committed,
                target=40,
                pending=40 - committed,
            ),
        ),
    )


def _audit(history, progress: Progress) -> AuditReceipt:
    log = msgspec.structs.replace(records_of_run("r1", history, T), progress=progress)
    return audit(log, DetectorConfig())


def test_unprocessed_ticks_that_would_raise_a_verdict_make_it_pending():
    # a stopped worker judged the run's heartbeats and the first tick, not the later ones
    receipt = _audit(_stalled_run(), _ticks_behind(12))
    assert receipt.anomalies.missing  # a replay of every tick finds dead ranks and a hang
    assert receipt.pending_ticks == 28
    assert receipt.verdict is Verdict.PENDING
    assert "and 28 clock ticks not yet processed" in render(receipt)


def test_unprocessed_ticks_whose_verdicts_are_published_agree():
    # processed and published, not yet committed: the record already has their verdicts
    history = _stalled_run()
    full = replay(records_of_run("r1", history, T).inputs, DetectorConfig())
    history = _with_record(history, list(full.anomalies), T.anomalies)
    log = records_of_run("r1", history, T)  # the policy reads the recorded anomalies
    policy = replay([*log.inputs, *log.recorded_anomalies], DetectorConfig())
    history = _with_record(history, list(policy.commands), T.commands)
    receipt = _audit(history, _ticks_behind(12))
    assert receipt.agrees and receipt.pending_ticks == 0
    assert receipt.verdict is Verdict.AGREES


def test_unprocessed_ticks_do_not_excuse_a_real_disagreement():
    history = _with_record(_stalled_run(), [anomaly(vid="forged")], T.anomalies)
    receipt = _audit(history, _ticks_behind(12))
    assert receipt.pending_ticks == 0
    assert receipt.verdict is Verdict.DISAGREES


def test_unprocessed_ticks_that_change_nothing_are_not_waited_for():
    # the log ends before the tick that finds the dead ranks (offset 16): ticks 13-15 are
    # unprocessed (a stopped worker's last ticks) and raise nothing: no reason to wait
    history = _stalled_run()
    history[T.heartbeats] = history[T.heartbeats][:16]
    receipt = _audit(history, _ticks_behind(13))
    assert receipt.agrees and receipt.verdict is Verdict.AGREES
