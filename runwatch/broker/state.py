"""The embedded broker's state file record: `BrokerInfo`."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from runwatch.broker.config import KAFKA_VERSION


@dataclass(frozen=True)
class BrokerInfo:
    """A running embedded broker, as recorded in its state file.

    Attributes:
        bootstrap: ``host:port`` of the client listener.
        pid: Process id of the broker's JVM.
        data_dir: The broker's data directory.
        port: Client (PLAINTEXT) port.
        controller_port: KRaft controller port.
        port_auto: True when the client port was picked automatically (and may be reused).
        kafka_version: The Apache Kafka release it runs.
        startup_s: Seconds from launching the JVM to the first answered metadata request.
        node_id: The node's id (``node.id``): 1 for a single broker, 1..N in a cluster.
        secure: True when clients must authenticate (SASL/SCRAM) and ACLs are checked
            (`runwatch.broker.security`).
    """

    bootstrap: str
    pid: int
    data_dir: Path
    port: int
    controller_port: int
    port_auto: bool
    kafka_version: str = KAFKA_VERSION
    startup_s: float = 0.0
    node_id: int = 1
    secure: bool = False

    def to_json(self) -> dict[str, Any]:
        """The state-file form (paths as strings)."""
        out = asdict(self)
        out["data_dir"] = str(self.data_dir)
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> BrokerInfo:
        """Parse the state-file form; raises KeyError/TypeError/ValueError when malformed."""
        return cls(
            bootstrap=str(raw["bootstrap"]),
            pid=int(raw["pid"]),
            data_dir=Path(raw["data_dir"]),
            port=int(raw["port"]),
            controller_port=int(raw["controller_port"]),
            port_auto=bool(raw.get("port_auto", True)),
            kafka_version=str(raw.get("kafka_version", KAFKA_VERSION)),
            startup_s=float(raw.get("startup_s", 0.0)),
            node_id=int(raw.get("node_id", 1)),
            secure=bool(raw.get("secure", False)),
        )


@dataclass(frozen=True)
class ClusterMember:
    """What a node of a multi-node cluster shares with the others.

    Attributes:
        node_id: This node's id (1..``nodes``).
        port: This node's client (PLAINTEXT) port.
        controller_port: This node's KRaft controller port.
        voters: ``controller.quorum.voters`` of the cluster (``id@host:port,...``), the
            same on every node: a static quorum of every node.
        cluster_id: The cluster id every node's storage is formatted with.
        nodes: Nodes in the cluster.
    """

    node_id: int
    port: int
    controller_port: int
    voters: str
    cluster_id: str
    nodes: int
