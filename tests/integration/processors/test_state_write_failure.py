"""A state write that fails after the batch's verdicts were published: re-applied, never lost.

The failure is real: the worker's table writes raise (``RUNWATCH_FAULT_STATE_WRITES``, the
seam in `processors.app.StateWriteFaults`) where faust's changelog send raised on a fresh
deployment, after the verdicts of the batch went out and before any state was stored.
Either the retry in place writes them, or the worker stops without committing the batch
and the next worker applies it again; in both cases every record is applied exactly once
and the policy issues exactly one command.
"""

from __future__ import annotations

import pytest

from runwatch.cmd.audit import render
from runwatch.processors.app import STATE_WRITE_ATTEMPTS, StateWriteFaults
from runwatch.processors.audit import audit, load_run_log
from runwatch.processors.core.config import DetectorConfig, with_overrides
from runwatch.processors.fleet import latest_states
from runwatch.schemas.events import RestartRequested
from runwatch.schemas.topics import names

from .harness import Reader, Trainer, short, workers
from .test_resilience import _wait_states

pytestmark = pytest.mark.integration

SETS = ("rank_heartbeat_threshold=10", "hang_timeout_s=600", "dead_rank_timeout_s=600")
CFG = with_overrides(DetectorConfig(), dict(s.split("=") for s in SETS))
RUN = "write-fail"
STEPS, DEAD_AFTER = 40, 20


def _feed(bootstrap: str, prefix: str) -> None:
    trainer = Trainer(bootstrap, prefix, RUN, world_size=2)
    trainer.start(0)
    for s in range(1, STEPS + 1):
        trainer.step(s, silent=(1,) if s > DEAD_AFTER else ())
    trainer.close()


def _applied_exactly(views) -> bool:
    view = views.get(RUN)
    return (
        view is not None
        and view.steps is not None
        and view.steps.steps_observed == STEPS
        and view.liveness is not None
        and view.liveness.heartbeats == STEPS + DEAD_AFTER
        and view.policy is not None
        and view.policy.commands == 1
    )


def _check(bootstrap: str, prefix: str) -> None:
    views = latest_states(bootstrap, f"{prefix}-app")
    assert views[RUN].steps.steps_observed == STEPS  # not lost, not applied twice
    assert views[RUN].liveness.heartbeats == STEPS + DEAD_AFTER
    commands = Reader(bootstrap, names(prefix).commands)
    got = commands.wait_for(lambda ev: len(ev) >= 1)
    commands.close()
    # at-least-once: an identical copy is allowed, a second command is not
    assert {c.command_id for c in got if isinstance(c, RestartRequested)} == {got[0].command_id}
    assert short(got[0]) == ("respawn", 0)
    receipt = audit(load_run_log(bootstrap, prefix, RUN), CFG)
    assert receipt.agrees, render(receipt)


def test_a_failed_state_write_is_retried_in_place(
    kafka_bootstrap, topic_prefix, make_topics, tmp_path
):
    make_topics(topic_prefix, partitions=2)
    _feed(kafka_bootstrap, topic_prefix)
    with workers(kafka_bootstrap, topic_prefix, tmp_path, partitions=2, sets=SETS) as start:
        worker = start(env={StateWriteFaults.ENV: "2"})
        _wait_states(kafka_bootstrap, f"{topic_prefix}-app", _applied_exactly)
        _check(kafka_bootstrap, topic_prefix)
        log_text = worker.log_path.read_text(errors="replace")
    assert "injected state write failure" in log_text  # the fault did fire
    assert "attempt 1 of" in log_text
    assert "Crashed" not in log_text and "could not be applied whole" not in log_text


def test_a_state_write_that_keeps_failing_stops_the_worker_and_the_batch_is_applied_again(
    kafka_bootstrap, topic_prefix, make_topics, tmp_path
):
    make_topics(topic_prefix, partitions=2)
    _feed(kafka_bootstrap, topic_prefix)
    with workers(kafka_bootstrap, topic_prefix, tmp_path, partitions=2, sets=SETS) as start:
        # more failures than a batch's retries can absorb: the first batch written fails
        first = start(env={StateWriteFaults.ENV: str(1000 * STATE_WRITE_ATTEMPTS)})
        status = first.wait(180)
        log_text = first.log_path.read_text(errors="replace")
        assert status != 0, log_text[-3000:]
        assert "could not be applied whole" in log_text, log_text[-3000:]
        stored = latest_states(kafka_bootstrap, f"{topic_prefix}-app")
        assert not any(v.steps or v.liveness for v in stored.values()), stored
        start()
        _wait_states(kafka_bootstrap, f"{topic_prefix}-app", _applied_exactly)
        _check(kafka_bootstrap, topic_prefix)
