"""The audit: re-derive a run's verdicts from its input log and compare with the record.

``load_run_log`` reads the run's records from the beginning of every topic (all
partitions, filtered by key, so a run is found wherever its history lies), plus the
clock's ticks in the heartbeat partitions the run used. ``audit`` folds the input through
the same reducers the live processors run and compares:

* anomalies: recomputed from steps and heartbeats vs. the anomalies topic;
* commands: the policy folded over the *recorded* anomalies log (its order is part of
  the log) vs. the commands topic, signatures aside.

``what_if`` answers "what would other thresholds have flagged" without writing anywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from processors.core.config import DetectorConfig, config_hash
from processors.core.replay import Record, ReplayResult, replay
from processors.intake import RawRecord, split
from processors.logread import read_history
from processors.verdict_diff import Comparison, compare_anomalies, compare_commands
from schemas.codec import encode_key
from schemas.events import TICK_RUN_ID, AnomalyDetected, RestartRequested, Tick
from schemas.topics import TopicNames, names

INPUT_ROLES: tuple[str, ...] = ("steps", "heartbeats", "checkpoints")


class RunLog(msgspec.Struct, frozen=True, kw_only=True):
    """One run's history as read from the topics.

    Attributes:
        run_id: The run.
        inputs: Input records (steps, heartbeats with ticks, checkpoints), each role in
            partition order.
        recorded_anomalies: Records of the anomalies topic, in order.
        recorded_commands: Commands from the commands topic, in order.
        dead_letters: Records of the run that failed to decode (kept out of the replay,
            as the live processors kept them out).
    """

    run_id: str
    inputs: list[Record]
    recorded_anomalies: list[Record]
    recorded_commands: list[RestartRequested]
    dead_letters: int = 0


class AuditReceipt(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of an audit.

    Attributes:
        run_id: The run.
        config_hash: Hash of the configuration the audit replayed with.
        recorded_config_hashes: Hashes found on the recorded verdicts.
        input_records: Input records replayed.
        anomalies: Recorded vs. recomputed anomalies.
        commands: Recorded vs. recomputed commands.
        dead_letters: Records of the run that failed to decode, fold or encode.
    """

    run_id: str
    config_hash: str
    recorded_config_hashes: tuple[str, ...]
    input_records: int
    anomalies: Comparison
    commands: Comparison
    dead_letters: int

    @property
    def agrees(self) -> bool:
        """True when every verdict and command is reproduced exactly."""
        return self.anomalies.agrees and self.commands.agrees


def records_of_run(
    run_id: str, history: Mapping[str, Sequence[RawRecord]], topics: TopicNames
) -> RunLog:
    """Pick one run's records (and the ticks of its heartbeat partitions) from raw history.

    Args:
        run_id: The run.
        history: Raw records by topic name, each partition in offset order.
        topics: The topic names of the deployment.

    Returns:
        The run's log, decoded.
    """
    key = encode_key(run_id)
    role_topic = {
        "steps": topics.steps,
        "heartbeats": topics.heartbeats,
        "checkpoints": topics.checkpoints,
        "anomalies": topics.anomalies,
        "commands": topics.commands,
    }
    hb_partitions = {r.partition for r in history.get(topics.heartbeats, ()) if r.key == key}
    inputs: list[Record] = []
    anomalies: list[Record] = []
    commands: list[RestartRequested] = []
    dead = 0
    for role, topic in role_topic.items():
        raw = [
            r
            for r in history.get(topic, ())
            if r.key == key or (role == "heartbeats" and r.partition in hb_partitions)
        ]
        good, bad = split(raw, role)
        dead += sum(1 for d in bad if d.key == key)
        for source, event in good:
            if isinstance(event, Tick):
                if event.run_id == TICK_RUN_ID:
                    inputs.append((role, source, event))
            elif event.run_id != run_id:
                continue
            elif role == "anomalies" and isinstance(event, AnomalyDetected):
                anomalies.append((role, source, event))
            elif role == "commands" and isinstance(event, RestartRequested):
                commands.append(event)
            elif role in INPUT_ROLES:
                inputs.append((role, source, event))  # type: ignore[arg-type]
    return RunLog(
        run_id=run_id,
        inputs=inputs,
        recorded_anomalies=anomalies,
        recorded_commands=commands,
        dead_letters=dead,
    )


def load_run_log(bootstrap: str, prefix: str, run_id: str, *, timeout_s: float = 60.0) -> RunLog:
    """Read one run's history from a live cluster."""
    topics = names(prefix)
    wanted = {encode_key(run_id), TICK_RUN_ID.encode()}
    history = read_history(
        bootstrap,
        [topics.steps, topics.heartbeats, topics.checkpoints, topics.anomalies, topics.commands],
        key_filter=lambda k: k in wanted,
        timeout_s=timeout_s,
    )
    return records_of_run(run_id, history, topics)


def audit(log: RunLog, cfg: DetectorConfig) -> AuditReceipt:
    """Replay a run's log and compare the result with what was recorded."""
    result: ReplayResult = replay([*log.inputs, *log.recorded_anomalies], cfg)
    recorded = [e for _, _, e in log.recorded_anomalies if isinstance(e, AnomalyDetected)]
    mine = [a for a in result.anomalies if a.run_id == log.run_id]
    hashes = sorted({a.config_hash for a in recorded})
    return AuditReceipt(
        run_id=log.run_id,
        config_hash=config_hash(cfg),
        recorded_config_hashes=tuple(hashes),
        input_records=len(log.inputs),
        anomalies=compare_anomalies(recorded, mine),
        commands=compare_commands(
            log.recorded_commands, [c for c in result.commands if c.run_id == log.run_id]
        ),
        # decode failures of the log plus the records the replay's fold or state encoding
        # dead-lettered, as the live processors did
        dead_letters=log.dead_letters
        + sum(1 for d in result.dead_letters if d.run_id == log.run_id),
    )


def what_if(log: RunLog, cfg: DetectorConfig) -> ReplayResult:
    """Replay a run's input with ``cfg``; the policy reads the recomputed anomalies."""
    return replay(log.inputs, cfg)
