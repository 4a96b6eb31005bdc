"""Replay: fold every reducer over a log, exactly as the live processors do.

Records come as ``(role, provenance, event)`` where the role (`schemas.topics.TopicRole`)
names the topic: one the processors fold (``steps``, ``heartbeats``, ``checkpoints``,
``anomalies``) or ``runs``. Records of one role
must be in partition order; how roles interleave does not matter, because each reducer
reads one role only. A Tick on the heartbeats role is fanned out to every run seen so far
in its partition, in run-id order (the live adapter must do the same, so that the verdicts
of one tick come out in the same order).

Commands come from the policy folded over the *recorded* anomalies log when the input has
anomaly records, in its order; otherwise over the recomputed anomalies in canonical order
(log time, then source topic, partition, offset, index in a pack, run and emission order),
with synthetic provenance on topic ``replay.anomalies`` (their ``source`` and ``seq``
therefore differ from live commands, which point into the real anomalies topic).

No record stops a partition (ARCHITECTURE rule 7). Every record is applied on its own:
when its fold raises, or the state it produces cannot be encoded for the table
(`processors.core.state_codec`), the record becomes a `DeadLetter` naming the stage
(``fold`` or ``encode``) and the reason, the run's state stays as it was before the record,
its verdicts are dropped, and the next record goes on. This is the fold the live agents
run (`processors.pipeline`), so live, replay and audit dead-letter the same records. A Tick
fanned out to many runs is applied per run: a run whose fold fails keeps its state, the
others advance.

The encode check costs O(world) for a liveness state (a 131,072-rank table takes tens of
milliseconds), so it runs once per run and batch (`Replayer.feed`), not per record: a
heartbeat's cost stays flat in the world size (ARCHITECTURE rule 8). When a run's state
after the batch cannot be stored, that run alone is refolded from its state before the
batch, record by record with the check after each (`Replayer._flush`), so the record that
made it unstorable is the ``encode`` dead letter, as if records came one per batch. The
one difference: a state made unstorable and then storable again inside one batch is not
caught (live, audit and replay all fold so, so they agree).

Packed records (`schemas.events.EventPack`) are unpacked here, in the fold every reader
shares: each inner event is applied as if it were a record of its own, in order, at the
position ``(offset, index)`` (`unpack`), so its verdicts and dead letters name it exactly
and the reducers' offset-in-state rule skips what was applied, inner event by inner
event. A pack is one run's, and one run's state is one table value written once per
batch, so after a crash a pack is redelivered to a state that holds all of it or none.

Two direct paths give the general one's outcome at less bookkeeping per record (issue
23): a heartbeats pack folded per record (`PACK_PATH`, `Replayer._heartbeat_pack`), and a
loose StepCompleted of a known run folded with `_dispatch` and `_apply`'s steps inline,
and a batch's loose Heartbeats of a known run queued and folded per run at once, their
outputs put back in the records' order (`LOOSE_PATH`, `Replayer._loose_heartbeat`,
`Replayer._fold_queued`, `Replayer._loose_step`).
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final, Literal, TypeAlias, TypeGuard, TypeVar

import msgspec

from runwatch.processors.core.checkpoints import CheckpointCatalogue, fold_checkpoint
from runwatch.processors.core.config import DetectorConfig, config_hash
from runwatch.processors.core.liveness import LivenessState, fold_liveness
from runwatch.processors.core.liveness_pack import (
    PackFold,
    fold_heartbeat_pack,
    fold_heartbeat_run,
)
from runwatch.processors.core.policy import PolicyState, fold_policy
from runwatch.processors.core.retention import (
    EXPIRED,
    STRAY_RETENTION_NS,
    SWEEP_EVERY_RECORDS,
    check_admission,
    liveness_expired,
    sweep_due,
)
from runwatch.processors.core.state_codec import encode_state
from runwatch.processors.core.steps import StepHealthState, fold_step
from runwatch.schemas.codec import encode
from runwatch.schemas.events import (
    AnomalyDetected,
    CheckpointCommitted,
    CheckpointFailed,
    DeadLetter,
    DeadLetterStage,
    Event,
    EventPack,
    Heartbeat,
    InputEvent,
    Provenance,
    RankExited,
    RestartRequested,
    RunEnded,
    RunStarted,
    StepCompleted,
    Tick,
)
from runwatch.schemas.topics import FOLD_ORDER, StateKind, TopicRole, folding

Record: TypeAlias = tuple[TopicRole, Provenance, InputEvent | AnomalyDetected]
"""``(role, provenance, event)``: one record of the log, as read from its topic."""
SortKey: TypeAlias = tuple[int, str, int, int, int, str, int]
Touched: TypeAlias = dict[tuple[StateKind, str], tuple[Any, list[tuple[Provenance, Any]]]]
"""(state kind, run) -> its state before the batch and the batch's events applied to it
(an event; a `PackSpan` of a pack's events at the pack's record position; or a
`LooseSpan` of a run's loose heartbeats folded at once, at the first one's position)."""
READ_ROLES: Final[frozenset[TopicRole]] = frozenset({*FOLD_ORDER, TopicRole.RUNS})
"""The roles a replay takes records of: the folded ones, and ``runs`` (read, not folded)."""
REPLAY_ANOMALIES_TOPIC: Final = "replay.anomalies"
SWEPT_ROLES: Final[frozenset[TopicRole]] = frozenset(
    {TopicRole.STEPS, TopicRole.CHECKPOINTS, TopicRole.ANOMALIES}
)
"""Roles whose partitions are swept for expired states every `retention.SWEEP_EVERY_RECORDS`
records (heartbeats are swept at their Ticks)."""
REASON_MAX_CHARS: Final = 1000
"""Longest reason a fold or encode dead letter carries."""
PACK_PATH: Final = True
"""Whether a `Replayer` folds a heartbeats record that is a pack per record
(`processors.core.liveness_pack`) unless told otherwise; off, every inner event goes
through `Replayer._dispatch` on its own. Both give the same states, verdicts and dead
letters (tests/unit/core/test_pack_path.py)."""
LOOSE_PATH: Final = True
"""Whether a `Replayer` folds a loose record (one event, not a pack) that is a Heartbeat of
the heartbeats role or a StepCompleted of the steps role through its direct path (a run's
heartbeats queued and folded at once, `Replayer._loose_heartbeat`, or a whole batch's
queued at once, `Replayer.feed_columns`; a step with `_dispatch` and `_apply`'s
bookkeeping inline, `Replayer._loose_step`) unless told otherwise; off, through
`Replayer._dispatch`. Both give the same states, verdicts and dead letters, in the
same order (tests/unit/core/test_loose_path.py)."""
_ROLE_STEPS: Final = TopicRole.STEPS
_ROLE_HEARTBEATS: Final = TopicRole.HEARTBEATS
_ROLE_CHECKPOINTS: Final = TopicRole.CHECKPOINTS
_ROLE_ANOMALIES: Final = TopicRole.ANOMALIES
_KIND_STEPS: Final = StateKind.STEPS
_KIND_LIVENESS: Final = StateKind.LIVENESS
_KIND_CHECKPOINTS: Final = StateKind.CHECKPOINTS
_KIND_POLICY: Final = StateKind.POLICY
"""The roles and state kinds, read once: on Python 3.11 reading an enum member off its
class (``TopicRole.STEPS``) goes through the enum's Python-level lookup, about 60 ns, and
the general path read several per record."""
S = TypeVar("S")
Out = TypeVar("Out")


def unpack(source: Provenance, event: Event) -> Iterator[tuple[Provenance, Event]]:
    """The events a record carries, each with its position: one, or a pack's in order.

    Args:
        source: Where the record was read.
        event: The record's event.

    Returns:
        ``(source, event)`` itself for a plain event; for an `EventPack`, each inner event
        with ``source`` plus its index in the pack.
    """
    if type(event) is not EventPack:
        yield source, event
        return
    topic, partition, offset = source.topic, source.partition, source.offset
    for index, inner in enumerate(event.events):
        yield Provenance(topic=topic, partition=partition, offset=offset, index=index), inner


class LooseRun:
    """A run's loose heartbeats queued in a batch (`Replayer._loose_heartbeat`).

    Attributes:
        before: The run's state when the first was queued (nothing else touches it while
            they are queued).
        sources: Their positions, increasing, in one partition.
        events: The heartbeats.
        seqs: Each one's place in the batch fed (`Replayer._fold_queued` orders by it).
    """

    __slots__ = ("before", "events", "seqs", "sources")

    def __init__(
        self,
        before: LivenessState,
        sources: list[Provenance],
        events: list[Heartbeat],
        seqs: list[int],
    ) -> None:
        """A queue of these heartbeats (one list each, index for index)."""
        self.before = before
        self.sources = sources
        self.events = events
        self.seqs = seqs


def _starts_queue(
    before: LivenessState | None, source: Provenance, event: Heartbeat
) -> TypeGuard[LivenessState]:
    """Whether a run's heartbeat may start its queue (`Replayer._loose_heartbeat`'s rule 3).

    Not when the run has no liveness state, a suspended one, or one the heartbeat is more
    than `STRAY_RETENTION_NS` past (it may be past its retention: the shortest one a live
    state has), or when its position is at or before the state's.
    """
    return not (
        before is None
        or not before.live
        or event.ts_ns - before.last_heartbeat_ns > STRAY_RETENTION_NS
        or (
            source.offset <= before.last_offset
            and (source.offset < before.last_offset or source.index <= before.last_index)
        )
    )


def _in_record_order(items: list[Any], mark: int, seqs: list[int]) -> None:
    """Put ``items[mark:]``, made for records at batch places ``seqs``, in record order.

    A stable sort: one record's items keep the order they were made in.
    """
    if all(map(operator.le, seqs, seqs[1:])):
        return
    made = items[mark:]
    keyed = sorted(range(len(made)), key=seqs.__getitem__)
    items[mark:] = [made[i] for i in keyed]


_FIRST: Final = operator.itemgetter(0)
_RUN_ID: Final = operator.attrgetter("run_id")
_OFFSET: Final = operator.attrgetter("offset")
_PARTITION: Final = operator.attrgetter("partition")
_NOWHERE: Final = object()
"""A position no verdict has (`Replayer._collect_pack`'s start)."""


class PackSpan(msgspec.Struct, frozen=True, gc=False):
    """Events ``start`` to ``stop`` (exclusive) of a pack, applied at once (`_touched`).

    `Replayer._flush` refolds them one by one, each at its own position (`unpack`).
    """

    pack: EventPack
    start: int
    stop: int


class LooseSpan(msgspec.Struct, frozen=True, gc=False):
    """A run's loose heartbeats folded at once, each at its own position (`_touched`).

    `Replayer._flush` refolds them one by one; kept as the two tuples the fold was given,
    not as a pair per heartbeat.
    """

    sources: tuple[Provenance, ...]
    events: tuple[Heartbeat, ...]


def stage_dead_letter(
    source: Provenance, event: Event, run_id: str, stage: DeadLetterStage, exc: BaseException
) -> DeadLetter:
    """The dead letter of a record whose ``stage`` raised ``exc`` for run ``run_id``.

    Its time is the record's own (log time), its payload the record re-encoded.
    """
    try:
        payload = encode(event)
    except Exception:  # an event that decoded always encodes; never let this raise
        payload = b""
    reason = f"{stage}: {type(exc).__name__}: {exc}"
    return DeadLetter(
        run_id=run_id,
        ts_ns=event.ts_ns,
        seq=source.offset,
        source=source,
        reason=reason[:REASON_MAX_CHARS],
        key=run_id.encode(),
        payload=payload,
        stage=stage,
    )


class ReplayResult(msgspec.Struct, frozen=True):
    """Everything a replay recomputed.

    Attributes:
        anomalies: Verdicts of the step and liveness reducers, in canonical order.
        commands: Commands of the policy (see the module docstring for their input).
        steps: Final step-health state per run.
        liveness: Final liveness state per run.
        policy: Final policy state per run.
        checkpoints: Final checkpoint catalogue per run.
        config_hash: Hash of the configuration replayed with.
        policy_input: ``recorded`` or ``recomputed``: which anomalies the policy read.
        dead_letters: Records whose fold or state encoding failed, in the order met.
    """

    anomalies: list[AnomalyDetected]
    commands: list[RestartRequested]
    steps: dict[str, StepHealthState]
    liveness: dict[str, LivenessState]
    policy: dict[str, PolicyState]
    checkpoints: dict[str, CheckpointCatalogue]
    config_hash: str
    policy_input: Literal["recorded", "recomputed"]
    dead_letters: list[DeadLetter] = []


def _no_runs(kind: StateKind, partition: int) -> Iterable[str]:
    return ()


def _fold_checkpoint(
    state: CheckpointCatalogue | None, event: Any, source: Provenance
) -> tuple[CheckpointCatalogue, None]:
    return fold_checkpoint(state, event, source), None


def _key(anomaly: AnomalyDetected, index: int) -> SortKey:
    src = anomaly.source or Provenance(topic="", partition=-1, offset=-1)
    return (anomaly.ts_ns, src.topic, src.partition, src.offset, src.index, anomaly.run_id, index)


class Replayer:
    """An incremental replay: feed records in batches, read the result at any point."""

    def __init__(
        self, cfg: DetectorConfig, *, pack_path: bool = PACK_PATH, loose_path: bool = LOOSE_PATH
    ) -> None:
        """Start with no state.

        Args:
            cfg: The detector configuration.
            pack_path: Fold a pack of heartbeats per record (`PACK_PATH`); False: event by
                event (the same outcome, slower; for tests and benches).
            loose_path: Fold a loose heartbeat or step through the direct path
                (`LOOSE_PATH`); False: through `_dispatch` (the same outcome, slower; for
                tests and benches).
        """
        self.cfg = cfg
        self.pack_path = pack_path
        self.loose_path = loose_path
        self.steps: dict[str, StepHealthState] = {}
        self.liveness: dict[str, LivenessState] = {}
        self.policy: dict[str, PolicyState] = {}
        self.checkpoints: dict[str, CheckpointCatalogue] = {}
        self.partition_runs: dict[int, set[str]] = {}
        self.recomputed: list[tuple[SortKey, AnomalyDetected]] = []
        self.commands: list[RestartRequested] = []
        self.recorded_anomalies = 0
        self.dead_letters: list[DeadLetter] = []
        self.encoded: dict[StateKind, dict[str, bytes]] = {kind: {} for kind in StateKind}
        """Kind -> run -> the encoded state after the latest batch that changed it."""
        self.evicted: dict[StateKind, set[str]] = {kind: set() for kind in StateKind}
        """Kind -> runs whose state was evicted (`processors.core.retention`) and not made
        again since: their table values are to be deleted."""
        self.members: dict[StateKind, dict[int, set[str]]] = {kind: {} for kind in StateKind}
        """Kind -> partition -> runs holding a state there (`processors.core.retention`:
        the cap and the sweeps), each partition's first taken from `stored_runs`."""
        self.stored_runs: Callable[[StateKind, int], Iterable[str]] = _no_runs
        """Runs whose states the caller keeps outside this replayer, by kind and partition
        (the live agents' tables); a whole replay keeps them all here: none."""
        self._touched: Touched | None = None
        self._stores: dict[StateKind, dict[str, Any]] = {
            _KIND_STEPS: self.steps,
            _KIND_LIVENESS: self.liveness,
            _KIND_POLICY: self.policy,
            _KIND_CHECKPOINTS: self.checkpoints,
        }

    def states_of(self, role: TopicRole | str) -> dict[str, Any]:
        """The live table of run -> state that ``role``'s records fold into.

        Callers may preload states into it before `feed` (the processors' stored states).

        Raises:
            ValueError: The processors do not fold ``role``.
        """
        return self._stores[folding(role).state]

    def _collect(self, verdicts: list[AnomalyDetected]) -> None:
        for i, v in enumerate(verdicts):
            self.recomputed.append((_key(v, i), v))

    def _apply(
        self,
        kind: StateKind,
        store: dict[str, S],
        run_id: str,
        source: Provenance,
        event: Event,
        fold: Callable[[S | None, Any, Provenance], tuple[S, Out]],
    ) -> Out | None:
        """Fold one record into one run's state, or dead-letter it and keep the state.

        Inside `feed` the state's encoding is deferred to the end of the batch (`_flush`);
        outside it (a refold) each record's state is checked as it is made.
        """
        before = store.get(run_id)
        if before is not None and type(event) is not Tick and EXPIRED[kind](before, event.ts_ns):
            # Past its retention at the run's own record: as if a sweep had evicted it, so
            # an audit of this run alone (no other runs' records, no sweeps) agrees.
            self._evict(kind, store, run_id, source.partition)
            before = None
        touched = self._touched
        if touched is not None:
            key = (kind, run_id)
            seen = touched.get(key)
            if seen is None:
                touched[key] = seen = (before, [])
            seen[1].append((source, event))
        members = self._members(kind, source.partition) if before is None else None
        try:
            if members is not None and run_id not in members:  # a new run: the cap
                check_admission(len(members), run_id, source.partition)
            state, outputs = fold(before, event, source)
        except Exception as exc:
            self.dead_letters.append(stage_dead_letter(source, event, run_id, "fold", exc))
            return None
        if state is before:  # the record changed nothing (a Tick of an ended run): no write
            return outputs
        if touched is not None:  # checked once per run, at the end of the batch (`_flush`)
            store[run_id] = state
            if members is not None:
                members.add(run_id)
            return outputs
        try:
            data = encode_state(state)  # type: ignore[arg-type]
        except Exception as exc:
            self.dead_letters.append(stage_dead_letter(source, event, run_id, "encode", exc))
            return None
        store[run_id] = state
        if members is not None:
            members.add(run_id)
        self.encoded[kind][run_id] = data
        self.evicted[kind].discard(run_id)
        return outputs

    def _members(self, kind: StateKind, partition: int) -> set[str]:
        """The runs holding a state of ``kind`` in ``partition`` (seeded once)."""
        runs = self.members[kind].get(partition)
        if runs is None:
            runs = self.members[kind][partition] = set(self.stored_runs(kind, partition))
        return runs

    def _sweep(self, kind: StateKind, store: dict[str, Any], partition: int, now_ns: int) -> None:
        """Evict every state of ``partition`` past its retention at log time ``now_ns``.

        The caller has put every stored state of the partition into ``store`` (the live
        agents preload them for a record that `sweep_due`).
        """
        expired = EXPIRED[kind]
        for run_id in sorted(self._members(kind, partition)):
            state = store.get(run_id)
            if state is not None and expired(state, now_ns):
                self._evict(kind, store, run_id, partition)

    def _fold_step(
        self, state: StepHealthState | None, event: Any, source: Provenance
    ) -> tuple[StepHealthState, list[AnomalyDetected]]:
        return fold_step(state, event, source, self.cfg)

    def _fold_liveness(
        self, state: LivenessState | None, event: Any, source: Provenance
    ) -> tuple[LivenessState, list[AnomalyDetected]]:
        return fold_liveness(state, event, source, self.cfg)

    def _fold_policy(
        self, state: PolicyState | None, event: Any, source: Provenance
    ) -> tuple[PolicyState, list[RestartRequested]]:
        return fold_policy(state, event, source, self.cfg)

    def _heartbeats(self, source: Provenance, event: InputEvent) -> None:
        if isinstance(event, Tick):
            for run_id in sorted(self.partition_runs.get(source.partition, ())):
                if run_id not in self.liveness:  # listed but never seen: nothing to age
                    continue
                verdicts = self._apply(
                    _KIND_LIVENESS,
                    self.liveness,
                    run_id,
                    source,
                    event,
                    self._fold_liveness,
                )
                self._collect(verdicts or [])
                state = self.liveness.get(run_id)
                if state is not None and liveness_expired(state, event.ts_ns):
                    self._evict(_KIND_LIVENESS, self.liveness, run_id, source.partition)
            return
        if not isinstance(event, (Heartbeat, RunStarted, RunEnded, RankExited)):
            return
        self.partition_runs.setdefault(source.partition, set()).add(event.run_id)
        verdicts = self._apply(
            _KIND_LIVENESS,
            self.liveness,
            event.run_id,
            source,
            event,
            self._fold_liveness,
        )
        self._collect(verdicts or [])

    def _evict(self, kind: StateKind, store: dict[str, Any], run_id: str, partition: int) -> None:
        """Forget a run's state past its retention (the agent deletes its table value)."""
        del store[run_id]
        self.encoded[kind].pop(run_id, None)
        self.evicted[kind].add(run_id)
        self._members(kind, partition).discard(run_id)
        if kind is _KIND_LIVENESS:
            self.partition_runs.get(partition, set()).discard(run_id)

    def _anomaly(self, source: Provenance, anomaly: AnomalyDetected) -> None:
        self.recorded_anomalies += 1
        commands = self._apply(
            _KIND_POLICY,
            self.policy,
            anomaly.run_id,
            source,
            anomaly,
            self._fold_policy,
        )
        self.commands.extend(commands or [])

    def feed(self, records: Iterable[Record]) -> Replayer:
        """Apply records (each role in partition order).

        Each run's state is checked (encoded for its table) once, after the batch, not
        after each record (`_flush`): encoding a 131,072-rank table costs what tens of
        thousands of folds do.

        Args:
            records: ``(role, provenance, event)`` triples.

        Returns:
            This replayer.

        Raises:
            ValueError: An unknown role.
        """
        return self._batch(functools.partial(self._apply_each, records))

    def feed_columns(
        self, role: TopicRole, sources: list[Provenance], events: list[Any]
    ) -> Replayer:
        """`feed` of one role's records given as columns: the same outcome.

        A batch of loose heartbeats only, on the heartbeats role, is queued per run at once
        where `_queue_batch` can (no call per heartbeat); any other goes record by record.

        Args:
            role: The records' role.
            sources: Each record's position (in partition order).
            events: Each record's event, index for index.

        Returns:
            This replayer.

        Raises:
            ValueError: An unknown role.
        """
        queued = None
        if role == _ROLE_HEARTBEATS and self.loose_path:
            queued = self._queue_batch(sources, events)
        if queued is None:
            return self.feed(zip(itertools.repeat(role), sources, events))
        return self._batch(lambda _: self._fold_queued(queued))

    def _batch(self, apply: Callable[[Touched], None]) -> Replayer:
        """One batch: ``apply`` its records (given the batch's `_touched`), then `_flush`."""
        marks = len(self.recomputed), len(self.dead_letters), len(self.commands)
        touched: Touched = {}
        self._touched = touched
        try:
            apply(touched)
        finally:
            self._touched = None
        self._flush(touched, marks)
        return self

    def _apply_each(self, records: Iterable[Record], touched: Touched) -> None:
        """`feed`'s records, one at a time (a run's loose heartbeats queued together)."""
        loose = self.loose_path
        queued: dict[str, LooseRun] = {}
        for seq, (role, source, event) in enumerate(records):
            kind = type(event)
            if kind is Heartbeat and loose and role == _ROLE_HEARTBEATS:
                self._loose_heartbeat(queued, seq, source, event)  # type: ignore[arg-type]
                continue
            if queued:
                self._fold_queued(queued)
            if kind is StepCompleted and loose and role == _ROLE_STEPS:
                self._loose_step(touched, source, event)  # type: ignore[arg-type]
            elif kind is EventPack:
                if self.pack_path and role == _ROLE_HEARTBEATS:
                    self._heartbeat_pack(source, event)  # type: ignore[arg-type]
                    continue
                for inner_source, inner in unpack(source, event):
                    self._dispatch(role, inner_source, inner)  # type: ignore[arg-type]
            else:
                self._dispatch(role, source, event)
        if queued:
            self._fold_queued(queued)

    def _queue_batch(
        self, sources: list[Provenance], events: list[Any]
    ) -> dict[str, LooseRun] | None:
        """A batch of loose heartbeats queued per run, as `_loose_heartbeat` queues them; or None.

        When every event is a Heartbeat, the first of each run may start its queue
        (`_loose_heartbeat`'s rule 3) and each later one joins it (its rule 1, checked here
        as the run's offsets increasing strictly in one partition, which implies it: two
        loose records never share an offset), `_loose_heartbeat` record by record builds
        these very queues, in the order of each run's first heartbeat, and folds nothing
        before the batch ends: `_fold_queued` of them is `feed`'s outcome. Anything else
        (another event, a run's first heartbeat that takes rule 2, a later one not past
        the one before it in the same partition) gives None, and the batch goes record by
        record.
        """
        if set(map(type, events)) != {Heartbeat}:
            return None
        places: dict[str, list[int]] = {}
        for seq, run_id in enumerate(map(_RUN_ID, events)):
            at = places.get(run_id)
            if at is None:
                places[run_id] = [seq]
            else:
                at.append(seq)
        queued: dict[str, LooseRun] = {}
        liveness = self.liveness
        for run_id, seqs in places.items():
            run_sources = list(map(sources.__getitem__, seqs))
            before = liveness.get(run_id)
            if not _starts_queue(before, run_sources[0], events[seqs[0]]):  # its rule 2
                return None
            if len(seqs) > 1:  # its rule 1, where offsets increase in one partition
                offsets = list(map(_OFFSET, run_sources))
                if not all(map(operator.lt, offsets, itertools.islice(offsets, 1, None))):
                    return None
                if len(set(map(_PARTITION, run_sources))) != 1:
                    return None
            run_events = list(map(events.__getitem__, seqs))
            queued[run_id] = LooseRun(before, run_sources, run_events, seqs)
        return queued

    def _loose_heartbeat(
        self, queued: dict[str, LooseRun], seq: int, source: Provenance, event: Heartbeat
    ) -> None:
        """A loose Heartbeat of the heartbeats role: queued with its run's, or dispatched.

        A batch's loose heartbeats of a run are folded at once (`_fold_queued`) unless
        something else of the batch comes between them; the outcome is `_dispatch`'s for
        each, in the same order.

        Rules:
            1. A run with heartbeats queued takes this one after them when its position
               is past the last one's in the same partition. Otherwise every queued run
               is folded first (`_fold_queued`), and rule 2 applies.
            2. A run with no liveness state, a suspended one, a heartbeat at or before the
               state's position, or one more than `STRAY_RETENTION_NS` after the run's last
               heartbeat (its state may be past its retention: the shortest one a live
               state has) goes through `_dispatch` (admission, a new state, log time only,
               the skip, the eviction), after every queued run is folded.
            3. Otherwise the heartbeat starts its run's queue.
        """
        run_id = event.run_id
        run = queued.get(run_id)
        if run is not None:  # rule 1
            last = run.sources[-1]
            if source.partition == last.partition and (
                source.offset > last.offset
                or (source.offset == last.offset and source.index > last.index)
            ):
                run.sources.append(source)
                run.events.append(event)
                run.seqs.append(seq)
                return
            self._fold_queued(queued)
        before = self.liveness.get(run_id)
        if not _starts_queue(before, source, event):  # rule 2
            if queued:
                self._fold_queued(queued)
            self._dispatch(_ROLE_HEARTBEATS, source, event)
            return
        queued[run_id] = LooseRun(before, [source], [event], [seq])  # rule 3

    def _fold_queued(self, queued: dict[str, LooseRun]) -> None:
        """Fold every queued run at once: `_dispatch`'s outcome for each heartbeat, in order.

        Steps, numbered as they keep the outcome of one-by-one folds:
            1. Each run, in the order of its first queued heartbeat, gets its `_touched`
               entry (its state before the batch: where `_apply` would have made it), and
               its heartbeats are folded at once (`_fold_loose_run`); a fold touches its
               run's state only, so runs may go one after the other.
            2. The heartbeats left over (past where a run's fold stopped: an eviction, a new
               state, an admission, which count a partition's runs) go through `_dispatch`
               in the records' order.
            3. The verdicts and dead letters made are put in the order of the records that
               made them (a stable sort by place in the batch).
        """
        touched = self._touched
        assert touched is not None  # inside `feed`
        recomputed, dead = self.recomputed, self.dead_letters
        marks = len(recomputed), len(dead)
        order: tuple[list[int], list[int]] = ([], [])
        rest: list[tuple[int, Provenance, Heartbeat]] = []
        for run_id, run in queued.items():  # step 1
            seen = touched.setdefault((_KIND_LIVENESS, run_id), (run.before, []))
            stop = self._fold_loose_run(seen[1], run_id, run, order)
            if stop < len(run.events):
                rest += zip(run.seqs[stop:], run.sources[stop:], run.events[stop:], strict=True)
        queued.clear()
        rest.sort(key=_FIRST)
        for seq, source, event in rest:  # step 2
            made = len(recomputed), len(dead)
            self._dispatch(_ROLE_HEARTBEATS, source, event)
            order[0].extend(itertools.repeat(seq, len(recomputed) - made[0]))
            order[1].extend(itertools.repeat(seq, len(dead) - made[1]))
        _in_record_order(recomputed, marks[0], order[0])  # step 3
        _in_record_order(dead, marks[1], order[1])

    def _fold_loose_run(
        self,
        applied: list[tuple[Provenance, Any]],
        run_id: str,
        run: LooseRun,
        order: tuple[list[int], list[int]],
    ) -> int:
        """Fold a run's queued heartbeats at once, up to where `fold_heartbeat_run` stops.

        Rules:
            1. The bookkeeping `_heartbeats` and `_apply` do per event is done once for the
               heartbeats folded: the partition's runs, the batch's `_touched` entries (one
               per heartbeat, which `_flush` refolds one by one), the state's write (not
               when unchanged), the verdicts, and a ``fold`` dead letter per failed one.
            2. A run fold that raises (it catches what each heartbeat's fold raises: this
               is for what it did not foresee) is as if it stopped at once.

        ``applied`` is the run's `_touched` list; ``order`` gets the batch place of the
        record behind each verdict and dead letter.

        Returns:
            How many heartbeats were folded (the caller dispatches the rest).
        """
        events, sources, seqs = tuple(run.events), tuple(run.sources), run.seqs
        before = run.before
        try:
            fold: PackFold | None = fold_heartbeat_run(before, events, sources, self.cfg)
        except Exception:  # rule 2
            fold = None
        if fold is None or not fold.stop:
            return 0
        stop = fold.stop  # rule 1
        self.partition_runs.setdefault(sources[0].partition, set()).add(run_id)
        applied.append((sources[0], LooseSpan(sources[:stop], events[:stop])))
        if fold.state is not before:
            self.liveness[run_id] = fold.state
        if fold.verdicts:
            self._collect_pack(fold.verdicts)
            at, last = dict(zip(sources, seqs, strict=True)), seqs[stop - 1]
            order[0].extend(at.get(v.source, last) for v in fold.verdicts)  # type: ignore[arg-type]
        for index, exc in fold.failures:
            self.dead_letters.append(
                stage_dead_letter(sources[index], events[index], run_id, "fold", exc)
            )
            order[1].append(seqs[index])
        return stop

    def _loose_step(self, touched: Touched, source: Provenance, event: StepCompleted) -> None:
        """A loose StepCompleted of the steps role: `_dispatch`'s outcome, its steps inline.

        Rules:
            1. A run with no step state, a record at which the partition may be swept
               (`retention.sweep_due`), a run not running, or a step more than
               `STRAY_RETENTION_NS` after the state's newest record (it may be past its
               retention) goes through `_dispatch` (admission, the sweep, the eviction).
            2. Otherwise what `_apply` does for it: the batch's `_touched` entry,
               `fold_step`, a ``fold`` dead letter if that raises (the state kept), else the
               state's write when it changed, and the verdicts (`_collect`).
        """
        run_id = event.run_id
        before = self.steps.get(run_id)
        if (  # rule 1
            before is None
            or source.offset % SWEEP_EVERY_RECORDS == 0
            or before.info.status != "running"
            or event.ts_ns - before.last_ts_ns > STRAY_RETENTION_NS
        ):
            self._dispatch(_ROLE_STEPS, source, event)
            return
        key = (_KIND_STEPS, run_id)  # rule 2
        seen = touched.get(key)
        if seen is None:
            touched[key] = seen = (before, [])
        seen[1].append((source, event))
        try:
            state, verdicts = fold_step(before, event, source, self.cfg)
        except Exception as exc:
            self.dead_letters.append(stage_dead_letter(source, event, run_id, "fold", exc))
            return
        if state is not before:
            self.steps[run_id] = state
        if verdicts:
            self._collect(verdicts)

    def _flush(self, touched: Touched, marks: tuple[int, int, int]) -> None:
        """Encode each state the batch changed; refold a run whose state cannot be stored.

        Rules, per run and state kind the batch touched:
            1. A state the batch left as it was is not written.
            2. A state that encodes is kept with its bytes (`encoded`).
            3. Otherwise the run's verdicts, commands and dead letters of this batch are
               dropped, its state is put back as it was before the batch, and its records
               are refolded one by one with the per-record check, so the record that made
               the state unstorable is the ``encode`` dead letter, as if each record had
               come in a batch of its own. (An unstorable state that a later record of the
               same batch makes storable again is not caught; live, audit and replay all
               fold so. The refolded run's verdicts come after the others of the batch.)
        """
        stores: dict[StateKind, dict[str, Any]] = {
            _KIND_STEPS: self.steps,
            _KIND_LIVENESS: self.liveness,
            _KIND_CHECKPOINTS: self.checkpoints,
            _KIND_POLICY: self.policy,
        }
        for (kind, run_id), (before, applied) in touched.items():
            store = stores[kind]
            state = store.get(run_id)
            if state is None or state is before:
                continue
            try:
                self.encoded[kind][run_id] = encode_state(state)
                self.evicted[kind].discard(run_id)  # evicted, then made again by a record
                continue
            except Exception:
                pass
            self._drop_run_outputs(run_id, marks)
            if before is None:
                del store[run_id]
                self._members(kind, applied[0][0].partition).discard(run_id)
            else:
                store[run_id] = before
            for source, event in applied:
                if type(event) is PackSpan:
                    spans = unpack(source, event.pack)
                    for inner_source, inner in list(spans)[event.start : event.stop]:
                        self._refold(kind, store, run_id, inner_source, inner)
                elif type(event) is LooseSpan:
                    for loose_source, loose in zip(event.sources, event.events, strict=True):
                        self._refold(kind, store, run_id, loose_source, loose)
                else:
                    self._refold(kind, store, run_id, source, event)

    def _drop_run_outputs(self, run_id: str, marks: tuple[int, int, int]) -> None:
        verdicts, dead, commands = marks
        self.recomputed[verdicts:] = [
            kv for kv in self.recomputed[verdicts:] if kv[1].run_id != run_id
        ]
        self.dead_letters[dead:] = [d for d in self.dead_letters[dead:] if d.run_id != run_id]
        self.commands[commands:] = [c for c in self.commands[commands:] if c.run_id != run_id]

    def _refold(
        self, kind: StateKind, store: dict[str, Any], run_id: str, source: Provenance, event: Any
    ) -> None:
        if kind is _KIND_STEPS:
            self._collect(self._apply(kind, store, run_id, source, event, self._fold_step) or [])
        elif kind is _KIND_LIVENESS:
            verdicts = self._apply(kind, store, run_id, source, event, self._fold_liveness)
            self._collect(verdicts or [])
        elif kind is _KIND_CHECKPOINTS:
            self._apply(kind, store, run_id, source, event, _fold_checkpoint)
        else:
            self.commands.extend(
                self._apply(kind, store, run_id, source, event, self._fold_policy) or []
            )

    def _heartbeat_pack(self, source: Provenance, pack: EventPack) -> None:
        """Apply a pack of the heartbeats role: per record where it can, else per event.

        Rules:
            1. A run with no liveness state, or a suspended one, goes event by event
               (`_dispatch`: admission, a new state, a suspended run's log time).
            2. Otherwise `fold_heartbeat_pack` folds its events up to where it stops; the
               bookkeeping `_heartbeats` and `_apply` do per event is done once for them:
               the partition's runs, the batch's `_touched` entry (a `PackSpan`, which
               `_flush` refolds event by event), the state's write (not when unchanged),
               the verdicts, and a ``fold`` dead letter per failed event at its position.
            3. The events from where it stopped on go event by event (`_dispatch`: an
               expired state is evicted there, a non-heartbeat folds as ever).
            4. A pack fold that raises (it catches what each event's fold raises: this is
               for what it did not foresee) is as if it stopped at once: the whole pack
               goes event by event from the state as it was (the rank table's versions
               keep it readable), so one record never stops the partition.
        """
        run_id = pack.run_id
        state = self.liveness.get(run_id)
        touched = self._touched
        stop = 0
        if state is not None and state.live and touched is not None:  # rule 1
            try:
                fold: PackFold | None = fold_heartbeat_pack(state, pack, source, self.cfg)
            except Exception:  # rule 4
                fold = None
            if fold is not None and fold.stop:
                stop = fold.stop
                self._applied_pack(touched, source, pack, state, fold)
        if stop < len(pack.events):  # rule 3
            for inner_source, inner in itertools.islice(unpack(source, pack), stop, None):
                self._dispatch(_ROLE_HEARTBEATS, inner_source, inner)  # type: ignore[arg-type]

    def _applied_pack(
        self,
        touched: Touched,
        source: Provenance,
        pack: EventPack,
        before: LivenessState,
        fold: PackFold,
    ) -> None:
        """Rule 2 of `_heartbeat_pack`: the bookkeeping of the events ``fold`` folded."""
        run_id = pack.run_id
        self.partition_runs.setdefault(source.partition, set()).add(run_id)
        key = (_KIND_LIVENESS, run_id)
        seen = touched.get(key)
        if seen is None:
            touched[key] = seen = (before, [])
        seen[1].append((source, PackSpan(pack, 0, fold.stop)))
        if fold.state is not before:
            self.liveness[run_id] = fold.state
        self._collect_pack(fold.verdicts)
        for index, exc in fold.failures:
            at = Provenance(
                topic=source.topic, partition=source.partition, offset=source.offset, index=index
            )
            self.dead_letters.append(stage_dead_letter(at, pack.events[index], run_id, "fold", exc))

    def _collect_pack(self, verdicts: list[AnomalyDetected]) -> None:
        """`_collect` of many events' verdicts, numbered within each event as `_collect` does.

        A pack's or a run's queued heartbeats': an event's verdicts name its position.
        """
        previous: object = _NOWHERE
        i = 0
        for v in verdicts:
            at = v.source
            i = i + 1 if at == previous else 0
            previous = at
            self.recomputed.append((_key(v, i), v))

    def _dispatch(self, role: str, source: Provenance, event: InputEvent | AnomalyDetected) -> None:
        """Apply one event (a record, or one event of a pack) of ``role``."""
        if role in SWEPT_ROLES and sweep_due(source):  # retention: log time of this record
            kind = folding(role).state
            self._sweep(kind, self._stores[kind], source.partition, event.ts_ns)
        if role == _ROLE_STEPS:
            if isinstance(event, (StepCompleted, RunStarted, RunEnded)):
                verdicts = self._apply(
                    _KIND_STEPS, self.steps, event.run_id, source, event, self._fold_step
                )
                self._collect(verdicts or [])
        elif role == _ROLE_HEARTBEATS:
            if not isinstance(event, AnomalyDetected):
                self._heartbeats(source, event)
        elif role == _ROLE_CHECKPOINTS:
            if isinstance(event, (CheckpointCommitted, CheckpointFailed, RunStarted, RunEnded)):
                self._apply(
                    _KIND_CHECKPOINTS,
                    self.checkpoints,
                    event.run_id,
                    source,
                    event,
                    _fold_checkpoint,
                )
        elif role == _ROLE_ANOMALIES:
            if isinstance(event, AnomalyDetected):
                self._anomaly(source, event)
        elif role not in READ_ROLES:
            raise ValueError(
                f"unknown topic role {role!r}; valid: {', '.join(map(str, READ_ROLES))}"
            )

    def canonical_anomalies(self) -> list[AnomalyDetected]:
        """The recomputed verdicts in canonical order."""
        return [v for _, v in sorted(self.recomputed, key=lambda kv: kv[0])]

    def result(self) -> ReplayResult:
        """What the records fed so far produce."""
        anomalies = self.canonical_anomalies()
        dead = list(self.dead_letters)
        if self.recorded_anomalies:
            commands, policy = list(self.commands), dict(self.policy)
            policy_input: Literal["recorded", "recomputed"] = "recorded"
        else:
            commands, policy = policy_over(anomalies, self.cfg, dead_letters=dead)
            policy_input = "recomputed"
        return ReplayResult(
            anomalies=anomalies,
            commands=commands,
            steps=dict(self.steps),
            liveness=dict(self.liveness),
            policy=policy,
            checkpoints=dict(self.checkpoints),
            config_hash=config_hash(self.cfg),
            policy_input=policy_input,
            dead_letters=dead,
        )


def policy_over(
    anomalies: Iterable[AnomalyDetected],
    cfg: DetectorConfig,
    *,
    dead_letters: list[DeadLetter] | None = None,
) -> tuple[list[RestartRequested], dict[str, PolicyState]]:
    """Fold the policy over anomalies given in order, with synthetic provenance.

    An anomaly whose fold raises is skipped (the run's policy state stays as it was), as
    the live policy would dead-letter it.

    Args:
        anomalies: Verdicts in the order the policy should see them.
        cfg: The configuration.
        dead_letters: Where to append a dead letter per skipped anomaly (None: nowhere).

    Returns:
        The commands and the final policy state per run.
    """
    states: dict[str, PolicyState] = {}
    commands: list[RestartRequested] = []
    offsets: dict[int, int] = {}
    for anomaly in anomalies:
        partition = anomaly.source.partition if anomaly.source is not None else 0
        offset = offsets.get(partition, 0)
        offsets[partition] = offset + 1
        source = Provenance(topic=REPLAY_ANOMALIES_TOPIC, partition=partition, offset=offset)
        stage: DeadLetterStage = "fold"
        try:
            state, new = fold_policy(states.get(anomaly.run_id), anomaly, source, cfg)
            stage = "encode"
            encode_state(state)
        except Exception as exc:
            if dead_letters is not None:
                dead_letters.append(stage_dead_letter(source, anomaly, anomaly.run_id, stage, exc))
            continue
        states[anomaly.run_id] = state
        commands.extend(new)
    return commands, states


def replay(records: Iterable[Record], cfg: DetectorConfig) -> ReplayResult:
    """Fold every reducer over a log.

    Args:
        records: ``(role, provenance, event)``, each role in partition order.
        cfg: The detector configuration.

    Returns:
        Anomalies, commands and final states.
    """
    return Replayer(cfg).feed(records).result()


__all__ = [
    "LOOSE_PATH",
    "READ_ROLES",
    "REPLAY_ANOMALIES_TOPIC",
    "Record",
    "ReplayResult",
    "Replayer",
    "policy_over",
    "replay",
    "stage_dead_letter",
    "unpack",
]
