"""compose/docker-compose.yml run for real: three brokers, two processors, sinks, Prometheus.

The images are built locally (compose/images/build.sh: idempotent, seconds when nothing
changed), the stack comes up under its own project name on free loopback ports (host
networking), runs stream from the host through `RunEmitter`, one processor container is
SIGKILLed mid-stream, and the survivor must carry every run to its verdict with nothing lost;
every audit agrees, Prometheus has scraped the exporter, and `down` leaves nothing behind.

The stack runs with per-role users and ACLs: the test makes every user's password file, the
host's trainers log in as trainer, and everything else the host reads (groups, changelogs,
the audit) it reads with the sinks' read-only login.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from runwatch import admin
from runwatch.broker.security import users
from runwatch.cmd.audit import render
from runwatch.processors.audit import audit, load_run_log
from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.fleet import RunView, committed_offsets, latest_states
from runwatch.processors.logread import LogReader
from runwatch.schemas.topics import DEFAULT_PARTITIONS, names

from ..processors.harness import Reader, Trainer, group_members, one_run_per_partition, short

UP_S = 600.0  # a cold 2-core machine: three JVMs, two faust workers, the sinks' replay
TEST_S = 420.0
"""Each test's own budget, every wait of it included (`Budget`). On this 2-core box the stack
comes up in ~60 s and the takeover test waits ~6 s in all; CI's box once spent more than the
300 s pytest-timeout allowed for the stack and the takeover together."""

# pytest-timeout counts a test's fixtures too: the first test of the module also pays for
# the stack coming up (`UP_S`), so the outer guard is both budgets; every wait fails on the
# test's own budget first, naming what it waited for and what it last saw.
pytestmark = [
    pytest.mark.integration,
    pytest.mark.deploy,
    pytest.mark.timeout(UP_S + TEST_S + 60.0),
]

REPO = Path(__file__).resolve().parents[3]
COMPOSE_FILE = REPO / "compose" / "docker-compose.yml"
BUILD = REPO / "compose" / "images" / "build.sh"
PREFIX = "runwatch"  # the compose default: the stack is this test's alone (its own volumes)
APP_ID = f"{PREFIX}-processors"
STEPS = 40
KILL_AFTER = 20  # steps 1..20 with both workers, 21..40 with the survivor
SPIKE_AT = 32
USERS = users()
"""The Kafka users the stack's brokers create: one password file each."""


def _docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    done = subprocess.run(["docker", "info"], capture_output=True, timeout=30, check=False)
    return done.returncode == 0


def _compose_cmd() -> list[str] | None:
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cmd[0]) is None:
            continue
        done = subprocess.run([*cmd, "version"], capture_output=True, timeout=30, check=False)
        if done.returncode == 0:
            return cmd
    return None


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


class Budget:
    """One test's time: every wait draws on it, and each says how long it took.

    The phases are printed as they end (pytest shows them with a failure), so a run that
    ran out of time says where the time went.
    """

    def __init__(self, total_s: float = TEST_S) -> None:
        self.deadline = time.monotonic() + total_s

    def left_s(self) -> float:
        """Seconds left of the test's budget (0 when spent)."""
        return max(0.0, self.deadline - time.monotonic())

    def wait(
        self,
        what: str,
        probe: Callable[[], Any],
        done: Callable[[Any], bool],
        show: Callable[[Any], str] = repr,
    ) -> Any:
        """Probe until ``done(probe())``; an AssertionError naming ``what`` when out of time.

        ``show`` renders the last probe's value for that error (its first 4,000 characters).
        """
        start = time.monotonic()
        while True:
            value = probe()
            if done(value):
                print(f"{what}: {time.monotonic() - start:.1f} s")
                return value
            if time.monotonic() > self.deadline:
                raise AssertionError(
                    f"timed out waiting for {what} after {time.monotonic() - start:.0f} s; "
                    f"last: {show(value)[:4000]}"
                )
            time.sleep(1.0)  # polling the stack's state, not synchronising on time


@dataclass
class Stack:
    """A running compose project and how to reach it from the host."""

    compose: list[str]
    project: str
    env: dict[str, str]
    bootstrap: str
    prometheus_url: str
    users: Path

    def login(self, user: str) -> dict[str, str]:
        """kafka-python's settings to log in as ``user`` (a role, or admin)."""
        return {
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_plain_username": user,
            "sasl_plain_password": (self.users / user).read_text(),
        }

    def run(self, *args: str, timeout_s: float = 120.0) -> str:
        cmd = [*self.compose, "-p", self.project, "-f", str(COMPOSE_FILE), *args]
        done = subprocess.run(
            cmd, env=self.env, capture_output=True, text=True, timeout=timeout_s, check=False
        )
        assert done.returncode == 0, f"{' '.join(args)}: {done.stdout}\n{done.stderr}"
        return done.stdout

    def containers(self, service: str | None = None, *, all_states: bool = False) -> list[str]:
        labels = [f"label=com.docker.compose.project={self.project}"]
        if service:
            labels.append(f"label=com.docker.compose.service={service}")
        args = ["docker", "ps", "-q", *(["-a"] if all_states else [])]
        for label in labels:
            args += ["--filter", label]
        out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=30)
        return out.stdout.split()

    def running(self, container: str) -> bool:
        out = subprocess.run(
            ["docker", "inspect", "-f", "{{.State.Running}}", container],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
        return out.stdout.strip() == "true"

    def logs(self) -> str:
        cmd = [*self.compose, "-p", self.project, "-f", str(COMPOSE_FILE), "logs", "--tail", "40"]
        done = subprocess.run(
            cmd, env=self.env, capture_output=True, text=True, timeout=120, check=False
        )
        return done.stdout + done.stderr

    def down(self) -> None:
        self.run("down", "-v", "--remove-orphans", "-t", "30", timeout_s=300)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if not _docker_answers():
        pytest.skip("no Docker engine answers (`docker info` failed): start dockerd")
    compose = _compose_cmd()
    if compose is None:
        pytest.skip("neither `docker compose` nor `docker-compose` is installed")
    built = subprocess.run(
        [str(BUILD)],
        env={**os.environ, "PYTHON": os.environ.get("PYTHON", _venv_python())},
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    assert built.returncode == 0, f"building the images failed:\n{built.stderr}"

    tmp = tmp_path_factory.mktemp("compose")
    k1, k2, k3, c1, c2, c3, metrics, prom, am = _free_ports(9)
    key = tmp / "command_key"
    key.write_text(uuid.uuid4().hex + uuid.uuid4().hex)
    key.chmod(0o444)  # the services run as uid 10001
    users_dir = tmp / "kafka-users"  # one password per user, read by brokers and services
    users_dir.mkdir()
    for user in USERS:
        (users_dir / user).write_text(uuid.uuid4().hex)  # no trailing newline
        (users_dir / user).chmod(0o444)
    users_dir.chmod(0o755)
    config = yaml.safe_load((REPO / "compose" / "prometheus" / "prometheus.yml").read_text())
    targets = {
        "runwatch-sinks": f"127.0.0.1:{metrics}",
        "prometheus": f"127.0.0.1:{prom}",
        "alertmanager": f"127.0.0.1:{am}",
    }
    for job in config["scrape_configs"]:
        job["static_configs"] = [{"targets": [targets[job["job_name"]]]}]
    config["alerting"]["alertmanagers"] = [{"static_configs": [{"targets": [f"127.0.0.1:{am}"]}]}]
    config["global"]["scrape_interval"] = "2s"  # the shipped 15 s, shortened for the test
    prom_file = tmp / "prometheus.yml"
    prom_file.write_text(yaml.safe_dump(config))
    prom_file.chmod(0o444)
    empty_env = tmp / "empty.env"  # never the developer's compose/.env
    empty_env.write_text("")
    remove_abandoned_stacks()
    project = f"{PROJECT_PREFIX}{os.getpid()}x{uuid.uuid4().hex[:6]}"
    ports = {
        "KAFKA_1_PORT": k1,
        "KAFKA_2_PORT": k2,
        "KAFKA_3_PORT": k3,
        "KAFKA_1_CONTROLLER_PORT": c1,
        "KAFKA_2_CONTROLLER_PORT": c2,
        "KAFKA_3_CONTROLLER_PORT": c3,
        "RUNWATCH_METRICS_PORT": metrics,
        "PROMETHEUS_PORT": prom,
        "ALERTMANAGER_PORT": am,
    }
    bootstrap = f"127.0.0.1:{k1},127.0.0.1:{k2},127.0.0.1:{k3}"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RUNWATCH_", "KAFKA_"))},
        **{k: str(v) for k, v in ports.items()},
        "RUNWATCH_BOOTSTRAP": bootstrap,
        "RUNWATCH_COMMAND_KEY_PATH": str(key),
        "RUNWATCH_KAFKA_USERS_DIR": str(users_dir),
        "PROMETHEUS_CONFIG": str(prom_file),
        "KAFKA_CLUSTER_ID": admin_cluster_id(),
        "GRAFANA_ADMIN_PASSWORD": uuid.uuid4().hex,  # required by the file, Grafana not started
    }
    compose = [*compose, "--env-file", str(empty_env)]
    running = Stack(compose, project, env, bootstrap, f"http://127.0.0.1:{prom}", users_dir)
    host_login = {
        "RUNWATCH_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "RUNWATCH_SASL_MECHANISM": "SCRAM-SHA-512",
        "RUNWATCH_SASL_USERNAME": "sinks",
        "RUNWATCH_SASL_PASSWORD_FILE": str(users_dir / "sinks"),
    }
    saved = {k: os.environ.get(k) for k in host_login}
    os.environ.update(host_login)  # the host reads as the sinks' read-only user
    try:
        start = time.monotonic()
        running.run("up", "-d", timeout_s=UP_S)
        print(f"the stack up: {time.monotonic() - start:.1f} s")
        yield running
    except BaseException:
        print(running.logs())
        raise
    finally:
        running.down()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


PROJECT_PREFIX = "rwtest"
"""A test stack's project is ``rwtest<pid>x<hex>``: the pid of the pytest that made it."""


def remove_abandoned_stacks() -> None:
    """Remove the containers and volumes of test stacks whose pytest is gone.

    A test run killed before its teardown leaves its stack behind, and the services'
    ``restart: unless-stopped`` brings it back whenever the Docker engine starts: four JVMs
    and workers loading every later test and bench on the box. A stack whose pytest still
    runs (another session on the same box) is left alone.
    """
    out = subprocess.run(
        ["docker", "ps", "-a", "--filter", "label=com.docker.compose.project",
         "--format", '{{.ID}} {{.Label "com.docker.compose.project"}}'],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    abandoned: dict[str, list[str]] = {}
    for line in out.splitlines():
        container, _, project = line.partition(" ")
        pid = project.removeprefix(PROJECT_PREFIX).partition("x")[0]
        if project.startswith(PROJECT_PREFIX) and pid.isdigit() and not _alive(int(pid)):
            abandoned.setdefault(project, []).append(container)
    for project, containers in abandoned.items():
        subprocess.run(["docker", "rm", "-f", "-v", *containers], check=True, timeout=120,
                       capture_output=True)  # fmt: skip
        volumes = subprocess.run(
            ["docker", "volume", "ls", "-q", "--filter",
             f"label=com.docker.compose.project={project}"],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout.split()  # fmt: skip
        if volumes:
            subprocess.run(["docker", "volume", "rm", *volumes], check=True, timeout=120,
                           capture_output=True)  # fmt: skip
        print(f"removed the abandoned test stack {project}: {len(containers)} containers")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def _venv_python() -> str:
    import sys

    return sys.executable


def admin_cluster_id() -> str:
    """A fresh KRaft cluster id (22 base64url characters) for this stack's volumes."""
    import base64

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode().replace("-", "A")


def _counts(view: RunView | None) -> tuple[int | None, int | None]:
    """A run's steps observed and heartbeats counted (None: no such state yet)."""
    steps = view.steps.steps_observed if view and view.steps else None
    heartbeats = view.liveness.heartbeats if view and view.liveness else None
    return steps, heartbeats


def _applied(views: dict[str, RunView], runs: list[str]) -> bool:
    return all(_counts(views.get(r)) == (STEPS, 2 * STEPS) for r in runs)


def _short_of_applied(views: dict[str, RunView], runs: list[str]) -> str:
    """The runs whose counts are not (yet) exact: fewer is a stall, more is a double apply."""
    off = {r: _counts(views.get(r)) for r in runs if _counts(views.get(r)) != (STEPS, 2 * STEPS)}
    return (
        f"{len(off)} of {len(runs)} runs off (steps, heartbeats) = ({STEPS}, {2 * STEPS}): "
        + ", ".join(f"{r} {c}" for r, c in off.items())
    )


def _group_lag(bootstrap: str) -> str:
    """The processors' group: each input partition whose commit is behind its end offset."""
    from kafka import TopicPartition

    try:
        committed = committed_offsets(bootstrap, APP_ID)
        with LogReader(bootstrap) as reader:
            ends = reader.end_offsets([TopicPartition(t, p) for t, p in committed])
    except Exception as exc:  # a diagnostic: say why it is missing, never mask the failure
        return f"group offsets unreadable: {exc!r}"
    lag = {tp: end - committed[tp.topic, tp.partition] for tp, end in ends.items()}
    behind = sorted((tp for tp in lag if lag[tp]), key=lambda tp: (-lag[tp], tp))
    most = ", ".join(f"{tp.topic}[{tp.partition}] {lag[tp]}" for tp in behind[:12])
    return f"the group's commits: {len(behind)} of {len(lag)} partitions behind their end" + (
        f"; the most behind (records): {most}" if behind else ""
    )


def _worker_log(container: str, lines: int = 200) -> str:
    """A processors container's log (timestamped), its last ``lines`` that say something.

    faust's recovery tables (a row per changelog partition, hundreds per rebalance) and the
    batch path's stats lines are left out: they would crowd out everything else.
    """
    done = subprocess.run(
        ["docker", "logs", "--timestamps", container],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    kept = [
        line
        for line in (done.stdout + done.stderr).splitlines()
        if not line.partition(" ")[2].startswith(("|", "+")) and "batch path stats" not in line
    ]
    return "\n".join(kept[-lines:])


def _explain_failure(stack: Stack, containers: list[str]) -> None:
    """Print what a failed takeover leaves to read: the group's lag and each worker's log."""
    print(_group_lag(stack.bootstrap))
    for container in containers:
        print(f"----- processors container {container[:12]} -----")
        print(_worker_log(container))


def _feed(trainers: dict[str, Trainer], first: int, last: int) -> None:
    """Step every run through ``first..last``, every run's step delivered before the next.

    The runs' deliveries of one step overlap (one flush round per step, not one per run:
    a flush is a round trip to three brokers, ~50 ms here, so flushing run by run made the
    feed most of the test's time).
    """
    for s in range(first, last + 1):
        for t in trainers.values():
            t.step(s, loss=9.0 if s == SPIKE_AT else None, flush=False)
        for t in trainers.values():
            t.flush()


def test_a_processor_killed_mid_stream_the_other_takes_over(stack: Stack) -> None:
    # The test's own readers (the changelogs, the anomalies, the audit's log) read with the
    # host's login, the sinks' read-only one (the stack fixture's): what an operator's
    # `runwatch status` and `runwatch ui` may read is enough to check the takeover.
    rule = admin.cluster_replication(stack.bootstrap)
    assert (rule.factor, rule.min_insync) == (3, 2)
    with admin.admin_client(stack.bootstrap) as client:
        (steps,) = client.describe_topics([names(PREFIX).steps])
    assert {len(p["replica_nodes"]) for p in steps["partitions"]} == {3}  # `topics` chose it
    processors = stack.containers("processors")
    assert len(processors) == 2, processors
    budget = Budget()
    budget.wait(
        "both workers in the group",
        lambda: group_members(stack.bootstrap, APP_ID),
        lambda n: n == 2,
    )

    runs = one_run_per_partition(DEFAULT_PARTITIONS["steps"])
    trainers = {
        run: Trainer(stack.bootstrap, PREFIX, run, seed=i, client_config=stack.login("trainer"))
        for i, run in enumerate(runs)
    }
    try:
        start = time.monotonic()
        for t in trainers.values():
            t.start(0)
        _feed(trainers, 1, KILL_AFTER)
        victim, survivor = processors
        subprocess.run(["docker", "kill", victim], check=True, capture_output=True, timeout=60)
        _feed(trainers, KILL_AFTER + 1, STEPS)  # the spike comes after the kill
        print(
            f"{len(runs)} runs fed {STEPS} steps, one worker killed: {time.monotonic() - start:.1f} s"
        )
        budget.wait(
            "the survivor alone in the group",
            lambda: group_members(stack.bootstrap, APP_ID),
            lambda n: n == 1,
        )
        views = budget.wait(
            "every step and heartbeat of every run applied once",
            lambda: latest_states(stack.bootstrap, APP_ID),
            lambda v: _applied(v, runs),
            show=lambda v: _short_of_applied(v, runs),
        )
        reader = Reader(stack.bootstrap, names(PREFIX).anomalies)
        events = reader.wait_for(
            lambda ev: {e.run_id for e in ev} >= set(runs), timeout_s=budget.left_s()
        )
        reader.close()
        print(_group_lag(stack.bootstrap))
        assert not stack.running(victim) and stack.running(survivor)
    except BaseException:
        _explain_failure(stack, processors)
        raise
    finally:
        for t in trainers.values():
            t.close()

    distinct: dict[str, Any] = {}
    for e in events:
        distinct.setdefault(e.verdict_id, e)
    by_run: dict[str, list[Any]] = {}
    for e in distinct.values():
        by_run.setdefault(e.run_id, []).append(short(e))
    for run in runs:
        assert views[run].steps is not None and views[run].steps.steps_observed == STEPS
        assert by_run.get(run) == [("loss_spike", SPIKE_AT, 0)], (run, by_run)
        receipt = audit(load_run_log(stack.bootstrap, PREFIX, run), DetectorConfig())
        assert receipt.agrees, (run, render(receipt))


def _prometheus(stack: Stack, query: str) -> list[dict[str, Any]]:
    url = f"{stack.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            body = json.loads(reply.read())
    except OSError:
        return []
    return list(body["data"]["result"]) if body.get("status") == "success" else []


def test_prometheus_scraped_the_exporter(stack: Stack) -> None:
    budget = Budget()
    up = budget.wait(
        "Prometheus to scrape the sinks' exporter",
        lambda: _prometheus(stack, 'up{job="runwatch-sinks"}'),
        lambda r: bool(r) and r[0]["value"][1] == "1",
    )
    assert up[0]["metric"]["job"] == "runwatch-sinks"
    spikes = budget.wait(
        "the loss spikes in Prometheus",
        lambda: _prometheus(stack, 'sum(runwatch_anomalies_total{kind="loss_spike"})'),
        lambda r: bool(r) and float(r[0]["value"][1]) >= DEFAULT_PARTITIONS["steps"],
    )
    assert float(spikes[0]["value"][1]) == DEFAULT_PARTITIONS["steps"]


def test_prometheus_loaded_the_rules_and_found_the_alertmanager(stack: Stack) -> None:
    def get(path: str) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(f"{stack.prometheus_url}{path}", timeout=10) as reply:
                return dict(json.loads(reply.read()).get("data") or {})
        except OSError:
            return {}

    budget = Budget()
    rules = budget.wait(
        "Prometheus to load compose/prometheus/rules",
        lambda: get("/api/v1/rules"),
        lambda d: bool(d.get("groups")),
    )
    names = {r["name"] for g in rules["groups"] for r in g["rules"]}
    assert {"RunwatchProcessorsDown", "RunwatchRunStoppedReporting"} <= names
    managers = budget.wait(
        "Prometheus to find the compose Alertmanager",
        lambda: get("/api/v1/alertmanagers"),
        lambda d: bool(d.get("activeAlertmanagers")),
    )
    (active,) = managers["activeAlertmanagers"]
    assert active["url"].endswith(f":{stack.env['ALERTMANAGER_PORT']}/api/v2/alerts")


def test_a_trainer_cannot_forge_a_verdict_on_the_stack(stack: Stack) -> None:
    """The stack's brokers check ACLs: the trainer's login writes steps, never anomalies."""
    from kafka import KafkaProducer
    from kafka.errors import TopicAuthorizationFailedError

    producer = KafkaProducer(bootstrap_servers=stack.bootstrap, **stack.login("trainer"))
    try:
        producer.send(names(PREFIX).steps, key=b"forger", value=b"{}").get(timeout=30)
        with pytest.raises(TopicAuthorizationFailedError):
            producer.send(names(PREFIX).anomalies, key=b"victim", value=b"{}").get(timeout=30)
    finally:
        producer.close(timeout=5)


def test_down_leaves_nothing_running(stack: Stack) -> None:
    assert stack.containers()  # still up before
    stack.down()
    assert stack.containers(all_states=True) == []
    volumes = subprocess.run(
        [
            "docker",
            "volume",
            "ls",
            "-q",
            "--filter",
            f"label=com.docker.compose.project={stack.project}",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    assert volumes.stdout.split() == []
