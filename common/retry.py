"""Retrying with exponential backoff: one policy and one counter of failures in a row.

Every retry in runwatch waits the same way: a first delay, multiplied by ``factor`` after
each failure in a row, never above a ceiling, optionally shortened by a random factor so
that many clients that failed together do not retry together. `Backoff` is that policy (a
frozen value, pure arithmetic); what varies is where the waiting happens:

* a loop that owns its thread and may be woken early (the emitter's delivery thread, the
  node relay) keeps a `Retrying` counter: ``wait_s = retrying.failed()`` after a failure,
  ``retrying.succeeded()`` after a success, and waits ``wait_s`` its own way;
* a bounded loop (a number of attempts, or a deadline) iterates `Backoff.delays_s` and
  sleeps, or awaits, each wait its own way.

Delays are seconds. The delay after failure ``n`` (1 for the first) is
``min(max_s, first_s * factor ** (n - 1))``, scaled by a uniform factor in
``[1 - jitter, 1]``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """An exponential backoff policy.

    Attributes:
        first_s: The wait after the first failure (before jitter), > 0.
        max_s: The longest wait, >= ``first_s``.
        factor: How much each further failure in a row multiplies the wait, >= 1.
        jitter: Fraction of a wait that is random: each wait is scaled by a uniform
            factor in ``[1 - jitter, 1]``; 0 (the default) for exact waits, at most 1.
    """

    first_s: float
    max_s: float
    factor: float = 2.0
    jitter: float = 0.0

    def __post_init__(self) -> None:
        """Check the invariants (a policy that exists is a valid one).

        Raises:
            ValueError: A field is out of its range.
        """
        if not self.first_s > 0:
            raise ValueError(f"first_s must be > 0, got {self.first_s}")
        if self.max_s < self.first_s:
            raise ValueError(f"max_s ({self.max_s}) must be >= first_s ({self.first_s})")
        if self.factor < 1:
            raise ValueError(f"factor must be >= 1, got {self.factor}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"jitter must be in [0, 1], got {self.jitter}")

    def delay_s(self, failures: int, rng: random.Random | None = None) -> float:
        """The wait after ``failures`` failures in a row.

        Args:
            failures: Failures so far, >= 1.
            rng: Source of the jitter; the module's when None (unused without jitter).

        Returns:
            Seconds to wait before the next attempt.

        Raises:
            ValueError: ``failures`` < 1.
        """
        if failures < 1:
            raise ValueError(f"failures must be >= 1, got {failures}")
        # Past the failure that reaches the ceiling the wait stays there: cap the exponent,
        # so that a counter that ran for days does not overflow a float.
        exponent = min(failures - 1, self._ceiling_failures)
        wait_s = min(self.max_s, self.first_s * self.factor**exponent)
        if self.jitter:
            wait_s *= 1.0 - self.jitter * (rng or random).random()
        return wait_s

    @property
    def _ceiling_failures(self) -> int:
        """An exponent at which the wait has reached ``max_s`` (0 when it never grows)."""
        if self.factor == 1 or self.max_s == self.first_s:
            return 0
        return math.ceil(math.log(self.max_s / self.first_s, self.factor))

    def delays_s(self, rng: random.Random | None = None) -> Iterator[float]:
        """The waits after the first, second, ... failure, without end."""
        failures = 0
        while True:
            failures += 1
            yield self.delay_s(failures, rng)


class Retrying:
    """Failures in a row under one `Backoff`: how long to wait before the next attempt.

    Args:
        backoff: The policy.
        rng: Source of the jitter (a seeded one makes the waits reproducible).
    """

    def __init__(self, backoff: Backoff, rng: random.Random | None = None) -> None:
        self.backoff = backoff
        self.failures = 0
        self._rng = rng

    def failed(self) -> float:
        """Count one more failure; return how long to wait before trying again."""
        self.failures += 1
        return self.backoff.delay_s(self.failures, self._rng)

    def succeeded(self) -> None:
        """An attempt succeeded: the next failure waits ``first_s`` again."""
        self.failures = 0


__all__ = ["Backoff", "Retrying"]
