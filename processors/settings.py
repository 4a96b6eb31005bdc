"""Settings of the processor app, from the command line or the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final, Literal, cast, get_args

import msgspec

from runwatch.common.settings import env_value
from runwatch.schemas.topics import default_partitions

DEFAULT_APP_ID = "runwatch-processors"

Store = Literal["memory", "rocksdb"]
"""Where a worker keeps its tables (`processors.stores`): process memory, or RocksDB on
local disk, which a successor on the same host reopens instead of replaying it all."""
STORES: Final[tuple[str, ...]] = get_args(Store)
DEFAULT_STORE: Final[Store] = "memory"
ENV_STORE: Final = "RUNWATCH_STORE"
EventLoop = Literal["uvloop", "asyncio"]
"""The event loop a worker runs faust on (`processors.event_loop`): uvloop (libuv's, in
C), or the standard library's."""
EVENT_LOOPS: Final[tuple[str, ...]] = get_args(EventLoop)
DEFAULT_EVENT_LOOP: Final[EventLoop] = "uvloop"
ENV_EVENT_LOOP: Final = "RUNWATCH_EVENT_LOOP"
ENV_BATCH_STATS: Final = "RUNWATCH_BATCH_STATS_S"
ENV_FAULT_STATE_WRITES: Final = "RUNWATCH_FAULT_STATE_WRITES"
BATCH_MAX: Final = 20_000
"""Default `ProcessorSettings.batch_max`. A round costs a few
fixed waits (a fetch handed across faust's consumer thread, the publish, the commit
bookkeeping) whatever its size, so larger rounds drain a backlog faster; without a
backlog a round is only what one fetch brought, so the bound does not add latency then."""

DEFAULT_STATE_FLUSH_S: Final = 1.0
"""Longest a folded round waits for its states to be written (and its offsets acknowledged).

Under a paced load a round is a few hundred records, every few tens of milliseconds, and
touches most runs: writing every touched run's state after every round wrote more bytes to
the changelogs than the input carried (a 7 KB step state for one step's change) and took
more of the worker's CPU than any part of the fold but the reducers. Written at most this
often, each run's state goes out once for all the steps it took in between (a backlog's
rounds, 0.1-0.4 s each on a 2-core box, are flushed at the same pace). Verdicts do not
wait for it: they go out as each chunk is folded. What it costs is a crash's redo: at
most this much more of the log is folded again (with the same verdict ids) by the worker
that takes over.

Why 1 s and not 0.2 s: a fleet of a thousand runs stepping a few times a second wrote
every run's two states about once a step at 0.2 s. In `bench/fleet.py` at 1,000 runs and
40 % of its drain, the workers took 1.02-1.05 cores for 127k events/s at 0.2 s (8.0-8.3 µs
CPU per event, 3x the drain's) and 0.69 of a core for 140k at 1 s (4.9 µs), p99 213-351 ms
against 103 ms. One worker of 100 runs writes the same states per flush either way; its
tail in seven alternated pairs was not told apart from the box's noise (docs/processors.md,
"a state flush every second"). Kafka Streams commits every 30 s by default.
"""


class ProcessorSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How a processor worker connects and batches.

    Attributes:
        bootstrap: Kafka bootstrap address.
        prefix: Topic name prefix.
        app_id: Faust app id: the consumer group and the prefix of the changelog topics.
            Workers with the same id share the work; another id processes independently.
        partitions: Input role (``steps``, ``heartbeats``, ``checkpoints``,
            ``anomalies``) -> the partition count of its topic as the cluster has it
            (`runwatch processors` reads it from the metadata): the partitions of that
            role's table (its changelog must be co-partitioned with the input) and of the
            Tick fan-out. A role not named has the catalogue's default.
        store: ``memory`` or ``rocksdb`` (`processors.stores`).
        data_dir: The worker's faust data dir (RocksDB databases live there); None:
            ``$RUNWATCH_HOME/processors/<app id>``.
        batch_max: Most records of one fetched round, all partitions together.
        state_flush_s: Longest a folded round waits for its states to
            be written and its offsets acknowledged (`processors.engine.BatchIngest`):
            longer writes each run's state once for more rounds, and leaves a crash more
            to fold again.
        tick_interval_s: How often the clock writes a Tick into every heartbeat partition.
        session_timeout_s: A worker silent this long leaves the group and its partitions
            move to the others: the failover time after a crash.
        web_port: Port of faust's web server; None disables it.
        replication_factor: Replicas of the topics faust creates (the tables' changelogs,
            its assignor topic); `runwatch processors` chooses it from the cluster's size,
            like the catalogue's (`schemas.topics.replication_for`).
        min_insync_replicas: ``min.insync.replicas`` of the changelog topics.
        overrides: Detector settings that differ from the defaults (`runwatch processors
            --set k=v`).
    """

    bootstrap: str
    prefix: str = "runwatch"
    app_id: str = DEFAULT_APP_ID
    partitions: dict[str, int] = {}
    store: Store = DEFAULT_STORE
    data_dir: str | None = None
    batch_max: int = BATCH_MAX
    state_flush_s: float = DEFAULT_STATE_FLUSH_S
    tick_interval_s: float = 1.0
    session_timeout_s: float = 10.0
    web_port: int | None = None
    replication_factor: int = 1
    min_insync_replicas: int = 1
    overrides: dict[str, str] = {}

    def partitions_of(self, role: str) -> int:
        """Partitions of the input topic of ``role`` (and of its table's changelog)."""
        return self.partitions.get(role) or default_partitions(role)


def _store(raw: str) -> Store:
    if raw not in STORES:
        raise ValueError(raw)
    return cast(Store, raw)


def _event_loop(raw: str) -> EventLoop:
    if raw not in EVENT_LOOPS:
        raise ValueError(raw)
    return cast(EventLoop, raw)


def _seconds(raw: str) -> float:
    value = float(raw)
    if not value >= 0:
        raise ValueError(raw)
    return value


def _count(raw: str) -> int:
    value = int(raw)
    if value < 0:
        raise ValueError(raw)
    return value


class ProcessorEnv(msgspec.Struct, frozen=True, kw_only=True):
    """What a processor worker reads from its environment (flags override it).

    Attributes:
        store: Where the tables live when ``--store`` is not given (``RUNWATCH_STORE``).
        batch_stats_s: Log a summary of the rounds' timings every this many seconds
            (``RUNWATCH_BATCH_STATS_S``; `processors.engine.RoundStats`); 0: never.
        fault_state_writes: A test seam: the first this many table writes of the process
            fail (``RUNWATCH_FAULT_STATE_WRITES``; `processors.app.StateWriteFaults`).
        event_loop: The event loop the worker runs on: ``uvloop``, or ``asyncio`` for the
            standard library's (``RUNWATCH_EVENT_LOOP``; `processors.event_loop.install`).
    """

    store: Store = DEFAULT_STORE
    batch_stats_s: float = 0.0
    fault_state_writes: int = 0
    event_loop: EventLoop = DEFAULT_EVENT_LOOP

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ProcessorEnv:
        """Read the variables (`os.environ` when None); unset or blank ones take defaults.

        Raises:
            UsageError: A variable is malformed (the message names it).
        """
        env = os.environ if environ is None else environ
        store = env_value(env, ENV_STORE, _store, f"one of {', '.join(STORES)}")
        stats_s = env_value(env, ENV_BATCH_STATS, _seconds, "a number of seconds >= 0")
        faults = env_value(env, ENV_FAULT_STATE_WRITES, _count, "an integer >= 0")
        loop = env_value(env, ENV_EVENT_LOOP, _event_loop, f"one of {', '.join(EVENT_LOOPS)}")
        return cls(
            store=DEFAULT_STORE if store is None else store,
            batch_stats_s=0.0 if stats_s is None else stats_s,
            fault_state_writes=0 if faults is None else faults,
            event_loop=DEFAULT_EVENT_LOOP if loop is None else loop,
        )


def changelog_topic(app_id: str, table: str) -> str:
    """The changelog topic faust keeps for ``table`` of app ``app_id``."""
    return f"{app_id}-{table}-changelog"


def leader_topic(app_id: str) -> str:
    """The topic whose one partition makes its holder faust's leader (the clock's worker)."""
    return f"{app_id}-__assignor-__leader"
