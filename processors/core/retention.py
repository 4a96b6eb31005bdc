"""How long the processors keep a run's state, and how many runs a partition may hold.

A fleet sees many runs; each keeps a state per folded topic (steps, liveness, checkpoints,
policy). Kept forever, 100,000 run ids from one trainer credential grew a worker from 91 to
833 MiB (issue 19, finding 10). Two bounds, both decided from the log alone, so live,
audit and replay keep and drop the same states:

**Retention.** A run's state of any kind is evicted, in log time, once (`run_expired`):

1. the run ended (RunEnded) more than `ENDED_RETENTION_NS` ago;
2. it never announced itself (no RunStarted: a typo, a test, a script, a flood) and nothing
   of it arrived for `STRAY_RETENTION_NS`;
3. nothing of it arrived for `SILENT_RETENTION_NS` (by then its hang verdict is days old).

The policy reads the anomalies topic alone and never sees a RunEnded or a RunStarted: its
state goes `POLICY_RETENTION_NS` (a day) after the run's last anomaly. Its memory matters
while a gang fails and restarts (minutes apart); what it forgets after a quiet day is
harmless: a verdict replayed into a fresh state makes the same command id, which the
controller refuses as replayed, and a command for an incarnation that is not the gang's
current one is refused as stale (`controller.command_gate`, rules 7 and 8). The restart
budget starts over, as after a day without failures it should.

"Now" is the log time of the partition: a Tick for liveness (the clock writes one into
every heartbeat partition); for steps, checkpoints and the policy, whose topics carry no
Ticks, the time of every `SWEEP_EVERY_RECORDS`-th record of the partition (`sweep_due`:
offsets are the log's, so live and replay sweep at the same records). A partition that
receives nothing is not swept, and holds no more than it did.

**A cap per partition.** A record of a run with no state in a partition that already holds
`MAX_RUNS_PER_PARTITION` states of its kind is refused (`check_admission`): a dead letter
saying so, the run's other records still in their topics. Runs that hold a state are never
evicted to make room, so a credential flooding new run ids cannot push out real runs;
what it can do is keep *new* runs out of a full partition until its strays expire (rule
2, an hour after the flood stops). docs/security.md has the reasoning.

Eviction deletes the state from the processors' table (a tombstone in its changelog, so a
restarted worker does not load it back); the records stay in their topics, so the audit
still replays the run, and a later record of the run starts a fresh state, as for a run
never seen.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from runwatch.processors.core.bounds import BoundError
from runwatch.processors.core.checkpoints import CheckpointCatalogue
from runwatch.processors.core.liveness_state import LivenessState
from runwatch.processors.core.policy import PolicyState
from runwatch.processors.core.step_state import StepHealthState
from runwatch.schemas.events import Provenance
from runwatch.schemas.topics import StateKind

HOUR_NS: Final = 3600 * 1_000_000_000
ENDED_RETENTION_NS: Final = 24 * HOUR_NS
"""How long an ended run's state is kept after its end (a day of log time: the web view and
the sinks show it that long)."""
STRAY_RETENTION_NS: Final = HOUR_NS
"""How long a run that never sent a RunStarted is kept with nothing of it arriving."""
SILENT_RETENTION_NS: Final = 7 * 24 * HOUR_NS
"""How long a live run's state is kept with nothing of it arriving (a week)."""
POLICY_RETENTION_NS: Final = ENDED_RETENTION_NS
"""How long a policy state is kept after the run's last anomaly (module docstring)."""
SWEEP_EVERY_RECORDS: Final = 1024
"""A steps, checkpoints or anomalies partition is swept at each record whose offset is a
multiple of this: a sweep reads every state of the partition, so this many records pay
for one."""
MAX_RUNS_PER_PARTITION: Final = 2048
"""States of one kind one partition may hold. With the catalogue's partitions: 32,768 runs
in steps, 131,072 in heartbeats, 16,384 in checkpoints and anomalies, ended runs of the
last day included (more partitions, more runs)."""


class PartitionFull(BoundError):
    """A new run's record in a partition that holds `MAX_RUNS_PER_PARTITION` states."""


def run_expired(*, ended: bool, announced: bool, last_ns: int, now_ns: int) -> bool:
    """Whether a run's state is past its retention at log time ``now_ns``.

    Args:
        ended: The run's latest run marker is a RunEnded.
        announced: A RunStarted of the run was seen.
        last_ns: Log time of the newest record of the run the state holds.
        now_ns: The partition's log time.

    Rules, in order:
        1. An ended run expires `ENDED_RETENTION_NS` after its last record (its end).
        2. A run never announced expires `STRAY_RETENTION_NS` after its last record.
        3. Any run expires `SILENT_RETENTION_NS` after its last record.
        4. Otherwise it is kept.
    """
    silent_ns = now_ns - last_ns
    if ended:  # rule 1
        return silent_ns > ENDED_RETENTION_NS
    return silent_ns > live_retention_ns(announced=announced)  # rules 2, 3 and 4


def live_retention_ns(*, announced: bool) -> int:
    """How long a running run's state is kept with nothing of it arriving (rules 2 and 3).

    `liveness_expired` of a live state at ``now_ns`` is ``now_ns - max(last_heartbeat_ns,
    started_ns)`` above this, ``announced`` being a RunStarted's world size (the heartbeat
    pack path, `processors.core.liveness_pack`, checks it so per event).
    """
    return SILENT_RETENTION_NS if announced else STRAY_RETENTION_NS


def liveness_expired(state: LivenessState, now_ns: int) -> bool:
    """`run_expired` for a liveness state.

    Its end is its last log time, its last sign of life its newest RunStarted or heartbeat;
    a RunStarted's world size says it was announced.
    """
    if not state.live:
        return run_expired(ended=True, announced=True, last_ns=state.log_time_ns, now_ns=now_ns)
    last_ns = max(state.last_heartbeat_ns, state.started_ns)
    announced = state.expected_ranks > 0
    return run_expired(ended=False, announced=announced, last_ns=last_ns, now_ns=now_ns)


def steps_expired(state: StepHealthState, now_ns: int) -> bool:
    """`run_expired` for a step-health state (announced: a RunStarted's world size)."""
    info = state.info
    return run_expired(
        ended=info.status != "running",
        announced=info.world_size > 0,
        last_ns=state.last_ts_ns,
        now_ns=now_ns,
    )


def checkpoints_expired(state: CheckpointCatalogue, now_ns: int) -> bool:
    """`run_expired` for a checkpoint catalogue."""
    return run_expired(
        ended=state.ended, announced=state.announced, last_ns=state.last_ts_ns, now_ns=now_ns
    )


def policy_expired(state: PolicyState, now_ns: int) -> bool:
    """Whether a policy state is `POLICY_RETENTION_NS` past its last anomaly."""
    return now_ns - state.last_ts_ns > POLICY_RETENTION_NS


EXPIRED: Final[dict[StateKind, Callable[[Any, int], bool]]] = {
    StateKind.STEPS: steps_expired,
    StateKind.LIVENESS: liveness_expired,
    StateKind.CHECKPOINTS: checkpoints_expired,
    StateKind.POLICY: policy_expired,
}
"""State kind -> whether a state of that kind is past its retention at a log time."""


def sweep_due(source: Provenance) -> bool:
    """Whether the record at ``source`` sweeps its partition (a pack: its first event)."""
    return source.offset % SWEEP_EVERY_RECORDS == 0 and source.index <= 0


def check_admission(held: int, run_id: str, partition: int) -> None:
    """Refuse a new run's state in a partition that holds ``held`` states of its kind.

    Raises:
        PartitionFull: ``held`` is `MAX_RUNS_PER_PARTITION` or more.
    """
    if held >= MAX_RUNS_PER_PARTITION:
        raise PartitionFull(
            f"partition {partition} holds {held} run states (the cap, "
            f"processors.core.retention.MAX_RUNS_PER_PARTITION); new run {run_id[:64]!r} "
            f"refused until states expire"
        )


__all__ = [
    "ENDED_RETENTION_NS",
    "EXPIRED",
    "HOUR_NS",
    "MAX_RUNS_PER_PARTITION",
    "POLICY_RETENTION_NS",
    "SILENT_RETENTION_NS",
    "STRAY_RETENTION_NS",
    "SWEEP_EVERY_RECORDS",
    "PartitionFull",
    "check_admission",
    "checkpoints_expired",
    "live_retention_ns",
    "liveness_expired",
    "policy_expired",
    "run_expired",
    "steps_expired",
    "sweep_due",
]
