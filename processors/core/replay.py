"""Replay: fold every reducer over a log, exactly as the live processors do.

Records come as ``(role, provenance, event)`` where the role names the topic
(``steps``, ``heartbeats``, ``checkpoints``, ``anomalies``, ``runs``). Records of one role
must be in partition order; how roles interleave does not matter, because each reducer
reads one role only. A Tick on the heartbeats role is fanned out to every run seen so far
in its partition, in run-id order (the live adapter must do the same, so that the verdicts
of one tick come out in the same order).

Commands come from the policy folded over the *recorded* anomalies log when the input has
anomaly records, in its order; otherwise over the recomputed anomalies in canonical order
(log time, then source topic, partition, offset, run and emission order), with synthetic
provenance on topic ``replay.anomalies`` (their ``source`` and ``seq`` therefore differ
from live commands, which point into the real anomalies topic).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Literal, TypeAlias

import msgspec

from processors.core.checkpoints import CheckpointCatalogue, fold_checkpoint
from processors.core.config import DetectorConfig, config_hash
from processors.core.liveness import LivenessState, fold_liveness
from processors.core.policy import PolicyState, fold_policy
from processors.core.steps import StepHealthState, fold_step
from schemas.events import (
    AnomalyDetected,
    CheckpointCommitted,
    CheckpointFailed,
    Heartbeat,
    InputEvent,
    Provenance,
    RestartRequested,
    RunEnded,
    RunStarted,
    StepCompleted,
    Tick,
)

Role = Literal["steps", "heartbeats", "checkpoints", "anomalies", "runs"]
ROLES: Final[tuple[str, ...]] = ("steps", "heartbeats", "checkpoints", "anomalies", "runs")
Record: TypeAlias = tuple[str, Provenance, InputEvent | AnomalyDetected]
SortKey: TypeAlias = tuple[int, str, int, int, str, int]
REPLAY_ANOMALIES_TOPIC: Final = "replay.anomalies"


class ReplayResult(msgspec.Struct, frozen=True):
    """Everything a replay recomputed.

    Attributes:
        anomalies: Verdicts of the step and liveness reducers, in canonical order.
        commands: Commands of the policy (see the module docstring for their input).
        steps: Final step-health state per run.
        liveness: Final liveness state per run.
        policy: Final policy state per run.
        checkpoints: Final checkpoint catalogue per run.
        config_hash: Hash of the configuration replayed with.
        policy_input: ``recorded`` or ``recomputed``: which anomalies the policy read.
    """

    anomalies: list[AnomalyDetected]
    commands: list[RestartRequested]
    steps: dict[str, StepHealthState]
    liveness: dict[str, LivenessState]
    policy: dict[str, PolicyState]
    checkpoints: dict[str, CheckpointCatalogue]
    config_hash: str
    policy_input: Literal["recorded", "recomputed"]


def _key(anomaly: AnomalyDetected, index: int) -> SortKey:
    src = anomaly.source or Provenance(topic="", partition=-1, offset=-1)
    return (anomaly.ts_ns, src.topic, src.partition, src.offset, anomaly.run_id, index)


class Replayer:
    """An incremental replay: feed records in batches, read the result at any point."""

    def __init__(self, cfg: DetectorConfig) -> None:
        """Start with no state.

        Args:
            cfg: The detector configuration.
        """
        self.cfg = cfg
        self.steps: dict[str, StepHealthState] = {}
        self.liveness: dict[str, LivenessState] = {}
        self.policy: dict[str, PolicyState] = {}
        self.checkpoints: dict[str, CheckpointCatalogue] = {}
        self.partition_runs: dict[int, set[str]] = {}
        self.recomputed: list[tuple[SortKey, AnomalyDetected]] = []
        self.commands: list[RestartRequested] = []
        self.recorded_anomalies = 0

    def _collect(self, verdicts: list[AnomalyDetected]) -> None:
        for i, v in enumerate(verdicts):
            self.recomputed.append((_key(v, i), v))

    def _heartbeats(self, source: Provenance, event: InputEvent) -> None:
        if isinstance(event, Tick):
            for run_id in sorted(self.partition_runs.get(source.partition, ())):
                known = self.liveness.get(run_id)
                if known is None:  # listed by a caller but never seen: nothing to age
                    continue
                state, verdicts = fold_liveness(known, event, source, self.cfg)
                self.liveness[run_id] = state
                self._collect(verdicts)
            return
        if not isinstance(event, (Heartbeat, RunStarted, RunEnded)):
            return
        self.partition_runs.setdefault(source.partition, set()).add(event.run_id)
        state, verdicts = fold_liveness(self.liveness.get(event.run_id), event, source, self.cfg)
        self.liveness[event.run_id] = state
        self._collect(verdicts)

    def _anomaly(self, source: Provenance, anomaly: AnomalyDetected) -> None:
        self.recorded_anomalies += 1
        state, commands = fold_policy(self.policy.get(anomaly.run_id), anomaly, source, self.cfg)
        self.policy[anomaly.run_id] = state
        self.commands.extend(commands)

    def feed(self, records: Iterable[Record]) -> Replayer:
        """Apply records (each role in partition order).

        Args:
            records: ``(role, provenance, event)`` triples.

        Returns:
            This replayer.

        Raises:
            ValueError: An unknown role.
        """
        for role, source, event in records:
            if role == "steps":
                if isinstance(event, (StepCompleted, RunStarted, RunEnded)):
                    state, verdicts = fold_step(
                        self.steps.get(event.run_id), event, source, self.cfg
                    )
                    self.steps[event.run_id] = state
                    self._collect(verdicts)
            elif role == "heartbeats":
                if not isinstance(event, AnomalyDetected):
                    self._heartbeats(source, event)
            elif role == "checkpoints":
                if isinstance(event, (CheckpointCommitted, CheckpointFailed, RunStarted, RunEnded)):
                    self.checkpoints[event.run_id] = fold_checkpoint(
                        self.checkpoints.get(event.run_id), event, source
                    )
            elif role == "anomalies":
                if isinstance(event, AnomalyDetected):
                    self._anomaly(source, event)
            elif role != "runs":
                raise ValueError(f"unknown topic role {role!r}; valid: {', '.join(ROLES)}")
        return self

    def canonical_anomalies(self) -> list[AnomalyDetected]:
        """The recomputed verdicts in canonical order."""
        return [v for _, v in sorted(self.recomputed, key=lambda kv: kv[0])]

    def result(self) -> ReplayResult:
        """What the records fed so far produce."""
        anomalies = self.canonical_anomalies()
        if self.recorded_anomalies:
            commands, policy = list(self.commands), dict(self.policy)
            policy_input: Literal["recorded", "recomputed"] = "recorded"
        else:
            commands, policy = policy_over(anomalies, self.cfg)
            policy_input = "recomputed"
        return ReplayResult(
            anomalies=anomalies,
            commands=commands,
            steps=dict(self.steps),
            liveness=dict(self.liveness),
            policy=policy,
            checkpoints=dict(self.checkpoints),
            config_hash=config_hash(self.cfg),
            policy_input=policy_input,
        )


def policy_over(
    anomalies: Iterable[AnomalyDetected], cfg: DetectorConfig
) -> tuple[list[RestartRequested], dict[str, PolicyState]]:
    """Fold the policy over anomalies given in order, with synthetic provenance.

    Args:
        anomalies: Verdicts in the order the policy should see them.
        cfg: The configuration.

    Returns:
        The commands and the final policy state per run.
    """
    states: dict[str, PolicyState] = {}
    commands: list[RestartRequested] = []
    offsets: dict[int, int] = {}
    for anomaly in anomalies:
        partition = anomaly.source.partition if anomaly.source is not None else 0
        offset = offsets.get(partition, 0)
        offsets[partition] = offset + 1
        source = Provenance(topic=REPLAY_ANOMALIES_TOPIC, partition=partition, offset=offset)
        state, new = fold_policy(states.get(anomaly.run_id), anomaly, source, cfg)
        states[anomaly.run_id] = state
        commands.extend(new)
    return commands, states


def replay(records: Iterable[Record], cfg: DetectorConfig) -> ReplayResult:
    """Fold every reducer over a log.

    Args:
        records: ``(role, provenance, event)``, each role in partition order.
        cfg: The detector configuration.

    Returns:
        Anomalies, commands and final states.
    """
    return Replayer(cfg).feed(records).result()


__all__ = [
    "REPLAY_ANOMALIES_TOPIC",
    "ROLES",
    "Record",
    "ReplayResult",
    "Replayer",
    "Role",
    "policy_over",
    "replay",
]
