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

import time
from collections.abc import Callable
from typing import Any

import pytest

from runwatch import admin
from runwatch.cmd.audit import render
from runwatch.processors.audit import audit, load_run_log
from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.fleet import latest_states
from runwatch.processors.logread import partition_for
from runwatch.schemas.topics import DEFAULT_PARTITIONS

from .harness import WAIT_S, Trainer, workers

pytestmark = pytest.mark.integration

STEPS, KILL_BEFORE, SPIKE_AT = 30, 16, 24
EXACT = (STEPS, 2 * STEPS)  # (steps observed, heartbeats) of a 2-rank run


def _one_run_per_steps_partition() -> list[str]:
    """One run id per steps partition, so the dead worker surely held some of them."""
    count = DEFAULT_PARTITIONS["steps"]
    found: dict[int, str] = {}
    i = 0
    while len(found) < count:
        found.setdefault(partition_for(f"run-{i}", count), f"run-{i}")
        i += 1
    return [found[p] for p in sorted(found)]


def _members(bootstrap: str, app_id: str) -> int:
    """Members of the group once it is stable (-1 while it is not, or has no coordinator yet)."""
    from kafka.errors import KafkaError

    try:
        with admin.admin_client(bootstrap) as client:
            group = client.describe_groups([app_id])[app_id]
    except KafkaError:
        return -1
    state = group.get("group_state") or group.get("state")
    return len(group.get("members") or []) if state == "Stable" else -1


def _wait(what: str, probe: Callable[[], Any], done: Callable[[Any], bool]) -> Any:
    deadline = time.monotonic() + WAIT_S
    while True:
        value = probe()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last: {value}")
        time.sleep(0.5)  # polling the group and the changelogs, not synchronising on time


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
    runs = _one_run_per_steps_partition()
    with workers(kafka_bootstrap, topic_prefix, tmp_path, partitions=None) as start:
        victim, _survivor = start(), start()
        _wait("both workers in the group", lambda: _members(kafka_bootstrap, app_id), (2).__eq__)
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
            _wait("the survivor alone", lambda: _members(kafka_bootstrap, app_id), (1).__eq__)
            counts = _wait(
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
