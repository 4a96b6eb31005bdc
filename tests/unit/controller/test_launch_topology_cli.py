"""`runwatch launch`'s topology flags: bad combinations are one-line usage errors, no Kafka."""

from __future__ import annotations

import argparse

import pytest

from runwatch.cli import main
from runwatch.cmd import launch
from runwatch.controller.topology import NodeTopology

MULTI = ["--nnodes", "2", "--node-rank", "1", "--master-addr", "10.1.2.3", "--run-id", "r"]


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    launch.configure(parser)
    return parser.parse_args([*argv, "--", "python", "train.py"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "--nproc N (one host) or --nproc-per-node K"),
        (["--nproc", "2", "--nnodes", "2"], "--nproc is the one-host form"),
        (["--nnodes", "2", "--master-addr", "h", "--run-id", "r"], "needs --node-rank"),
        (["--nnodes", "2", "--node-rank", "0", "--run-id", "r"], "needs --master-addr"),
        (["--nnodes", "2", "--node-rank", "0", "--master-addr", "h"], "needs --run-id"),
        ([*MULTI, "--node-rank", "2"], "--node-rank must be in 0..1"),
        ([*MULTI, "--master-port", "0"], "fixed --master-port"),
        ([*MULTI, "--log-format", "nanogpt"], "--log-format reads rank 0's output on one host"),
        (["--nproc", "0"], "--nproc must be >= 1"),
        (["--nproc", "2", "--nproc-per-node", "2"], "--nproc is the one-host form"),
        ([*MULTI, "--min-nnodes", "3"], "--min-nnodes must be in 1..2 (--nnodes), got 3"),
        ([*MULTI, "--min-nnodes", "0"], "--min-nnodes must be in 1..2"),
        (["--nproc", "2", "--min-nnodes", "1"], "--nproc is the one-host form"),
        ([*MULTI, "--node-timeout", "0"], "--node-timeout must be > 0"),
        ([*MULTI, "--node-failure-budget", "-1"], "--node-failure-budget must be >= 0, got -1"),
    ],
)
def test_bad_topologies_are_one_line_usage_errors(argv, message, capsys, tmp_path):
    base = ["launch", "--state-dir", str(tmp_path), "--bootstrap", "127.0.0.1:1"]
    code = main([*base, *argv, "--", "python", "train.py"])
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_nproc_is_one_host(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    plan = launch.resolve(_parse(["--nproc", "3"]), {})
    assert plan.topology == NodeTopology(nproc_per_node=3)
    assert plan.run_id.startswith("train-")
    assert plan.state_dir.name == plan.run_id


def test_a_node_of_several_gets_its_own_state_dir(tmp_path):
    args = _parse([*MULTI, "--nproc-per-node", "4", "--master-port", "31000"])
    plan = launch.resolve(args, {})
    t = plan.topology
    assert (t.nnodes, t.node_rank, t.nproc_per_node, t.master_port) == (2, 1, 4, 31000)
    assert (plan.run_id, plan.state_dir.name, plan.state_dir.parent.name) == ("r", "node1", "r")
    explicit = launch.resolve(_parse([*MULTI, "--state-dir", str(tmp_path / "s")]), {})
    assert explicit.state_dir == (tmp_path / "s").resolve()


def test_min_nnodes_defaults_to_nnodes_never_shrinking():
    assert launch.resolve(_parse(MULTI), {}).topology.min_nnodes == 2
    assert launch.resolve(_parse([*MULTI, "--min-nnodes", "1"]), {}).topology.min_nnodes == 1


def test_under_srun_the_flags_are_optional():
    env = {
        "SLURM_JOB_ID": "77",
        "SLURM_STEP_ID": "1",
        "SLURM_NNODES": "2",
        "SLURM_NTASKS": "2",
        "SLURM_PROCID": "1",
        "SLURM_NODEID": "1",
        "SLURM_GPUS_ON_NODE": "4",
        "SLURM_JOB_NODELIST": "cn[10-11]",
    }
    plan = launch.resolve(_parse([]), env)
    t = plan.topology
    assert (t.nnodes, t.node_rank, t.nproc_per_node, t.master_addr) == (2, 1, 4, "cn10")
    assert plan.run_id == "slurm-77.1" and plan.state_dir.name == "node1"
