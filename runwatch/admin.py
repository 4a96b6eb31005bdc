"""Kafka administration runwatch needs: create the topic catalogue idempotently, list topics.

Every client takes its connection settings from `common.settings.kafka_client_config`.
kafka-python is imported inside the functions so that importing this module stays cheap.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from runwatch.common.errors import RunwatchError
from runwatch.common.settings import kafka_client_config

if TYPE_CHECKING:
    from kafka import KafkaAdminClient

    from runwatch.schemas.topics import Replication, TopicSpec

logger = logging.getLogger(__name__)

_TOPIC_ALREADY_EXISTS = 36  # Kafka protocol error code


class TopicLike(Protocol):
    """What `create_topics` reads from a topic spec (`schemas.topics.TopicSpec` fits)."""

    @property
    def name(self) -> str:
        """Full topic name."""
        ...

    @property
    def partitions(self) -> int:
        """Partition count."""
        ...

    @property
    def compacted(self) -> bool:
        """True for ``cleanup.policy=compact``."""
        ...

    @property
    def retention_ms(self) -> int | None:
        """``retention.ms``; None keeps the broker default."""
        ...


def topic_configs(spec: TopicLike) -> dict[str, str]:
    """The topic-level configs to create ``spec`` with.

    Uses the spec's own ``configs()`` when it has one (`schemas.topics.TopicSpec` does), so
    the catalogue stays the single source of truth; otherwise derives them from its fields.
    """
    own = getattr(spec, "configs", None)
    if callable(own):
        return {str(k): str(v) for k, v in own().items()}
    configs = {"cleanup.policy": "compact" if spec.compacted else "delete"}
    if spec.retention_ms is not None and not spec.compacted:
        configs["retention.ms"] = str(spec.retention_ms)
    return configs


@contextlib.contextmanager
def admin_client(bootstrap: str, *, timeout_s: float = 30.0) -> Iterator[KafkaAdminClient]:
    """A connected `kafka.KafkaAdminClient`, closed on exit.

    Args:
        bootstrap: ``host:port[,host:port...]``.
        timeout_s: Longest to wait for the first connection and for each request.

    Raises:
        RunwatchError: when no broker answers at ``bootstrap``.
    """
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    try:
        client = KafkaAdminClient(
            bootstrap_servers=bootstrap,
            client_id="runwatch-admin",
            bootstrap_timeout_ms=int(timeout_s * 1000),
            request_timeout_ms=int(timeout_s * 1000),
            **kafka_client_config(),
        )
    except KafkaError as exc:
        raise RunwatchError(f"cannot reach Kafka at {bootstrap}: {exc}") from None
    try:
        yield client
    finally:
        client.close()


def _broker_count(admin: KafkaAdminClient) -> int:
    from kafka.errors import KafkaError

    try:
        brokers = admin.describe_cluster().get("brokers") or []
    except KafkaError as exc:
        raise RunwatchError(f"describing the Kafka cluster failed: {exc}") from None
    return max(1, len(brokers))


def _replication(brokers: int, factor: int | None) -> Replication:
    from runwatch.schemas.topics import replication_for

    try:
        return replication_for(brokers, factor)
    except ValueError as exc:
        raise RunwatchError(str(exc)) from None


def cluster_replication(
    bootstrap: str, *, factor: int | None = None, timeout_s: float = 30.0
) -> Replication:
    """The replication runwatch's topics get on the cluster at ``bootstrap``.

    The cluster's size is read from its metadata (DescribeCluster), not configured, so the
    same command is right on a laptop's single broker and on a production cluster; see
    `schemas.topics.replication_for` for the rule.

    Args:
        bootstrap: Kafka bootstrap address.
        factor: An explicit replication factor (``--replication-factor`` or
            ``RUNWATCH_REPLICATION_FACTOR``); None chooses from the cluster's size.
        timeout_s: Longest to wait for the brokers.

    Raises:
        RunwatchError: the cluster is unreachable, or ``factor`` exceeds its brokers.
    """
    with admin_client(bootstrap, timeout_s=timeout_s) as admin:
        return _replication(_broker_count(admin), factor)


def create_topics(
    bootstrap: str,
    specs: Sequence[TopicLike],
    *,
    replication: Replication | None = None,
    timeout_s: float = 30.0,
) -> dict[str, bool]:
    """Create the topics of ``specs`` unless they exist, then wait until metadata shows them.

    Idempotent: a topic that already exists is left as it is (a warning is logged when its
    partition count or replication factor differs from the one asked for).

    Args:
        bootstrap: Kafka bootstrap address.
        specs: The topics (name, partitions, compacted, retention_ms).
        replication: Replication factor and ``min.insync.replicas`` of the new topics;
            None chooses them from the cluster's size (`cluster_replication`).
        timeout_s: Longest to wait for the brokers, for creation and for leaders.

    Returns:
        Topic name -> True if this call created it, False if it existed already.

    Raises:
        RunwatchError: the cluster is unreachable, refused a topic, or a topic has no leader
            within ``timeout_s``.
    """
    from kafka.errors import KafkaError, for_code

    if not specs:
        return {}
    by_name = {spec.name: spec for spec in specs}
    created: dict[str, bool] = {}
    with admin_client(bootstrap, timeout_s=timeout_s) as admin:
        rule = replication if replication is not None else _replication(_broker_count(admin), None)
        request: dict[str, dict[str, Any]] = {
            spec.name: {
                "num_partitions": spec.partitions,
                "replication_factor": rule.factor,
                "configs": {
                    **topic_configs(spec),
                    "min.insync.replicas": str(rule.min_insync),
                    "unclean.leader.election.enable": "false",
                },
            }
            for spec in by_name.values()
        }
        try:
            response = admin.create_topics(
                request, timeout_ms=int(timeout_s * 1000), raise_errors=False
            )
            for topic in response.get("topics", []):
                name, code = topic["name"], int(topic["error_code"])
                if code == 0:
                    created[name] = True
                elif code == _TOPIC_ALREADY_EXISTS:
                    created[name] = False
                else:
                    error = for_code(code)
                    reason = topic.get("error_message") or error.__name__
                    raise RunwatchError(f"Kafka refused to create topic {name}: {reason}")
            admin.wait_for_topics(list(by_name), timeout_ms=int(timeout_s * 1000))
            existing = [name for name, new in created.items() if not new]
            if existing:
                _warn_mismatch(admin, existing, by_name, rule.factor)
        except KafkaError as exc:
            raise RunwatchError(f"creating topics on {bootstrap} failed: {exc}") from None
    return created


def _warn_mismatch(
    admin: KafkaAdminClient, names: list[str], by_name: dict[str, TopicLike], factor: int
) -> None:
    for topic in admin.describe_topics(names):
        name = topic.get("topic") or topic.get("name")
        want = by_name[name].partitions if name in by_name else None
        partitions = topic.get("partitions") or []
        have = len(partitions)
        if want is not None and have != want:
            logger.warning(
                "topic %s exists with %d partitions, not %d; left as it is", name, have, want
            )
        replicas = min((len(p.get("replica_nodes") or []) for p in partitions), default=factor)
        if replicas != factor:
            logger.warning(
                "topic %s exists with replication factor %d, not %d; left as it is "
                "(kafka-reassign-partitions changes it)",
                name,
                replicas,
                factor,
            )


def catalogue(
    prefix: str = "runwatch", partitions: int | Mapping[str, int] | None = None
) -> list[TopicSpec]:
    """The topic catalogue (`schemas.topics.catalogue`) for ``prefix``.

    Args:
        prefix: Topic name prefix.
        partitions: One count for every topic, counts by short name, or None (the
            catalogue's `schemas.topics.DEFAULT_PARTITIONS`).

    Raises:
        RunwatchError: when the catalogue cannot be imported or a count is invalid.
    """
    try:
        from runwatch.schemas import topics
    except ImportError as exc:
        raise RunwatchError(f"the topic catalogue schemas.topics is unavailable: {exc}") from None
    try:
        return list(topics.catalogue(prefix, partitions))
    except ValueError as exc:
        raise RunwatchError(str(exc)) from None


def create_catalogue(
    bootstrap: str,
    *,
    prefix: str = "runwatch",
    partitions: int | Mapping[str, int] | None = None,
    replication: Replication | None = None,
    timeout_s: float = 30.0,
) -> dict[str, bool]:
    """Create every catalogue topic for ``prefix`` (see `create_topics`).

    Args:
        bootstrap: Kafka bootstrap address.
        prefix: Topic name prefix.
        partitions: As in `catalogue`.
        replication: As in `create_topics` (None: from the cluster's size).
        timeout_s: As in `create_topics`.

    Returns:
        Topic name -> True if this call created it.
    """
    return create_topics(
        bootstrap, catalogue(prefix, partitions), replication=replication, timeout_s=timeout_s
    )


def list_topics(
    bootstrap: str, *, include_internal: bool = False, timeout_s: float = 30.0
) -> dict[str, int]:
    """The cluster's topics and their partition counts, sorted by name.

    Args:
        bootstrap: Kafka bootstrap address.
        include_internal: Also list internal topics (``__consumer_offsets`` ...).
        timeout_s: Longest to wait for the brokers.
    """
    from kafka.errors import KafkaError

    with admin_client(bootstrap, timeout_s=timeout_s) as admin:
        try:
            described = admin.describe_topics()
        except KafkaError as exc:
            raise RunwatchError(f"listing topics on {bootstrap} failed: {exc}") from None
    out: dict[str, int] = {}
    for topic in described:
        name = topic.get("topic") or topic.get("name")
        if not name:
            continue
        internal = bool(topic.get("is_internal")) or name.startswith("__")
        if internal and not include_internal:
            continue
        out[name] = len(topic.get("partitions") or [])
    return dict(sorted(out.items()))
