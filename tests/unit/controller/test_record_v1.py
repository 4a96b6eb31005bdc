"""``gang.json`` version 1 (one flat record): read, converted, and its gang adopted.

The files in ``data/`` were written by the version before the split (its ``GangRecord``
encoded with ``msgspec.json.format``, as its ``ControllerState.save_gang`` did).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from runwatch.controller.gang import Gang
from runwatch.controller.launcher import WHOLE_NODE, LocalLauncher
from runwatch.controller.state import (
    GANG_FILE,
    GANG_FILE_VERSION,
    ControllerState,
    GangFile,
    GangRecord,
    LaunchSpec,
    LogWatchSpec,
    RankProcess,
    StateFormatError,
    WarmSparesSpec,
    read_gang_file,
)
from runwatch.controller.supervisor import RunSupervisor
from runwatch.controller.topology import NodeTopology, RunBinding
from runwatch.schemas.events import BackendDeclaration, Event, RankExited, RestartCompleted
from tests.unit.controller.builders import command

DATA = Path(__file__).parent / "data"
PY = sys.executable


def test_a_multinode_version_1_record_is_split_field_for_field(tmp_path):
    gang = read_gang_file(DATA / "gang_v1_multinode.json")
    topology = NodeTopology(
        nnodes=2,
        node_rank=1,
        nproc_per_node=2,
        master_addr="n0",
        master_port=30000,
        min_nnodes=1,
        max_restarts=5,
        source="slurm",
    )
    assert gang == GangFile(
        spec=LaunchSpec(
            run=RunBinding(
                run_id="train-20250101-000000-abcd",
                bootstrap="127.0.0.1:9092",
                prefix="runwatch",
                checkpoint_dir="/ckpt/run",
                relay_socket="/state/relay.sock",
            ),
            argv=("python", "train.py", "--steps", "100"),
            env={"PYTHONUNBUFFERED": "1", "EXTRA": "x"},
            topology=topology,
            host="n1",
            launch_offsets={0: 12, 1: 7},
            grace_s=5.0,
            command_timeout_s=90.0,
            rank_failure_budget=3,
            min_nproc=2,
            node_timeout_s=30.0,
            node_failure_budget=1,
            exit_evidence=False,
            log_watch=None,
            warm_spares=WarmSparesSpec(preload=("torch", "numpy")),
        ),
        record=GangRecord(
            incarnation=3,
            topology=topology,
            ranks=(
                RankProcess(rank=2, pid=4242, start_ticks=77),
                RankProcess(rank=3, pid=4243, start_ticks=78),
            ),
            master_port=30003,
            failure_counts=(0, 1, 0, 2),
            node_failure_counts=(0, 1),
            consumer_offsets={1: 9},
            backend=BackendDeclaration(
                name="torch-ddp", reshardable_checkpoint=True, elastic_restart=True
            ),
            status="running",
        ),
    )
    assert gang.record.world_size == 4  # version 1's world_size, now the topology's


def test_a_printing_one_host_record_keeps_its_log_watch_and_no_spares():
    gang = read_gang_file(DATA / "gang_v1_minimal.json")
    assert gang is not None
    assert gang.spec.log_watch == LogWatchSpec(
        format="regex", regex=r"step (?P<step>\d+) loss (?P<loss>\S+)", tokens_per_step=512
    )
    assert gang.spec.warm_spares is None and gang.spec.run.relay_socket is None
    assert gang.spec.run.checkpoint_dir is None and gang.spec.host == "h"
    assert gang.record == GangRecord(topology=NodeTopology(nproc_per_node=2))


def _v1(**changes: object) -> dict:
    """The minimal version 1 record as a dict, with ``changes``."""
    return json.loads((DATA / "gang_v1_minimal.json").read_text()) | changes


def test_a_one_host_gang_that_shrank_by_ranks_keeps_both_sizes(tmp_path):
    (tmp_path / GANG_FILE).write_text(json.dumps(_v1(world_size=1)))
    gang = read_gang_file(tmp_path / GANG_FILE)
    assert gang is not None
    assert gang.spec.topology.nproc_per_node == 2  # as launched
    assert (gang.record.world_size, gang.record.topology.nproc_per_node) == (1, 1)  # now


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(json.dumps({"version": 3, "spec": {}}), "gang file version 3", id="newer"),
        pytest.param('{"run_id": "r"', "not a gang record", id="torn"),
        pytest.param(json.dumps(_v1(world_size="two")), "not a gang record", id="bad-field"),
        pytest.param(json.dumps({"version": 2, "spec": {}}), "not a gang record", id="v2-missing"),
    ],
)
def test_a_file_this_version_cannot_read_is_one_clear_error(tmp_path, content, message):
    (tmp_path / GANG_FILE).write_text(content)
    with pytest.raises(StateFormatError, match=message) as exc:
        ControllerState(tmp_path).load_gang()
    assert str(tmp_path / GANG_FILE) in str(exc.value) and "\n" not in str(exc.value)


def test_an_adopter_skips_an_unreadable_record_saying_why(tmp_path, capsys):
    from runwatch.cli import main

    (tmp_path / "r").mkdir()
    (tmp_path / "r" / GANG_FILE).write_text(json.dumps({"version": 9}))
    assert main(["controller", "--state-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"skipping {tmp_path / 'r' / GANG_FILE}: gang file version 9" in err
    assert err.strip().splitlines()[-1].startswith("runwatch controller: no running gang to adopt")


SLEEPER = (
    "import pathlib, sys, time\nwhile not pathlib.Path(sys.argv[1]).exists(): time.sleep(0.02)\n"
)


def _start_v1_gang(tmp_path: Path) -> tuple[ControllerState, Gang, Path]:
    """Two ranks started and recorded the way version 1 did: a flat ``gang.json``."""
    state = ControllerState(tmp_path / "state")
    go = tmp_path / "go"
    argv = [PY, "-c", SLEEPER, str(go)]
    ranks = (0, 1)
    gang = Gang.launch(
        argv,
        [{"PATH": "/usr/bin:/bin", "RANK": str(r)} for r in ranks],
        [state.log_path(0, r) for r in ranks],
        [state.exit_path(0, r) for r in ranks],
    )
    v1 = _v1(
        run_id="r",
        argv=argv,
        grace_s=0.2,
        bootstrap="127.0.0.1:1",
        log_format=None,
        log_regex=None,
        ranks=[{"rank": p.rank, "pid": p.pid, "start_ticks": p.start_ticks} for p in gang.ranks],
        master_port=1234,
        consumer_offsets={"0": 5},
    )
    (state.root / GANG_FILE).write_text(json.dumps(v1, indent=2))
    return state, gang, go


def _adopt(state: ControllerState, published: list[Event]) -> RunSupervisor:
    """What `runwatch controller` builds for a recorded gang (without Kafka)."""
    gang = state.load_gang()
    assert gang is not None
    return RunSupervisor(
        state=state,
        spec=gang.spec,
        record=gang.record,
        launcher=LocalLauncher.for_run(state, gang.spec, gang.record),
        publish=published.append,
        announce_end=lambda *_: None,
    )


def test_a_gang_recorded_by_version_1_is_adopted_and_completes(tmp_path):
    state, gang, go = _start_v1_gang(tmp_path)
    published: list[Event] = []
    try:
        sup = _adopt(state, published)
        assert sup.launcher.running() == [0, 1]  # the same processes, watched through /proc
        sup.note_offset(0, 6)  # the first save writes version 2
        saved = json.loads((state.root / GANG_FILE).read_text())
        assert saved["version"] == GANG_FILE_VERSION
        assert [r["pid"] for r in saved["record"]["ranks"]] == [p.pid for p in gang.ranks]
        go.touch()
        assert gang.wait(60.0)
        sup.observe(time.monotonic())
        assert sup.record.status == "completed"
        assert [(e.rank, e.exit_code) for e in published if isinstance(e, RankExited)] == [
            (0, 0),
            (1, 0),
        ]
        assert read_gang_file(state.root / GANG_FILE) == GangFile(spec=sup.spec, record=sup.record)
    finally:
        gang.stop(0.0, kill_now=True)


def test_a_gang_recorded_by_version_1_is_restarted_by_a_command(tmp_path):
    state, gang, _go = _start_v1_gang(tmp_path)
    published: list[Event] = []
    sup = _adopt(state, published)
    try:
        sup.execute(command(world_size=None), time.monotonic())
        assert gang.running() == []  # the adopted ranks were stopped
        (done,) = [e for e in published if isinstance(e, RestartCompleted)]
        assert (done.world_size, sup.record.incarnation, sup.record.consumer_offsets) == (
            2,
            1,
            {0: 5},
        )
        assert [p.rank for p in sup.record.ranks] == [0, 1] and sup.launcher.running() == [0, 1]
    finally:
        sup.launcher.stop(WHOLE_NODE, grace_s=0.0, kill_now=True)
