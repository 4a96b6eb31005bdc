"""A controller killed mid-run: its successor adopts the gang and repeats nothing.

`runwatch launch` executes one real command, then is SIGKILLed. `runwatch controller` on the
same state directory re-reads the commands topic from the last command acted on: it refuses
that command as replayed (published as CommandRejected; the gang keeps its pids), refuses
two forged commands the test publishes, and serves the run to its end. And a gang recorded
by the version before the launch spec / gang record split (a flat ``gang.json``) is adopted,
restarted by a command and served to its end by this version.
"""

from __future__ import annotations

import json
import sys

import msgspec
import pytest
from kafka import KafkaProducer

from runwatch.controller.gang import Gang
from runwatch.controller.launcher import HOST
from runwatch.controller.loop import commands_end_offsets
from runwatch.controller.state import GANG_FILE, ControllerState, read_gang_file
from runwatch.schemas.codec import encode, encode_key
from runwatch.schemas.events import CommandRejected, RestartCompleted, RestartRequested
from runwatch.schemas.signing import CommandKey, sign
from tests.integration.processors.harness import COMMAND_KEY

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


V1_RUN = "adopted-v1"
WAITER = (
    "import pathlib, sys, time\nwhile not pathlib.Path(sys.argv[1]).exists(): time.sleep(0.05)\n"
)


def _v1_record(loop, argv: list[str], ranks) -> dict:
    """A gang record as the version before the spec/record split wrote it: one flat struct."""
    return {
        "run_id": V1_RUN,
        "argv": argv,
        "world_size": 2,
        "bootstrap": loop.bootstrap,
        "prefix": loop.prefix,
        "checkpoint_dir": None,
        "env": {},
        "incarnation": 0,
        "ranks": [{"rank": p.rank, "pid": p.pid, "start_ticks": p.start_ticks} for p in ranks],
        "master_port": 0,
        "launch_offsets": {
            str(p): o for p, o in commands_end_offsets(loop.bootstrap, loop.prefix).items()
        },
        "consumer_offsets": {},
        "failure_counts": [],
        "status": "running",
        "grace_s": 1.0,
        "command_timeout_s": 60.0,
        "rank_failure_budget": 2,
        "min_nproc": 1,
        "log_format": None,
        "log_regex": None,
        "log_tokens_per_step": 0,
        "exit_evidence": True,
        "topology": {
            "nnodes": 1,
            "node_rank": 0,
            "nproc_per_node": 2,
            "master_addr": "127.0.0.1",
            "master_port": 0,
            "min_nnodes": 1,
            "max_restarts": None,
            "source": "flags",
        },
        "host": HOST,
        "node_timeout_s": 60.0,
        "backend": None,
        "relay_socket": "",
        "warm_spares": False,
        "spare_preload": ["torch"],
        "node_failure_budget": 2,
        "node_failure_counts": [],
    }


def test_a_gang_recorded_by_the_previous_version_is_adopted_and_restarted(loop, tmp_path):
    """`runwatch controller` adopts a version 1 gang.json, executes a command, completes."""
    controller = loop.reader(loop.topics.controller)
    state = ControllerState(tmp_path / "state")
    go = tmp_path / "go"
    argv = [sys.executable, "-c", WAITER, str(go)]
    gang = Gang.launch(
        argv,
        [rank_env() | {"RANK": str(r)} for r in (0, 1)],
        [state.log_path(0, r) for r in (0, 1)],
        [state.exit_path(0, r) for r in (0, 1)],
    )
    (state.root / GANG_FILE).write_text(json.dumps(_v1_record(loop, argv, gang.ranks)))
    successor = Proc(
        ["controller", "--state-dir", str(state.root)], tmp_path / "controller.log", rank_env()
    )
    try:
        command = sign(
            RestartRequested(
                run_id=V1_RUN,
                ts_ns=1,
                command_id="v1-respawn",
                action="respawn",
                cause_verdict_id="v",
                cause_kind="loss_spike",
            ),
            CommandKey.from_secret(COMMAND_KEY.encode()),
        )
        producer = KafkaProducer(bootstrap_servers=loop.bootstrap, acks="all")
        producer.send(loop.topics.commands, key=encode_key(V1_RUN), value=encode(command)).get(30)
        producer.close()
        (done,) = wait_events(controller, of_run(V1_RUN))
        assert isinstance(done, RestartCompleted) and done.command_id == "v1-respawn"
        assert done.world_size == 2
        assert gang.wait(30.0)  # the adopted ranks were stopped
        go.touch()
        assert successor.wait() == 0, successor.log()
    finally:
        successor.close()
        gang.stop(0.0, kill_now=True)
    assert "adopted run adopted-v1, incarnation 0" in successor.log()
    saved = json.loads((state.root / GANG_FILE).read_text())
    assert saved["version"] == 2  # rewritten in the new format on the first save
    final = read_gang_file(state.root / GANG_FILE)
    assert final is not None and final.spec.argv == tuple(argv)
    assert (final.record.incarnation, final.record.status, final.record.world_size) == (
        1,
        "completed",
        2,
    )
