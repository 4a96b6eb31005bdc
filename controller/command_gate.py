"""The command gate: may the controller execute a restart command it read? A pure decision.

A restart command kills a training job, so the controller executes only a command that is
authentic, new, for a gang it owns, and about that gang as it is now. The rules, in order:

1. A command for a run this controller does not own: **ignore** silently (another
   controller may own it; every controller reads every command).
2. A command read before the run's launch offset (the commands topic's end offset when the
   gang was first launched): **ignore** silently; it is the history of an earlier run that
   had the same id.
3. A shadow command (``shadow``: what a verdict in shadow mode would have caused; see
   `processors.core.policy`): **ignore**; it is recorded on the commands topic for
   people to measure, never executed.
4. No command key configured: **reject** ("controller has no command key").
5. Unsigned, signed with an unknown key, or a bad signature (`schemas.signing.verify`):
   **reject** with the reason.
6. The gang has a launch id and the command's (signed) launch id is another, or none:
   **reject** as "bound to another launch" (a command signed for an earlier launch of the
   same run id, replayed into this one; a command made before launch ids existed). A gang
   without a launch id (recorded before launch ids, or a multi-node launch given none)
   binds nothing: the rule passes.
7. A command id already executed (persisted): **reject** as "replayed".
8. A command whose incarnation is not the gang's current one: **reject** as "stale" (it was
   about a gang that no longer exists).
9. Otherwise: **execute**.

Signature comes before replay so a forged command that reuses an executed id is reported as
forged; the launch comes before replay so a command of another launch says so even where
this state directory executed it once (a relaunch in the same directory); replay comes
before staleness so an executed command read again (a restarted controller re-reads its
last command) is reported as replayed.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Literal

from runwatch.schemas.events import Provenance, RestartRequested
from runwatch.schemas.signing import CommandKey, SignatureError, verify

Verdict = Literal["execute", "reject", "ignore"]

NO_KEY = "controller has no command key"
REPLAYED = "replayed: command already executed"
OTHER_LAUNCH = "bound to another launch"
SHADOW = "shadow: recorded, not executed"


@dataclass(frozen=True)
class OwnedGang:
    """What the gate needs to know about a gang this controller owns.

    Attributes:
        run_id: The run.
        incarnation: The gang's current incarnation.
        launch_offsets: Commands-topic partition -> its end offset when the run was first
            launched; a partition absent here had no records then (offset 0).
        launch_id: The launch the gang's commands must be bound to; empty: none (rule 5
            passes every command).
    """

    run_id: str
    incarnation: int
    launch_offsets: Mapping[int, int]
    launch_id: str = ""

    def launched_before(self, source: Provenance) -> bool:
        """True if a record at ``source`` was in the topic before this run was launched."""
        return source.offset < self.launch_offsets.get(source.partition, 0)


@dataclass(frozen=True)
class Decision:
    """The gate's answer.

    Attributes:
        verdict: ``execute``, ``reject`` (publish a CommandRejected) or ``ignore`` (silent).
        reason: One line; empty for ``execute``.
    """

    verdict: Verdict
    reason: str = ""


def decide(
    command: RestartRequested,
    source: Provenance,
    *,
    gangs: Mapping[str, OwnedGang],
    keys: Mapping[str, CommandKey],
    processed: Container[str],
) -> Decision:
    """Decide what to do with one command read from the commands topic.

    Args:
        command: The command as read.
        source: Where it was read.
        gangs: The gangs this controller owns, by run id.
        keys: Known command keys by key id; empty when none is configured.
        processed: Ids of the commands already executed.

    Returns:
        The decision; see the module doc for the rules.
    """
    gang = gangs.get(command.run_id)
    if gang is None:
        return Decision("ignore", f"run {command.run_id!r} is not owned by this controller")
    if gang.launched_before(source):
        return Decision("ignore", "read before the run was launched (an earlier run's history)")
    if command.shadow:
        return Decision("ignore", SHADOW)
    if not keys:
        return Decision("reject", NO_KEY)
    try:
        verify(command, keys)
    except SignatureError as exc:
        return Decision("reject", str(exc))
    if gang.launch_id and command.launch_id != gang.launch_id:
        return Decision(
            "reject",
            f"{OTHER_LAUNCH}: command for launch {command.launch_id or '(none)'!r}, "
            f"this gang is launch {gang.launch_id!r}",
        )
    if command.command_id in processed:
        return Decision("reject", REPLAYED)
    if command.incarnation != gang.incarnation:
        return Decision(
            "reject",
            f"stale: command for incarnation {command.incarnation}, "
            f"the gang is at incarnation {gang.incarnation}",
        )
    return Decision("execute")


__all__ = [
    "NO_KEY",
    "OTHER_LAUNCH",
    "REPLAYED",
    "SHADOW",
    "Decision",
    "OwnedGang",
    "Verdict",
    "decide",
]
