"""Two workers of a new app id, one SIGKILLed mid-stream: the survivor takes over with the states.

The survivor must recover the dead worker's tables from their changelogs before it folds
the partitions it took over. On a new app id it once recovered nothing: faust declared the
changelog topics after its consumer's first metadata fetch, the group leader's metadata
(refreshed every five minutes) did not have the newest changelog, faust's assignor ignored
it, and the survivor folded the dead worker's runs on from empty states. Every such run's
heartbeat count began again at the dead worker's last commit (49-68 of 80 here, two runs of
two; the compose stack's takeover timed out on it in CI). The counts must be exact, and
every audit must agree.
"""

from __future__ import annotations

from typing import Any

import pytest

from runwatch.cmd.audit import render
from runwatch.processors.audit import audit, load_run_log
from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.fleet import latest_states
from runwatch.schemas.topics import DEFAULT_PARTITIONS

from .harness import Trainer, group_members, one_run_per_partition, wait_until, workers

pytestmark = pytest.mark.integration

STEPS, KILL_BEFORE, SPIKE_AT = 30, 16, 24
EXACT = (STEPS, 2 * STEPS)  # (steps observed, heartbeats) of a 2-rank run


def _counts(bootstrap: str, app_id: str, runs: list[str]) -> dict[str, tuple[Any, Any]]:
    views = latest_states(bootstrap, app_id)
    return {
        r: (
            views[r].steps.steps_observed if r in views and views[r].steps else None,
            views[r].liveness.heartbeats if r in views and views[r].liveness else None,
        )
        for r in runs
    }


def test_the_survivor_recovers_the_dead_workers_states(
    kafka_bootstrap, topic_prefix, make_topics, tmp_path
):
    make_topics(topic_prefix)  # the catalogue's counts, as a deployment's
    app_id = f"{topic_prefix}-app"  # new: its changelogs do not exist yet
    runs = one_run_per_partition(DEFAULT_PARTITIONS["steps"])  # the dead one held some
    with workers(kafka_bootstrap, topic_prefix, tmp_path, partitions=None) as start:
        victim, _survivor = start(), start()
        wait_until(
            "both workers in the group", lambda: group_members(kafka_bootstrap, app_id), (2).__eq__
        )
        trainers = {
            r: Trainer(kafka_bootstrap, topic_prefix, r, seed=i) for i, r in enumerate(runs)
        }
        try:
            for t in trainers.values():
                t.start(0)
            for step in range(1, STEPS + 1):
                if step == KILL_BEFORE:
                    victim.kill()
                for t in trainers.values():
                    t.step(step, loss=9.0 if step == SPIKE_AT else None, flush=False)
                for t in trainers.values():
                    t.flush()
            wait_until(
                "the survivor alone", lambda: group_members(kafka_bootstrap, app_id), (1).__eq__
            )
            counts = wait_until(
                "every step and heartbeat applied once",
                lambda: _counts(kafka_bootstrap, app_id, runs),
                lambda c: all(v == EXACT for v in c.values()),
            )
        finally:
            for t in trainers.values():
                t.close()
    assert set(counts.values()) == {EXACT}
    for run in runs:
        receipt = audit(load_run_log(kafka_bootstrap, topic_prefix, run), DetectorConfig())
        assert receipt.agrees, (run, render(receipt))
