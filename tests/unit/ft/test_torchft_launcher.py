"""The torchft launcher's pure parts: the layout of groups and the recorded Lighthouse."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from runwatch.controller.launcher import WHOLE_NODE, Scope
from runwatch.controller.torchft_compat import LighthouseProcess, LighthouseSettings
from runwatch.controller.torchft_launcher import ReplicaLayout, _running_lighthouse


def test_the_layout_maps_global_ranks_to_groups_and_checks_scopes() -> None:
    layout = ReplicaLayout(groups=3, nproc_per_group=2, min_replicas=2)
    assert [layout.group_of(r) for r in range(6)] == [0, 0, 1, 1, 2, 2]
    assert list(layout.ranks_of(2)) == [4, 5]
    assert layout.groups_in(WHOLE_NODE) == (0, 1, 2)
    assert layout.groups_in(Scope(groups=(2, 0, 2))) == (0, 2)
    with pytest.raises(ValueError, match="no replica group"):
        layout.groups_in(Scope(groups=(3,)))
    with pytest.raises(ValueError, match="--min-replicas"):
        ReplicaLayout(groups=2, min_replicas=3)


def test_an_adopter_reuses_a_recorded_lighthouse_only_while_its_process_runs(
    tmp_path: Path,
) -> None:
    path = tmp_path / "lighthouse.json"
    assert _running_lighthouse(path) is None
    alive = LighthouseProcess(pid=os.getpid(), address="http://h:1", barrier="http://h:2")
    path.write_bytes(msgspec.json.encode(alive))
    assert _running_lighthouse(path) == alive
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    path.write_bytes(msgspec.json.encode(dataclasses.replace(alive, pid=gone.pid)))
    assert _running_lighthouse(path) is None
    path.write_bytes(b"{not json")
    assert _running_lighthouse(path) is None


def test_the_lighthouse_process_is_started_with_its_settings() -> None:
    argv = LighthouseSettings(min_replicas=2, groups=3, heartbeat_timeout_ms=500).argv()
    assert argv[1:3] == ["-m", "runwatch.controller.torchft_compat"]
    assert argv[argv.index("--min-replicas") + 1] == "2"
    assert argv[argv.index("--groups") + 1] == "3"
    assert argv[argv.index("--heartbeat-timeout-ms") + 1] == "500"
