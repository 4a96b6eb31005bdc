"""Elastic restarts: which ranks caused a gang's failure, and the world size of its respawn.

Pure functions. When one rank of a DDP gang dies, the others fail in their next collective a
few milliseconds later, so "every rank exited abnormally" says little about who failed. The
culprits of a failure are:

* the ranks killed by a signal (a negative return code, or 128+N from a shell), if any;
* otherwise the ranks whose abnormal exit was observed first (within ``window_s``);
* never ranks the controller stopped itself (they are not passed in).

Each rank index keeps a count of failures it caused. When a count exceeds the budget the
next respawn runs one rank fewer (never below the minimum), resuming from the same
checkpoint (the checkpoints reshard); the counts then start over, since the rank indices of
a smaller gang name other processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RankExit:
    """How one rank of a gang ended.

    Attributes:
        rank: The rank index.
        code: Its exit status: negative for a signal (``subprocess``), 128+N from a shell,
            None when unknown (a rank whose exit status could not be read).
        seen_s: When the controller noticed the exit (monotonic seconds).
        finished: The rank was killed by a signal after it had said its training
            finished (`producers.rank_done`; the supervisor sets it only then): its
            interpreter's teardown, not a failure of the gang.
    """

    rank: int
    code: int | None
    seen_s: float
    finished: bool = False

    @property
    def abnormal(self) -> bool:
        """True unless the rank exited 0, or was killed in its teardown (``finished``)."""
        return self.code != 0 and not self.finished

    @property
    def signalled(self) -> bool:
        """True if the rank was killed by a signal."""
        return self.code is not None and (self.code < 0 or self.code > 128)

    @property
    def exit_code(self) -> int | None:
        """The exit code, None when killed by a signal or unknown."""
        return None if self.signalled else self.code

    @property
    def signal(self) -> int | None:
        """The signal that killed the rank (``-N`` or the shell's ``128+N``), else None."""
        if self.code is None or not self.signalled:
            return None
        return -self.code if self.code < 0 else self.code - 128

    def report_order(self) -> tuple[int, int]:
        """Sort key for exits noticed together: signalled, other abnormal, clean; by rank.

        A gang's peers fail in their next collective milliseconds after a rank dies, so
        exits noticed in one sweep are reported culprit-first (see `culprits`).
        """
        if not self.abnormal:
            return (2, self.rank)
        return (0 if self.signalled else 1, self.rank)


def culprits(exits: Sequence[RankExit], window_s: float = 0.5) -> tuple[int, ...]:
    """The ranks that caused a gang's failure, ascending (empty when none failed).

    Args:
        exits: The ranks that exited, the controller's own kills excluded.
        window_s: Abnormal exits noticed within this long of the first count as first.

    Returns:
        The signalled ranks if any, else the first abnormal ones.
    """
    bad = [e for e in exits if e.abnormal]
    if not bad:
        return ()
    signalled = [e.rank for e in bad if e.signalled]
    if signalled:
        return tuple(sorted(signalled))
    first = min(e.seen_s for e in bad)
    return tuple(sorted(e.rank for e in bad if e.seen_s - first <= window_s))


def due_reports(
    pending: Sequence[RankExit], now_s: float, hold_s: float
) -> tuple[list[RankExit], list[RankExit]]:
    """Split exits not yet reported into those to report now (culprit-first) and the rest.

    An agent of a multi-node gang holds back a non-signalled abnormal exit for ``hold_s``:
    when a rank is killed on another node, this node's ranks fail their next collective
    milliseconds later, and the killed rank's evidence (published at once by its own
    agent) must reach the log first to be the incarnation's one exit verdict. Signalled
    and clean exits are never held.

    Args:
        pending: Exits noticed and not reported yet.
        now_s: Now (monotonic seconds, the clock of ``RankExit.seen_s``).
        hold_s: How long a non-signalled abnormal exit waits; 0: nothing waits.

    Returns:
        ``(report now, in report order; keep holding)``.
    """
    now: list[RankExit] = []
    later: list[RankExit] = []
    for gone in pending:
        held = gone.abnormal and not gone.signalled and now_s - gone.seen_s < hold_s
        (later if held else now).append(gone)
    return sorted(now, key=RankExit.report_order), later


def count_failures(counts: Sequence[int], ranks: Sequence[int], world_size: int) -> tuple[int, ...]:
    """Per-rank failure counts after one more failure caused by ``ranks``.

    Args:
        counts: Counts so far (shorter than ``world_size`` is padded with zeros).
        ranks: The culprits of the new failure.
        world_size: The gang's size.

    Returns:
        One count per rank index of the gang.
    """
    out = [*counts[:world_size], *[0] * max(0, world_size - len(counts))]
    for rank in ranks:
        if 0 <= rank < world_size:
            out[rank] += 1
    return tuple(out)


@dataclass(frozen=True)
class SizeDecision:
    """The world size of the next respawn.

    Attributes:
        world_size: Ranks to launch.
        counts: The failure counts to keep (reset when the size changed).
        reason: Why the size changed; empty when it did not.
    """

    world_size: int
    counts: tuple[int, ...]
    reason: str = ""


def next_world_size(
    world_size: int,
    counts: Sequence[int],
    *,
    budget: int,
    min_nproc: int,
    requested: int | None = None,
) -> SizeDecision:
    """Decide the world size of the next respawn.

    Args:
        world_size: The current world size.
        counts: Failures per rank index.
        budget: A rank may cause this many failures; one more shrinks the gang.
        min_nproc: The gang never shrinks below this.
        requested: A size the command asks for (wins when given).

    Returns:
        The decision.
    """
    if requested is not None:
        if requested == world_size:
            return SizeDecision(world_size, tuple(counts))
        return SizeDecision(requested, (0,) * requested, f"command asks for {requested} ranks")
    over = [rank for rank, n in enumerate(counts) if n > budget]
    if not over or world_size - 1 < max(1, min_nproc):
        return SizeDecision(world_size, tuple(counts))
    smaller = world_size - 1
    worst = max(over, key=lambda r: counts[r])
    return SizeDecision(
        smaller,
        (0,) * smaller,
        f"rank {worst} failed {counts[worst]} times (budget {budget}): {world_size} -> "
        f"{smaller} ranks",
    )


__all__ = [
    "RankExit",
    "SizeDecision",
    "count_failures",
    "culprits",
    "due_reports",
    "next_world_size",
]
