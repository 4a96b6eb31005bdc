"""A scripted run with every fault, through real workers; the audit must agree."""

from __future__ import annotations

import pytest

from runwatch.processors.audit import audit, load_run_log
from runwatch.processors.core.config import DetectorConfig, with_overrides
from runwatch.schemas.events import AnomalyDetected, RestartRequested
from runwatch.schemas.signing import CommandKey, verify
from runwatch.schemas.topics import names

from .harness import COMMAND_KEY, Reader, Trainer, short, workers

pytestmark = pytest.mark.integration

SETS = ("hang_timeout_s=3", "rank_heartbeat_threshold=10", "dead_rank_timeout_s=600")


def _commands(events):
    return [e for e in events if isinstance(e, RestartRequested)]


def test_every_fault_is_found_once_and_the_audit_agrees(
    kafka_bootstrap, topic_prefix, make_topics, tmp_path
):
    make_topics(topic_prefix, partitions=2)
    topics = names(topic_prefix)
    run = "run-e2e"
    anomalies = Reader(kafka_bootstrap, topics.anomalies)
    commands = Reader(kafka_bootstrap, topics.commands)
    trainer = Trainer(kafka_bootstrap, topic_prefix, run)
    with workers(kafka_bootstrap, topic_prefix, tmp_path, partitions=2, sets=SETS) as start:
        start()
        # incarnation 0: a loss spike at 30, rank 1 dies after step 40 -> respawn
        trainer.start(0)
        for s in range(1, 53):
            trainer.step(s, loss=9.0 if s == 30 else None, silent=(1,) if s > 40 else ())
            if s % 10 == 0:
                trainer.checkpoint(s)
        trainer.end()
        commands.wait_for(lambda ev: len(ev) >= 1)
        # incarnation 1: a good resume from 40, a NaN at 58 -> rollback to <= 57
        trainer.start(1)
        for s in range(41, 59):
            trainer.step(
                s, loss=float("nan") if s == 58 else None, restart_from=40 if s == 41 else None
            )
            if s % 10 == 0:
                trainer.checkpoint(s)
        trainer.end()
        commands.wait_for(lambda ev: len(ev) >= 2)
        # incarnation 2: a resume from 50 that lost optimizer state (loss jumps), then silence
        trainer.start(2)
        for s in range(51, 61):
            trainer.step(
                s, loss=trainer.healthy_loss(s) + 1.0, restart_from=50 if s == 51 else None
            )
        trainer.flush()
        commands.wait_for(lambda ev: len(ev) >= 3)
        trainer.close()

    got = sorted(short(e) for e in anomalies.wait_for(lambda ev: len(ev) >= 5))
    assert got == sorted(
        [
            ("loss_spike", 30, 0),
            ("dead_rank", 51, 1, 0),
            ("nonfinite_loss", 58, 1),
            # judged against the baseline's level at step 50: the +1 nat jump is caught at once
            ("restart_discontinuity", 51, 2),
            ("hang", 60, 2),
        ]
    )
    cmds = _commands(commands.events)
    assert [(c.action, c.cause_kind, c.incarnation, c.max_checkpoint_step) for c in cmds] == [
        ("respawn", "dead_rank", 0, None),
        ("rollback", "nonfinite_loss", 1, 57),
        ("respawn", "hang", 2, None),
    ]
    key = CommandKey.from_secret(COMMAND_KEY.encode())
    for c in cmds:
        verify(c, {key.key_id: key})

    cfg = with_overrides(DetectorConfig(), dict(s.split("=") for s in SETS))
    receipt = audit(load_run_log(kafka_bootstrap, topic_prefix, run), cfg)
    assert receipt.agrees, receipt
    assert len(receipt.anomalies.matched) == 5 and len(receipt.commands.matched) == 3
    assert all(isinstance(a, AnomalyDetected) and a.source is not None for a in anomalies.events)
    anomalies.close()
    commands.close()
