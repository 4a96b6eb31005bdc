"""`runwatch launch` reads a torchrun command line as it is (`runwatch.cmd._torchrun`).

Each case parses a command line with `runwatch launch`'s own parser and translates it,
no Kafka, no process: a flag (in both spellings where torchrun has two) gives the
settings it means here, or one line that says why it cannot.
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from runwatch.cli import main
from runwatch.cmd import launch
from runwatch.cmd._torchrun import LaunchSettings, translate
from runwatch.common.errors import UsageError

PY = "/venv/bin/python"
SRUN = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NNODES": "1"}


def _devices(kind: str) -> int:
    return {"cpu": 16, "gpu": 8, "xpu": 4, "auto": 8}[kind]


def settings(*argv: str, environ: dict[str, str] | None = None) -> LaunchSettings:
    parser = argparse.ArgumentParser()
    launch.configure(parser)
    args = parser.parse_args(list(argv))
    return translate(args, environ or {}, python=PY, count_devices=_devices)


def _case(argv: list[str], want: dict[str, Any], id: str, env: dict[str, str] | None = None):
    return pytest.param(argv, env or {}, want, id=id)


SCRIPT = ["train.py", "--lr", "3e-4"]
RUN = (PY, "-u", "train.py", "--lr", "3e-4")

MAPPED = [
    _case(SCRIPT, {"command": RUN, "torchrun_form": True, "nproc_per_node": 1}, "script"),
    _case(["--", "python", "t.py"], {"command": ("python", "t.py"), "nproc_per_node": None}, "--"),
    _case(["-m", "pkg.train", "--x"], {"command": (PY, "-u", "-m", "pkg.train", "--x")}, "-m"),
    _case(["--module", "pkg.train"], {"command": (PY, "-u", "-m", "pkg.train")}, "--module"),
    _case(["--no-python", "./run.sh", "a"], {"command": ("./run.sh", "a")}, "--no-python"),
    _case(["--no_python", "./run.sh"], {"command": ("./run.sh",)}, "--no_python"),
    _case(["--run-path", "/abs/t.py"], {"command": (PY, "-u", "/abs/t.py")}, "--run-path"),
    _case(["--nproc-per-node", "4", *SCRIPT], {"nproc_per_node": 4}, "--nproc-per-node"),
    _case(["--nproc_per_node=2", *SCRIPT], {"nproc_per_node": 2}, "--nproc_per_node="),
    _case(["--nproc-per-node", "gpu", *SCRIPT], {"nproc_per_node": 8}, "--nproc-per-node-gpu"),
    _case(["--nproc-per-node=cpu", *SCRIPT], {"nproc_per_node": 16}, "--nproc-per-node-cpu"),
    _case(["--nproc-per-node=auto", *SCRIPT], {"nproc_per_node": 8}, "--nproc-per-node-auto"),
    _case(["--nnodes", "2", *SCRIPT], {"nnodes": 2, "min_nnodes": None}, "--nnodes"),
    _case(["--nnodes=2:4", *SCRIPT], {"nnodes": 4, "min_nnodes": 2}, "--nnodes=MIN:MAX"),
    _case(["--nnodes=3:3", *SCRIPT], {"nnodes": 3, "min_nnodes": None}, "--nnodes=N:N"),
    _case(
        ["--nnodes=2:4", "--min-nnodes", "2", *SCRIPT],
        {"nnodes": 4, "min_nnodes": 2},
        "--nnodes=MIN:MAX-agrees-with-min-nnodes",
    ),
    _case(["--node-rank", "1", *SCRIPT], {"node_rank": 1}, "--node-rank"),
    _case(["--node_rank=1", *SCRIPT], {"node_rank": 1}, "--node_rank"),
    _case(["--master-addr", "n0", *SCRIPT], {"master_addr": "n0"}, "--master-addr"),
    _case(["--master_addr=n0", *SCRIPT], {"master_addr": "n0"}, "--master_addr"),
    _case(["--master-port", "29600", *SCRIPT], {"master_port": 29600}, "--master-port"),
    _case(["--master_port=29600", *SCRIPT], {"master_port": 29600}, "--master_port"),
    _case(["--max-restarts", "3", *SCRIPT], {"max_restarts": 3}, "--max-restarts"),
    _case(["--max_restarts=0", *SCRIPT], {"max_restarts": 0}, "--max_restarts"),
    _case(SCRIPT, {"max_restarts": None}, "no-max-restarts-no-limit"),
    _case(
        ["--standalone", *SCRIPT],
        {"nnodes": 1, "nproc_per_node": 1, "master_addr": None, "master_port": 0},
        "--standalone",
    ),
    _case(
        ["--standalone", "--rdzv-endpoint", "h:1", "--rdzv-id", "x", *SCRIPT],
        {"master_addr": None, "master_port": 0, "run_id": None},
        "--standalone-ignores-rdzv-as-torchrun",
    ),
    _case(
        ["--rdzv-endpoint", "n0:29400", "--rdzv-backend", "c10d", *SCRIPT],
        {"master_addr": "n0", "master_port": 29400},
        "--rdzv-endpoint",
    ),
    _case(
        ["--rdzv_endpoint=n0", "--rdzv_backend=c10d", *SCRIPT],
        {"master_addr": "n0", "master_port": 29400},
        "--rdzv_endpoint-c10d-default-port",
    ),
    _case(
        ["--rdzv-endpoint=[fe80::1]:29401", "--rdzv-backend=c10d", *SCRIPT],
        {"master_addr": "fe80::1", "master_port": 29401},
        "--rdzv-endpoint-ipv6",
    ),
    _case(
        ["--rdzv-endpoint=127.0.0.1:0", "--rdzv-backend=c10d", *SCRIPT],
        {"master_addr": "127.0.0.1", "master_port": 0},
        "--rdzv-endpoint-port-0-free",
    ),
    _case(["--rdzv-backend", "static", *SCRIPT], {"master_port": None}, "--rdzv-backend-static"),
    _case(["--rdzv-id", "job42", *SCRIPT], {"run_id": "job42"}, "--rdzv-id"),
    _case(["--rdzv_id=job42", "--run-id", "job42", *SCRIPT], {"run_id": "job42"}, "--rdzv_id"),
    _case(["--role", "trainer", *SCRIPT], {"role": "trainer"}, "--role"),
    _case(SCRIPT, {"role": "default", "grace_s": 10.0}, "defaults"),
    _case(["--shutdown-timeout", "30", *SCRIPT], {"grace_s": 30.0}, "--shutdown-timeout"),
    _case(["--grace-s", "3", *SCRIPT], {"grace_s": 3.0}, "--grace-s"),
    _case(["--nproc", "2", "--", "python", "t.py"], {"nproc": 2}, "runwatch-nproc"),
    _case(
        ["--nproc", "2", "--standalone", *SCRIPT],
        {"nproc": 2, "nnodes": None, "master_port": 0},
        "runwatch-nproc-with-standalone",
    ),
    _case(
        ["--signals-to-handle", "SIGTERM,SIGINT", *SCRIPT],
        {"no_effect": ()},
        "--signals-to-handle-default",
    ),
    _case(
        SCRIPT, {"command": ("/opt/py", "-u", *SCRIPT)}, "PYTHON_EXEC", {"PYTHON_EXEC": "/opt/py"}
    ),
    _case(SCRIPT, {"nproc_per_node": None}, "under-srun-slurm-sizes", SRUN),
    _case(
        SCRIPT,
        {"nproc_per_node": 4, "nnodes": 2, "node_rank": 1, "master_addr": "m", "master_port": 5},
        "PET_variables",
        {
            "PET_NPROC_PER_NODE": "4",
            "PET_NNODES": "2",
            "PET_NODE_RANK": "1",
            "PET_MASTER_ADDR": "m",
            "PET_MASTER_PORT": "5",
        },
    ),
    _case(
        ["--nproc-per-node", "2", *SCRIPT],
        {"nproc_per_node": 2},
        "a-flag-wins-over-PET",
        {"PET_NPROC_PER_NODE": "4"},
    ),
    _case(
        ["--rdzv-endpoint", "n0:29400", *SCRIPT],
        {"master_addr": "n0", "master_port": 29400},
        "the-endpoint-wins-over-PET_MASTER",
        {"PET_MASTER_ADDR": "other", "PET_MASTER_PORT": "1"},
    ),
]


@pytest.mark.parametrize(("argv", "environ", "want"), MAPPED)
def test_a_torchrun_flag_means_the_same_here(argv, environ, want):
    got = settings(*argv, environ=environ)
    assert {name: getattr(got, name) for name in want} == want


NO_EFFECT = [
    pytest.param(["--tee", "3"], "-t", id="--tee"),
    pytest.param(["-t", "3"], "-t", id="-t"),
    pytest.param(["--redirects", "3"], "-r", id="--redirects"),
    pytest.param(["--log-dir", "/tmp/l"], "--log-dir", id="--log-dir"),
    pytest.param(["--log_dir=/tmp/l"], "--log-dir", id="--log_dir"),
    pytest.param(["--local-ranks-filter", "0"], "--local-ranks-filter", id="--local-ranks-filter"),
    pytest.param(["--log-line-prefix-template", "x"], "--log-line-prefix", id="--log-line-prefix"),
    pytest.param(["--monitor-interval", "1"], "--monitor-interval", id="--monitor-interval"),
    pytest.param(["--start-method", "fork"], "--start-method", id="--start-method"),
    pytest.param(["--event-log-handler", "x"], "--event-log-handler", id="--event-log-handler"),
    pytest.param(["--rdzv-conf", "join_timeout=900"], "--rdzv-conf", id="--rdzv-conf"),
    pytest.param(["--local-addr", "10.0.0.2"], "--local-addr", id="--local-addr"),
    pytest.param(["--logs-specs", "x"], "--logs-specs", id="--logs-specs"),
]


@pytest.mark.parametrize(("flags", "named"), NO_EFFECT)
def test_console_and_agent_flags_are_accepted_and_said_to_have_no_effect(flags, named):
    got = settings(*flags, *SCRIPT)
    assert got.command == RUN
    (line,) = got.no_effect
    assert line.startswith(named) and ": " in line


REFUSED = [
    pytest.param(["--rdzv-backend", "etcd"], "--rdzv-backend etcd: ", id="--rdzv-backend-etcd"),
    pytest.param(["--rdzv_backend=etcd-v2"], "--rdzv-backend etcd-v2: ", id="--rdzv_backend"),
    pytest.param(["--numa-binding", "node"], "--numa-binding: ", id="--numa-binding"),
    pytest.param(["--virtual-local-rank"], "--virtual-local-rank: ", id="--virtual-local-rank"),
    pytest.param(
        ["--signals-to-handle", "SIGTERM,SIGUSR1"], "--signals-to-handle SIGUSR1", id="SIGUSR1"
    ),
    pytest.param(["--nnodes", "4:2"], "0 < MIN <= MAX", id="--nnodes-MIN>MAX"),
    pytest.param(["--nnodes", "two"], "--nnodes must be N or MIN:MAX", id="--nnodes-word"),
    pytest.param(
        ["--nnodes", "2:4", "--min-nnodes", "3"], "already says --min-nnodes 2", id="min-nnodes"
    ),
    pytest.param(["--nproc-per-node", "many"], "--nproc-per-node must be", id="nproc-word"),
    pytest.param(["--standalone", "--nnodes", "2"], "--standalone is one node", id="standalone"),
    pytest.param(
        ["--rdzv-endpoint", "n0:1", "--master-addr", "n1"], "name two places", id="two-places"
    ),
    pytest.param(
        ["--rdzv-endpoint", "n0"], "names no port (the static backend", id="static-no-port"
    ),
    pytest.param(["--rdzv-endpoint", "n0:x"], "must be HOST[:PORT]", id="endpoint-bad-port"),
    pytest.param(
        ["--rdzv-backend", "c10d", "--rdzv-endpoint", "n0", "--nnodes", "2"],
        "c10d numbers nodes in the order they join",
        id="c10d-without-node-rank",
    ),
    pytest.param(["--rdzv-id", "a", "--run-id", "b"], "name two runs", id="two-run-ids"),
    pytest.param(["--shutdown-timeout", "5", "--grace-s", "3"], "say two graces", id="two-graces"),
    pytest.param(["--no-python", "-m"], "do not go together", id="no-python-with-module"),
]


@pytest.mark.parametrize(("flags", "message"), REFUSED)
def test_what_cannot_mean_the_same_is_refused_in_one_line(flags, message):
    with pytest.raises(UsageError, match=None) as info:
        settings(*flags, *SCRIPT)
    text = str(info.value)
    assert message in text and "\n" not in text, text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(
            ["-m", "--", "python", "t.py"], "-m/--module shapes a script", id="-m-with---"
        ),
        pytest.param(["--"], "no command after --", id="nothing-after---"),
        pytest.param([], "no command: runwatch launch", id="no-command"),
    ],
)
def test_the_two_forms_of_the_command(argv, message):
    with pytest.raises(UsageError, match=message):
        settings(*argv)


def test_pet_virtual_local_rank_is_refused_too():
    with pytest.raises(UsageError, match="PET_VIRTUAL_LOCAL_RANK: runwatch gives LOCAL_RANK"):
        settings(*SCRIPT, environ={"PET_VIRTUAL_LOCAL_RANK": "1"})


def test_a_two_node_torchrun_line_resolves_to_node_1_of_2():
    line = ["--nnodes=2", "--nproc_per_node=4", "--node_rank=1", "--rdzv-backend=c10d"]
    line += ["--rdzv-endpoint=10.0.0.1:29400", "--rdzv-id=job7", "--max-restarts=2", *SCRIPT]
    parser = argparse.ArgumentParser()
    launch.configure(parser)
    plan = launch.resolve(parser.parse_args(line), {}, devices=_devices)
    t = plan.topology
    assert (t.nnodes, t.node_rank, t.nproc_per_node, t.world_size) == (2, 1, 4, 8)
    assert (t.master_addr, t.master_port, t.max_restarts) == ("10.0.0.1", 29400, 2)
    assert plan.run_id == "job7" and plan.state_dir.name == "node1"
    assert plan.settings.command[1:] == ("-u", *SCRIPT)


def test_an_elastic_torchrun_line_may_shrink_to_its_minimum():
    line = ["--nnodes=1:2", "--nproc-per-node=1", "--node-rank=0", "--master-addr=h"]
    parser = argparse.ArgumentParser()
    launch.configure(parser)
    plan = launch.resolve(parser.parse_args([*line, "--run-id", "r", *SCRIPT]), {})
    assert (plan.topology.nnodes, plan.topology.min_nnodes) == (2, 1)


def test_the_cli_refuses_in_one_line_and_exit_status_2(capsys, tmp_path):
    base = ["launch", "--state-dir", str(tmp_path), "--bootstrap", "127.0.0.1:1"]
    assert main([*base, "--rdzv-backend", "etcd", "--rdzv-endpoint", "e:2379", *SCRIPT]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--rdzv-backend etcd:" in err, err


def test_the_module_names_the_default_run_id():
    plan = launch.resolve(argparse.Namespace(**_namespace(["-m", "pkg.train_lm"])), {})
    assert plan.run_id.startswith("train_lm-")


def _namespace(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    launch.configure(parser)
    return vars(parser.parse_args(argv))
