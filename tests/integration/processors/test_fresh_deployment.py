"""A brand-new deployment: own broker data dir, new topics, new app id, first worker start.

The suite's session broker and app ids are warm after the first test, which hid a bug: a
worker that folded before its producer knew the changelog topics' metadata crashed its
agents between "verdicts published" and "states written", faust acknowledged the batch
anyway, the policy state was lost and a second command went out for one incarnation.
This test runs the scenario on a broker nobody has used before.
"""

from __future__ import annotations

import math
import os
import time

import pytest

from runwatch.broker import ephemeral_broker
from runwatch.cmd.audit import render
from runwatch.processors.audit import audit, load_run_log
from runwatch.processors.core.config import DetectorConfig, with_overrides
from runwatch.processors.fleet import latest_states
from runwatch.procs import ManagedProcess
from runwatch.schemas.events import AnomalyDetected, RestartRequested
from runwatch.schemas.topics import names

from .harness import WAIT_S, Reader, Trainer, short, workers

pytestmark = pytest.mark.integration

SETS = ("rank_heartbeat_threshold=10", "hang_timeout_s=600", "dead_rank_timeout_s=600")
CFG = with_overrides(DetectorConfig(), dict(s.split("=") for s in SETS))
RUN = "fresh-run"
WORLD = 4
DEAD_RANK, DEAD_AFTER = 3, 20
NAN_AT = 60
STEPS = 70


def _policy_caught_up(bootstrap: str, app_id: str, last_anomaly_offset: int) -> bool:
    view = latest_states(bootstrap, app_id).get(RUN)
    return (
        view is not None
        and view.policy is not None
        and (view.policy.last_offset >= last_anomaly_offset)
    )


def test_first_start_on_a_fresh_broker_issues_one_command_per_incarnation(tmp_path):
    with ephemeral_broker(tmp_path / "kafka") as broker:
        bootstrap = broker.bootstrap
        prefix = "fresh"
        app_id = f"{prefix}-app"
        env = {**os.environ, "RUNWATCH_BOOTSTRAP": bootstrap}
        topics_cmd = ManagedProcess.runwatch(
            "topics", ["topics", "create", "--prefix", prefix], tmp_path / "topics.log", env=env
        )
        assert topics_cmd.wait(120) == 0, topics_cmd.log_tail()
        trainer = Trainer(bootstrap, prefix, RUN, world_size=WORLD)
        # the topics exist with the catalogue's counts; the worker reads them from metadata
        with workers(bootstrap, prefix, tmp_path, partitions=None, sets=SETS) as start:
            worker = start()
            trainer.start(0)
            commands = Reader(bootstrap, names(prefix).commands)
            for s in range(1, STEPS + 1):
                silent = (DEAD_RANK,) if s > DEAD_AFTER else ()
                trainer.step(s, loss=math.nan if s == NAN_AT else None, silent=silent)
                if s == NAN_AT - 10:
                    # The steps and heartbeats agents publish anomalies independently: the
                    # NaN comes once the dead rank's command is out, "later" in log order.
                    commands.wait_for(lambda ev: len(ev) >= 1)
            trainer.close()

            anomalies = Reader(bootstrap, names(prefix).anomalies)
            kinds = {"dead_rank", "nonfinite_loss"}
            anomalies.wait_for(
                lambda ev: kinds <= {e.kind for e in ev if isinstance(e, AnomalyDetected)}
            )
            last_offset = max(r.offset for r in anomalies.raw)
            anomalies.close()
            # The policy has read every anomaly once its stored state says so; a lost state
            # shows up as a second command first.
            deadline = time.monotonic() + WAIT_S
            while not _policy_caught_up(bootstrap, app_id, last_offset):
                commands.wait_for(lambda ev: True, timeout_s=1.0)
                assert len(commands.events) <= 1, [short(c) for c in commands.events]
                assert time.monotonic() < deadline, "the policy never applied every anomaly"
            got = commands.wait_for(lambda ev: len(ev) >= 1)
            commands.close()
            log_text = worker.log_path.read_text(errors="replace")

        assert [short(c) for c in got] == [("respawn", 0)], [short(c) for c in got]
        assert isinstance(got[0], RestartRequested) and got[0].cause_kind == "dead_rank"
        assert "Crashed" not in log_text, log_text[-4000:]
        receipt = audit(load_run_log(bootstrap, prefix, RUN), CFG)
        assert receipt.agrees, render(receipt)
        assert len(receipt.commands.matched) == 1
