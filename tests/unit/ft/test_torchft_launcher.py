"""The torchft launcher's pure parts: the layout of groups (one node or several), the
recorded Lighthouse, where node 0 serves it, and the launch flags that place the groups."""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from runwatch.cmd import launch
from runwatch.common.errors import UsageError
from runwatch.controller.launcher import WHOLE_NODE, Scope
from runwatch.controller.topology import PORT_SPAN, NodeTopology
from runwatch.controller.torchft_compat import (
    LighthouseProcess,
    LighthouseSettings,
    join_lighthouse,
    lighthouse_address,
)
from runwatch.controller.torchft_launcher import (
    ReplicaLayout,
    _running_lighthouse,
    lighthouse_port,
)


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


def test_over_several_nodes_each_node_owns_its_share_of_the_groups() -> None:
    """Two nodes, four groups of two: node 1 starts and stops groups 2 and 3 alone."""
    node1 = ReplicaLayout(groups=4, nproc_per_group=2, nodes=2, node=1)
    assert node1.local == range(2, 4)
    assert node1.groups_in(WHOLE_NODE) == (2, 3)
    assert [list(node1.ranks_of(g)) for g in node1.local] == [[4, 5], [6, 7]]
    assert node1.groups_in(Scope(groups=(3,))) == (3,)
    with pytest.raises(ValueError, match="no replica group \\[0\\] on node 1"):
        node1.groups_in(Scope(groups=(0,)))
    with pytest.raises(ValueError, match="multiple of --nnodes 2"):
        ReplicaLayout(groups=3, nodes=2)


def test_node_0_serves_the_lighthouse_past_the_incarnation_ports() -> None:
    two = NodeTopology(nnodes=2, node_rank=1, nproc_per_node=1, master_addr="h", master_port=31000)
    assert lighthouse_port(two) == 31000 + PORT_SPAN
    assert lighthouse_port(NodeTopology(nproc_per_node=2)) == 0  # one host: free ports
    argv = LighthouseSettings(min_replicas=1, groups=2, port=31016).argv()
    assert argv[argv.index("--port") + 1] == "31016"
    assert lighthouse_address("h", 31016) == "http://h:31016"


def test_joining_a_lighthouse_that_never_answers_times_out_saying_where() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with pytest.raises(TimeoutError, match=f"127.0.0.1:{port} did not answer"):
            join_lighthouse("127.0.0.1", port, timeout_s=0.3)


def _launch_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    launch.configure(parser)
    return parser.parse_args([*argv, "--", "python", "train.py"])


FT2 = ["--fault-tolerance", "torchft", "--run-id", "r", "--master-addr", "127.0.0.1"]
FT2 += ["--master-port", "31000", "--nnodes", "2", "--node-rank", "1"]


def test_launch_spreads_the_groups_over_the_nodes_and_refuses_what_cannot_be() -> None:
    plan = launch.resolve(_launch_args([*FT2, "--replica-groups", "4"]), {})
    assert (plan.topology.nnodes, plan.topology.nproc_per_node) == (2, 2)
    assert list(plan.topology.global_ranks) == [2, 3]
    for bad, message in (
        (["--replica-groups", "3"], "must be a multiple of --nnodes 2"),
        (["--replica-groups", "2", "--nproc-per-node", "2"], "--nproc-per-node 2 is not"),
        (["--replica-groups", "2", "--min-nnodes", "1"], "restarts lost replica groups"),
        (["--replica-groups", "2", "--master-port", "65520"], "no room for the torchft"),
    ):
        with pytest.raises(UsageError, match=message):
            launch.resolve(_launch_args([*FT2, *bad]), {})
