"""The audit: re-derive a run's verdicts from its input log and compare with the record.

``load_run_log`` reads only the run's partition of each topic (records are keyed by run
id with Kafka's default partitioner, `processors.logread.partition_for`), from the run's
first record on: the timestamp of its first RunStarted (incarnation 0, found in the small
compacted runs topic) less `START_MARGIN_MS` of clock skew, turned into offsets with
Kafka's time index. When that RunStarted is gone (compacted away, or never sent) it reads
the partition from its beginning: slower, never wrong. The clock's ticks come with the
heartbeat partition; ticks before the run's first heartbeat-topic event touch no state of
the run and are left out, so where reading starts changes nothing in the receipt.

``audit`` folds the input through the same reducers the live processors run and compares:

* anomalies: recomputed from steps and heartbeats vs. the anomalies topic;
* commands: the policy folded over the *recorded* anomalies log (its order is part of
  the log) vs. the commands topic, signatures aside.

Lag is not disagreement. Given the processors' consumer group, loading happens in stages:
the inputs are read, then the audit waits (up to ``wait_s``) until the group has committed
past every input offset it relies on; only then are the anomalies read (their verdicts are
all published by then), the audit waits for the policy to have processed them, and then
the commands are read. What is still unprocessed at the deadline makes the verdict
`Verdict.PENDING`, never DISAGREES. ``audit_all`` does the same for every run of the log,
reading each topic once.

``what_if`` answers "what would other thresholds have flagged" without writing anywhere.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from typing import NamedTuple

import msgspec
from kafka import TopicPartition

from runwatch.processors.core.config import DetectorConfig, config_hash
from runwatch.processors.core.replay import Record, ReplayResult, replay
from runwatch.processors.lag import GroupOffsets, Progress, await_processed, lag_of
from runwatch.processors.logread import KeyFilter, LogReader, Span, partition_for
from runwatch.processors.verdict_diff import Comparison, compare_anomalies, compare_commands
from runwatch.schemas.codec import encode_key
from runwatch.schemas.events import TICK_RUN_ID, AnomalyDetected, RestartRequested, RunStarted, Tick
from runwatch.schemas.records import RawRecord, split
from runwatch.schemas.topics import (
    FOLD_ORDER,
    ROLES,
    Principal,
    TopicNames,
    TopicRole,
    names,
)

INPUT_ROLES: tuple[TopicRole, ...] = tuple(
    role for role in FOLD_ORDER if Principal.TRAINER in ROLES[role].writers
)
"""The folded roles trainers write: steps, heartbeats (with the clock's ticks), checkpoints."""
STAGES: tuple[tuple[TopicRole, ...], ...] = (
    INPUT_ROLES,
    (TopicRole.ANOMALIES,),
    (TopicRole.COMMANDS,),
)
"""Read order: inputs, then the anomalies they produced, then the commands those produced."""
PROCESSED_ROLES: frozenset[TopicRole] = frozenset(FOLD_ORDER)
"""Roles the processors consume (the anomalies feed the policy): lag is told on these."""
START_MARGIN_MS = 60_000
"""Reading starts this long before the run's first RunStarted: ranks' clocks may differ
(they must agree to well within the detectors' timeouts) and another rank's first
heartbeat may be stamped a little earlier than rank 0's RunStarted."""
TICK_KEY = TICK_RUN_ID.encode()


class Verdict(enum.StrEnum):
    """The outcome of an audit."""

    AGREES = "AGREES"
    """Every verdict and command was reproduced exactly."""
    DISAGREES = "DISAGREES"
    """The processors have processed everything compared, and the log differs."""
    PENDING = "PENDING"
    """The processors have not processed some of the run's records yet."""


def role_topics(topics: TopicNames) -> dict[TopicRole, str]:
    """Role -> topic name, for the topics an audit reads (`STAGES`)."""
    return {role: topics.of(role) for stage in STAGES for role in stage}


class RunLog(msgspec.Struct, frozen=True, kw_only=True):
    """One run's history as read from the topics.

    Attributes:
        run_id: The run.
        inputs: Input records (steps, heartbeats with ticks, checkpoints), each role in
            partition order.
        recorded_anomalies: Records of the anomalies topic, in order.
        recorded_commands: Commands from the commands topic, in order.
        dead_letters: Records of the run that failed to decode (kept out of the replay,
            as the live processors kept them out).
        progress: What the processors' group had processed of it; None when not asked
            (an archive, or no group given).
        start_ts_ms: Reading started at this record timestamp; None: at the beginning.
    """

    run_id: str
    inputs: list[Record]
    recorded_anomalies: list[Record]
    recorded_commands: list[RestartRequested]
    dead_letters: int = 0
    progress: Progress | None = None
    start_ts_ms: int | None = None


class AuditReceipt(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of an audit.

    Attributes:
        run_id: The run.
        config_hash: Hash of the configuration the audit replayed with.
        recorded_config_hashes: Hashes found on the recorded verdicts.
        input_records: Input records replayed.
        anomalies: Recorded vs. recomputed anomalies.
        commands: Recorded vs. recomputed commands.
        dead_letters: Records of the run that failed to decode, fold or encode.
        progress: What the processors had processed; None when lag was not asked about.
        pending_ticks: Clock ticks not processed yet whose verdicts the record still
            lacks (0 when the unprocessed ticks change nothing); see `audit`.
    """

    run_id: str
    config_hash: str
    recorded_config_hashes: tuple[str, ...]
    input_records: int
    anomalies: Comparison
    commands: Comparison
    dead_letters: int
    progress: Progress | None = None
    pending_ticks: int = 0

    @property
    def agrees(self) -> bool:
        """True when every verdict and command is reproduced exactly."""
        return self.anomalies.agrees and self.commands.agrees

    @property
    def verdict(self) -> Verdict:
        """PENDING while the group is behind on the run; else AGREES or DISAGREES."""
        progress = self.progress
        if (
            progress is not None
            and progress.group_found
            and (progress.pending or self.pending_ticks)
        ):
            return Verdict.PENDING
        return Verdict.AGREES if self.agrees else Verdict.DISAGREES


def records_of_run(
    run_id: str, history: Mapping[str, Sequence[RawRecord]], topics: TopicNames
) -> RunLog:
    """Pick one run's records (and the ticks of its heartbeat partitions) from raw history.

    Args:
        run_id: The run.
        history: Raw records by topic name, each partition in offset order.
        topics: The topic names of the deployment.

    Returns:
        The run's log, decoded.
    """
    key = encode_key(run_id)
    role_topic = role_topics(topics)
    hb_partitions = {r.partition for r in history.get(topics.heartbeats, ()) if r.key == key}
    inputs: list[Record] = []
    anomalies: list[Record] = []
    commands: list[RestartRequested] = []
    dead = 0
    for role, topic in role_topic.items():
        records = history.get(topic, ())
        if role == TopicRole.HEARTBEATS:
            raw = [r for r in records if r.key == key or r.partition in hb_partitions]
        else:
            raw = [r for r in records if r.key == key]
        good, bad = split(raw, role)
        dead += sum(1 for d in bad if d.key == key)
        # One loop per role, each test the role's own (a 200k-record run: ~2 µs a record
        # less than one loop asking every record every role's questions).
        pairs = zip(good.sources, good.events, strict=True)  # the columns: no pair object
        if role in INPUT_ROLES:
            for source, event in pairs:
                if type(event) is Tick:
                    if event.run_id == TICK_RUN_ID:
                        inputs.append((role, source, event))
                elif event.run_id == run_id:
                    inputs.append((role, source, event))  # type: ignore[arg-type]
        elif role == TopicRole.ANOMALIES:
            for source, event in pairs:
                if event.run_id == run_id and isinstance(event, AnomalyDetected):
                    anomalies.append((role, source, event))
        elif role == TopicRole.COMMANDS:
            for event in good.events:
                if event.run_id == run_id and isinstance(event, RestartRequested):
                    commands.append(event)
    return RunLog(
        run_id=run_id,
        inputs=_from_first_event(inputs, run_id),
        recorded_anomalies=anomalies,
        recorded_commands=commands,
        dead_letters=dead,
    )


def _from_first_event(inputs: list[Record], run_id: str) -> list[Record]:
    """Drop the ticks of a heartbeat partition that precede the run's first event there.

    Such ticks touch no state of the run (a tick ages only the runs already seen in its
    partition), so dropping them changes no verdict, and a receipt does not depend on how
    far before the run the reading began.
    """
    first: dict[int, int] = {}
    ticks = False
    for role, source, event in inputs:
        if role != TopicRole.HEARTBEATS:
            continue
        if type(event) is Tick:
            ticks = True
        elif event.run_id == run_id:
            partition = source.partition
            if partition not in first or source.offset < first[partition]:
                first[partition] = source.offset
    if not ticks:
        return inputs
    return [
        record
        for record in inputs
        if not (
            type(record[2]) is Tick
            and record[1].offset < first.get(record[1].partition, record[1].offset + 1)
        )
    ]


class ReliedOn(NamedTuple):
    """The offsets of one partition an audit relies on, each list ascending."""

    records: list[int]
    """The audited runs' own records (dead letters included: the processors handle them)."""
    ticks: list[int]
    """The clock's ticks after the first of those records."""


def relied_offsets(records: Sequence[RawRecord], keys: frozenset[bytes] | None) -> ReliedOn:
    """The offsets of one partition an audit relies on.

    Args:
        records: The partition's records as read, in offset order.
        keys: The run keys audited; None: every key (the whole log).

    Returns:
        The audited runs' records, and the ticks after the first of them.
    """
    own: list[int] = []
    ticks: list[int] = []
    for r in records:
        if r.key == TICK_KEY:
            if own:
                ticks.append(r.offset)
        elif keys is None or r.key in keys:
            own.append(r.offset)
    return ReliedOn(own, ticks)


def _run_start_ms(reader: LogReader, topics: TopicNames, run_id: str) -> int | None:
    """Timestamp from which to read the run: its first RunStarted less the margin.

    The runs topic is compacted and small (two records per incarnation), so reading the
    run's partition of it is cheap. None when the RunStarted of incarnation 0 is not there.
    """
    count = reader.partition_count(topics.runs)
    if not count:
        return None
    tp = TopicPartition(topics.runs, partition_for(run_id, count))
    start = reader.offsets_at([tp], None)[tp]
    key = encode_key(run_id)
    raw = reader.read(
        {tp: Span(start, reader.end_offsets([tp])[tp])}, key_filter=lambda k: k == key
    )[tp]
    good, _ = split(raw, TopicRole.RUNS)
    for source, event in good:
        if isinstance(event, RunStarted) and event.run_id == run_id and event.incarnation == 0:
            stamp = next(r.timestamp_ms for r in raw if r.offset == source.offset)
            return max(0, stamp - START_MARGIN_MS)
    return None


class _Staged(msgspec.Struct, frozen=True, kw_only=True):
    """Raw history read in stages, and the group's committed offsets after each wait."""

    history: dict[str, list[RawRecord]]
    by_partition: dict[TopicPartition, list[RawRecord]]
    committed: dict[TopicPartition, int] | None
    waited_s: float


def _read_staged(
    reader: LogReader,
    offsets: GroupOffsets | None,
    parts: Mapping[str, Sequence[TopicPartition]],
    starts: Mapping[TopicPartition, int],
    key_filter: KeyFilter | None,
    relied: Callable[[TopicPartition, list[RawRecord]], ReliedOn],
    wait_s: float,
) -> _Staged:
    began = time.monotonic()
    deadline = began + wait_s
    by_partition: dict[TopicPartition, list[RawRecord]] = {}
    committed: dict[TopicPartition, int] | None = {} if offsets is not None else None
    for stage in STAGES:
        tps = [tp for role in stage for tp in parts.get(role, ())]
        ends = reader.end_offsets(tps)  # asked only now: what the previous stage produced
        got = reader.read({tp: Span(starts[tp], ends[tp]) for tp in tps}, key_filter=key_filter)
        by_partition.update(got)
        if offsets is not None and committed is not None and PROCESSED_ROLES.issuperset(stage):
            on = {tp: relied(tp, got[tp]) for tp in tps}
            own = {tp: r.records for tp, r in on.items()}
            ticks = {tp: r.ticks for tp, r in on.items() if r.ticks}
            committed.update(await_processed(offsets, own, deadline, ticks=ticks))
    history: dict[str, list[RawRecord]] = {}
    for tp in sorted(by_partition, key=lambda tp: (tp.topic, tp.partition)):
        history.setdefault(tp.topic, []).extend(by_partition[tp])
    return _Staged(
        history=history,
        by_partition=by_partition,
        committed=committed,
        waited_s=round(time.monotonic() - began, 3),
    )


def _progress(group: str, staged: _Staged, relied: Mapping[TopicPartition, ReliedOn]) -> Progress:
    committed = staged.committed or {}
    return Progress(
        group=group,
        group_found=True,
        partitions=lag_of({tp: r.records for tp, r in relied.items()}, committed),
        ticks=lag_of({tp: r.ticks for tp, r in relied.items() if r.ticks}, committed),
        waited_s=staged.waited_s,
    )


def _group_offsets(
    stack: ExitStack, bootstrap: str, group: str | None, topics: TopicNames
) -> tuple[GroupOffsets | None, Progress | None]:
    """The group's offsets reader, or the Progress that says lag cannot be told."""
    if group is None:
        return None, None
    offsets = stack.enter_context(GroupOffsets(bootstrap, group))
    if offsets.exists([topics.steps, topics.heartbeats, topics.checkpoints, topics.anomalies]):
        return offsets, None
    return None, Progress(
        group=group,
        group_found=False,
        other_groups=offsets.groups_on(role_topics(topics).values()),
    )


def load_run_log(
    bootstrap: str,
    prefix: str,
    run_id: str,
    *,
    timeout_s: float = 60.0,
    group: str | None = None,
    wait_s: float = 0.0,
) -> RunLog:
    """Read one run's history from a live cluster: its partitions, from its start.

    Args:
        bootstrap: Kafka bootstrap address.
        prefix: Topic name prefix.
        run_id: The run.
        timeout_s: A read gives up when the broker makes no progress for this long.
        group: The processors' consumer group (app id); None: do not ask about lag.
        wait_s: Longest to wait for the group to process the run's records.

    Returns:
        The run's log, with ``progress`` set when ``group`` was given.
    """
    topics = names(prefix)
    key = encode_key(run_id)
    keys = frozenset({key})
    with ExitStack() as stack:
        reader = stack.enter_context(LogReader(bootstrap, timeout_s=timeout_s))
        offsets, unknown = _group_offsets(stack, bootstrap, group, topics)
        start_ms = _run_start_ms(reader, topics, run_id)
        parts = {
            role: [TopicPartition(topic, partition_for(run_id, count))]
            for role, topic in role_topics(topics).items()
            if (count := reader.partition_count(topic))
        }
        starts = reader.offsets_at([tp for tps in parts.values() for tp in tps], start_ms)

        def relied(tp: TopicPartition, records: list[RawRecord]) -> ReliedOn:
            return relied_offsets(records, keys)

        staged = _read_staged(
            reader,
            offsets,
            parts,
            starts,
            lambda k: k in (key, TICK_KEY),
            relied,
            wait_s,
        )
    log = records_of_run(run_id, staged.history, topics)
    progress = unknown
    if offsets is not None and group is not None:
        relied_now = {
            tp: relied(tp, records)
            for tp, records in staged.by_partition.items()
            if tp.topic != topics.commands
        }
        progress = _progress(group, staged, relied_now)
    return msgspec.structs.replace(log, progress=progress, start_ts_ms=start_ms)


def audit_all(
    bootstrap: str,
    prefix: str,
    cfg: DetectorConfig,
    *,
    timeout_s: float = 60.0,
    group: str | None = None,
    wait_s: float = 0.0,
) -> list[AuditReceipt]:
    """Audit every run of the log, reading each topic once.

    Runs are those of `load_all_run_logs` (a forged verdict for a run without input is a
    run too, and disagrees).

    Args:
        bootstrap: Kafka bootstrap address.
        prefix: Topic name prefix.
        cfg: The detector configuration to replay with.
        timeout_s: A read gives up when the broker makes no progress for this long.
        group: The processors' consumer group (app id); None: do not ask about lag.
        wait_s: Longest to wait for the group to process the log read.

    Returns:
        One receipt per run, sorted by run id.
    """
    logs = load_all_run_logs(bootstrap, prefix, timeout_s=timeout_s, group=group, wait_s=wait_s)
    return [audit(log, cfg) for log in logs]


def load_all_run_logs(
    bootstrap: str,
    prefix: str,
    *,
    timeout_s: float = 60.0,
    group: str | None = None,
    wait_s: float = 0.0,
) -> list[RunLog]:
    """Every run's log, reading each topic once, every partition from its beginning.

    Runs are the keys found in the topics. Keys with neither a decodable input nor a
    recorded verdict (dead letters only) are left out.

    Args:
        bootstrap: Kafka bootstrap address.
        prefix: Topic name prefix.
        timeout_s: A read gives up when the broker makes no progress for this long.
        group: The processors' consumer group (app id); None: do not ask about lag.
        wait_s: Longest to wait for the group to process the log read.

    Returns:
        One log per run, sorted by run id, each with ``progress`` when ``group`` was given.
    """
    topics = names(prefix)
    with ExitStack() as stack:
        reader = stack.enter_context(LogReader(bootstrap, timeout_s=timeout_s))
        offsets, unknown = _group_offsets(stack, bootstrap, group, topics)
        parts = {
            role: [TopicPartition(topic, p) for p in range(reader.partition_count(topic))]
            for role, topic in role_topics(topics).items()
        }
        starts = reader.offsets_at([tp for tps in parts.values() for tp in tps], None)
        staged = _read_staged(
            reader,
            offsets,
            parts,
            starts,
            None,
            lambda tp, records: relied_offsets(records, None),
            wait_s,
        )
    # one pass over the log to index it by key; each run then takes its own records and
    # the ticks of its heartbeat partitions
    own: dict[bytes, dict[TopicPartition, list[RawRecord]]] = {}
    ticks: dict[int, list[RawRecord]] = {}
    for tp, records in staged.by_partition.items():
        for r in records:
            if r.key == TICK_KEY and tp.topic == topics.heartbeats:
                ticks.setdefault(tp.partition, []).append(r)
            elif r.key:
                own.setdefault(r.key, {}).setdefault(tp, []).append(r)
    logs = []
    for key in sorted(own):
        run_id = key.decode("utf-8", "replace")
        merged: dict[TopicPartition, list[RawRecord]] = {}
        for tp in sorted(own[key], key=lambda tp: (tp.topic, tp.partition)):
            records = own[key][tp]
            if tp.topic == topics.heartbeats:
                first = records[0].offset
                later = [t for t in ticks.get(tp.partition, ()) if t.offset > first]
                records = sorted([*records, *later], key=lambda r: r.offset)
            merged[tp] = records
        history: dict[str, list[RawRecord]] = {}
        for tp, records in merged.items():
            history.setdefault(tp.topic, []).extend(records)
        log = records_of_run(run_id, history, topics)
        if not (log.inputs or log.recorded_anomalies or log.recorded_commands):
            continue
        progress = unknown
        if offsets is not None and group is not None:
            relied_now = {
                tp: relied_offsets(records, frozenset({key}))
                for tp, records in merged.items()
                if tp.topic != topics.commands
            }
            progress = _progress(group, staged, relied_now)
        logs.append(msgspec.structs.replace(log, progress=progress))
    return logs


def _compare(log: RunLog, inputs: list[Record], cfg: DetectorConfig) -> AuditReceipt:
    result: ReplayResult = replay([*inputs, *log.recorded_anomalies], cfg)
    recorded = [e for _, _, e in log.recorded_anomalies if isinstance(e, AnomalyDetected)]
    mine = [a for a in result.anomalies if a.run_id == log.run_id]
    hashes = sorted({a.config_hash for a in recorded})
    return AuditReceipt(
        run_id=log.run_id,
        config_hash=config_hash(cfg),
        recorded_config_hashes=tuple(hashes),
        input_records=len(log.inputs),
        anomalies=compare_anomalies(recorded, mine),
        commands=compare_commands(
            log.recorded_commands, [c for c in result.commands if c.run_id == log.run_id]
        ),
        # decode failures of the log plus the records the replay's fold or state encoding
        # dead-lettered, as the live processors did
        dead_letters=log.dead_letters
        + sum(1 for d in result.dead_letters if d.run_id == log.run_id),
        progress=log.progress,
    )


def _unprocessed_tick(record: Record, committed: Mapping[tuple[str, int], int | None]) -> bool:
    role, source, event = record
    if role != TopicRole.HEARTBEATS or not isinstance(event, Tick):
        return False
    key = (source.topic, source.partition)
    if key not in committed:
        return False
    done = committed[key]
    return done is None or source.offset >= done


def audit(log: RunLog, cfg: DetectorConfig) -> AuditReceipt:
    """Replay a run's log and compare the result with what was recorded.

    The clock keeps writing ticks while a worker runs, and a worker that stops leaves its
    last ticks unprocessed for good. Once the run's own records are processed, such ticks
    make the verdict PENDING only if they matter: when the record agrees with a replay of
    the ticks the processors did process but not with a replay of all of them (the
    pending ticks would raise a verdict the processors have not judged yet). When the
    record agrees with all of them, they changed nothing; when it agrees with neither,
    it disagrees.
    """
    receipt = _compare(log, log.inputs, cfg)
    progress = log.progress
    if (
        receipt.agrees
        or progress is None
        or not progress.group_found
        or progress.pending
        or not progress.ticks_pending
    ):
        return receipt
    committed = {(t.topic, t.partition): t.committed for t in progress.ticks}
    judged = [r for r in log.inputs if not _unprocessed_tick(r, committed)]
    if _compare(log, judged, cfg).agrees:
        return msgspec.structs.replace(receipt, pending_ticks=progress.ticks_pending)
    return receipt


def what_if(log: RunLog, cfg: DetectorConfig) -> ReplayResult:
    """Replay a run's input with ``cfg``; the policy reads the recomputed anomalies."""
    return replay(log.inputs, cfg)
