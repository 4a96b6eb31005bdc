"""A node's topology from flags and SLURM's variables, and the rank environment it writes."""

from __future__ import annotations

import itertools

import msgspec
import pytest

from runwatch.common.launch_env import LaunchEnv
from runwatch.controller.topology import (
    PORT_SPAN,
    NodeTopology,
    RunBinding,
    SlurmStep,
    TopologyError,
    expand_hostlist,
    resolve_topology,
)

RUN = RunBinding(run_id="r1", bootstrap="k:9092", prefix="p", checkpoint_dir="/ckpt")

# An `srun --nodes 4 --ntasks-per-node 1 --gpus-per-node 8` task on the third node.
SRUN = {
    "SLURM_JOB_ID": "123456",
    "SLURM_STEP_ID": "0",
    "SLURM_NNODES": "4",
    "SLURM_NTASKS": "4",
    "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_PROCID": "2",
    "SLURM_NODEID": "2",
    "SLURM_GPUS_ON_NODE": "8",
    "SLURM_JOB_NODELIST": "gpu[07-09,12]",
    "SLURM_STEP_NODELIST": "gpu[07-09,12]",
}


# --------------------------------------------------------------------------- hostlists


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [
        ("node01", ["node01"]),
        ("node[01-04,07],gpu5", ["node01", "node02", "node03", "node04", "node07", "gpu5"]),
        ("a,b,c", ["a", "b", "c"]),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        (
            "rack[1-2]-node[01-02].cl",
            ["rack1-node01.cl", "rack1-node02.cl", "rack2-node01.cl", "rack2-node02.cl"],
        ),
        ("x[3],y", ["x3", "y"]),
        (" n[1-2] ", ["n1", "n2"]),
    ],
)
def test_hostlists_expand_in_order(hostlist, hosts):
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize(
    "bad", ["", "n[1-2", "n1-2]", "n[2-1]", "n[a-b]", "n[[1]]", "a,,b", "n[1-]"]
)
def test_malformed_hostlists_are_refused(bad):
    with pytest.raises(TopologyError):
        expand_hostlist(bad)


# --------------------------------------------------------------------------- SLURM


def test_an_srun_task_takes_everything_from_slurm():
    resolved = resolve_topology(SRUN)
    t = resolved.topology
    assert (t.nnodes, t.node_rank, t.nproc_per_node, t.world_size) == (4, 2, 8, 32)
    assert t.master_addr == "gpu07"  # the first host of the step's node list
    assert t.master_port == 20000 + 123456 % 20000  # derived from the job id: same everywhere
    assert t.source == "slurm" and t.min_nnodes == 4
    assert resolved.run_id == "slurm-123456.0"
    assert list(t.global_ranks) == list(range(16, 24))


def test_every_node_of_a_job_agrees_on_master_and_port():
    views = [
        resolve_topology(SRUN | {"SLURM_PROCID": str(i), "SLURM_NODEID": str(i)}).topology
        for i in range(4)
    ]
    assert {(v.master_addr, v.master_port, v.world_size) for v in views} == {("gpu07", 23456, 32)}
    assert sorted(r for v in views for r in v.global_ranks) == list(range(32))


def test_flags_win_over_slurm_value_by_value():
    t = resolve_topology(SRUN, nproc_per_node=2, master_port=31000, run_id="mine")
    assert (t.topology.nproc_per_node, t.topology.master_port) == (2, 31000)
    assert (t.topology.nnodes, t.topology.node_rank) == (4, 2)  # still SLURM's
    assert t.run_id == "mine"


def test_without_gpus_the_tasks_per_node_give_the_ranks():
    env = {k: v for k, v in SRUN.items() if k != "SLURM_GPUS_ON_NODE"}
    assert resolve_topology(env).topology.nproc_per_node == 1
    env["SLURM_GPUS_ON_NODE"] = "0"
    assert resolve_topology(env).topology.nproc_per_node == 1


def test_an_exported_master_port_and_job_nodelist_are_used():
    env = {k: v for k, v in SRUN.items() if k != "SLURM_STEP_NODELIST"}
    env |= {"SLURM_JOB_NODELIST": "login1,cn[001-003]", "MASTER_PORT": "29400"}
    t = resolve_topology(env).topology
    assert (t.master_addr, t.master_port) == ("login1", 29400)


def test_node_rank_is_procid_with_one_task_per_node_else_nodeid():
    assert SlurmStep.from_environ(SRUN | {"SLURM_NODEID": "0"}).node_rank == 2
    step = SlurmStep.from_environ(SRUN | {"SLURM_NTASKS": "8", "SLURM_PROCID": "5"})
    assert step.node_rank == 2


def test_several_tasks_per_node_is_a_usage_error():
    with pytest.raises(TopologyError, match=r"8 tasks on 4 nodes.*--ntasks-per-node=1"):
        resolve_topology(SRUN | {"SLURM_NTASKS": "8"})


def test_an_salloc_shell_or_batch_script_is_not_an_srun_step():
    shell = {k: v for k, v in SRUN.items() if k != "SLURM_STEP_ID"}
    resolved = resolve_topology(shell, nproc_per_node=2)
    assert resolved.topology.nnodes == 1 and resolved.topology.source == "flags"
    assert resolved.run_id is None
    assert SlurmStep.from_environ(shell) is None


def test_the_one_host_form_ignores_slurm():
    resolved = resolve_topology(SRUN, nproc=2)
    assert resolved.topology == NodeTopology(nproc_per_node=2)
    assert resolved.run_id is None


def test_a_malformed_slurm_variable_is_a_usage_error():
    with pytest.raises(TopologyError, match="SLURM_NNODES"):
        resolve_topology(SRUN | {"SLURM_NNODES": "four"})


def test_a_one_node_step_runs_without_flags():
    env = SRUN | {
        "SLURM_NNODES": "1",
        "SLURM_NTASKS": "1",
        "SLURM_PROCID": "0",
        "SLURM_NODEID": "0",
        "SLURM_GPUS_ON_NODE": "2",
        "SLURM_STEP_NODELIST": "cn7",
        "SLURM_STEP_ID": "3",
    }
    resolved = resolve_topology(env)
    t = resolved.topology
    assert (t.nnodes, t.node_rank, t.nproc_per_node, t.master_addr) == (1, 0, 2, "cn7")
    assert t.incarnation_port(0) == t.master_port and resolved.run_id == "slurm-123456.3"


# --------------------------------------------------------------------------- flags


def test_flags_alone_describe_a_node():
    t = resolve_topology(
        {}, nnodes=2, node_rank=1, nproc_per_node=3, master_addr="10.0.0.1", min_nnodes=1
    ).topology
    assert (t.world_size, list(t.global_ranks), t.master_port) == (6, [3, 4, 5], 29500)
    assert (t.min_nnodes, t.source) == (1, "flags")


def test_nproc_is_one_node_with_a_fresh_port_per_incarnation():
    t = resolve_topology({}, nproc=4).topology
    assert (t.nnodes, t.node_rank, t.world_size, t.master_addr) == (1, 0, 4, "127.0.0.1")
    assert t.incarnation_port(3) is None


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"nnodes": 2, "master_addr": "h"}, "needs --node-rank"),
        ({"nnodes": 2, "node_rank": 1}, "needs --master-addr"),
        ({"nnodes": 2, "node_rank": 2, "master_addr": "h"}, "--node-rank must be in 0..1"),
        ({"nnodes": 0}, "--nnodes must be >= 1"),
        ({"nproc_per_node": 0}, "--nproc-per-node must be >= 1"),
        ({"nnodes": 2, "node_rank": 0, "master_addr": "h", "min_nnodes": 3}, "--min-nnodes"),
        (
            {"nnodes": 2, "node_rank": 0, "master_addr": "h", "master_port": 0},
            "fixed --master-port",
        ),
        ({"nnodes": 1, "master_port": 65535}, "--master-port must be in"),
        ({"nproc": 2, "nnodes": 2}, "--nproc is the one-host form"),
        ({"nproc": 2, "max_restarts": -1}, "--max-restarts"),
    ],
)
def test_bad_combinations_are_one_line_errors(flags, message):
    with pytest.raises(TopologyError, match=message) as info:
        resolve_topology({}, **flags)
    assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- rank environment


def test_launch_env_is_torchruns_contract_plus_runwatchs():
    t = NodeTopology(
        nnodes=2, node_rank=1, nproc_per_node=2, master_addr="node0", master_port=29500
    )
    launch = t.launch_env(
        1, incarnation=3, master_port=t.incarnation_port(3), run=RUN, restart_from=10
    )
    assert launch.to_environ() == {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "ROLE_NAME": "default",
        "ROLE_RANK": "3",
        "ROLE_WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "WORLD_SIZE": "4",
        "MASTER_ADDR": "node0",
        "MASTER_PORT": "29503",
        "TORCHELASTIC_RESTART_COUNT": "3",
        "TORCHELASTIC_MAX_RESTARTS": "2147483647",
        "TORCHELASTIC_RUN_ID": "r1",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "RUNWATCH_BOOTSTRAP": "k:9092",
        "RUNWATCH_RUN_ID": "r1",
        "RUNWATCH_TOPIC_PREFIX": "p",
        "RUNWATCH_INCARNATION": "3",
        "RUNWATCH_CHECKPOINT_DIR": "/ckpt",
        "RUNWATCH_RESTART_FROM": "10",
    }
    # The trainer reads back exactly what the agent wrote: one struct, both ends.
    assert LaunchEnv.from_environ(launch.to_environ()) == launch


def test_a_first_launch_has_no_restart_from_and_unknown_checkpoints_no_dir():
    env = (
        NodeTopology(nproc_per_node=1, max_restarts=5)
        .launch_env(
            0,
            incarnation=0,
            master_port=1234,
            run=RunBinding(run_id="r", bootstrap="b", prefix="p"),
        )
        .to_environ()
    )
    assert "RUNWATCH_RESTART_FROM" not in env and "RUNWATCH_CHECKPOINT_DIR" not in env
    assert env["TORCHELASTIC_MAX_RESTARTS"] == "5"


def test_a_torchrun_restart_count_reads_as_the_incarnation():
    assert LaunchEnv.from_environ({"TORCHELASTIC_RESTART_COUNT": "2"}).incarnation == 2


def test_incarnation_ports_cycle_and_never_repeat_back_to_back():
    t = NodeTopology(nnodes=2, master_addr="m", master_port=30000)
    ports = [t.incarnation_port(i) for i in range(2 * PORT_SPAN)]
    assert ports[:PORT_SPAN] == list(range(30000, 30000 + PORT_SPAN))
    assert ports[PORT_SPAN:] == ports[:PORT_SPAN]
    assert all(a != b for a, b in itertools.pairwise(ports))


def test_topology_round_trips_through_the_gang_record_encoding():
    t = NodeTopology(nnodes=2, node_rank=1, master_addr="m", master_port=30000, min_nnodes=1)
    assert msgspec.json.decode(msgspec.json.encode(t), type=NodeTopology) == t
    with pytest.raises(msgspec.ValidationError, match="node-rank"):
        msgspec.json.decode(b'{"nnodes": 1, "node_rank": 4}', type=NodeTopology)


def test_local_rank_outside_the_node_is_refused():
    with pytest.raises(ValueError, match="local rank 2"):
        NodeTopology(nproc_per_node=2).global_rank(2)
