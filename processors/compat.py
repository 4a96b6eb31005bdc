"""Every private name of faust-streaming, aiokafka and mode the processors rely on.

The engine is written against the exact versions in `PINS` (pyproject pins them too). It
uses their internals two ways, both listed here:

* **calls and attributes**: the accessors below (`note_acks`, `set_retry_backoff`, ...)
  are the only code that reads or writes a private attribute or calls a private method
  of those packages; each fails loudly (`InternalsMoved`) when what it touches is gone;
* **overrides**: runwatch's subclasses (`processors.engine`, `processors.stores`,
  `runwatch.cmd.processors`) replace private methods. An override of a method that was
  renamed upstream is silently never called, so each one is listed in `INTERNALS` too.

`check` verifies every entry of `INTERNALS` against the installed packages (a method with
the parameters the code passes or overrides, a property, an attribute its class's
constructor sets) and raises `InternalsMoved` naming each one that moved; `create_app`
calls it before anything starts, and ``tests/unit/processors/test_compat.py`` runs it.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import inspect
import itertools
import operator
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Final, Literal

PINS: Final[Mapping[str, str]] = {
    "faust-streaming": "0.15.3",
    "aiokafka": "0.14.0",
    "mode-streaming": "0.7.1",
}
"""The versions the internals below were read from (pyproject.toml pins the same)."""

Kind = Literal["method", "property", "attribute", "function"]


@dataclass(frozen=True, slots=True)
class Internal:
    """One private name runwatch uses.

    Attributes:
        owner: Dotted path of the class (or module) that has it.
        name: The attribute's name.
        kind: ``method`` (with ``params``, ``self`` first), ``property``, ``attribute``
            (set by the owner's constructor: ``self.<name> =`` in its source), or
            ``function`` (module level, with ``params``).
        used_by: Where runwatch uses it, and how.
        params: The parameter names a method or function must have, in order.
    """

    owner: str
    name: str
    kind: Kind
    used_by: str
    params: tuple[str, ...] = ()


_AIOKAFKA_CONSUMER = "aiokafka.consumer.consumer.AIOKafkaConsumer"
_CLIENT = "aiokafka.client.AIOKafkaClient"
_DRIVER = "faust.transport.drivers.aiokafka"
_FAUST_CONSUMER = "faust.transport.consumer.Consumer"
_ROCKS = "faust.stores.rocksdb.Store"
_FETCHER = "aiokafka.consumer.fetcher.Fetcher"
_FETCH_RESULT = "aiokafka.consumer.fetcher.FetchResult"
_PARTITION_RECORDS = "aiokafka.consumer.fetcher.PartitionRecords"

PORTED: Final[Mapping[str, str]] = {
    f"{_FETCHER}.fetched_records": "be4348896b9b66af",
    f"{_FETCH_RESULT}.getall": "3e717e30de5068d5",
    f"{_PARTITION_RECORDS}._unpack_records": "b803e6d46480732c",
}
"""Code of aiokafka's that `fetched_records` does again its own way (the raw record path),
by the first 16 hex digits of the SHA-256 of its source: a change upstream is a change to
port, and `check` names it."""

INTERNALS: Final[tuple[Internal, ...]] = (
    # aiokafka
    Internal(
        _CLIENT,
        "_metadata_update",
        "method",
        "override: backoff after a failed metadata update (`_BackoffClient`)",
        ("self", "cluster_metadata", "topics"),
    ),
    Internal(_CLIENT, "_retry_backoff", "attribute", "set_retry_backoff"),
    Internal(_AIOKAFKA_CONSUMER, "_client", "attribute", "set_retry_backoff"),
    Internal(_AIOKAFKA_CONSUMER, "_retry_backoff_ms", "attribute", "set_retry_backoff"),
    Internal(_AIOKAFKA_CONSUMER, "_fetch_max_wait_ms", "attribute", "set_fetch_max_wait"),
    Internal(_AIOKAFKA_CONSUMER, "_fetcher", "attribute", "set_fetch_min_bytes"),
    Internal(
        "aiokafka.consumer.fetcher.Fetcher",
        "_fetch_min_bytes",
        "attribute",
        "set_fetch_min_bytes: read for every fetch request it builds",
    ),
    # aiokafka: the raw record path (`fetched_records`), a port of the code in `PORTED`
    Internal(_AIOKAFKA_CONSUMER, "_closed", "attribute", "fetched_records"),
    *(
        Internal(_FETCHER, name, "attribute", "fetched_records")
        for name in ("_closed", "_subscriptions", "_records", "_wait_consume_future")
    ),
    Internal(_FETCHER, "_notify", "method", "fetched_records", ("self", "future")),
    Internal(_FETCHER, "_create_fetch_waiter", "method", "fetched_records", ("self",)),
    Internal(_FETCH_RESULT, "_partition_records", "attribute", "_drain_raw"),
    Internal(_FETCH_RESULT, "check_assignment", "method", "_drain_raw", ("self", "tp")),
    Internal(_FETCH_RESULT, "_update_position", "method", "_drain_raw", ("self",)),
    *(
        Internal(_PARTITION_RECORDS, name, "attribute", "_drain_raw, _unpack_raw")
        for name in (
            "_records",
            "_records_iterator",
            "_check_crcs",
            "_isolation_level",
            "_key_deserializer",
            "_value_deserializer",
            "_aborted_producers",
        )
    ),
    Internal(
        _PARTITION_RECORDS,
        "_consume_aborted_up_to",
        "method",
        "_unpack_raw",
        ("self", "batch_offset"),
    ),
    Internal(
        _PARTITION_RECORDS,
        "_contains_abort_marker",
        "method",
        "_unpack_raw",
        ("self", "next_batch"),
    ),
    Internal(
        f"{_DRIVER}.AIOKafkaConsumerThread",
        "_fetch_records",
        "method",
        "override: the batch path's records raw (`fetched_records`)",
        ("self", "consumer", "active_partitions", "timeout", "max_records"),
    ),
    # faust: the producer, the consumer thread, the consumer, the app
    Internal(
        f"{_DRIVER}.Producer",
        "_producer_type",
        "property",
        "override: the producer class (engine.Producer)",
    ),
    Internal(
        f"{_DRIVER}.Producer",
        "_ensure_producer",
        "method",
        "producer_client, aiokafka_producer",
        ("self",),
    ),
    Internal(
        f"{_DRIVER}.AIOKafkaConsumerThread",
        "_create_consumer",
        "method",
        "override: configure the consumer before it starts",
        ("self", "loop"),
    ),
    Internal(
        f"{_DRIVER}.AIOKafkaConsumerThread",
        "_ensure_consumer",
        "method",
        "committed_offset",
        ("self",),
    ),
    Internal(
        f"{_DRIVER}.Consumer",
        "_new_consumer_thread",
        "method",
        "override: runwatch's consumer thread",
        ("self",),
    ),
    Internal(
        f"{_DRIVER}.Consumer", "_wait_next_records", "method", "next_records", ("self", "timeout")
    ),
    Internal(
        f"{_DRIVER}.Consumer", "_to_message", "method", "to_message", ("self", "tp", "record")
    ),
    Internal(
        f"{_DRIVER}.Consumer", "_get_active_partitions", "method", "active_partitions", ("self",)
    ),
    Internal(_DRIVER, "ensure_aiokafka_TP", "function", "committed_offset", ("tp",)),
    Internal(f"{_DRIVER}.Consumer", "_thread", "attribute", "committed_offset"),
    Internal(f"{_DRIVER}.AIOKafkaConsumerThread", "_consumer", "attribute", "set_fetch_min_bytes"),
    Internal(_FAUST_CONSUMER, "_acked", "attribute", "note_acks"),
    Internal(_FAUST_CONSUMER, "_committed_offset", "attribute", "faust_committed"),
    Internal(_FAUST_CONSUMER, "_n_acked", "attribute", "note_acks, reset_ack_count"),
    Internal(
        _FAUST_CONSUMER,
        "_new_offset",
        "method",
        "override: the batch path's next commit from its ranges (engine.Consumer)",
        ("self", "tp"),
    ),
    Internal(
        _FAUST_CONSUMER,
        "_filter_tps_with_pending_acks",
        "method",
        "note_acks: faust commits the partitions that are keys of _acked",
        ("self", "topics"),
    ),
    Internal(_FAUST_CONSUMER, "_buffered_partitions", "attribute", "buffered_partitions"),
    Internal(
        "faust.app.base.App",
        "_new_transport",
        "method",
        "override: runwatch's transport (engine.App)",
        ("self",),
    ),
    Internal(
        "faust.app.base.App",
        "_new_producer_transport",
        "method",
        "override: runwatch's transport (engine.App)",
        ("self",),
    ),
    Internal("faust.app.base.App", "_leader_assignor", "attribute", "leader_topic_of"),
    Internal(
        "faust.assignor.leader_assignor.LeaderAssignor",
        "_leader_topic",
        "attribute",
        "leader_topic_of: the topic `runwatch processors` creates first",
    ),
    Internal(
        "faust.sensors.monitor.Monitor",
        "stream_inbound_time",
        "attribute",
        "inbound_times: faust's livelock detector reads it",
    ),
    # faust: tables and the RocksDB store
    Internal(
        "faust.tables.base.Collection",
        "_new_store_by_url",
        "method",
        "override: RunTable's RocksDB store",
        ("self", "url"),
    ),
    Internal(_ROCKS, "_set", "method", "override: RunRocksStore", ("self", "key", "value")),
    Internal(_ROCKS, "_get", "method", "override: RunRocksStore", ("self", "key")),
    Internal(_ROCKS, "_contains", "method", "override: RunRocksStore", ("self", "key")),
    Internal(_ROCKS, "_del", "method", "override: RunRocksStore", ("self", "key")),
    Internal(_ROCKS, "_db_for_partition", "method", "RunRocksStore", ("self", "partition")),
    Internal(_ROCKS, "_visible_keys", "method", "RunRocksStore.partition_keys", ("self", "db")),
    Internal(_ROCKS, "_key_index", "attribute", "RunRocksStore._set"),
    # faust's worker (mode's Worker underneath)
    Internal(
        "faust.worker.Worker",
        "_schedule_shutdown",
        "method",
        "override: a bounded stop (runwatch.cmd.processors)",
        ("self", "signal"),
    ),
    Internal(
        "mode.worker.Worker",
        "_signal_stop_time",
        "attribute",
        "runwatch.cmd.processors: the first stop signal",
    ),
    Internal("faust.worker.Worker", "spinner", "attribute", "runwatch.cmd.processors: no spinner"),
)
"""Every private name of faust, aiokafka and mode that runwatch calls, reads, writes or
overrides."""


class InternalsMoved(RuntimeError):
    """An internal of faust, aiokafka or mode that runwatch uses is not where it was."""


def installed_versions() -> dict[str, str | None]:
    """The installed version of each package in `PINS` (None: not installed)."""
    found: dict[str, str | None] = {}
    for package in PINS:
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = None
    return found


def _resolve(dotted: str) -> Any:
    try:
        return importlib.import_module(dotted)
    except ImportError:
        module, _, name = dotted.rpartition(".")
        return getattr(importlib.import_module(module), name)


def _constructor_sets(owner: type, name: str) -> bool:
    """Whether a constructor in ``owner``'s classes assigns ``self.<name>``."""
    for klass in owner.__mro__:
        for method in ("__init__", "__post_init__"):
            fun = klass.__dict__.get(method)
            if fun is None:
                continue
            try:
                source = inspect.getsource(fun)
            except (OSError, TypeError):
                continue
            if f"self.{name} =" in source or f"self.{name}:" in source:
                return True
    return name in getattr(owner, "__annotations__", {}) or hasattr(owner, name)


def problem(internal: Internal) -> str | None:
    """What is wrong with ``internal`` in the installed packages (None: it is as expected)."""
    where = f"{internal.owner}.{internal.name}"
    try:
        owner = _resolve(internal.owner)
    except (ImportError, AttributeError) as exc:
        return f"{internal.owner}: cannot import ({exc})"
    if internal.kind == "attribute":
        return None if _constructor_sets(owner, internal.name) else f"{where}: not set"
    found = inspect.getattr_static(owner, internal.name, None)
    if found is None:
        return f"{where}: missing"
    if internal.kind == "property":
        return None if isinstance(found, property) else f"{where}: not a property"
    fun = getattr(owner, internal.name)
    if not callable(fun):
        return f"{where}: not callable"
    params = tuple(inspect.signature(fun).parameters)
    if params[: len(internal.params)] != internal.params:
        return f"{where}: parameters {params}, expected {internal.params}"
    return None


def port_problem(dotted: str) -> str | None:
    """What is wrong with ported code ``dotted`` in the installed packages (None: as ported)."""
    owner, _, name = dotted.rpartition(".")
    try:
        source = inspect.getsource(getattr(_resolve(owner), name))
    except (ImportError, AttributeError, OSError, TypeError) as exc:
        return f"{dotted}: cannot read its source ({exc})"
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    if digest != PORTED[dotted]:
        return f"{dotted}: its source changed (sha256 {digest}, ported from {PORTED[dotted]})"
    return None


def check() -> None:
    """Raise when an internal runwatch uses moved; say which, and the versions.

    Raises:
        InternalsMoved: One or more entries of `INTERNALS` do not hold.
    """
    problems = [p for p in map(problem, INTERNALS) if p is not None]
    problems += [p for p in map(port_problem, PORTED) if p is not None]
    if problems:
        raise InternalsMoved(
            f"runwatch's processors are written against {dict(PINS)}, installed "
            f"{installed_versions()}; these internals moved: {'; '.join(problems)}"
        )


def _moved(what: str) -> InternalsMoved:
    return InternalsMoved(
        f"{what} is gone (installed {installed_versions()}, written against {dict(PINS)})"
    )


# ----------------------------------------------------------------------------------------
# Accessors: the only code that touches the internals above.


def set_retry_backoff(consumer: Any, backoff_ms: int) -> None:
    """Give an aiokafka consumer that has not started yet ``backoff_ms`` as retry backoff.

    Raises:
        InternalsMoved: aiokafka's consumer no longer has the attributes this sets.
    """
    client = getattr(consumer, "_client", None)
    if not hasattr(consumer, "_retry_backoff_ms") or not hasattr(client, "_retry_backoff"):
        raise _moved("AIOKafkaConsumer._retry_backoff_ms / _client._retry_backoff")
    consumer._retry_backoff_ms = backoff_ms  # read by start() for the fetcher and coordinator
    client._retry_backoff = backoff_ms / 1000


def set_fetch_max_wait(consumer: Any, wait_ms: int) -> None:
    """Give an aiokafka consumer that has not started yet ``wait_ms`` as ``fetch_max_wait_ms``.

    Raises:
        InternalsMoved: aiokafka's consumer no longer has the attribute this sets.
    """
    if not hasattr(consumer, "_fetch_max_wait_ms"):
        raise _moved("AIOKafkaConsumer._fetch_max_wait_ms")
    consumer._fetch_max_wait_ms = wait_ms  # read by start() for the fetcher


def set_fetch_min_bytes(consumer: Any, min_bytes: int) -> bool:
    """Make the running fetcher of faust's ``consumer`` ask the broker for ``min_bytes``.

    aiokafka's fetcher reads its ``_fetch_min_bytes`` each time it builds a fetch request
    (in faust's consumer thread); an int written from the worker's thread is seen by the
    next request. The broker holds a fetch until that many bytes are there or
    ``fetch_max_wait_ms`` passed (`processors.engine.FETCH_MAX_WAIT_MS`).

    Returns:
        False when the consumer or its fetcher is not started yet (nothing set).

    Raises:
        InternalsMoved: faust's consumer thread or aiokafka's fetcher lost the attributes.
    """
    thread = getattr(consumer, "_thread", None)
    if thread is None or not hasattr(thread, "_consumer"):
        raise _moved("faust Consumer._thread._consumer")
    client = thread._consumer
    if client is None:
        return False
    if not hasattr(client, "_fetcher"):
        raise _moved("AIOKafkaConsumer._fetcher")
    fetcher = client._fetcher
    if fetcher is None:
        return False
    if not hasattr(fetcher, "_fetch_min_bytes"):
        raise _moved("aiokafka Fetcher._fetch_min_bytes")
    fetcher._fetch_min_bytes = min_bytes
    return True


def client_of(consumer: Any) -> Any:
    """The `AIOKafkaClient` of an aiokafka consumer.

    Raises:
        InternalsMoved: The consumer has no ``_client``.
    """
    client = getattr(consumer, "_client", None)
    if client is None:
        raise _moved("AIOKafkaConsumer._client")
    return client


def leader_topic_of(app: Any) -> Any:
    """The faust topic (name, partitions, config) whose one partition makes a worker leader."""
    assignor = getattr(app, "_leader_assignor", None)
    if assignor is None:
        raise _moved("faust App._leader_assignor")
    return assignor._leader_topic


def producer_client(app: Any) -> Any:
    """The `AIOKafkaClient` of a faust app's producer (its metadata: ``client.cluster``)."""
    return app.producer._ensure_producer().client


def aiokafka_producer(app: Any) -> Any:
    """The started ``aiokafka.AIOKafkaProducer`` under a faust app's producer.

    Its public ``create_batch`` and ``send_batch`` write the tables' changelogs
    (`processors.changelog_batches`).
    """
    return app.producer._ensure_producer()


async def next_records(consumer: Any, timeout_s: float) -> tuple[Any, Any]:
    """The next records faust fetched: ``(records by TP or None, active TPs or None)``."""
    return await consumer._wait_next_records(timeout_s)


def to_message(consumer: Any, tp: Any, record: Any) -> Any:
    """A fetched record as faust's ``ConsumerMessage``."""
    return consumer._to_message(tp, record)


def buffered_partitions(consumer: Any) -> set[Any]:
    """Partitions faust keeps records of while they are not active."""
    return consumer._buffered_partitions  # type: ignore[no-any-return]


def active_partitions(consumer: Any) -> set[Any]:
    """The partitions faust's consumer delivers records of now."""
    return consumer._get_active_partitions()  # type: ignore[no-any-return]


def faust_committed(consumer: Any, tp: Any) -> int | None:
    """The offset faust's consumer holds as committed for ``tp`` (None: none yet)."""
    return consumer._committed_offset[tp]  # type: ignore[no-any-return]


def note_acks(consumer: Any, tp: Any, count: int) -> None:
    """Tell faust's consumer that ``count`` offsets of ``tp`` were acknowledged.

    The offsets themselves are the engine's (`processors.acked.AckedRanges`, which its
    consumer's ``_new_offset`` reads); faust needs the partition among those with
    pending acknowledgements (its commit looks only at those: the keys of ``_acked``)
    and the count towards ``broker_commit_every``.
    """
    consumer._acked.setdefault(tp, [])  # the partition is one with acknowledgements to commit
    consumer._n_acked += count


def reset_ack_count(consumer: Any) -> None:
    """Zero faust's count of acks towards ``broker_commit_every`` (the engine commits)."""
    consumer._n_acked = 0


async def committed_offset(consumer: Any, tp: Any) -> int | None:
    """The group's committed offset of ``tp`` as the broker has it (None: no commit)."""
    from faust.transport.drivers import aiokafka as driver

    thread = consumer._thread
    client = thread._ensure_consumer()
    offset = await thread.call_thread(client.committed, driver.ensure_aiokafka_TP(tp))
    return None if offset is None else int(offset)


def inbound_times(app: Any) -> dict[Any, float] | None:
    """The per-partition time of the last record in, which faust's livelock detector reads."""
    return getattr(app.monitor, "stream_inbound_time", None)


# ----------------------------------------------------------------------------------------
# The raw record path: the batch path's records straight from aiokafka's record batches.
#
# aiokafka turns every fetched record into a `ConsumerRecord` (a dataclass with eleven
# fields, built in two Python calls) through a generator that `FetchResult.getall` steps
# one `__next__` call at a time; the batch path then made a `RawRecord` of each. For the
# batch path's topics, `fetched_records` below does aiokafka's `Fetcher.fetched_records`
# with the records made as `RawRecord`s in one generator that a C loop drains
# (`itertools.islice`): 1.0-1.2 -> 0.5-0.6 us a record in faust's consumer thread, and no
# second copy in the worker's. Every other topic (the tables' changelogs) gets aiokafka's
# own `ConsumerRecord`s from aiokafka's own code.


async def fetched_records(
    consumer: Any,
    partitions: Any,
    timeout_s: float | None,
    max_records: int | None,
    raw_topics: frozenset[str],
    limits: Mapping[str, int] | None = None,
) -> dict[Any, list[Any]]:
    """What faust's ``_fetch_records`` returns, with ``raw_topics``' records raw.

    The records of a topic in ``raw_topics`` are `schemas.records.RawRecord`s (no
    headers: runwatch reads none); every other topic's are aiokafka's `ConsumerRecord`s.
    Offsets, positions, CRC checks, control batches and aborted transactions are
    aiokafka's, step for step (`_fetched`, `_unpack_raw`).

    ``limits`` (topic of ``raw_topics`` -> value bytes) bounds what one call takes of a
    topic, all its partitions together: those topics' buffered records are taken after
    every other topic's, record by record until they count the limit (`counted_bytes`:
    their values' bytes and `RECORD_OVERHEAD_BYTES` each; at least one record while the
    limit is positive), and what is left of them stays
    buffered for the next call, its position just past the last record taken (as
    aiokafka's ``max_records`` leaves it). A limit on a topic not in ``raw_topics`` is
    not applied.

    Raises:
        ConsumerStoppedError: The consumer or its fetcher is closed (as aiokafka's).
    """
    from aiokafka.errors import ConsumerStoppedError

    fetcher = consumer._fetcher
    if consumer._closed or fetcher._closed:
        raise ConsumerStoppedError()
    with fetcher._subscriptions.fetch_context():
        return await _fetched(fetcher, partitions, timeout_s, max_records, raw_topics, limits)


async def _fetched(
    fetcher: Any,
    partitions: Any,
    timeout_s: float | None,
    max_records: int | None,
    raw_topics: frozenset[str],
    limits: Mapping[str, int] | None = None,
) -> dict[Any, list[Any]]:
    """The loop of `Fetcher.fetched_records` (aiokafka 0.14.0), `_drain_raw` for ``raw_topics``.

    ``limits`` as `fetched_records`: the limited topics' partitions come last, each drained
    up to what is left of its topic's limit in bytes (none: left buffered).
    """
    from aiokafka.consumer.fetcher import FetchResult

    subscriptions = fetcher._subscriptions
    buffered = fetcher._records  # TP -> FetchResult or FetchError, filled by the fetch task
    while True:
        if subscriptions.reassignment_in_progress:
            await subscriptions.wait_for_assignment()
        start_s = time.monotonic()
        drained: dict[Any, list[Any]] = {}
        left = {t: b for t, b in limits.items() if t in raw_topics} if limits else None
        order = list(buffered)
        if left:
            order.sort(key=lambda tp: tp.topic in left)  # stable: the limited ones last
        for tp in order:
            if partitions and tp not in partitions:
                if not subscriptions.is_assigned(tp):
                    del buffered[tp]
                continue
            result = buffered[tp]
            if type(result) is FetchResult:
                limit = left.get(tp.topic) if left else None
                if limit is not None and limit <= 0:
                    continue  # stays buffered: the next call takes it
                if tp.topic in raw_topics:
                    records, size = _drain_raw(result, tp, max_records, limit)
                else:
                    records, size = result.getall(max_records), 0
                if not result.has_more():
                    del buffered[tp]
                    fetcher._notify(fetcher._wait_consume_future)
                if not records:
                    continue
                drained[tp] = records
                if limit is not None and left is not None:
                    left[tp.topic] = limit - size
                if max_records is not None:
                    max_records -= len(records)
                    if max_records <= 0:
                        break
            elif drained:
                return drained  # the error is raised by the next call
            else:
                del buffered[tp]
                fetcher._notify(fetcher._wait_consume_future)
                result.check_raise()
        if drained or not timeout_s:
            return drained
        waiter = fetcher._create_fetch_waiter()
        done, pending = await asyncio.wait([waiter], timeout=timeout_s)
        if not done or fetcher._closed:
            if pending:
                pending.pop().cancel()
            return {}
        if waiter.done():
            waiter.result()  # raises what the fetch task failed with (authorization)
        timeout_s = max(0.0, timeout_s - (time.monotonic() - start_s))


def _drain_raw(
    result: Any, tp: Any, max_records: int | None, max_bytes: int | None = None
) -> tuple[list[Any], int]:
    """`FetchResult.getall` with `_unpack_raw`'s records, and the bytes they count.

    The first drain of a `PartitionRecords` puts `_unpack_raw` in place of aiokafka's
    generator, which nothing has started yet: each `PartitionRecords` is read by one of
    the two, whole. One that is not as expected (deserializers set, aiokafka's generator
    already started) is read by aiokafka's ``getall`` and its records converted (no byte
    limit there: aiokafka hands over what it took at once).

    Args:
        result: aiokafka's `FetchResult` of ``tp``.
        tp: The partition.
        max_records: The most records to take (None: no bound).
        max_bytes: Take records until they count this many bytes (`counted_bytes`: their
            values and `RECORD_OVERHEAD_BYTES` each; at least one record); None: no bound.

    Returns:
        The records taken, in order, and the bytes they count (0 without ``max_bytes``:
        nothing asks, and the sum would be a loop over every record for nothing).
    """
    if not result.check_assignment(tp) or not result.has_more():
        return [], 0
    records = result._partition_records
    unpack = records._records_iterator
    if unpack is None or unpack.gi_code is not _unpack_raw.__code__:
        aiokafka_fresh = (
            unpack is not None
            and inspect.getgeneratorstate(unpack) == inspect.GEN_CREATED
            and records._key_deserializer is None
            and records._value_deserializer is None
        )
        if not aiokafka_fresh:
            converted = [_as_raw(tp, r) for r in result.getall(max_records)]
            return converted, 0 if max_bytes is None else counted_bytes(converted)
        unpack.close()
        unpack = records._records_iterator = _unpack_raw(records, tp.topic, tp.partition)
    bounded = (
        unpack if max_records is None or max_records <= 0 else itertools.islice(unpack, max_records)
    )
    taken, size, whole = _take(bounded, max_bytes)
    if whole and (max_records is None or max_records <= 0 or len(taken) < max_records):
        result._update_position()  # every batch read
        result._partition_records = None
        records._records_iterator = None
    else:  # as aiokafka's: the position is just past the last record returned
        records.next_fetch_offset = taken[-1].offset + 1
        result._update_position()
    return taken, size


RECORD_OVERHEAD_BYTES: Final = 64
"""What a record counts against a byte limit besides its value (Kafka's own per-record
overhead is of this order). A record with an empty or null value is still decoded and
dead-lettered: without it a flood of them on a limited topic, which any producer to it can
write, would count nothing and fill a round."""


def _take(records: Iterator[Any], max_bytes: int | None) -> tuple[list[Any], int, bool]:
    """Records off ``records`` until they count ``max_bytes`` (None: all of them).

    Returns:
        The records, the bytes they count (`counted_bytes`; 0 when ``max_bytes`` is None),
        and whether ``records`` ran out.
    """
    if max_bytes is None:
        return list(records), 0, True
    taken, size = [], 0
    for record in records:
        taken.append(record)
        size += len(record.value or b"") + RECORD_OVERHEAD_BYTES
        if size >= max_bytes:
            return taken, size, False
    return taken, size, True


def value_bytes(records: Sequence[Any]) -> int:
    """The bytes of `schemas.records.RawRecord`s' values (a tombstone's: 0), in C loops."""
    return sum(map(len, filter(None, map(_RAW_VALUE, records))))


def counted_bytes(records: Sequence[Any]) -> int:
    """What `schemas.records.RawRecord`s count against a byte limit (`fetched_records`).

    Their values' bytes (`value_bytes`) and `RECORD_OVERHEAD_BYTES` each.
    """
    return value_bytes(records) + RECORD_OVERHEAD_BYTES * len(records)


_RAW_VALUE: Final = operator.attrgetter("value")


def _as_raw(tp: Any, record: Any) -> Any:
    from runwatch.schemas.records import RawRecord

    return RawRecord(
        tp.topic, tp.partition, record.offset, record.key, record.value, record.timestamp or 0
    )


def _unpack_raw(records: Any, topic: str, partition: int) -> Any:
    """The records of `PartitionRecords._unpack_records` (aiokafka 0.14.0) as `RawRecord`s.

    Rules, in aiokafka's order, per record batch:
        1. A batch whose CRC does not hold raises `CorruptRecordException` (when the
           consumer checks CRCs; aiokafka's default).
        2. Under ``read_committed``, the aborted transactions up to the batch are noted; a
           control batch with an abort marker ends its producer's aborted transaction, and a
           transactional batch of an aborted producer is skipped.
        3. A control batch is skipped.
        4. Records below the fetch offset (the rest of a batch fetched again) are skipped.
    The position moves past a batch once it is read (or skipped), as aiokafka's.
    """
    from aiokafka.consumer.fetcher import READ_COMMITTED
    from aiokafka.errors import CorruptRecordException
    from aiokafka.structs import TopicPartition

    from runwatch.schemas.records import RawRecord

    new = tuple.__new__  # RawRecord's own __new__ is a Python call per record
    batches = records._records
    while batches.has_next():
        batch = batches.next_batch()
        if records._check_crcs and not batch.validate_crc():
            raise CorruptRecordException(f"Invalid CRC - {TopicPartition(topic, partition)}")
        if records._isolation_level == READ_COMMITTED and batch.producer_id is not None:
            records._consume_aborted_up_to(batch.base_offset)
            if batch.is_control_batch and records._contains_abort_marker(batch):
                records._aborted_producers.discard(batch.producer_id)
            if batch.is_transactional and batch.producer_id in records._aborted_producers:
                records.next_fetch_offset = batch.next_offset
                continue
        if batch.is_control_batch:
            records.next_fetch_offset = batch.next_offset
            continue
        first = records.next_fetch_offset
        for record in batch:
            offset = record.offset
            if offset >= first:
                yield new(
                    RawRecord,
                    (topic, partition, offset, record.key, record.value, record.timestamp or 0),
                )
        records.next_fetch_offset = batch.next_offset
