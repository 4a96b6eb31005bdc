"""A bounded check that a Kafka bootstrap address answers, before a client retries for long.

kafka-python waits 30 s for its first connection by default and aiokafka (under faust)
retries without end. `check_reachable` connects with a timeout of a few seconds and, on a
plaintext listener, sends one ApiVersions request (the first request of every Kafka
client, answered before any authentication): "nothing listens there" and "something
listens but it is no Kafka broker" are both known within the timeout. On a TLS listener it
stops at the TCP connection (the clients' own TLS settings decide the rest).
"""

from __future__ import annotations

import socket
import struct

from runwatch.common.errors import BrokerUnreachable, UsageError
from runwatch.common.settings import CommonSettings, KafkaAuth


def connect_timeout_s() -> float:
    """Seconds a connection attempt may take: `RUNWATCH_CONNECT_TIMEOUT_S`, else 5.

    Raises:
        UsageError: The variable is not a positive number.
    """
    return CommonSettings.from_env().connect_timeout_s


def parse_bootstrap(bootstrap: str) -> list[tuple[str, int]]:
    """``host:port[,host:port...]`` (IPv6 hosts in brackets) as (host, port) pairs.

    Raises:
        UsageError: An entry has no port or a port that is not 1..65535.
    """
    out: list[tuple[str, int]] = []
    for entry in (e.strip() for e in bootstrap.split(",")):
        if not entry:
            continue
        host, sep, port = entry.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(f"bad bootstrap address {entry!r}: expected HOST:PORT")
        out.append((host, int(port)))
    if not out:
        raise UsageError(f"bad bootstrap address {bootstrap!r}: expected HOST:PORT")
    return out


_API_VERSIONS_KEY = 18
_CORRELATION_ID = 0x52570001
_CLIENT_ID = b"runwatch-probe"
_NOT_KAFKA = "it accepts connections but does not answer as a Kafka broker"


def api_versions_request() -> bytes:
    """A size-prefixed ApiVersions v0 request (header v1: key, version, id, client id)."""
    body = struct.pack(">hhih", _API_VERSIONS_KEY, 0, _CORRELATION_ID, len(_CLIENT_ID))
    body += _CLIENT_ID
    return struct.pack(">i", len(body)) + body


def _speaks_kafka(sock: socket.socket) -> bool:
    """Send ApiVersions and read the response's size and correlation id.

    Any response with our correlation id is a broker (one that rejects v0 still answers,
    with an error code). Raises OSError (a timeout included) when nothing comes back.
    """
    sock.sendall(api_versions_request())
    head = b""
    while len(head) < 8:
        chunk = sock.recv(8 - len(head))
        if not chunk:
            return False
        head += chunk
    size, correlation_id = struct.unpack(">ii", head)
    return bool(size >= 4 and correlation_id == _CORRELATION_ID)


def _plaintext() -> bool:
    """True when the clients speak Kafka's protocol in the clear (no TLS) to the broker."""
    return KafkaAuth.from_env().plaintext


def _reason(exc: OSError, timeout_s: float) -> str:
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host: {exc.strerror or exc}"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout_s:g} s"
    return exc.strerror or str(exc)


def check_reachable(bootstrap: str, timeout_s: float | None = None) -> None:
    """Return once one of the bootstrap addresses answers as a Kafka broker.

    Args:
        bootstrap: ``host:port[,host:port...]``.
        timeout_s: Longest wait per address (to connect, then for the answer);
            `connect_timeout_s` when None.

    Raises:
        BrokerUnreachable: No address accepts a connection in time or, in plaintext,
            answers the ApiVersions request.
        UsageError: The address is malformed.
    """
    timeout = connect_timeout_s() if timeout_s is None else timeout_s
    probe = _plaintext()
    reasons: list[str] = []
    for host, port in parse_bootstrap(bootstrap):
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            reasons.append(_reason(exc, timeout))
            continue
        with sock:
            if not probe:
                return
            try:
                if _speaks_kafka(sock):
                    return
                reasons.append(_NOT_KAFKA)
            except TimeoutError:
                reasons.append(f"it accepts connections but sent no answer in {timeout:g} s")
            except OSError:
                reasons.append(_NOT_KAFKA)
    raise BrokerUnreachable(bootstrap, "; ".join(dict.fromkeys(reasons)))
