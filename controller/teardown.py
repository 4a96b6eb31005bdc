"""Ranks stuck in their teardown after the gang finished training: a pure decision.

Every rank of a local gang says when its training finished (`producers.rank_done`, the
agent's done file). A rank killed by a signal after that died in its interpreter's
teardown and counts as finished; one that never exits is another matter: an NCCL or gloo
destructor waiting on a peer that already left blocks its process forever. Rank 0's
`RunEnded` has suspended liveness by then (a run that ended is not watched for silence),
so nothing pages, the launcher never returns and the node's accelerators stay held.

`teardown_step` decides, at each look at the gang, what the agent does about the ranks
still running once every local rank has said it finished. The rules, in order:

1. Some local rank has not said it finished, or none is still running: **wait**, and the
   clock stops (a rank still training, or one that died before its word, is the exit
   rules' and the detectors' business, not the teardown's).
2. The first look at which every rank has said it finished and some still run starts the
   clock.
3. The ranks were stopped at an earlier look and some still run (they outlived SIGKILL:
   a process in uninterruptible sleep, most often inside a driver call, dies only when the
   call returns): every `TEARDOWN_WARN_S` since the stop or the last such look, **kill**
   them again and say so; otherwise **wait**. They are never stopped twice the long way
   (stacks, SIGTERM, the grace): a stack dump of such a process can hang too, and each
   stop held the agent for the grace and SIGKILL's wait.
4. A teardown timeout is set (``runwatch launch --teardown-timeout``) and has passed since
   the clock started: **stop** the ranks still running. Killed after their word, they
   count as finished (`controller.elastic.RankExit.finished`) and the run completes.
5. `TEARDOWN_WARN_S` have passed since the clock started or since the last warning:
   **warn** (the agent logs the ranks still running and how long they have been).
6. Otherwise: **wait**.

No timeout by default: a script may still work after its training loop (a final save, an
upload to a model hub), and the agent cannot tell that from a hang. The warnings say what
is happening either way; a team whose scripts do nothing long after training sets the
timeout and gets its nodes back.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

TEARDOWN_WARN_S: Final = 60.0
"""Seconds between two warnings about ranks still running after the gang finished."""


class TeardownAction(StrEnum):
    """What the agent does at one look at a gang that may be in its teardown."""

    WAIT = "wait"
    WARN = "warn"
    STOP = "stop"
    KILL = "kill"


@dataclass(frozen=True, slots=True)
class TeardownClock:
    """How long a finished gang has had ranks running.

    Attributes:
        since_s: When a look first saw every local rank finished and some still running
            (monotonic seconds); None: not now.
        warned_s: When the last warning, or the last kill after the stop, was given
            (monotonic seconds); None: none yet.
        stopped_s: When the ranks were stopped (monotonic seconds); None: not yet.
    """

    since_s: float | None = None
    warned_s: float | None = None
    stopped_s: float | None = None


STOPPED: Final = TeardownClock()
"""The clock of a gang not in its teardown."""


def teardown_step(
    clock: TeardownClock,
    *,
    every_done: bool,
    running: int,
    now_s: float,
    timeout_s: float | None,
) -> tuple[TeardownClock, TeardownAction]:
    """One look at the gang: the clock after it, and what to do (module docstring's rules).

    Args:
        clock: The clock after the previous look.
        every_done: Every local rank of the incarnation has said its training finished.
        running: How many local ranks are still running.
        now_s: Now (monotonic seconds).
        timeout_s: The teardown timeout; None: never stop them.

    Returns:
        The clock after this look, and the action.
    """
    if not every_done or running == 0:  # 1
        return STOPPED, TeardownAction.WAIT
    since_s = clock.since_s if clock.since_s is not None else now_s  # 2
    if clock.stopped_s is not None:  # 3
        stopped_s, warned_s = clock.stopped_s, clock.warned_s
        last_s = stopped_s if warned_s is None else max(stopped_s, warned_s)
        if now_s - last_s >= TEARDOWN_WARN_S:
            return TeardownClock(since_s, now_s, stopped_s), TeardownAction.KILL
        return clock, TeardownAction.WAIT
    if timeout_s is not None and now_s - since_s >= timeout_s:  # 4
        return TeardownClock(since_s, clock.warned_s, now_s), TeardownAction.STOP
    last_s = clock.warned_s if clock.warned_s is not None else since_s
    if now_s - last_s >= TEARDOWN_WARN_S:  # 5
        return TeardownClock(since_s, now_s), TeardownAction.WARN
    return TeardownClock(since_s, clock.warned_s), TeardownAction.WAIT  # 6


__all__ = ["STOPPED", "TEARDOWN_WARN_S", "TeardownAction", "TeardownClock", "teardown_step"]
