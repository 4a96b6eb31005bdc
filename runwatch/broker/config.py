"""The embedded broker's configuration: versions, JVM options, ports, cluster id, properties."""

from __future__ import annotations

import base64
import socket
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from runwatch.common.settings import runwatch_home

KAFKA_VERSION = "4.4.0"
"""The Apache Kafka release the embedded broker runs (the pom's default, passed to Maven)."""

HOST = "127.0.0.1"
"""The embedded broker listens on loopback only."""

# 1 GiB of heap: a long-lived development broker accumulates topics (a test session makes
# hundreds of catalogues of ~120 partitions each, at the fleet-sized partition counts), and
# at 512 MiB one shared by a day's test runs ended in OutOfMemoryError.
DEFAULT_JVM_OPTS: tuple[str, ...] = (
    "-Xms64m",
    "-Xmx1g",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)
"""JVM options: a small heap, for laptops and 2-core CI machines."""

TOOL_JVM_OPTS: tuple[str, ...] = ("-Xmx256m", "-Djava.awt.headless=true")
"""JVM options of the short-lived StorageTool (formatting a data directory)."""

ASSEMBLY_DIR = Path(__file__).resolve().parents[2] / "compose" / "kafka-embedded"
"""The Maven assembly of the broker's jars and its log4j2 configuration."""

MAIN_CLASS = "kafka.Kafka"
"""The broker's main class (also how a pid is recognised as a broker)."""

STORAGE_TOOL = "kafka.tools.StorageTool"
"""Kafka's storage tool, which formats a KRaft data directory."""

CLIENT_LISTENER = "PLAINTEXT"
"""The client listener's name (and protocol) of a broker without security."""

SECURE_LISTENER = "SASL_PLAINTEXT"
"""The client listener's name (and protocol) of a secure broker (`runwatch.broker.security`)."""


def default_data_dir() -> Path:
    """The embedded broker's default data directory: ``$RUNWATCH_HOME/broker``."""
    return runwatch_home() / "broker"


def port_free(port: int, host: str = HOST) -> bool:
    """True if nothing listens on ``host:port`` (a TIME_WAIT leftover counts as free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def pick_port(host: str = HOST, avoid: Sequence[int] = ()) -> int:
    """A port nothing listens on now, other than ``avoid``."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in avoid:
            return port


def random_cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding, no leading '-'."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


def server_properties(
    port: int,
    controller_port: int,
    log_dirs: Path,
    *,
    node_id: int = 1,
    voters: str | None = None,
    replicas: int = 1,
    security: Mapping[str, str] | None = None,
) -> str:
    """The text of ``server.properties`` for a KRaft node that is broker and controller.

    Args:
        port: Client (PLAINTEXT) port.
        controller_port: KRaft controller port.
        log_dirs: Kafka's ``log.dirs``: metadata log and partitions.
        node_id: The node's id (1 for a single-node broker).
        voters: ``controller.quorum.voters`` (``id@host:port,...``); None: this node alone.
        replicas: Nodes in the cluster: the replication factor of Kafka's internal topics
            and the default for new topics, with ``min.insync.replicas`` from
            `schemas.topics.replication_for` (the rule the catalogue uses).
        security: The properties of a secure broker (`runwatch.broker.security`): the
            client listener is then `SECURE_LISTENER` (SASL) and the controller listener
            authenticates too; None: both listeners are PLAINTEXT, without an authorizer.
    """
    from runwatch.schemas.topics import replication_for

    rule = replication_for(replicas)
    rf, isr = str(rule.factor), str(rule.min_insync)
    client = CLIENT_LISTENER if security is None else SECURE_LISTENER
    protocol = "PLAINTEXT" if security is None else "SASL_PLAINTEXT"
    props = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": voters or f"{node_id}@{HOST}:{controller_port}",
        "listeners": f"{client}://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"{client}://{HOST}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": client,
        "listener.security.protocol.map": f"{client}:{protocol},CONTROLLER:{protocol}",
        "log.dirs": str(log_dirs),
        "num.partitions": "1",
        "default.replication.factor": rf,
        "min.insync.replicas": isr,
        "unclean.leader.election.enable": "false",
        "offsets.topic.replication.factor": rf,
        "offsets.topic.num.partitions": "8",
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": isr,
        "transaction.state.log.num.partitions": "8",
        "share.coordinator.state.topic.replication.factor": rf,
        "share.coordinator.state.topic.min.isr": isr,
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "false",
        "num.network.threads": "2",
        "num.io.threads": "4",
        "num.recovery.threads.per.data.dir": "1",
        "log.retention.check.interval.ms": "60000",
        **(security or {}),
    }
    body = "".join(f"{key}={value}\n" for key, value in props.items())
    return "# Generated by runwatch on every `broker start`; edits are overwritten.\n" + body
