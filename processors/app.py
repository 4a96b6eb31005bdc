"""The faust-streaming app: one agent per input topic, one table of reducer states each.

Each agent takes batches of raw records (``stream.take_events``), decodes each record once,
sends malformed ones to the dead-letter topic, folds the rest through the pure core and
then, in this order:

1. publishes the verdicts and dead letters and waits until Kafka acknowledged them;
2. writes the new states to its table (a changelog topic co-partitioned with the input).

A crash between 1 and 2 replays the batch from the last committed offset: the states
still hold the offset they last applied and skip nothing they have not seen, the folds
recompute the same verdicts with the same ids, and consumers see at worst an identical
duplicate. A crash after 2 skips the records the states already applied (each state
carries its last applied source offset).

Faust's timers and windowed tables run on the wall clock; none of them is used for a
decision. The one timer here is the clock: it only *writes* Tick events into every
heartbeat partition, and hang detection reads time from the log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import faust
from kafka.partitioner.default import murmur2

from processors.core.config import DetectorConfig
from processors.core.state_codec import decode_state, encode_state
from processors.intake import RawRecord, split
from processors.pipeline import ROLE_STATE, fold_batch
from processors.settings import ProcessorSettings
from runwatch.settings import faust_broker_settings
from schemas.codec import encode, encode_key
from schemas.events import TICK_RUN_ID, DeadLetter, Event, RestartRequested, Tick
from schemas.signing import CommandKey, sign
from schemas.topics import TopicNames, names

log = logging.getLogger(__name__)

TABLES: dict[str, str] = {
    "steps": "step-health",
    "heartbeats": "liveness",
    "checkpoints": "checkpoints",
    "anomalies": "policy",
}
"""Input role -> the name of the table holding its reducer states."""


def partition_for(run_id: str, partitions: int) -> int:
    """The partition Kafka's default partitioner gives a run's key (murmur2, like Java's)."""
    return int(murmur2(encode_key(run_id)) & 0x7FFFFFFF) % partitions


def output_topic(event: Event, topics: TopicNames) -> str:
    """Where a processor publishes an event it produced."""
    if isinstance(event, DeadLetter):
        return topics.deadletter
    if isinstance(event, RestartRequested):
        return topics.commands
    return topics.anomalies


class _Agent:
    """The body of one agent: batch in, verdicts out, states written."""

    def __init__(
        self,
        app: faust.App,
        role: str,
        table: Any,
        settings: ProcessorSettings,
        cfg: DetectorConfig,
        topics: TopicNames,
        finish: Callable[[Event], Event],
    ) -> None:
        self.app = app
        self.role = role
        self.table = table
        self.settings = settings
        self.cfg = cfg
        self.topics = topics
        self.finish = finish
        self.kind = ROLE_STATE[role]

    def load(self, run_id: str) -> Any:
        raw = self.table.get(encode_key(run_id))
        return None if raw is None else decode_state(self.kind, raw)  # type: ignore[arg-type]

    def runs_in_partition(self, partition: int) -> Iterable[str]:
        count = self.settings.partitions
        for key in list(self.table.keys()):
            run_id = key.decode()
            if partition_for(run_id, count) == partition:
                yield run_id

    async def __call__(self, stream: Any) -> None:
        async for events in stream.take_events(
            self.settings.batch_max, within=self.settings.batch_within_s
        ):
            records = [
                RawRecord(
                    e.message.topic,
                    e.message.partition,
                    e.message.offset,
                    e.key,
                    e.value,
                    int((e.message.timestamp or 0) * 1000),
                )
                for e in events
            ]
            good, dead = split(records, self.role)
            result = fold_batch(self.role, good, self.load, self.runs_in_partition, self.cfg)
            await self.publish([*dead, *(self.finish(o) for o in result.outputs)])
            for run_id, state in result.states.items():
                self.table[encode_key(run_id)] = encode_state(state)

    async def publish(self, events: list[Event]) -> None:
        if not events:
            return
        producer = self.app.producer
        pending = [
            await producer.send(
                output_topic(e, self.topics), encode_key(e.run_id), encode(e), None, None, None
            )
            for e in events
        ]
        await asyncio.gather(*pending)


def create_app(
    settings: ProcessorSettings, cfg: DetectorConfig, key: CommandKey | None
) -> faust.App:
    """Build the faust app for ``settings``.

    Args:
        settings: Connection, naming and batching.
        cfg: Detector configuration (defaults plus ``settings.overrides``).
        key: The key that signs restart commands; None publishes them unsigned (the
            controller then rejects them, and says so).

    Returns:
        The app; run it with `run_worker`.
    """
    app = faust.App(
        settings.app_id,
        broker=f"kafka://{settings.bootstrap}",
        store="memory://",
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        topic_allow_declare=True,
        key_serializer="raw",
        value_serializer="raw",
        consumer_auto_offset_reset="earliest",
        processing_guarantee="at_least_once",
        producer_acks=-1,
        # Table states are kilobytes; faust's 16 KiB batches would send two per request.
        producer_max_batch_size=1024 * 1024,
        producer_linger=0.005,
        web_enabled=settings.web_port is not None,
        web_port=settings.web_port or 6066,
        table_standby_replicas=0,
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=min(3.0, settings.session_timeout_s / 5),
        broker_rebalance_timeout=max(20.0, 2 * settings.session_timeout_s),
        broker_commit_every=10_000,
        broker_commit_interval=1.0,
        stream_buffer_maxsize=20_000,
        worker_redirect_stdouts=False,
        **faust_broker_settings(),
    )
    topics = names(settings.prefix)

    def finish(event: Event) -> Event:
        if isinstance(event, RestartRequested) and key is not None:
            return sign(event, key)
        return event

    role_topic = {
        "steps": topics.steps,
        "heartbeats": topics.heartbeats,
        "checkpoints": topics.checkpoints,
        "anomalies": topics.anomalies,
    }
    for role, topic_name in role_topic.items():
        table = app.Table(
            TABLES[role],
            default=None,
            partitions=settings.partitions,
            key_type=bytes,
            value_type=bytes,
            use_partitioner=True,
            extra_topic_configs={
                "min.insync.replicas": str(settings.min_insync_replicas),
                "unclean.leader.election.enable": "false",
            },
        )
        source = app.topic(
            topic_name,
            key_type=bytes,
            value_type=bytes,
            partitions=settings.partitions,
            acks=True,
        )
        body = _Agent(app, role, table, settings, cfg, topics, finish)
        app.agent(source, name=f"runwatch.{role}")(body.__call__)

    @app.timer(settings.tick_interval_s, on_leader=True, name="runwatch.clock")  # type: ignore[untyped-decorator]
    async def clock() -> None:
        # The only wall-clock read in the processors: it is written to the log as a Tick,
        # and every decision reads time from the log.
        now_ns = time.time_ns()
        producer = app.producer
        pending = [
            await producer.send(
                topics.heartbeats,
                TICK_RUN_ID.encode(),
                encode(Tick(run_id=TICK_RUN_ID, ts_ns=now_ns, partition=p)),
                p,
                None,
                None,
            )
            for p in range(settings.partitions)
        ]
        await asyncio.gather(*pending)

    return app
