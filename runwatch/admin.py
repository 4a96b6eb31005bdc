"""Kafka administration runwatch needs: the topic catalogue, ACLs and users, the authorizer.

Topics: create the catalogue idempotently (`create_catalogue`), list a cluster's topics.
Security: apply the roles' ACLs (`apply_acls`, from `runwatch.broker.acls`), create SCRAM
users (`ensure_scram_users`), and tell whether the cluster has an authorizer at all
(`authorizer_enabled`, `warn_if_no_authorizer`).

Every client takes its connection settings from `common.settings.kafka_client_config`
unless a function is given its own ``client_config`` (the embedded broker's admin).
kafka-python is imported inside the functions so that importing this module stays cheap.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from runwatch.common.errors import RunwatchError
from runwatch.common.settings import kafka_client_config

if TYPE_CHECKING:
    from kafka import KafkaAdminClient

    from runwatch.broker.acls import Acl
    from runwatch.schemas.topics import Replication, TopicSpec

logger = logging.getLogger(__name__)

_TOPIC_ALREADY_EXISTS = 36  # Kafka protocol error codes
_TOPIC_AUTHORIZATION_FAILED = 29


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
def admin_client(
    bootstrap: str, *, timeout_s: float = 30.0, client_config: Mapping[str, Any] | None = None
) -> Iterator[KafkaAdminClient]:
    """A connected `kafka.KafkaAdminClient`, closed on exit.

    Args:
        bootstrap: ``host:port[,host:port...]``.
        timeout_s: Longest to wait for the first connection and for each request.
        client_config: Security settings for kafka-python; None: `kafka_client_config()`.

    Raises:
        RunwatchError: when no broker answers at ``bootstrap``.
    """
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    config = kafka_client_config() if client_config is None else client_config
    try:
        client = KafkaAdminClient(
            bootstrap_servers=bootstrap,
            client_id="runwatch-admin",
            bootstrap_timeout_ms=int(timeout_s * 1000),
            request_timeout_ms=int(timeout_s * 1000),
            **config,
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
    client_config: Mapping[str, Any] | None = None,
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
        client_config: Security settings for kafka-python; None: `kafka_client_config()`.

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
    with admin_client(bootstrap, timeout_s=timeout_s, client_config=client_config) as admin:
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
            refused: list[str] = []
            for topic in response.get("topics", []):
                name, code = topic["name"], int(topic["error_code"])
                if code == 0:
                    created[name] = True
                elif code == _TOPIC_ALREADY_EXISTS:
                    created[name] = False
                elif code == _TOPIC_AUTHORIZATION_FAILED:
                    refused.append(name)
                else:
                    error = for_code(code)
                    reason = topic.get("error_message") or error.__name__
                    raise RunwatchError(f"Kafka refused to create topic {name}: {reason}")
            created.update(_existing(admin, refused))
            admin.wait_for_topics(list(by_name), timeout_ms=int(timeout_s * 1000))
            existing = [name for name, new in created.items() if not new]
            if existing:
                _warn_mismatch(admin, existing, by_name, rule.factor)
                _ensure_broker_time(admin, existing, by_name)
        except KafkaError as exc:
            raise RunwatchError(f"creating topics on {bootstrap} failed: {exc}") from None
    return created


def _existing(admin: KafkaAdminClient, refused: list[str]) -> dict[str, bool]:
    """The topics this credential may not create: fine when they exist (False each).

    An authorizer refuses a CreateTopics without Create on the topic, whether it exists
    or not; a principal that may use the topic sees it in the metadata.

    Raises:
        RunwatchError: a refused topic does not exist (or cannot even be described).
    """
    if not refused:
        return {}
    described = {t.get("name"): int(t.get("error_code", 0)) for t in admin.describe_topics(refused)}
    hidden = sorted(n for n in refused if described.get(n) == _TOPIC_AUTHORIZATION_FAILED)
    missing = sorted(
        n for n in refused if described.get(n, -1) not in (0, _TOPIC_AUTHORIZATION_FAILED)
    )
    if hidden or missing:
        what = []
        if missing:
            what.append(f"{', '.join(missing)}, which do not exist")
        if hidden:
            what.append(f"{', '.join(hidden)}, which this credential may not even see")
        raise RunwatchError(
            f"not authorized to create topic(s) {'; '.join(what)}: create the catalogue with "
            "a credential allowed to (an admin's, or the processors' role: `runwatch topics "
            "create`, docs/security.md)"
        )
    return dict.fromkeys(refused, False)


TIMESTAMP_TYPE = "message.timestamp.type"


def _ensure_broker_time(
    admin: KafkaAdminClient, names: list[str], by_name: dict[str, TopicLike]
) -> None:
    """Give existing topics the catalogue's ``message.timestamp.type`` (LogAppendTime).

    A topic created before its role stamped records with the broker's clock keeps
    ``CreateTime``, and then the writer sets the stamp that bounds an event's time
    (docs/core.md, "Records that steer decisions"). The topics' configs are read first
    (a credential without DescribeConfigs, e.g. the processors' role, leaves it to the
    admin's `runwatch topics create`); then only that one key is set where it differs
    (IncrementalAlterConfigs), and a credential without AlterConfigs gets a warning naming
    the command that fixes it.
    """
    from kafka.admin import ConfigResource, ConfigResourceType
    from kafka.errors import KafkaError

    wanted = {
        name: topic_configs(by_name[name])[TIMESTAMP_TYPE]
        for name in names
        if TIMESTAMP_TYPE in topic_configs(by_name[name])
    }
    if not wanted:
        return
    try:
        described = admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, name) for name in sorted(wanted)]
        )
    except (KafkaError, ValueError) as exc:  # no DescribeConfigs: an admin's job
        logger.info("cannot read the configs of existing topics (%s); not checked", exc)
        return
    have: dict[str, object] = {}
    for per_type in described.values():
        for name, configs in per_type.items():
            if isinstance(configs, dict):  # only modified keys: absent is the default
                entry = configs.get(TIMESTAMP_TYPE)
                have[name] = entry.get("value") if isinstance(entry, dict) else entry
    wanted = {n: v for n, v in wanted.items() if n in have and have[n] != v}
    if not wanted:
        return
    resources = [
        ConfigResource(ConfigResourceType.TOPIC, name, configs={TIMESTAMP_TYPE: value})
        for name, value in sorted(wanted.items())
    ]
    try:
        result = admin.alter_configs(resources)
        failed = [
            f"{name}: {outcome}"
            for per_type in result.values()
            for name, outcome in per_type.items()
            if isinstance(outcome, BaseException)
        ]
    except (KafkaError, ValueError) as exc:
        failed = [f"{', '.join(sorted(wanted))}: {exc}"]
    for failure in failed:
        logger.warning(
            "could not set %s=LogAppendTime on an existing topic (%s): its records keep the "
            "writer's timestamps, so the bound on event times does not hold there; run "
            "kafka-configs --alter --entity-type topics --entity-name TOPIC --add-config "
            "message.timestamp.type=LogAppendTime",
            TIMESTAMP_TYPE,
            failure,
        )


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


def apply_acls(
    bootstrap: str,
    grants: Sequence[tuple[str, Acl]],
    *,
    client_config: Mapping[str, Any] | None = None,
    timeout_s: float = 30.0,
) -> int:
    """Create an ALLOW ACL for every operation of every (principal, grant), from any host.

    Idempotent: Kafka keeps one copy of a binding, so applying the same grants again
    changes nothing. Nothing is removed.

    Args:
        bootstrap: Kafka bootstrap address.
        grants: (principal, grant) pairs (`runwatch.broker.acls.bindings`).
        client_config: An admin's security settings; None: `kafka_client_config()`.
        timeout_s: Longest to wait for the brokers.

    Returns:
        The number of bindings sent (one per principal, resource and operation).

    Raises:
        RunwatchError: the cluster is unreachable, has no authorizer, or refused a binding
            (the credential is not allowed to alter ACLs).
    """
    from kafka.admin import (
        ACL,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        ResourcePattern,
        ResourceType,
    )
    from kafka.errors import KafkaError

    acls = [
        ACL(
            principal=principal,
            host="*",
            operation=ACLOperation[op.value],
            permission_type=ACLPermissionType.ALLOW,
            resource_pattern=ResourcePattern(
                ResourceType[grant.resource.value],
                grant.name,
                ACLResourcePatternType[grant.pattern.value],
            ),
        )
        for principal, grant in grants
        for op in grant.operations
    ]
    if not acls:
        return 0
    with admin_client(bootstrap, timeout_s=timeout_s, client_config=client_config) as admin:
        try:
            result = admin.create_acls(acls)
            failed = list(result.get("failed", []))
            if failed:
                reasons = ", ".join(sorted({getattr(e, "__name__", str(e)) for e in failed}))
                raise RunwatchError(
                    f"Kafka at {bootstrap} refused {len(failed)} of {len(acls)} ACLs: {reasons} "
                    "(ACLs need an authorizer and a credential allowed to alter them: the admin's)"
                )
            _await_acls(admin, acls, deadline=time.monotonic() + timeout_s)
        except KafkaError as exc:
            raise RunwatchError(f"creating ACLs on {bootstrap} failed: {exc}") from None
    return len(acls)


def _any_acl() -> Any:
    """A DescribeAcls filter matching every ACL."""
    from kafka.admin import (
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        ResourcePatternFilter,
        ResourceType,
    )

    return ACLFilter(
        principal=None,
        host=None,
        operation=ACLOperation.ANY,
        permission_type=ACLPermissionType.ANY,
        resource_pattern=ResourcePatternFilter(ResourceType.ANY, None, ACLResourcePatternType.ANY),
    )


def _acl_key(acl: Any) -> tuple[Any, ...]:
    pattern = acl.resource_pattern
    return (
        acl.principal,
        acl.host,
        acl.operation,
        acl.permission_type,
        pattern.resource_type,
        pattern.resource_name,
        pattern.pattern_type,
    )


def _await_acls(admin: KafkaAdminClient, acls: Sequence[Any], *, deadline: float) -> None:
    """Wait until the broker answering ``admin`` enforces every ACL of ``acls``.

    CreateAcls returns once the controller committed them; each broker applies the
    metadata a moment later. DescribeAcls is answered from the broker's own authorizer,
    so once it lists them, that broker enforces them.

    Raises:
        RunwatchError: they are not all listed by ``deadline``.
    """
    wanted = {_acl_key(acl) for acl in acls}
    while True:
        listed, _ = admin.describe_acls(_any_acl())
        missing = wanted - {_acl_key(acl) for acl in listed}
        if not missing:
            return
        if time.monotonic() > deadline:
            raise RunwatchError(f"{len(missing)} ACLs are not in force after they were created")
        time.sleep(0.1)  # the broker applies the controller's metadata on its own schedule


def ensure_scram_users(
    bootstrap: str,
    passwords: Mapping[str, str],
    *,
    mechanism: str = "SCRAM-SHA-512",
    client_config: Mapping[str, Any] | None = None,
    timeout_s: float = 30.0,
) -> list[str]:
    """Create the SCRAM credential of every user in ``passwords`` that has none yet.

    Users that already have a credential for ``mechanism`` are left as they are (their
    password is not reset).

    Args:
        bootstrap: Kafka bootstrap address.
        passwords: User name -> password.
        mechanism: ``SCRAM-SHA-512`` or ``SCRAM-SHA-256``.
        client_config: An admin's security settings; None: `kafka_client_config()`.
        timeout_s: Longest to wait for the brokers.

    Returns:
        The users created, sorted.

    Raises:
        RunwatchError: the cluster is unreachable or refused a credential.
    """
    from kafka.admin import ScramMechanism, UserScramCredentialUpsertion
    from kafka.errors import KafkaError

    kind = ScramMechanism[mechanism.upper().replace("-", "_")]

    def having(admin: KafkaAdminClient) -> set[str]:
        described = admin.describe_user_scram_credentials(sorted(passwords))
        return {
            user
            for user, info in described.items()
            if any(c["mechanism"] == kind for c in info.get("credential_infos") or [])
        }

    deadline = time.monotonic() + timeout_s
    with admin_client(bootstrap, timeout_s=timeout_s, client_config=client_config) as admin:
        try:
            new = sorted(set(passwords) - having(admin))
            if not new:
                return []
            errors = admin.alter_user_scram_credentials(
                [UserScramCredentialUpsertion(u, kind, passwords[u], iterations=8192) for u in new]
            )
            refused = {user: why for user, why in errors.items() if why}
            if refused:
                raise RunwatchError(f"Kafka at {bootstrap} refused SCRAM users: {refused}")
            # In force once the broker lists them (it applies the controller's metadata
            # a moment after the alteration was committed).
            while not set(new) <= having(admin):
                if time.monotonic() > deadline:
                    raise RunwatchError(f"SCRAM users {new} not in force after their creation")
                time.sleep(0.1)
        except KafkaError as exc:
            raise RunwatchError(f"creating SCRAM users on {bootstrap} failed: {exc}") from None
    return new


def authorizer_enabled(
    bootstrap: str, *, client_config: Mapping[str, Any] | None = None, timeout_s: float = 10.0
) -> bool | None:
    """Whether the cluster at ``bootstrap`` checks ACLs at all.

    Asks DescribeAcls: a cluster without an authorizer answers SECURITY_DISABLED; one with
    an authorizer answers with ACLs, or refuses a principal that may not describe them
    (CLUSTER_AUTHORIZATION_FAILED): either way its ACLs are enforced.

    Args:
        bootstrap: Kafka bootstrap address.
        client_config: Security settings; None: `kafka_client_config()`.
        timeout_s: Longest to wait for the brokers.

    Returns:
        True (an authorizer), False (none), None (could not tell: unreachable, or
        another error).
    """
    from kafka.errors import ClusterAuthorizationFailedError, KafkaError, SecurityDisabledError

    try:
        with admin_client(bootstrap, timeout_s=timeout_s, client_config=client_config) as admin:
            admin.describe_acls(_any_acl())
    except SecurityDisabledError:
        return False
    except ClusterAuthorizationFailedError:
        return True
    except (KafkaError, RunwatchError, OSError) as exc:
        logger.debug("could not tell whether %s has an authorizer: %s", bootstrap, exc)
        return None
    return True


NO_AUTHORIZER_WARNING = (
    "Kafka at %s checks no ACLs (no authorizer): any client that can write to it can forge "
    "verdicts (%s.anomalies), and the processors turn verdicts into signed restart "
    "commands. Run Kafka with an authorizer and one user per role: `runwatch broker start "
    "--secure`, or `runwatch topics create --acls apply` on your cluster (docs/security.md)."
)
"""What every component says once at start on a cluster without an authorizer."""


def warn_if_no_authorizer(bootstrap: str, prefix: str, component: str) -> threading.Thread:
    """Say once, at a component's start, when Kafka enforces no ACLs (a WARNING line).

    Processors, controllers (``runwatch launch`` / ``runwatch controller``), sinks and the
    web view call it once, after their broker answered. The check (`authorizer_enabled`:
    a connection and a DescribeAcls, up to 5 s) runs in a daemon thread, so no start waits
    on it: an adopting controller, for one, reads its gang's log from where it took over.

    Args:
        bootstrap: Kafka bootstrap address.
        prefix: The topic prefix (named in the warning).
        component: Who says it: the logger is ``runwatch.<component>``.

    Returns:
        The started thread (joined by tests; nobody needs to wait for it).
    """

    def check() -> None:
        if authorizer_enabled(bootstrap, timeout_s=5.0) is False:
            logging.getLogger(f"runwatch.{component}").warning(
                NO_AUTHORIZER_WARNING, bootstrap, prefix
            )

    thread = threading.Thread(target=check, name="runwatch-authorizer-check", daemon=True)
    thread.start()
    return thread
