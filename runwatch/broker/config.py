"""The embedded broker's configuration: versions, JVM options, ports, cluster id, properties."""

from __future__ import annotations

import base64
import socket
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from runwatch.common.errors import RunwatchError
from runwatch.common.settings import runwatch_home

if TYPE_CHECKING:
    from runwatch.broker.state import BrokerInfo

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

_TOOL_JVM_OPTS = ("-Xmx256m", "-Djava.awt.headless=true")  # short-lived StorageTool
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]
_ASSEMBLY_DIR = _PACKAGE_ROOT / "compose" / "kafka-embedded"
_MAIN_CLASS = "kafka.Kafka"
_STORAGE_TOOL = "kafka.tools.StorageTool"


def default_data_dir() -> Path:
    """The embedded broker's default data directory: ``$RUNWATCH_HOME/broker``."""
    return runwatch_home() / "broker"


def _port_free(port: int, host: str = HOST) -> bool:
    """True if nothing listens on ``host:port`` (a TIME_WAIT leftover counts as free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _pick_port(host: str = HOST, avoid: Sequence[int] = ()) -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in avoid:
            return port


def _random_cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding, no leading '-'."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


def _choose_ports(requested: int | None, previous: BrokerInfo | None) -> tuple[int, int, bool]:
    """The client port, the controller port, and whether the client port was picked.

    Args:
        requested: The client port asked for; None picks one (reusing ``previous``'s
            automatically chosen port while it is free).
        previous: The broker's last recorded state, if any.

    Raises:
        RunwatchError: when ``requested`` is taken.
    """
    if requested is not None:
        if not _port_free(requested):
            raise RunwatchError(
                f"port {requested} on {HOST} is taken: stop what listens there or choose "
                "another with --port"
            )
        port, auto = requested, False
    elif previous is not None and previous.port_auto and _port_free(previous.port):
        port, auto = previous.port, True
    else:
        port, auto = _pick_port(), True
    if (
        previous is not None
        and previous.controller_port != port
        and _port_free(previous.controller_port)
    ):
        controller_port = previous.controller_port
    else:
        controller_port = _pick_port(avoid=(port,))
    return port, controller_port, auto


def _server_properties(
    port: int,
    controller_port: int,
    log_dirs: Path,
    *,
    node_id: int = 1,
    voters: str | None = None,
    replicas: int = 1,
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
    """
    from runwatch.schemas.topics import replication_for

    rule = replication_for(replicas)
    rf, isr = str(rule.factor), str(rule.min_insync)
    props = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": voters or f"{node_id}@{HOST}:{controller_port}",
        "listeners": f"PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
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
    }
    body = "".join(f"{key}={value}\n" for key, value in props.items())
    return "# Generated by runwatch on every `broker start`; edits are overwritten.\n" + body
