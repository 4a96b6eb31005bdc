"""Broker readiness: a real DescribeCluster answered by an unfenced broker, never a sleep."""

from __future__ import annotations

import logging
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from typing import Any

logger = logging.getLogger("runwatch.broker")  # the package's logger, as before the split


class BrokerExited(Exception):
    """The broker's JVM exited while it was awaited.

    Attributes:
        status: Its exit status.
    """

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def exit_probe(proc: subprocess.Popen[bytes]) -> Callable[[float], int | None]:
    """A function that waits up to ``s`` seconds for ``proc`` to exit; its status or None."""

    def wait(timeout_s: float) -> int | None:
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    return wait


def await_ready(
    bootstrap: str,
    *,
    deadline: float,
    exited: Callable[[float], int | None],
    node_id: int | None = None,
    client_config: Mapping[str, Any] | None = None,
) -> None:
    """Wait until the broker at ``bootstrap`` answers DescribeCluster with an unfenced broker.

    With ``node_id`` (a node of a cluster), that broker itself must be listed unfenced: the
    controller quorum has accepted its registration. Between attempts it waits on the
    process's exit (``exited``), so a crash surfaces at once. A secure broker is asked
    with its admin's ``client_config`` (SASL settings for kafka-python). Raises
    `BrokerExited` or `TimeoutError`.
    """
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    host, _, port = bootstrap.rpartition(":")
    while True:
        status = exited(0.0)
        if status is not None:
            raise BrokerExited(status)
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            raise TimeoutError(bootstrap)
        try:  # cheap probe first: keeps kafka-python's connection warnings out of the way
            with socket.create_connection((host, int(port)), timeout=min(1.0, remaining_s)):
                pass
        except OSError:
            status = exited(min(0.2, max(0.0, remaining_s)))
            if status is not None:
                raise BrokerExited(status) from None
            continue
        try:
            admin = KafkaAdminClient(
                bootstrap_servers=bootstrap,
                client_id="runwatch-readiness",
                bootstrap_timeout_ms=int(min(5.0, remaining_s) * 1000),
                request_timeout_ms=int(min(10.0, max(1.0, remaining_s)) * 1000),
                **(client_config or {}),
            )
            try:
                cluster = admin.describe_cluster()
            finally:
                admin.close()
            brokers = cluster.get("brokers") or []
            unfenced = {b.get("broker_id") for b in brokers if not b.get("is_fenced", False)}
            if unfenced and (node_id is None or node_id in unfenced):
                return
        except (KafkaError, OSError) as exc:
            logger.debug("broker at %s not ready yet: %s", bootstrap, exc)
        status = exited(min(0.2, max(0.0, deadline - time.monotonic())))
        if status is not None:
            raise BrokerExited(status)
