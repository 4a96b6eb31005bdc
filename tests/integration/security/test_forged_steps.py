"""Finding 1, the command side, as the attacker writes it: a trainer credential, raw records.

On the secure session broker (SASL/SCRAM, ACLs from the roles' table), a real
``runwatch processors`` worker judges a victim run whose gang (two `RunEmitter`s with the
trainer credential, launch ``victim-launch``) trained 20 healthy steps and committed
checkpoints 10 and 20. An attacker holding the same trainer credential, with plain
kafka-python and no runwatch code:

* produces the issue's forged ``anomaly.v1``: refused by Kafka (no Write on anomalies);
* produces five forged ``step.v1`` records for the victim, steps 21-25 with a NaN loss.

The trainer role may write steps, so those are read like the gang's own, and the question
is what they buy. The answer, written down here and asserted: **exactly what the
processors' own detection gives for such steps, and no more** -- the verdicts that the
pure core (`processors.core`, the same code) gives for the same steps topic, which is one
``nonfinite_loss`` at step 21, and the policy's one command per (run, incarnation): a
``rollback`` to a checkpoint at or before step 20, signed and bound to the victim's launch
(``victim-launch``, from its RunStarted). Executed, that rollback SIGKILLs the gang and
resumes from checkpoint 20 with nothing deleted (checkpoints past 20 are moved aside:
docs/controller.md). ``runwatch audit`` (the sinks' credential) reproduces every verdict.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
from kafka import KafkaProducer
from kafka.errors import TopicAuthorizationFailedError

from runwatch.processors.core.config import DetectorConfig, with_overrides
from runwatch.processors.core.policy import fold_policy
from runwatch.processors.core.steps import fold_step
from runwatch.producers import RunEmitter
from runwatch.schemas.events import (
    AnomalyDetected,
    Event,
    Provenance,
    RestartRequested,
    RunStarted,
    StepCompleted,
)
from runwatch.schemas.signing import CommandKey, verify
from runwatch.schemas.topics import names
from tests.integration.processors.harness import COMMAND_KEY, workers

from .conftest import SecureKafka, SecureReader
from .test_secure_run import _as, _audit

pytestmark = pytest.mark.integration

RUN, LAUNCH = "victim", "victim-launch"
SETS = ("hang_timeout_s=3", "dead_rank_timeout_s=3")  # test_secure_run's, for its _audit
QUIET = {"hang_timeout_s": 600.0, "dead_rank_timeout_s": 600.0}
"""The victim's own thresholds: its gang going quiet after step 20 is no verdict."""
GOOD, FORGED = range(1, 21), range(21, 26)


def _loss(step: int) -> float:
    return 4.0 - 0.01 * step + 0.02 * math.sin(step)


def _victim(kafka: SecureKafka, prefix: str) -> None:
    gang = [
        RunEmitter(
            RUN,
            bootstrap=kafka.bootstrap,
            topic_prefix=prefix,
            rank=rank,
            world_size=2,
            incarnation=0,
            client_config=kafka.config("trainer"),
            launch_id=LAUNCH,
        )
        for rank in range(2)
    ]
    try:
        gang[0].run_started(vocab_size=256, peak_flops_per_s=1e12, thresholds=QUIET)
        for step in GOOD:
            gang[0].step(step, loss=_loss(step), step_time_s=0.05, grad_norm=1.0, tokens=4096)
            for emitter in gang:
                emitter.heartbeat(step, step_time_s=0.05)
            if step % 10 == 0:
                gang[0].checkpoint_committed(step, f"/ckpt/step_{step}")
        for emitter in gang:
            assert emitter.flush(30.0), "the victim's events were not delivered"
    finally:
        for emitter in gang:
            emitter.close(30.0)


def _attack(kafka: SecureKafka, prefix: str) -> None:
    producer = KafkaProducer(
        bootstrap_servers=kafka.bootstrap,
        max_block_ms=10_000,
        request_timeout_ms=10_000,
        **kafka.config("trainer"),
    )
    try:
        verdict = {"type": "anomaly.v1", "run_id": RUN, "verdict_id": "f"}
        verdict |= {"kind": "nonfinite_loss", "step": 1, "incarnation": 0}
        with pytest.raises(TopicAuthorizationFailedError):
            producer.send(
                f"{prefix}.anomalies", key=RUN.encode(), value=json.dumps(verdict).encode()
            ).get(15)
        for step in FORGED:
            record = {"type": "step.v1", "run_id": RUN, "ts_ns": time.time_ns(), "step": step}
            record |= {"loss": "NaN", "step_time_s": 0.05}
            producer.send(
                f"{prefix}.steps", key=RUN.encode(), value=json.dumps(record).encode()
            ).get(15)
    finally:
        producer.close(timeout=5)


def _read(kafka: SecureKafka, topic: str, until: int) -> list[Event]:
    """The victim's events on ``topic``, read as the sinks until ``until`` of them arrived."""
    reader = SecureReader(kafka, "sinks", topic)
    try:
        events = reader.wait_for(lambda ev: sum(e.run_id == RUN for e in ev) >= until)
    finally:
        reader.close()
    return [e for e in events if e.run_id == RUN]


def _what_the_core_gives(
    steps_topic: list[Event],
) -> tuple[list[AnomalyDetected], list[RestartRequested]]:
    """The verdicts and commands of the pure core for the victim's steps topic, in order."""
    cfg = with_overrides(DetectorConfig(), dict(s.split("=", 1) for s in SETS))
    state, policy, verdicts, commands = None, None, [], []
    for offset, event in enumerate(steps_topic):
        assert isinstance(event, RunStarted | StepCompleted)
        state, out = fold_step(state, event, Provenance(topic="s", partition=0, offset=offset), cfg)
        for verdict in out:
            verdicts.append(verdict)
            source = Provenance(topic="a", partition=0, offset=len(verdicts))
            policy, made = fold_policy(policy, verdict, source, cfg)
            commands += made
    return verdicts, commands


def test_a_trainers_forged_nan_steps_buy_what_the_detection_gives_and_no_forged_verdict(
    secure_kafka: SecureKafka, secure_prefix: str, tmp_path: Path
) -> None:
    prefix = secure_prefix
    scope = secure_kafka.grant(prefix, f"{prefix}-app")
    topics = names(prefix)
    with workers(secure_kafka.bootstrap, prefix, tmp_path, partitions=2, sets=SETS) as start:
        start(env=_as(secure_kafka, "processors"))
        _victim(secure_kafka, prefix)
        _attack(secure_kafka, prefix)
        steps_topic = _read(secure_kafka, topics.steps, 1 + len(GOOD) + len(FORGED))
        expected, expected_commands = _what_the_core_gives(steps_topic)
        assert [(v.kind, v.step, v.launch_id) for v in expected] == [("nonfinite_loss", 21, LAUNCH)]
        assert [(c.action, c.max_checkpoint_step, c.launch_id) for c in expected_commands] == [
            ("rollback", 20, LAUNCH)
        ]
        # The live processors: their command, then `runwatch audit` waits for them to have
        # consumed the whole log and replays it: every live verdict, no more and no fewer.
        commands = _read(secure_kafka, topics.commands, len(expected_commands))
        audit = _audit(secure_kafka, prefix, scope.app_id, RUN)
        assert audit.returncode == 0, audit.stdout + audit.stderr
        assert "verdict: every verdict reproduced" in audit.stdout, audit.stdout
        assert "anomalies: 1 matched, 0 missing, 0 unexpected" in audit.stdout, audit.stdout
        anomalies = _read(secure_kafka, topics.anomalies, len(expected))
    assert all(isinstance(a, AnomalyDetected) for a in anomalies)
    assert [(a.kind, a.step, a.launch_id) for a in anomalies] == [
        (v.kind, v.step, v.launch_id) for v in expected
    ]
    assert {a.verdict_id for a in anomalies} == {v.verdict_id for v in expected}
    assert "f" not in {a.verdict_id for a in anomalies}  # the forged verdict is not there
    (command,) = commands
    assert isinstance(command, RestartRequested)
    key = CommandKey.from_secret(COMMAND_KEY.encode())
    verify(command, {key.key_id: key})  # the processors signed it
    (want,) = expected_commands
    assert (command.action, command.max_checkpoint_step, command.incarnation) == (
        want.action,
        want.max_checkpoint_step,
        want.incarnation,
    )
    assert command.launch_id == LAUNCH and command.command_id == want.command_id
