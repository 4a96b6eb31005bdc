"""A shadow command reaches the controller through a real broker and is not executed.

`runwatch launch` runs a gang; the test publishes, for the gang's current incarnation, a
validly signed respawn flagged ``shadow`` (what a verdict in shadow mode would cause),
then the same command unflagged under another id. Commands of one run share a partition
and the controller reads them in order, so once the second is executed the first was read
before it: it was ignored (no restart, no rejection), and exactly one restart happened.
"""

from __future__ import annotations

import msgspec
import pytest
from kafka import KafkaProducer

from runwatch.schemas.codec import encode, encode_key
from runwatch.schemas.events import (
    CommandRejected,
    RestartCompleted,
    RestartRequested,
    StepCompleted,
)
from runwatch.schemas.signing import CommandKey, sign
from tests.integration.processors.harness import COMMAND_KEY

from .conftest import of_run, wait_events

pytestmark = [pytest.mark.integration, pytest.mark.torch]

RUN = "shadowed"


def test_a_shadow_command_is_recorded_but_not_executed(loop, launch):
    steps = loop.reader(loop.topics.steps)
    controller = loop.reader(loop.topics.controller)
    run = launch(RUN, ["--steps", "60", "--step-delay-s", "0.1"])
    wait_events(steps, of_run(RUN, StepCompleted))  # launched: past its launch offset
    key = CommandKey.from_secret(COMMAND_KEY.encode())
    real = RestartRequested(
        run_id=RUN,
        ts_ns=1,
        command_id="real-respawn",
        action="respawn",
        cause_verdict_id="v-real",
        cause_kind="hang",
        incarnation=0,
        launch_id=run.gang().spec.run.launch_id,  # bound to this launch (gate rule 6)
    )
    shadow = msgspec.structs.replace(
        real, command_id="shadow-respawn", cause_verdict_id="v-shadow", shadow=True
    )
    producer = KafkaProducer(bootstrap_servers=loop.bootstrap, acks="all")
    for command in (sign(shadow, key), sign(real, key)):
        producer.send(loop.topics.commands, key=encode_key(RUN), value=encode(command)).get(30)
    producer.close()

    (done,) = wait_events(controller, of_run(RUN, RestartCompleted))
    assert done.command_id == "real-respawn"
    assert run.launcher.wait() == 0, run.launcher.log() + run.rank_logs()
    final = run.gang_record()
    assert final.status == "completed" and final.incarnation == 1
    processed = (run.state_dir / "processed.jsonl").read_text()
    assert "real-respawn" in processed and "shadow-respawn" not in processed
    mine = [e for e in controller.events if e.run_id == RUN]
    assert not any(isinstance(e, CommandRejected) for e in mine), mine
    assert sum(isinstance(e, RestartCompleted) for e in mine) == 1
