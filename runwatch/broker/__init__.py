"""The embedded Kafka broker: a real single-node KRaft Apache Kafka run as a local JVM process.

The jars come from Maven Central (`ensure_jars`, through Maven and
``compose/kafka-embedded/pom.xml``) into ``$RUNWATCH_HOME/kafka/<version>/libs``. A broker
keeps everything in one data directory (default ``$RUNWATCH_HOME/broker``)::

    server.properties   generated on every start (ports may change)
    kafka-logs/         the KRaft metadata log and the topic partitions (durable)
    logs/server.log     the broker's log4j2 log (rolled)
    broker.out          the JVM's stdout/stderr (WARN and above, crashes)
    broker.pid          the pid while it runs
    broker.json         the state: bootstrap address, pid, ports, data dir

Readiness is a real metadata request (DescribeCluster) answered by the broker, never a sleep.
``secure=True`` (``runwatch broker start --secure``) adds SASL/SCRAM, the StandardAuthorizer
and a user per role with the roles' ACLs (`security`, `acls`); the data directory then also
holds ``credentials/`` (0700: ``credentials.json`` and a ``<user>.env`` per user, 0600).

`EmbeddedCluster` runs N such nodes on loopback as one replicated cluster (a static
controller quorum of every node, one data directory each under the cluster's directory);
`ephemeral_cluster` is its ``with`` form, with ``kill(node)`` / ``start(node)`` for tests.

Modules, each importing only those before it: `config` (versions, JVM options, ports,
cluster id, ``server.properties``), `files` (atomic and private writes, locks), `state`
(`BrokerInfo`), `jars` (the Maven assembly), `pids` (the JVM as an OS process),
`readiness` (the DescribeCluster probe), `process` (launching a JVM, stopping it),
`acls` (the roles and their ACLs, for any cluster), `security` (a secure broker's
users, passwords and properties), `lifecycle` (`EmbeddedBroker` and shortcuts), `cluster`
(`EmbeddedCluster`) and `locate` (what runs from a data directory). No module uses
another's private names.
Everything public is re-exported here: import from ``runwatch.broker``.
"""

from runwatch.broker.cluster import (
    ClusterInfo,
    ClusterLayout,
    EmbeddedCluster,
    ephemeral_cluster,
    is_cluster_dir,
)
from runwatch.broker.config import DEFAULT_JVM_OPTS, HOST, KAFKA_VERSION, default_data_dir
from runwatch.broker.jars import assembly_pom, ensure_jars, kafka_libs_dir
from runwatch.broker.lifecycle import EmbeddedBroker, ephemeral_broker
from runwatch.broker.locate import running_bootstrap, running_secure
from runwatch.broker.state import BrokerInfo, ClusterMember

__all__ = [
    "DEFAULT_JVM_OPTS",
    "HOST",
    "KAFKA_VERSION",
    "BrokerInfo",
    "ClusterInfo",
    "ClusterLayout",
    "ClusterMember",
    "EmbeddedBroker",
    "EmbeddedCluster",
    "assembly_pom",
    "default_data_dir",
    "ensure_jars",
    "ephemeral_broker",
    "ephemeral_cluster",
    "is_cluster_dir",
    "kafka_libs_dir",
    "running_bootstrap",
    "running_secure",
]
