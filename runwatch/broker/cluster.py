"""A replicated cluster on loopback: N combined KRaft nodes, one data directory each.

Every node is broker and controller; the controller quorum is static (every node a voter,
``controller.quorum.voters`` the same on each), and every node's storage is formatted with
the same cluster id. The cluster's directory holds::

    cluster.json   the layout: cluster id, Kafka version, each node's id and ports (kept)
    node-1/ ...    one `EmbeddedBroker` data directory per node (``node.id`` 1..N)

Nodes keep their ports for the life of the directory (the quorum's addresses are in every
node's configuration), so one node can be killed and restarted while the others run.
Readiness is DescribeCluster listing each node unfenced, never a sleep.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from runwatch.broker.config import (
    DEFAULT_JVM_OPTS,
    HOST,
    KAFKA_VERSION,
    default_data_dir,
    pick_port,
    port_free,
    random_cluster_id,
)
from runwatch.broker.files import file_lock, write_json
from runwatch.broker.lifecycle import EmbeddedBroker
from runwatch.broker.process import Launched
from runwatch.broker.state import BrokerInfo, ClusterMember
from runwatch.common.errors import RunwatchError

logger = logging.getLogger("runwatch.broker")

CLUSTER_FILE = "cluster.json"
"""The cluster layout's file name in the cluster's data directory."""

MAX_NODES = 9
"""The most nodes `EmbeddedCluster` runs (every node is a controller voter)."""


@dataclass(frozen=True)
class NodeLayout:
    """One node's fixed identity in a cluster: its id and ports.

    Attributes:
        node_id: ``node.id`` (1..N).
        port: Client (PLAINTEXT) port.
        controller_port: KRaft controller port.
    """

    node_id: int
    port: int
    controller_port: int


@dataclass(frozen=True)
class ClusterLayout:
    """What `cluster.json` records: the cluster id and every node's ports.

    Attributes:
        cluster_id: The id every node's storage is formatted with.
        kafka_version: The Apache Kafka release the nodes run.
        nodes: The nodes, by id.
    """

    cluster_id: str
    kafka_version: str
    nodes: tuple[NodeLayout, ...]

    @property
    def voters(self) -> str:
        """``controller.quorum.voters``: every node, ``id@host:controller_port``."""
        return ",".join(f"{n.node_id}@{HOST}:{n.controller_port}" for n in self.nodes)

    @property
    def bootstrap(self) -> str:
        """Every node's client address, comma-separated (clients need any one alive)."""
        return ",".join(f"{HOST}:{n.port}" for n in self.nodes)

    def to_json(self) -> dict[str, object]:
        """The file form."""
        return {
            "cluster_id": self.cluster_id,
            "kafka_version": self.kafka_version,
            "nodes": [
                {"node_id": n.node_id, "port": n.port, "controller_port": n.controller_port}
                for n in self.nodes
            ],
        }

    @classmethod
    def from_json(cls, raw: dict[str, object]) -> ClusterLayout:
        """Parse the file form; raises KeyError/TypeError/ValueError when malformed."""
        nodes = raw["nodes"]
        if not isinstance(nodes, list) or not nodes:
            raise ValueError("no nodes")
        return cls(
            cluster_id=str(raw["cluster_id"]),
            kafka_version=str(raw.get("kafka_version", KAFKA_VERSION)),
            nodes=tuple(
                NodeLayout(int(n["node_id"]), int(n["port"]), int(n["controller_port"]))
                for n in nodes
            ),
        )


@dataclass(frozen=True)
class ClusterInfo:
    """The nodes of a cluster that run now.

    Attributes:
        data_dir: The cluster's data directory.
        cluster_id: Its cluster id.
        nodes: Every node's id; the running ones are in ``running``.
        running: The running nodes' state, by node id.
        bootstrap: Every node's client address, comma-separated.
    """

    data_dir: Path
    cluster_id: str
    nodes: tuple[int, ...]
    running: dict[int, BrokerInfo]
    bootstrap: str

    @property
    def complete(self) -> bool:
        """True when every node runs."""
        return set(self.running) == set(self.nodes)


def is_cluster_dir(data_dir: Path) -> bool:
    """True if ``data_dir`` holds a cluster (its `cluster.json`)."""
    return (data_dir / CLUSTER_FILE).is_file()


class EmbeddedCluster:
    """N KRaft nodes (broker and controller each) on loopback, from one data directory.

    The nodes outlive the Python process that starts them; a later `EmbeddedCluster` on
    the same directory finds them. ``kill(node)`` and ``start(node)`` act on one node.
    """

    def __init__(
        self,
        data_dir: Path | str | None = None,
        *,
        nodes: int | None = None,
        port: int | None = None,
        jvm_opts: tuple[str, ...] = DEFAULT_JVM_OPTS,
        libs_dir: Path | None = None,
        kafka_version: str = KAFKA_VERSION,
    ) -> None:
        """Describe a cluster; nothing starts until `start`.

        Args:
            data_dir: Its directory; `default_data_dir()` when None.
            nodes: Node count (2..`MAX_NODES`) for a new cluster; None: the recorded one
                (3 when there is none). A recorded cluster must match it.
            port: Client port of node 1, node i gets ``port + i - 1`` (new clusters only);
                None picks free ports.
            jvm_opts: Options for each node's JVM.
            libs_dir: Jar directory; `kafka_libs_dir(kafka_version)` when None.
            kafka_version: Apache Kafka release to run.

        Raises:
            RunwatchError: ``nodes`` out of range, or it differs from the recorded cluster.
        """
        self.data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
        self.data_dir = self.data_dir.expanduser().absolute()
        if nodes is not None and not 2 <= nodes <= MAX_NODES:
            raise RunwatchError(f"a cluster has 2..{MAX_NODES} nodes, not {nodes}")
        self.port = port
        self.jvm_opts = tuple(jvm_opts)
        self.libs_dir = libs_dir
        self.kafka_version = kafka_version
        recorded = self._read_layout()
        if recorded is not None and nodes is not None and len(recorded.nodes) != nodes:
            raise RunwatchError(
                f"{self.data_dir} holds a cluster of {len(recorded.nodes)} nodes, not {nodes}: "
                "use another --data-dir for another cluster"
            )
        self.nodes = len(recorded.nodes) if recorded is not None else (nodes or 3)
        self._brokers: dict[int, EmbeddedBroker] = {}

    # ---- layout
    @property
    def layout_file(self) -> Path:
        """The layout file, `CLUSTER_FILE` in the data directory."""
        return self.data_dir / CLUSTER_FILE

    def node_dir(self, node_id: int) -> Path:
        """Node ``node_id``'s data directory."""
        return self.data_dir / f"node-{node_id}"

    def _read_layout(self) -> ClusterLayout | None:
        try:
            return ClusterLayout.from_json(json.loads(self.layout_file.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _new_layout(self, previous: ClusterLayout | None) -> ClusterLayout:
        """The layout to start with when no node runs.

        The recorded one while its ports are free, else new ports (the cluster id, and so
        the data, stays).
        """
        if previous is not None and all(
            port_free(n.port) and port_free(n.controller_port) for n in previous.nodes
        ):
            return previous
        if previous is not None:
            logger.warning("some of the cluster's ports are taken; choosing new ones")
        taken: list[int] = []
        nodes = []
        for node_id in range(1, self.nodes + 1):
            if self.port is not None and previous is None:
                port = self.port + node_id - 1
                if not port_free(port):
                    raise RunwatchError(
                        f"port {port} on {HOST} (node {node_id}) is taken: stop what listens "
                        "there or choose another --port"
                    )
            else:
                port = pick_port(avoid=taken)
            taken.append(port)
            controller_port = pick_port(avoid=taken)
            taken.append(controller_port)
            nodes.append(NodeLayout(node_id, port, controller_port))
        return ClusterLayout(
            cluster_id=previous.cluster_id if previous is not None else random_cluster_id(),
            kafka_version=self.kafka_version,
            nodes=tuple(nodes),
        )

    def _broker(self, layout: ClusterLayout, node: NodeLayout) -> EmbeddedBroker:
        member = ClusterMember(
            node_id=node.node_id,
            port=node.port,
            controller_port=node.controller_port,
            voters=layout.voters,
            cluster_id=layout.cluster_id,
            nodes=len(layout.nodes),
        )
        known = self._brokers.get(node.node_id)
        if known is not None and known.member == member:
            return known  # keeps the Popen handle, so a stop reaps its own child
        broker = EmbeddedBroker(
            self.node_dir(node.node_id),
            jvm_opts=self.jvm_opts,
            libs_dir=self.libs_dir,
            kafka_version=layout.kafka_version,
            member=member,
        )
        self._brokers[node.node_id] = broker
        return broker

    def _check_node(self, node_id: int) -> None:
        if not 1 <= node_id <= self.nodes:
            raise RunwatchError(f"the cluster has nodes 1..{self.nodes}, not {node_id}")

    def _check_not_single(self) -> None:
        if (self.data_dir / "kafka-logs").exists() or (self.data_dir / "broker.json").exists():
            raise RunwatchError(
                f"{self.data_dir} holds a single-node broker: start a cluster in another --data-dir"
            )

    # ---- queries
    def running(self) -> ClusterInfo | None:
        """The cluster's running nodes, or None if it has no layout or no node runs."""
        layout = self._read_layout()
        if layout is None:
            return None
        live = {}
        for node in layout.nodes:
            info = self._broker(layout, node).running()
            if info is not None:
                live[node.node_id] = info
        if not live:
            return None
        return ClusterInfo(
            data_dir=self.data_dir,
            cluster_id=layout.cluster_id,
            nodes=tuple(n.node_id for n in layout.nodes),
            running=live,
            bootstrap=layout.bootstrap,
        )

    @property
    def bootstrap(self) -> str:
        """Every node's client address, comma-separated (empty before the first start)."""
        layout = self._read_layout()
        return layout.bootstrap if layout is not None else ""

    def broker(self, node_id: int) -> EmbeddedBroker:
        """The `EmbeddedBroker` of node ``node_id`` (its files: logs, pid, state).

        Raises:
            RunwatchError: no such node, or the cluster was never started.
        """
        self._check_node(node_id)
        layout = self._read_layout()
        if layout is None:
            raise RunwatchError(f"no cluster in {self.data_dir} (has it been started?)")
        return self._broker(layout, layout.nodes[node_id - 1])

    # ---- start
    def start(self, node: int | None = None, *, timeout_s: float = 120.0) -> ClusterInfo:
        """Start every node that does not run (or only ``node``) and wait until they answer.

        The nodes start together (a quorum needs a majority of them); each is ready when
        DescribeCluster answered by it lists it unfenced.

        Args:
            node: Start only this node (the others must keep running for it to join).
            timeout_s: Longest to wait for the nodes to answer.

        Returns:
            The running cluster.

        Raises:
            RunwatchError: as `EmbeddedBroker.start`, for any node (the nodes this call
                launched are stopped again).
        """
        if node is not None:
            self._check_node(node)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with file_lock(self.data_dir / ".lock"):
            self._check_not_single()
            previous = self._read_layout()
            live = self.running()
            layout = previous if live is not None and previous else self._new_layout(previous)
            if layout != previous:
                write_json(self.layout_file, layout.to_json())
            wanted = [n for n in layout.nodes if node is None or n.node_id == node]
            with contextlib.ExitStack() as locks:
                launched: list[tuple[EmbeddedBroker, Launched]] = []
                try:
                    for spec in wanted:
                        broker = self._broker(layout, spec)
                        locks.enter_context(broker.lock())
                        result = broker.spawn()
                        if isinstance(result, Launched):
                            launched.append((broker, result))
                    for broker, result in launched:
                        broker.await_started(result, started_by=result.started, timeout_s=timeout_s)
                except BaseException:
                    for broker, _ in launched:
                        broker.signal_stop()
                    for broker, result in launched:
                        with contextlib.suppress(RunwatchError, OSError):
                            broker.terminate(result.proc.pid, timeout_s=15.0)
                    raise
        info = self.running()
        if info is None:
            raise RunwatchError(f"the cluster in {self.data_dir} stopped during its start")
        return info

    # ---- stop
    def stop(self, node: int | None = None, *, timeout_s: float = 30.0) -> list[int]:
        """Stop every node (or only ``node``) cleanly: SIGTERM to all at once, then wait.

        Args:
            node: Stop only this node.
            timeout_s: Longest to wait for each node before SIGKILL.

        Returns:
            The ids of the nodes that ran and were stopped.
        """
        layout = self._read_layout()
        if layout is None:
            return []
        if node is not None:
            self._check_node(node)
        brokers = [
            (n.node_id, self._broker(layout, n))
            for n in layout.nodes
            if node is None or n.node_id == node
        ]
        pids = {node_id: broker.live_pid() for node_id, broker in brokers}
        for _, broker in brokers:
            broker.signal_stop()
        stopped = []
        for node_id, broker in brokers:
            pid = pids[node_id]
            if pid is not None:
                with broker.lock():
                    broker.terminate(pid, timeout_s=timeout_s)
                stopped.append(node_id)
        return stopped

    def kill(self, node: int) -> bool:
        """SIGKILL node ``node``'s JVM, as a crash would (for tests); True if it ran."""
        return self.broker(node).kill()

    # ---- context manager
    def __enter__(self) -> EmbeddedCluster:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


@contextlib.contextmanager
def ephemeral_cluster(
    data_dir: Path, *, nodes: int = 3, timeout_s: float = 180.0
) -> Iterator[EmbeddedCluster]:
    """Run an `EmbeddedCluster` in ``data_dir`` for a ``with`` block (tests, demos).

    Yields the cluster itself, so a test can ``kill(node)`` and ``start(node)``; its
    ``bootstrap`` lists every node.

    Args:
        data_dir: Its directory (a temporary one, typically).
        nodes: Node count.
        timeout_s: Longest to wait for the nodes to answer.
    """
    cluster = EmbeddedCluster(data_dir, nodes=nodes)
    cluster.start(timeout_s=timeout_s)
    try:
        yield cluster
    finally:
        cluster.stop()
