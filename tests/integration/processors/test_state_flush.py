"""The batch path's flush on a graceful stop: the last rounds' states written, their offsets
committed, so the worker that takes over folds nothing again.

States are written by a flush every ``--state-flush-interval``. With it set to an hour,
nothing but the stop can flush the rounds of this test (one worker: no rebalance), so the
stop's flush is what is measured: without it the states of every record would be lost
with the process and the next worker would fold the whole log again (and publish its
verdicts a second time).
"""

from __future__ import annotations

import pytest

from runwatch.processors.fleet import latest_states, wait_until_processed
from runwatch.schemas.topics import names

from .harness import Reader, Trainer, workers

pytestmark = pytest.mark.integration

SETS = ("rank_heartbeat_threshold=10", "hang_timeout_s=600", "dead_rank_timeout_s=600")
RUN, WORLD, STEPS, SPIKE = "flush-at-stop", 2, 60, 50


def test_a_graceful_stop_writes_the_last_rounds_states_and_commits_them(
    kafka_bootstrap, topic_prefix, make_topics, tmp_path
):
    make_topics(topic_prefix, partitions=2)
    topics = names(topic_prefix)
    app_id = f"{topic_prefix}-app"
    with workers(kafka_bootstrap, topic_prefix, tmp_path, partitions=2, sets=SETS) as start:
        worker = start(extra=["--state-flush-interval", "3600"])
        trainer = Trainer(kafka_bootstrap, topic_prefix, RUN, world_size=WORLD)
        trainer.start(0)
        for s in range(1, STEPS + 1):
            trainer.step(s, loss=9.0 if s == SPIKE else None)
        trainer.close()
        anomalies = Reader(kafka_bootstrap, topics.anomalies)
        verdicts = anomalies.wait_for(
            lambda ev: any(getattr(e, "kind", None) == "loss_spike" for e in ev)
        )
        anomalies.close()
        assert [e.step for e in verdicts if getattr(e, "kind", None) == "loss_spike"] == [SPIKE]
        status = worker.stop()
        log_text = worker.log_path.read_text(errors="replace")
    assert status == 0, log_text[-3000:]
    assert "stopping: the last rounds' states written" in log_text, log_text[-3000:]
    view = latest_states(kafka_bootstrap, app_id)[RUN]
    assert view.steps is not None and view.steps.steps_observed == STEPS
    assert view.liveness is not None and view.liveness.heartbeats == WORLD * STEPS
    # Every input offset committed (the worker is gone: the commits can only be its stop's).
    wait_until_processed(kafka_bootstrap, app_id, [topics.steps, topics.heartbeats], timeout_s=5)
