"""The emitter's configuration: arguments over ``RUNWATCH_*``/torchrun variables, checked.

`resolve_config` turns `RunEmitter`'s constructor arguments (each falling back to an
environment variable, then to a default) into a checked `EmitterConfig`;
`producer_settings` builds the kafka-python producer's keyword arguments from it and
`default_producer_factory` checks them against kafka-python's when no fake is passed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from runwatch.common.launch_env import (
    ENV_INCARNATION,
    ENV_RANK,
    ENV_RELAY_SOCKET,
    ENV_RUN_ID,
    ENV_WORLD_SIZE,
)
from runwatch.common.settings import DEFAULT_TOPIC_PREFIX, ENV_BOOTSTRAP, kafka_client_config
from runwatch.producers.delivery import ProducerFactory
from runwatch.producers.packing import PackPolicy
from runwatch.producers.ratelimit import quiet_library_loggers
from runwatch.producers.settings import EmitterEnv
from runwatch.producers.validation import as_bool, as_float, as_int, as_step, as_str

PRODUCER_DEFAULTS: Final[Mapping[str, Any]] = {
    "acks": "all",
    "enable_idempotence": True,
    "linger_ms": 5,
    "batch_size": 256 * 1024,
    "compression_type": "gzip",
    "max_block_ms": 2_000,
    "bootstrap_timeout_ms": 5_000,
    "delivery_timeout_ms": 7 * 24 * 3600 * 1000,
    "reconnect_backoff_ms": 50,
    "reconnect_backoff_max_ms": 1_000,
}
"""kafka-python settings the emitter starts from (``client_config`` may override most).

gzip (zlib, always available) costs the process less CPU per event than no compression
with kafka-python, delivers more events/s and shrinks the retained topics about tenfold
(JSON events repeat their field names); see bench/producer.py.

``delivery_timeout_ms`` is a week: while the broker is away the producer keeps retrying
(idempotently, so without duplicates) instead of failing events, and the emitter's own
bound caps the memory. ``max_block_ms`` and ``bootstrap_timeout_ms`` are short because
they only ever block the delivery thread, which retries.
"""

FIXED_SETTINGS: Final = frozenset(
    {"acks", "enable_idempotence", "bootstrap_servers", "key_serializer", "value_serializer"}
)
"""Producer settings ``client_config`` may not override."""

THREAD_PREFIX: Final = "runwatch-emitter-"
"""Start of the names of the emitter's threads (its own and kafka-python's)."""


@dataclass(frozen=True, slots=True)
class EmitterConfig:
    """One emitter's checked configuration; see `resolve_config`.

    Attributes:
        run_id: The run (not empty).
        bootstrap: Kafka bootstrap servers (not empty).
        rank: This process's rank, in ``[0, world_size)``.
        world_size: Ranks in the gang (>= 1).
        incarnation: Restarts of the gang so far (>= 0).
        topic_prefix: Prefix of the topic names (not empty).
        max_buffered: Most events held before new ones are dropped (>= 1).
        client_config: Extra kafka-python producer settings, none of them fixed.
        packing: What the delivery thread packs into `schemas.events.EventPack` records
            (`producers.packing`); nothing by default.
        relay_socket: The node agent's relay socket (`producers.relay_client`): the
            delivery thread writes records there instead of running a Kafka producer;
            None: straight to Kafka.
        launch_id: The launch the gang belongs to (``RunStarted.launch_id``); empty: none.
    """

    run_id: str
    bootstrap: str
    rank: int
    world_size: int
    incarnation: int
    topic_prefix: str
    max_buffered: int
    client_config: Mapping[str, Any]
    packing: PackPolicy = field(default_factory=PackPolicy)
    relay_socket: str | None = None
    launch_id: str = ""

    @property
    def thread_name(self) -> str:
        """The name of the delivery thread (and kafka-python's client id)."""
        return f"{THREAD_PREFIX}{self.run_id}-rank{self.rank}"


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def resolve_config(
    run_id: str | None,
    *,
    bootstrap: str | None,
    rank: int | None,
    world_size: int | None,
    topic_prefix: str | None,
    incarnation: int | None,
    max_buffered: int,
    client_config: Mapping[str, Any] | None,
    pack_heartbeats: bool = False,
    pack_steps: bool = False,
    pack_max_events: int = 512,
    pack_linger_ms: float = 100.0,
    relay_socket: str | None = None,
    launch_id: str | None = None,
) -> EmitterConfig:
    """Fill in `RunEmitter`'s arguments from the environment and check them.

    Args: as `RunEmitter`'s constructor; None means "from the environment, else the
    default" (``relay_socket``: ``$RUNWATCH_RELAY_SOCKET``, else straight to Kafka;
    ``launch_id``: ``$RUNWATCH_LAUNCH_ID``, else none).

    Returns:
        The configuration.

    Raises:
        ValueError: No run id or bootstrap, a negative rank, a rank outside the world,
            a malformed environment variable, ``max_buffered`` < 1, ``client_config``
            overriding a fixed setting, or a packing bound out of range.
        TypeError: An argument of the wrong type.
    """
    packing = PackPolicy(
        heartbeats=as_bool("pack_heartbeats", pack_heartbeats),
        steps=as_bool("pack_steps", pack_steps),
        max_events=as_int("pack_max_events", pack_max_events),
        linger_s=as_float("pack_linger_ms", pack_linger_ms) / 1e3,
    )
    env = EmitterEnv.from_env()
    run_id = run_id if run_id is not None else env.run_id
    if run_id is None or run_id == "":
        raise ValueError(f"RunEmitter needs a run id: pass run_id=... or set {ENV_RUN_ID}")
    run_id = as_str("run_id", run_id, allow_empty=False)
    bootstrap = bootstrap if bootstrap is not None else env.bootstrap
    if not bootstrap:
        raise ValueError(
            f"RunEmitter needs a Kafka address: pass bootstrap='host:port' or set {ENV_BOOTSTRAP}"
        )
    bootstrap = as_str("bootstrap", bootstrap, allow_empty=False)
    rank = as_step("rank", rank if rank is not None else env.rank or 0)
    world_size = as_int(
        "world_size", world_size if world_size is not None else _or(env.world_size, 1)
    )
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if rank >= world_size:
        raise ValueError(f"rank {rank} is outside world_size {world_size}")
    incarnation = as_step(
        "incarnation",
        incarnation if incarnation is not None else env.incarnation or 0,
    )
    prefix = topic_prefix or env.topic_prefix or DEFAULT_TOPIC_PREFIX
    topic_prefix = as_str("topic_prefix", prefix, allow_empty=False)
    max_buffered = as_int("max_buffered", max_buffered)
    if max_buffered < 1:
        raise ValueError(f"max_buffered must be >= 1, got {max_buffered}")
    overrides = dict(client_config or {})
    fixed = sorted(FIXED_SETTINGS & overrides.keys())
    if fixed:
        raise ValueError(f"client_config may not override {', '.join(fixed)}")
    relay = relay_socket if relay_socket is not None else env.relay_socket
    launch = launch_id if launch_id is not None else env.launch_id or ""
    return EmitterConfig(
        run_id=run_id,
        bootstrap=bootstrap,
        rank=rank,
        world_size=world_size,
        incarnation=incarnation,
        topic_prefix=topic_prefix,
        max_buffered=max_buffered,
        client_config=overrides,
        packing=packing,
        relay_socket=as_str("relay_socket", relay) if relay else None,
        launch_id=as_str("launch_id", launch),
    )


def producer_settings(config: EmitterConfig) -> dict[str, Any]:
    """The kafka-python producer's keyword arguments for ``config``.

    `PRODUCER_DEFAULTS`, then the client id, then the ``RUNWATCH_*`` security variables,
    then ``config.client_config``; ``bootstrap_servers`` last.
    """
    return {
        **PRODUCER_DEFAULTS,
        # kafka-python names its network thread after the client id: with this
        # prefix, its connection chatter is rate-limited like the delivery thread's.
        "client_id": config.thread_name,
        **kafka_client_config(),
        **config.client_config,
        "bootstrap_servers": config.bootstrap,
    }


def default_producer_factory(settings: Mapping[str, Any]) -> ProducerFactory:
    """``kafka.KafkaProducer``, once ``settings`` are known to it; quiets its loggers.

    Args:
        settings: The producer's keyword arguments (`producer_settings`).

    Returns:
        The factory.

    Raises:
        ValueError: A setting kafka-python does not know.
    """
    from kafka import KafkaProducer

    unknown = sorted(settings.keys() - KafkaProducer.DEFAULT_CONFIG.keys())
    if unknown:
        raise ValueError(f"unknown kafka-python producer setting(s): {', '.join(unknown)}")
    quiet_library_loggers("kafka", THREAD_PREFIX)
    factory: ProducerFactory = KafkaProducer
    return factory


__all__ = [
    "ENV_INCARNATION",
    "ENV_RANK",
    "ENV_RELAY_SOCKET",
    "ENV_RUN_ID",
    "ENV_WORLD_SIZE",
    "FIXED_SETTINGS",
    "PRODUCER_DEFAULTS",
    "THREAD_PREFIX",
    "EmitterConfig",
    "default_producer_factory",
    "producer_settings",
    "resolve_config",
]
