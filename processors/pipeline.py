"""Fold a batch of decoded records into per-run states: the glue between agents and core.

Pure: no Kafka, no faust. The live agents fold through the core's `Replayer`, the very
object `runwatch audit` replays the log with, preloaded with the stored states of the
runs the batch touches. Live and replay therefore share one code path, tick fan-out
and per-record isolation included (a record whose fold or state encoding fails is a
dead letter, its run's state stays as before it), and cannot drift apart.

The result carries each touched state already encoded (the Replayer encodes every state
it keeps, which is how it knows the state can be stored): the agent publishes the
outputs and dead letters first, then writes exactly these bytes (ARCHITECTURE rule 6).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import repeat
from operator import attrgetter, mod
from typing import Any, Final, NamedTuple

from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.replay import LOOSE_PATH, PACK_PATH, SWEPT_ROLES, Replayer
from runwatch.processors.core.retention import SWEEP_EVERY_RECORDS, sweep_due
from runwatch.schemas.events import TICK_RUN_ID, DeadLetter, Event, EventPack, Provenance, Tick
from runwatch.schemas.records import Admitted, Decoded
from runwatch.schemas.topics import TopicRole, folding

_HEARTBEATS: Final = TopicRole.HEARTBEATS
"""Read once (on Python 3.11 an enum member read off its class costs a Python-level lookup)."""
_RUN_ID: Final = attrgetter("run_id")
_PARTITION: Final = attrgetter("partition")
_OFFSET: Final = attrgetter("offset")


class BatchResult(NamedTuple):
    """What folding a batch produced.

    Attributes:
        states: The state of every run the batch touched (preloaded ones included).
        outputs: Verdicts and commands, in the order the reducers emitted them.
        dead: Records whose fold or state encoding failed.
        encoded: Run -> its new state as table bytes, for every run a record changed.
        evicted: Runs whose state passed its retention (`processors.core.retention`):
            delete their table values (they are in neither ``states`` nor ``encoded``).
    """

    states: dict[str, Any]
    outputs: list[Event]
    dead: list[DeadLetter]
    encoded: dict[str, bytes]
    evicted: frozenset[str] = frozenset()


def fold_batch(
    role: TopicRole,
    items: Sequence[Decoded],
    load: Callable[[str], Any],
    runs_in_partition: Callable[[int], Iterable[str]],
    cfg: DetectorConfig,
    *,
    pack_path: bool = PACK_PATH,
    loose_path: bool = LOOSE_PATH,
) -> BatchResult:
    """Fold ``items`` (one topic role, in partition order) into the states they touch.

    Args:
        role: A role the processors fold (`schemas.topics.FOLD_ORDER`).
        items: Decoded records of that role (an `Admitted` is read as its columns; any
            other sequence of `Decoded` is made into one).
        load: The stored state of a run, or None for a run not seen yet.
        runs_in_partition: Runs with a stored state in a partition (a Tick fans out to them).
        cfg: Detector configuration.
        pack_path: Fold a pack of heartbeats per record (`Replayer`'s switch: the same
            outcome either way).
        loose_path: Fold a loose heartbeat or step through the Replayer's direct path
            (its switch: the same outcome either way).

    Returns:
        The states of every run the batch touched, the verdicts or commands to publish in
        the order the reducers emitted them, the dead letters, and the encoded states.
    """
    replayer = Replayer(cfg, pack_path=pack_path, loose_path=loose_path)
    kind = folding(role).state
    store = replayer.states_of(role)
    replayer.stored_runs = lambda _, partition: runs_in_partition(partition)
    admitted = Admitted.of(items)
    sources, events = admitted.sources, admitted.events
    if not _preload_plain(store, sources, events, load, replayer.partition_runs, role):
        _preload_each(store, admitted, load, runs_in_partition, replayer.partition_runs, role)
    replayer.feed_columns(role, sources, events)
    outputs: list[Event] = [verdict for _, verdict in replayer.recomputed]
    outputs.extend(replayer.commands)
    return BatchResult(
        store,
        outputs,
        list(replayer.dead_letters),
        replayer.encoded[kind],
        frozenset(replayer.evicted[kind]),
    )


def _preload_plain(
    store: dict[str, Any],
    sources: list[Provenance],
    events: list[Any],
    load: Callable[[str], Any],
    partition_runs: dict[int, set[str]],
    role: TopicRole,
) -> bool:
    """`_preload_each` of a batch with no Tick and no sweep due, per run instead of per record.

    The runs are preloaded, and (heartbeats) noted in their partitions, in the order of
    their first record, as `_preload_each` does them: the store's order and each set's
    insertion order are the same (``load`` is asked once a run, where `_preload_each`
    asks again at each record of a run it has no state of). Returns False, doing
    nothing, when a record's run id is a Tick's (``*``) or a record of a swept role is at
    a sweep's offset: those take `_preload_each`, record by record.
    """
    run_ids = list(map(_RUN_ID, events))
    if TICK_RUN_ID in run_ids:
        return False
    if role in SWEPT_ROLES and 0 in map(mod, map(_OFFSET, sources), repeat(SWEEP_EVERY_RECORDS)):
        return False
    for run_id in dict.fromkeys(run_ids):
        _preload(store, run_id, load)
    if role == _HEARTBEATS:
        for partition, run_id in dict.fromkeys(zip(map(_PARTITION, sources), run_ids, strict=True)):
            runs = partition_runs.get(partition)
            if runs is None:
                partition_runs[partition] = {run_id}
            else:
                runs.add(run_id)
    return True


def _preload_each(
    store: dict[str, Any],
    items: Admitted,
    load: Callable[[str], Any],
    runs_in_partition: Callable[[int], Iterable[str]],
    partition_runs: dict[int, set[str]],
    role: TopicRole,
) -> None:
    """Preload the states a batch's records need, record by record (`fold_batch`).

    A Tick preloads every run of its partition; the first record of a partition at a
    sweep's offset preloads every stored run of it (the sweep reads them all); any other
    record its own run. Heartbeats also note each run in its partition's runs.
    """
    swept: set[int] = set()
    sweeps, heartbeats = role in SWEPT_ROLES, role == _HEARTBEATS
    for source, event in zip(items.sources, items.events, strict=True):  # inline (issue 23)
        run_id = event.run_id
        if run_id == TICK_RUN_ID and isinstance(event, Tick):
            known = partition_runs.setdefault(source.partition, set())
            for run_id in runs_in_partition(source.partition):
                known.add(run_id)
                _preload(store, run_id, load)
            continue
        if sweeps and sweep_due(source) and source.partition not in swept:
            swept.add(source.partition)  # the sweep reads every state of the partition
            for stored in runs_in_partition(source.partition):
                _preload(store, stored, load)
        if run_id not in store:  # `_preload`
            state = load(run_id)
            if state is not None:
                store[run_id] = state
        if heartbeats:
            runs = partition_runs.get(source.partition)
            if runs is None:
                partition_runs[source.partition] = {run_id}
            elif run_id not in runs:
                runs.add(run_id)


def fold_chunks(
    role: TopicRole,
    items: Sequence[Decoded],
    load: Callable[[str], Any],
    runs_in_partition: Callable[[int], Iterable[str]],
    cfg: DetectorConfig,
    chunk_events: int,
) -> Iterator[BatchResult]:
    """`fold_batch` of ``items`` in consecutive chunks of about ``chunk_events`` events.

    Each chunk's result is yielded as soon as it is folded, so a caller can send a chunk's
    outputs before the next chunk is folded. The states of the earlier chunks are carried
    to the next in memory (as one fold carries them from record to record), and a Tick
    fans out to the runs ``runs_in_partition`` names plus those the earlier chunks'
    heartbeats named, as in one fold: the concatenated outputs and dead letters, and the
    last ``encoded``, are those of ``fold_batch(role, items, ...)`` (a unit test holds
    them to that).

    Args:
        role: As for `fold_batch`.
        items: As for `fold_batch`.
        load: As for `fold_batch` (asked only for runs no earlier chunk touched).
        runs_in_partition: As for `fold_batch`.
        cfg: Detector configuration.
        chunk_events: Events per chunk (a pack weighs its events; a chunk ends after the
            record that reaches the budget).

    Yields:
        One `BatchResult` per chunk: its own outputs and dead letters; ``states`` and
        ``encoded`` are the same two dicts every time, holding everything up to this
        chunk (the last one yielded is the whole batch's), and ``evicted`` every run
        evicted up to this chunk and not made again since.
    """
    states: dict[str, Any] = {}
    encoded: dict[str, bytes] = {}
    seen: dict[int, set[str]] = {}
    evicted: set[str] = set()

    def carried_load(run_id: str) -> Any:
        if run_id in states:
            return states[run_id]
        return None if run_id in evicted else load(run_id)

    def runs_in(partition: int) -> Iterable[str]:
        runs = seen.get(partition)
        stored = [r for r in runs_in_partition(partition) if r not in evicted]
        return [*stored, *runs] if runs else stored

    chunks = list(_chunks(Admitted.of(items), chunk_events))
    for index, chunk in enumerate(chunks, start=1):
        result = fold_batch(role, chunk, carried_load, runs_in, cfg)
        states.update(result.states)
        encoded.update(result.encoded)
        evicted.difference_update(result.encoded)
        for run_id in result.evicted:
            states.pop(run_id, None)
            encoded.pop(run_id, None)
            evicted.add(run_id)
            for runs in seen.values():
                runs.discard(run_id)
        # Runs whose states this chunk made or kept, each (partition, run) once, in the
        # order of its first record (the sets' insertion order, as one record at a time),
        # for the later chunks' Ticks: none after the last (a paced round's only) chunk.
        if index < len(chunks):
            partitions = map(_PARTITION, chunk.sources)
            pairs = zip(partitions, map(_RUN_ID, chunk.events), strict=True)
            for partition, run_id in dict.fromkeys(pairs):
                if run_id in states and run_id != TICK_RUN_ID:
                    seen.setdefault(partition, set()).add(run_id)
        yield BatchResult(states, result.outputs, result.dead, encoded, frozenset(evicted))


def _chunks(items: Admitted, budget: int) -> Iterator[Admitted]:
    """``items`` in consecutive slices of about ``budget`` events (a pack weighs its events)."""
    events = items.events
    if EventPack not in set(map(type, events)):  # one event a record
        step = max(budget, 1)
        for start in range(0, len(items), step):
            yield items[start : start + step]
        return
    start = weight = 0
    for i, event in enumerate(events):
        weight += len(event.events) if type(event) is EventPack else 1  # exact types: 3x faster
        if weight >= budget:
            yield items[start : i + 1]
            start, weight = i + 1, 0
    if start < len(items):
        yield items[start:]


def _preload(store: dict[str, Any], run_id: str, load: Callable[[str], Any]) -> None:
    if run_id not in store:
        state = load(run_id)
        if state is not None:
            store[run_id] = state
