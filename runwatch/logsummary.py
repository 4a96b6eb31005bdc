"""Log lines that stay few while something keeps failing: repeats summarised, outages named.

Two pieces, both set up by the command line (`runwatch.cli.setup_logging`,
`runwatch.cmd.processors`):

* `RepeatSummary`, a filter on the stderr handler: the first record of a kind (logger,
  level, message template) goes through; repeats within the next `RepeatSummary.window_s`
  are counted, not written, and the first repeat after the window goes through with
  ``[+N like this in the last 10 s]`` appended. A library that logs an error per retry
  costs a line per kind per window, whatever its retry rate.
* `BrokerWatch`, a handler on the Kafka client's logger: it turns the client's connection
  errors (which it keeps off the screen by default) into the worker's own view, one
  warning when the broker stops answering, one every `BrokerWatch.remind_s` while it
  stays down, and one info line when it answers again (probed every
  `BrokerWatch.probe_s` from a thread, only during an outage).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Final

log = logging.getLogger("runwatch.broker_watch")

WINDOW_S: Final = 10.0
"""Seconds over which repeats of one kind of record are counted into one line."""


class RepeatSummary(logging.Filter):
    """Lets the first record of each kind through, then one per window with a count.

    Only records at WARNING or above are summarised; INFO and DEBUG pass untouched (they
    are what ``-v`` asks for). A kind is ``(logger name, level, unformatted message)``:
    ``Unable connect to node with id %s: %s`` is one kind whatever the node.
    """

    def __init__(self, window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic):
        """Summarise over ``window_s`` seconds of ``clock``."""
        super().__init__()
        self.window_s = window_s
        self.clock = clock
        self._shown_at: dict[tuple[str, int, str], float] = {}
        self._held: dict[tuple[str, int, str], int] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        """True to write ``record`` (its message extended with the count it stands for)."""
        if record.levelno < logging.WARNING:
            return True
        kind = (record.name, record.levelno, str(record.msg))
        now = self.clock()
        with self._lock:
            shown = self._shown_at.get(kind)
            if shown is not None and now - shown < self.window_s:
                self._held[kind] = self._held.get(kind, 0) + 1
                return False
            held = self._held.pop(kind, 0)
            self._shown_at[kind] = now
        if held:
            record.msg = f"{record.msg} [+{held} like this in the last {self.window_s:g} s]"
        return True


CONNECTION_MARKERS: Final = (
    "Unable connect to node",
    "Unable to update metadata",
    "Unable to request metadata",
    "Connect call failed",
    "KafkaConnectionError",
    "NodeNotReadyError",
    "Unable to bootstrap",
)
"""Substrings of the client's error messages that mean "no broker answers"."""


class BrokerWatch(logging.Handler):
    """The worker's own view of a broker outage, from its Kafka client's error records.

    Attach it to the client's logger (``aiokafka``) at ERROR. While no connection error
    arrives it does nothing (no thread, no probe).
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        probe: Callable[[], bool],
        remind_s: float = 30.0,
        probe_s: float = 2.0,
        retry_s: float = 0.5,
    ) -> None:
        """Watch the client of ``bootstrap``.

        Args:
            bootstrap: The address, for the messages.
            probe: Returns True when a broker answers (called from a thread, during an
                outage only).
            remind_s: Seconds between "still unreachable" lines.
            probe_s: Seconds between probes during an outage.
            retry_s: The client's retry backoff, for the first message.
        """
        super().__init__(logging.ERROR)
        self.bootstrap = bootstrap
        self.probe = probe
        self.remind_s = remind_s
        self.probe_s = probe_s
        self.retry_s = retry_s
        self._state = threading.Lock()
        self._down_since: float | None = None
        self._errors = 0
        self._stop = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        """Count a connection error; the first one of an outage starts the watch."""
        message = record.getMessage()
        if not any(marker in message for marker in CONNECTION_MARKERS):
            return
        with self._state:
            self._errors += 1
            if self._down_since is not None:
                return
            self._down_since = time.monotonic()
        log.warning(
            "Kafka at %s does not answer (%s); the worker retries every %g s and says when "
            "it is back",
            self.bootstrap,
            message,
            self.retry_s,
        )
        threading.Thread(target=self._watch, name="runwatch-broker-watch", daemon=True).start()

    def _watch(self) -> None:
        with self._state:
            since = self._down_since or time.monotonic()
        reminded = since
        while not self._stop.wait(self.probe_s):
            try:
                back = self.probe()
            except Exception:  # a probe that fails is a broker that does not answer
                back = False
            now = time.monotonic()
            if back:
                with self._state:
                    errors, self._errors, self._down_since = self._errors, 0, None
                log.info(
                    "Kafka at %s answers again after %.0f s (%d client connection errors "
                    "in between)",
                    self.bootstrap,
                    now - since,
                    errors,
                )
                return
            if now - reminded >= self.remind_s:
                reminded = now
                with self._state:
                    errors = self._errors
                log.warning(
                    "Kafka at %s still does not answer after %.0f s (%d client connection errors)",
                    self.bootstrap,
                    now - since,
                    errors,
                )

    def close(self) -> None:
        """Stop the watch thread, if any."""
        self._stop.set()
        super().close()
