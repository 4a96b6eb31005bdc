"""Finding what runs from a data directory: a single broker or a cluster's nodes."""

from __future__ import annotations

from pathlib import Path

from runwatch.broker.cluster import EmbeddedCluster, is_cluster_dir
from runwatch.broker.config import default_data_dir
from runwatch.broker.lifecycle import EmbeddedBroker


def running_bootstrap(data_dir: Path | None = None) -> str | None:
    """The address of the embedded broker if its state file exists and its process lives.

    For a cluster's directory (`EmbeddedCluster`): every node's address, comma-separated,
    while at least one node runs.

    Args:
        data_dir: The broker's data directory; `default_data_dir()` when None.
    """
    directory = data_dir if data_dir is not None else default_data_dir()
    if is_cluster_dir(directory):
        cluster = EmbeddedCluster(directory).running()
        return cluster.bootstrap if cluster is not None else None
    info = EmbeddedBroker(data_dir).running(clean_stale=False)
    return info.bootstrap if info is not None else None


def running_secure(data_dir: Path | None = None) -> bool:
    """True if the embedded broker of ``data_dir`` runs and is secure (clients must log in).

    Args:
        data_dir: The broker's data directory; `default_data_dir()` when None.
    """
    directory = data_dir if data_dir is not None else default_data_dir()
    if is_cluster_dir(directory):
        return False
    info = EmbeddedBroker(data_dir).running(clean_stale=False)
    return info is not None and info.secure
