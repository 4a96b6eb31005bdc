"""JSON POSTs with bounded retries, exponential backoff and jitter (standard library only).

A request is retried on connection errors, timeouts, 408, 429 and 5xx; other statuses
are final (a 400 will not get better by asking again). Delays grow as
``min(cap, base * 2**attempt)``, each scaled by a random factor in [0.5, 1.0] so that many
senders do not retry in step.
"""

from __future__ import annotations

import json
import random
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, NamedTuple

from runwatch.common.version import __version__


class RetryPolicy(NamedTuple):
    """How hard to try.

    Attributes:
        attempts: Requests at most (1: no retry).
        base_delay_s: Delay before the first retry, before jitter.
        max_delay_s: Ceiling of one delay.
        timeout_s: Per-request timeout.
    """

    attempts: int = 5
    base_delay_s: float = 0.5
    max_delay_s: float = 8.0
    timeout_s: float = 5.0


class PostResult(NamedTuple):
    """The outcome of a delivery.

    Attributes:
        ok: A 2xx answer arrived.
        attempts: Requests made.
        status: The last HTTP status; None when none arrived.
        error: The last failure, one line; empty when ok.
    """

    ok: bool
    attempts: int
    status: int | None
    error: str


def backoff_delays_s(policy: RetryPolicy, rng: random.Random) -> list[float]:
    """The delays before each retry (``attempts - 1`` of them), jitter included."""
    return [
        min(policy.max_delay_s, policy.base_delay_s * 2**i) * (0.5 + 0.5 * rng.random())
        for i in range(max(0, policy.attempts - 1))
    ]


def is_retryable(status: int | None) -> bool:
    """True for no answer, 408, 429 and 5xx."""
    return status is None or status in (408, 429) or status >= 500


def _post_once(url: str, body: bytes, timeout_s: float) -> tuple[int | None, str]:
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": f"runwatch/{__version__}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            response.read()
            return int(response.status), ""
    except urllib.error.HTTPError as exc:
        try:
            said = exc.read(300).decode(errors="replace").strip().splitlines()
        except OSError:
            said = []
        return int(exc.code), f"HTTP {exc.code} {exc.reason}" + (f": {said[0]}" if said else "")
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return None, f"{type(exc).__name__}: {reason}"


def post_json(
    url: str,
    payload: Any,
    policy: RetryPolicy,
    *,
    rng: random.Random | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> PostResult:
    """POST ``payload`` as JSON, retrying as `RetryPolicy` says.

    Args:
        url: The receiver.
        payload: Anything `json.dumps` takes.
        policy: Attempts, delays and timeout.
        rng: Jitter source.
        sleep: How to wait between attempts.

    Returns:
        The outcome; never raises for network or HTTP failures.
    """
    body = json.dumps(payload).encode()
    delays = backoff_delays_s(policy, rng or random.Random())
    status: int | None = None
    error = ""
    for attempt in range(1, policy.attempts + 1):
        status, error = _post_once(url, body, policy.timeout_s)
        if status is not None and 200 <= status < 300:
            return PostResult(True, attempt, status, "")
        if not is_retryable(status) or attempt == policy.attempts:
            return PostResult(False, attempt, status, error or f"HTTP {status}")
        sleep(delays[attempt - 1])
    return PostResult(False, policy.attempts, status, error)
