"""Finding 6 of issue 19, as the attacker replays it: a command is bound to its launch.

Launch A of run ``recurring`` (a recurring run id, as SLURM job ids and nightly jobs give)
loses rank 1 at step 8; the processors sign a respawn for launch A and A's controller
executes it; A completes. Launch B of the same run id then starts from a state directory of
its own (another job, another node) and is held at step 6. The attacker, with nothing but
kafka-python and read/write on the commands topic, copies the signed command's record from
the log and produces the same bytes again. B's controller refuses it ("bound to another
launch") and its gang is untouched. B then still obeys a fresh command: rank 1 is
SIGKILLed, and the respawn signed for launch B is executed.
"""

from __future__ import annotations

import os
import signal

import pytest
from kafka import KafkaConsumer, KafkaProducer

from runwatch.schemas.codec import decode, encode_key
from runwatch.schemas.events import (
    CommandRejected,
    RestartCompleted,
    RestartRequested,
    RunStarted,
)

from .conftest import of_run, wait_events

pytestmark = [pytest.mark.integration, pytest.mark.torch]

RUN = "recurring"
QUIET = ["--threshold", "dead_rank_timeout_s=600", "--threshold", "hang_timeout_s=600"]
"""B's hold is silent: its liveness thresholds outlast the replay."""


def _raw_command_record(bootstrap: str, topic: str, command_id: str) -> tuple[bytes, bytes]:
    """The key and value bytes of the command's record, read as any consumer would."""
    consumer = KafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=5000
    )
    try:
        for record in consumer:
            event = decode(record.value)
            if isinstance(event, RestartRequested) and event.command_id == command_id:
                return record.key, record.value
    finally:
        consumer.close()
    raise AssertionError(f"command {command_id} is not on {topic}")


def test_a_command_replayed_into_a_new_launch_is_refused_and_a_fresh_one_obeyed(
    loop, launch, tmp_path
):
    commands = loop.reader(loop.topics.commands)
    controller = loop.reader(loop.topics.controller)
    runs = loop.reader(loop.topics.runs)

    a = launch(RUN, ["--steps", "14", "--inject", "kill@8:rank=1"], name="a")
    (command,) = wait_events(commands, of_run(RUN, RestartRequested))
    launch_a = a.gang().spec.run.launch_id
    assert launch_a and command.launch_id == launch_a and command.signature
    (done,) = wait_events(controller, of_run(RUN, RestartCompleted))
    assert done.command_id == command.command_id
    assert a.launcher.wait() == 0, a.launcher.log() + a.rank_logs()

    hold = tmp_path / "hold"
    hold.touch()
    args = ["--steps", "30", *QUIET, "--hold-after-step", "6", "--hold-file", str(hold)]
    b = launch(RUN, args, name="b")
    (started_b,) = wait_events(
        runs, lambda e: of_run(RUN, RunStarted)(e) and e.launch_id not in ("", launch_a)
    )
    launch_b = b.gang().spec.run.launch_id
    assert started_b.launch_id == launch_b and started_b.incarnation == 0
    pids = [r.pid for r in b.gang_record().ranks]

    # The attacker: the signed record, byte for byte, produced again.
    key, value = _raw_command_record(loop.bootstrap, loop.topics.commands, command.command_id)
    assert key == encode_key(RUN)
    producer = KafkaProducer(bootstrap_servers=loop.bootstrap, acks="all")
    producer.send(loop.topics.commands, key=key, value=value).get(30)
    producer.close()
    (refused,) = wait_events(controller, of_run(RUN, CommandRejected))
    assert refused.command_id == command.command_id
    assert refused.reason.startswith("bound to another launch"), refused.reason
    assert launch_a in refused.reason and launch_b in refused.reason
    record = b.gang_record()
    assert record.incarnation == 0 and [r.pid for r in record.ranks] == pids

    (rank_1,) = [r.pid for r in record.ranks if r.rank == 1]
    os.killpg(rank_1, signal.SIGKILL)  # held at step 6: it is alive
    hold.unlink()
    of_b = lambda e: of_run(RUN, RestartRequested)(e) and e.launch_id == launch_b  # noqa: E731
    (fresh,) = wait_events(commands, of_b)
    assert fresh.incarnation == 0
    restarts = wait_events(controller, of_run(RUN, RestartCompleted), count=2)
    assert restarts[-1].command_id == fresh.command_id
    assert b.launcher.wait() == 0, b.launcher.log() + b.rank_logs()
    assert b.gang_record().incarnation == 1
    assert "bound to another launch" in b.launcher.log()
