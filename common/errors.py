"""Errors the command line turns into one-line messages instead of tracebacks.

Exit statuses: 2 for a `UsageError`, 3 for a `BrokerUnreachable`, 1 for any other
`RunwatchError`. `kafka_error` maps the exceptions of the Kafka client libraries
(kafka-python, aiokafka) to these types, so no command shows a client's traceback.
"""

from __future__ import annotations

import sys

BROKER_HINT = (
    "start a broker with `runwatch broker start`, or point --bootstrap or "
    "RUNWATCH_BOOTSTRAP at a running one"
)
"""What to do about an unreachable broker; the end of every `BrokerUnreachable` message."""


class RunwatchError(Exception):
    """A failure the user can act on; the CLI prints its message and exits with 1."""

    exit_code: int = 1


class UsageError(RunwatchError):
    """A bad argument or setting; the CLI prints its message and exits with 2."""

    exit_code = 2


class BrokerUnreachable(RunwatchError):
    """No Kafka broker answers at the bootstrap address; the CLI exits with 4.

    A status of its own, so that a script can tell "the broker is down" from a command's
    own failure (`runwatch audit` exits 1 when the verdicts disagree, 3 while they are
    pending).

    Attributes:
        bootstrap: The address that was tried.
        reason: What went wrong, in a few words (``connection refused``).
    """

    exit_code = 4

    def __init__(self, bootstrap: str, reason: str) -> None:
        """Name the address and the reason; the message adds `BROKER_HINT`."""
        self.bootstrap = bootstrap
        self.reason = reason
        super().__init__(f"cannot reach Kafka at {bootstrap} ({reason}); {BROKER_HINT}")


_CONNECTION_ERRORS = (
    "NoBrokersAvailable",
    "KafkaConnectionError",
    "KafkaTimeoutError",
    "NodeNotReadyError",
    "ConnectionError",
    "RequestTimedOutError",
)
"""Client exception classes (by name, in kafka-python and aiokafka) meaning "no broker"."""


def _one_line(text: str) -> str:
    return " ".join(text.split())


def kafka_error(exc: BaseException, bootstrap: str | None) -> RunwatchError | None:
    """The one-line error for an exception of a Kafka client library, None for others.

    The client modules are looked up in `sys.modules`, never imported: an exception of a
    library that was not loaded cannot be one of its exceptions.

    Args:
        exc: What a command raised.
        bootstrap: The address the command used, if known (for the message).

    Returns:
        A `BrokerUnreachable` for the "no broker" family (``NoBrokersAvailable``, connection
        errors and bootstrap/metadata timeouts), a `RunwatchError` naming the client error
        for any other client exception, or None when ``exc`` comes from neither library.
    """
    bases = tuple(
        module.KafkaError
        for name in ("kafka.errors", "aiokafka.errors")
        if (module := sys.modules.get(name)) is not None and hasattr(module, "KafkaError")
    )
    if not bases or not isinstance(exc, bases):
        return None
    names = {cls.__name__ for cls in type(exc).__mro__}
    detail = _one_line(str(exc)) or type(exc).__name__
    if names & set(_CONNECTION_ERRORS):
        return BrokerUnreachable(bootstrap or "the bootstrap address", detail)
    where = f" at {bootstrap}" if bootstrap else ""
    return RunwatchError(f"Kafka{where} failed: {type(exc).__name__}: {detail}")
