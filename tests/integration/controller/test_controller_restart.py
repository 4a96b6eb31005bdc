"""A controller killed mid-run: its successor adopts the gang and repeats nothing.

`runwatch launch` executes one real command, then is SIGKILLed. `runwatch controller` on the
same state directory re-reads the commands topic from the last command acted on: it refuses
that command as replayed (published as CommandRejected; the gang keeps its pids), refuses
two forged commands the test publishes, and serves the run to its end.
"""

from __future__ import annotations

import msgspec
import pytest
from kafka import KafkaProducer

from runwatch.schemas.codec import encode, encode_key
from runwatch.schemas.events import CommandRejected, RestartCompleted, RestartRequested
from runwatch.schemas.signing import CommandKey, sign

from .conftest import Proc, of_run, rank_env, wait_events

pytestmark = [pytest.mark.integration, pytest.mark.torch]

RUN = "adopted"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_a_restarted_controller_neither_repeats_nor_obeys_forgeries(loop, launch):
    commands = loop.reader(loop.topics.commands)
    controller = loop.reader(loop.topics.controller)
    # Long enough after the respawn (70 steps x >= 0.1 s) for the handover to happen mid-run.
    run = launch(RUN, ["--steps", "80", "--inject", "kill@8:rank=1", "--step-delay-s", "0.1"])
    (command,) = wait_events(commands, of_run(RUN, RestartRequested))
    (done,) = wait_events(controller, of_run(RUN))
    assert isinstance(done, RestartCompleted) and done.command_id == command.command_id
    run.launcher.kill()
    record = run.gang_record()
    assert record.incarnation == 1 and record.status == "running"
    pids = [r.pid for r in record.ranks]
    assert all(_alive(p) for p in pids), run.rank_logs()

    successor = Proc(
        ["controller", "--state-dir", str(run.state_dir)],
        run.state_dir.parent / "controller.log",
        rank_env(),
    )
    try:
        replayed = wait_events(controller, of_run(RUN, CommandRejected))
        assert replayed[0].command_id == command.command_id
        assert replayed[0].reason.startswith("replayed")
        assert [r.pid for r in run.gang_record().ranks] == pids
        assert all(_alive(p) for p in pids), "the gang was touched"

        # Two forgeries of a command for the current incarnation: signed with a key the
        # controller does not know, and a genuine signature over an altered command.
        genuine = msgspec.structs.replace(command, command_id="forged-1", incarnation=1)
        stranger = sign(genuine, CommandKey.from_secret(b"not-the-controller-key-000"))
        altered = msgspec.structs.replace(
            sign(genuine, CommandKey.from_secret(b"test-command-key-0123456789")),
            command_id="forged-2",
        )
        producer = KafkaProducer(bootstrap_servers=loop.bootstrap, acks="all")
        for forged in (stranger, altered):
            producer.send(loop.topics.commands, key=encode_key(RUN), value=encode(forged)).get(30)
        producer.close()
        rejected = wait_events(controller, of_run(RUN, CommandRejected), count=3)
        reasons = {r.command_id: r.reason for r in rejected}
        assert "unknown key" in reasons["forged-1"]
        assert "bad signature" in reasons["forged-2"]

        assert successor.wait() == 0, successor.log() + run.rank_logs()
    finally:
        successor.close()
    assert "adopted run adopted, incarnation 1" in successor.log()
    final = run.gang_record()
    assert final.status == "completed" and final.incarnation == 1
    assert [r.pid for r in final.ranks] == pids
    assert run.losses() and max(run.losses()) == 80
    # Exactly one restart was ever executed.
    assert (run.state_dir / "processed.jsonl").read_text().count("command_id") == 1
    assert sum(isinstance(e, RestartCompleted) for e in controller.events if e.run_id == RUN) == 1
