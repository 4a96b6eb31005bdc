"""Controller state: durable processed ids, atomic gang records, the lock, resume points."""

from __future__ import annotations

import os

import pytest

from runwatch.common.checkpoint_layout import METADATA_FILE, checkpoint_dir
from runwatch.common.launch_env import LaunchEnv
from runwatch.controller.gang import rank_environ
from runwatch.controller.launcher import Incarnation, Resume, launch_env, resolve_resume
from runwatch.controller.state import (
    ControllerState,
    GangFile,
    ProcessedCommand,
    RankProcess,
    StateLocked,
    lock_state_dir,
)
from tests.unit.controller.builders import record, spec


def entry(cid: str) -> ProcessedCommand:
    return ProcessedCommand(command_id=cid, run_id="r", incarnation=0, ts_ns=1)


def test_processed_ids_survive_a_restart_and_a_torn_line(tmp_path):
    state = ControllerState(tmp_path)
    state.mark_processed(entry("a"))
    state.mark_processed(entry("b"))
    with (tmp_path / "processed.jsonl").open("ab") as f:
        f.write(b'{"command_id": "c", "run_')  # a crash mid-append
    again = ControllerState(tmp_path)
    assert again.processed == {"a", "b"}
    again.mark_processed(entry("d"))
    assert "d" in ControllerState(tmp_path).processed


def test_gang_record_round_trips(tmp_path):
    state = ControllerState(tmp_path)
    assert state.load_gang() is None
    launched = spec(argv=("python", "x.py"), launch_offsets={0: 3, 1: 0})
    gang = GangFile(
        spec=launched,
        record=record(
            launched,
            ranks=(RankProcess(rank=0, pid=11, start_ticks=5),),
            consumer_offsets={1: 7},
            failure_counts=(0, 1),
        ),
    )
    state.save_gang(gang)
    assert ControllerState(tmp_path).load_gang() == gang
    assert not list(tmp_path.glob("*.tmp"))


def test_the_lock_is_exclusive(tmp_path):
    fd = lock_state_dir(tmp_path)
    try:
        # flock locks belong to the open file description: a second open conflicts.
        with pytest.raises(StateLocked):
            lock_state_dir(tmp_path)
    finally:
        os.close(fd)
    os.close(lock_state_dir(tmp_path))


def _commit(root, step):
    path = checkpoint_dir(root, step)
    path.mkdir(parents=True)
    (path / METADATA_FILE).write_bytes(b"x")
    return path


def test_resolve_resume(tmp_path):
    assert resolve_resume(None, None) == Resume(None)
    assert resolve_resume(str(tmp_path), None) == Resume(None)
    _commit(tmp_path, 5)
    p10 = _commit(tmp_path, 10)
    (tmp_path / "step_000015.tmp").mkdir()  # a write in flight never counts
    assert resolve_resume(str(tmp_path), None) == Resume(10, str(p10))
    assert resolve_resume(str(tmp_path), 9).step == 5
    nothing = resolve_resume(str(tmp_path), 4)
    assert nothing == Resume(None) and nothing.env_value == 0


def test_rank_env_contract():
    base = {
        "PATH": "/bin",
        "RUNWATCH_COMMAND_KEY": "secret",
        "RUNWATCH_RESTART_FROM": "9",
        "RANK": "7",
    }
    launched = spec(checkpoint_dir="/ck")
    launch = launch_env(launched, Incarnation(3, launched.topology), 1, 1234)
    env = rank_environ(base, {"EXTRA": "1"}, launch)
    assert env == {
        "PATH": "/bin",
        "EXTRA": "1",
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1234",
        "RUNWATCH_BOOTSTRAP": "b:1",
        "RUNWATCH_RUN_ID": "r",
        "RUNWATCH_TOPIC_PREFIX": "p",
        "RUNWATCH_INCARNATION": "3",
        "RUNWATCH_CHECKPOINT_DIR": "/ck",
        "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "1",
        "ROLE_NAME": "default",
        "ROLE_RANK": "1",
        "ROLE_WORLD_SIZE": "2",
        "TORCHELASTIC_RESTART_COUNT": "3",
        "TORCHELASTIC_MAX_RESTARTS": "2147483647",  # no limit
        "TORCHELASTIC_RUN_ID": "r",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        # torchrun's defaults, under the controller's environment
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "OMP_NUM_THREADS": "1",
    }
    # The rank reads back exactly what the controller wrote: one struct, both ends.
    assert LaunchEnv.from_environ(env) == launch
    one = spec(nproc=1)
    again = rank_environ(
        base, {}, launch_env(one, Incarnation(1, one.topology, Resume(None)), 0, 1)
    )
    assert again["RUNWATCH_RESTART_FROM"] == "0" and "RUNWATCH_CHECKPOINT_DIR" not in again


@pytest.mark.parametrize(
    ("base", "extra", "threads"),
    [
        pytest.param({}, {}, "1", id="torchruns-default"),
        pytest.param({"OMP_NUM_THREADS": "4"}, {}, "4", id="the-agents-environment-wins"),
        pytest.param({"OMP_NUM_THREADS": "4"}, {"OMP_NUM_THREADS": "8"}, "8", id="env-flag-wins"),
    ],
)
def test_torchruns_defaults_yield_to_the_agent_and_env(base, extra, threads):
    launched = spec(checkpoint_dir="/ck")
    launch = launch_env(launched, Incarnation(0, launched.topology), 0, 1234)
    env = rank_environ(base | {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}, extra, launch)
    assert env["OMP_NUM_THREADS"] == threads
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"


def test_each_rank_is_given_its_own_error_file(tmp_path):
    state = ControllerState(tmp_path / "s")
    launched = spec()
    path = str(state.error_path(2, 1))
    launch = launch_env(launched, Incarnation(2, launched.topology), 1, 1234, error_file=path)
    assert rank_environ({}, {}, launch)["TORCHELASTIC_ERROR_FILE"] == path
    assert path.endswith("errors/inc2.rank1.json") and state.error_path(2, 1).parent.is_dir()
