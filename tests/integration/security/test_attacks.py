"""Issue 19's findings 3-5 and 9-12, each as an attacker would try them, on a real broker.

The attacker writes raw records with plain kafka-python (hand-written JSON, no runwatch
code) to topics that trainers write, or talks raw HTTP / raw socket frames to the edges.
Every test then shows the process it aimed at is still up and still does its work on a
good record sent after the bad ones.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka import KafkaProducer

from runwatch import admin
from runwatch.controller.relay import RelayServer, relay_socket_path
from runwatch.procs import ManagedProcess
from runwatch.schemas.codec import encode, encode_key
from runwatch.schemas.events import CommandRejected, Event, RestartCompleted, RestartRequested
from runwatch.schemas.records import RawRecord
from runwatch.schemas.signing import CommandKey, sign
from runwatch.schemas.topics import TopicNames, names
from runwatch.sinks.consumer import SinkLoop, start_thread
from runwatch.ui.model import WebviewData
from runwatch.ui.server import UiServer
from tests.integration.processors.harness import COMMAND_KEY, Reader
from tests.integration.sinks.test_alerts_metrics import publish
from tests.unit.sinks.events import anomaly, step
from tests.unit.sinks.recorder import Recorder

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
WAIT_S = 90.0
WAITER = (
    "import pathlib, sys, time\nwhile not pathlib.Path(sys.argv[1]).exists(): time.sleep(0.05)\n"
)
"""A rank that runs until a file exists (no torch: the controller is what is under test)."""


@pytest.fixture
def prefix(kafka_bootstrap: str) -> str:
    """A fresh prefix with the whole catalogue on the session broker."""
    name = f"x{uuid.uuid4().hex[:10]}"
    admin.create_topics(kafka_bootstrap, admin.catalogue(name, 2))
    return name


@pytest.fixture
def topics(prefix: str) -> TopicNames:
    """The fresh prefix's topic names."""
    return names(prefix)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNWATCH_")}
    env.update(RUNWATCH_COMMAND_KEY=COMMAND_KEY, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = str(REPO)
    return env


class Proc:
    """A `runwatch` subcommand as a subprocess in its own session, its output in a file."""

    def __init__(self, args: Sequence[str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runwatch.cli", *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=_env(),
            cwd=REPO,
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout_s: float = WAIT_S) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout_s}s:\n{self.log()}") from None

    def kill(self) -> None:
        """SIGKILL this process only (a gang's ranks are in sessions of their own)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def close(self) -> None:
        self.kill()
        self._log.close()


@pytest.fixture
def procs() -> Iterator[Callable[[Sequence[str], Path], Proc]]:
    made: list[Proc] = []

    def start(args: Sequence[str], log_path: Path) -> Proc:
        made.append(Proc(args, log_path))
        return made[-1]

    yield start
    for proc in made:
        proc.close()


def _raw_producer(bootstrap: str) -> KafkaProducer:
    return KafkaProducer(bootstrap_servers=bootstrap, acks="all")


def _wait_file(path: Path, proc: Proc, timeout_s: float = WAIT_S) -> None:
    """Wait for ``path`` to exist while ``proc`` runs (its state file: it is reading)."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.alive(), proc.log()
        assert time.monotonic() < deadline, f"no {path}:\n{proc.log()}"
        time.sleep(0.05)  # a file has no event to await; polled with a deadline


def _of(run_id: str, kind: type[Event], command_id: str) -> Callable[[list[Event]], bool]:
    return lambda events: any(
        isinstance(e, kind) and e.run_id == run_id and e.command_id == command_id  # type: ignore[attr-defined]
        for e in events
    )


# ---------------------------------------------------------------- finding 3


def _forged_command(run_id: str, command_id: str, signature: str, key_id: str) -> bytes:
    """The attacker's command: hand-written JSON, a public key id, a non-ASCII signature."""
    return json.dumps(
        {
            "type": "restart_requested.v1",
            "run_id": run_id,
            "ts_ns": 1,
            "command_id": command_id,
            "action": "respawn",
            "cause_verdict_id": "v",
            "cause_kind": "loss_spike",
            "incarnation": 0,
            "signature": signature,
            "key_id": key_id,
        },
        ensure_ascii=False,
    ).encode()


def test_a_non_ascii_signature_neither_kills_the_launcher_nor_its_adoption(
    kafka_bootstrap: str, prefix: str, topics: TopicNames, procs, tmp_path: Path
) -> None:
    """Finding 3: forged commands with non-ASCII signatures are rejected with a reason.

    `runwatch launch` rejects one and stays up; SIGKILLed, its successor `runwatch
    controller` reads that one again and another, rejects both, and executes the valid
    signed command that follows.
    """
    run_id = "victim3"
    key = CommandKey.from_secret(COMMAND_KEY.encode())
    state_dir, go = tmp_path / "state", tmp_path / "go"
    launcher = procs(
        [
            "launch",
            *("--bootstrap", kafka_bootstrap, "--prefix", prefix),
            *("--nproc", "1", "--run-id", run_id, "--state-dir", str(state_dir)),
            *("--launch-id", "launch-3", "--grace-s", "1", "--command-timeout", "60", "--"),
            *(sys.executable, "-c", WAITER, str(go)),
        ],
        tmp_path / "launch.log",
    )
    controller = Reader(kafka_bootstrap, topics.controller)
    producer = _raw_producer(kafka_bootstrap)
    try:
        _wait_file(state_dir / "gang.json", launcher)
        for cid, sig in (("forged-1", "é" * 64), ("forged-2", "Ω" * 64)):
            value = _forged_command(run_id, cid, sig, key.key_id)
            if cid == "forged-2":
                launcher.kill()  # the adoption must get past both
            producer.send(topics.commands, key=run_id.encode(), value=value).get(30)
            if cid == "forged-1":
                controller.wait_for(_of(run_id, CommandRejected, cid))
                assert launcher.alive(), launcher.log()
        successor = procs(["controller", "--state-dir", str(state_dir)], tmp_path / "ctl.log")
        controller.wait_for(_of(run_id, CommandRejected, "forged-2"))
        valid = sign(
            RestartRequested(
                run_id=run_id,
                ts_ns=2,
                command_id="genuine",
                action="respawn",
                cause_verdict_id="v",
                cause_kind="loss_spike",
                launch_id="launch-3",  # commands are bound to their launch (gate rule 6)
            ),
            key,
        )
        producer.send(topics.commands, key=encode_key(run_id), value=encode(valid)).get(30)
        controller.wait_for(_of(run_id, RestartCompleted, "genuine"))
        go.touch()
        assert successor.wait() == 0, successor.log()
    finally:
        go.touch()
        producer.close()
        controller.close()
    # finding 12: the state directory and the rank logs are this user's only
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
    logs = sorted((state_dir / "logs").glob("*.log"))
    assert logs and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in logs)
    reasons = [
        e.reason
        for e in controller.events
        if isinstance(e, CommandRejected) and e.command_id.startswith("forged")
    ]
    assert reasons and all("malformed signature" in r for r in reasons), reasons
    assert "Traceback" not in launcher.log() + successor.log()


# ---------------------------------------------------------------- finding 4 and "no record stops a process"

SLASHES = "/" * 100
"""Finding 4's run id: valid (under 256 characters), 307 bytes once quoted as a directory."""

TAGS = ("step.v1", "heartbeat.v1", "anomaly.v1", "run_started.v1", "run_ended.v1", "tick.v1")
TAGS += ("restart_requested.v1", "restart_completed.v1", "command_rejected.v1", "dead_letter.v1")
INT_FIELDS = ("ts_ns", "seq", "step", "rank", "tokens", "incarnation", "world_size")
INT_FIELDS += ("final_step", "partition", "pid", "examples", "microbatches", "vocab_size")
FLOAT_FIELDS = ("loss", "step_time_s", "grad_norm", "lr", "value", "baseline", "scale", "z")
FLOAT_FIELDS += ("threshold", "peak_flops_per_s", "duration_s")
TEXT_FIELDS = ("verdict_id", "kind", "severity", "status", "reason", "command_id", "action")
TEXT_FIELDS += ("host", "detail", "cause_verdict_id", "cause_kind", "signature", "key_id")


def _garbage() -> st.SearchStrategy[tuple[str, bytes | None, bytes]]:
    """``(topic role, key, value)``: bytes, or an event's JSON with absurd field values."""
    extreme_ints = st.sampled_from([0, -1, 2**31 - 1, 2**63 - 1, -(2**63), 2**64, 7 * 10**18])
    ints = st.one_of(extreme_ints, st.integers())
    floats = st.one_of(st.sampled_from([0.0, 5e-324, -0.0, 1e308]), st.floats())
    texts = st.one_of(
        st.sampled_from([SLASHES, "..", "*", "%2F", "hang", "critical", "é" * 300, ""]),
        st.text(max_size=40),
    )
    run_ids = st.one_of(st.sampled_from([SLASHES, "..", "*", "victim", "a/b", "%00"]), texts)
    anything = st.one_of(ints, floats, texts, st.none(), st.booleans(), st.lists(ints, max_size=2))

    @st.composite
    def event(draw: st.DrawFn) -> bytes:
        body: dict[str, object] = {"type": draw(st.sampled_from(TAGS)), "run_id": draw(run_ids)}
        for names_, values in ((INT_FIELDS, ints), (FLOAT_FIELDS, floats), (TEXT_FIELDS, texts)):
            for name in draw(st.lists(st.sampled_from(names_), max_size=5, unique=True)):
                body[name] = draw(st.one_of(values, anything))
        if draw(st.booleans()):
            body["thresholds"] = draw(st.dictionaries(texts, floats, max_size=3))
        return json.dumps(body, allow_nan=True, ensure_ascii=draw(st.booleans())).encode()

    roles = st.sampled_from(["steps", "heartbeats", "anomalies", "runs", "controller"])
    keys = st.one_of(st.none(), st.binary(max_size=300), run_ids.map(str.encode))
    values = st.one_of(event(), st.binary(max_size=200))
    return st.tuples(roles, keys, values)


def _wait_line(proc: ManagedProcess, needle: str, timeout_s: float = WAIT_S) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        text = proc.log_path.read_text(errors="replace") if proc.log_path.exists() else ""
        for line in text.splitlines():
            if needle in line:
                return line
        assert proc.returncode is None, f"{proc.name} exited:\n{proc.log_tail(60)}"
        assert time.monotonic() < deadline, f"no {needle!r}:\n{proc.log_tail(60)}"
        time.sleep(0.1)  # polling a log file: the line decides, not the sleep


def _wait_path(pattern: str, root: Path, proc: ManagedProcess) -> list[Path]:
    deadline = time.monotonic() + WAIT_S
    while not (found := sorted(root.glob(pattern))):
        assert proc.returncode is None, proc.log_tail(60)
        assert time.monotonic() < deadline, f"no {pattern} in {root}:\n{proc.log_tail(60)}"
        time.sleep(0.1)  # an archive file has no event to await; polled with a deadline
    return found


POISON_LAST_EVENT = 'runwatch_run_last_event_timestamp_seconds{run="poison"}'


def _scrape_until(proc: ManagedProcess, needle: str) -> str:
    """GET /metrics until it holds ``needle``."""
    url = f"http://127.0.0.1:{proc.metrics_port}/metrics"  # type: ignore[attr-defined]
    deadline = time.monotonic() + WAIT_S
    while True:
        with urllib.request.urlopen(url, timeout=10) as reply:
            text = reply.read().decode()
        if needle in text:
            return text
        assert proc.returncode is None, proc.log_tail(60)
        assert time.monotonic() < deadline, f"no {needle!r} in /metrics:\n{text[-3000:]}"
        time.sleep(0.2)  # a scrape is a poll; the content decides


@pytest.fixture
def sinks_proc(kafka_bootstrap: str, prefix: str, tmp_path: Path) -> Iterator[ManagedProcess]:
    """`runwatch sinks --alerts --metrics --archive` on the fresh prefix, all three read."""
    args = ["sinks", "--alerts", "--metrics", "--archive", str(tmp_path / "archive"),
            "--metrics-port", str(Recorder.free_port()), "--archive-flush-s", "0.5",
            "--group-wait-s", "0.1", "--cause-wait-s", "0", "--session-timeout", "6",
            "--state-dir", str(tmp_path / "state"),
            "--bootstrap", kafka_bootstrap, "--prefix", prefix]  # fmt: skip
    env = {**_env(), "RUNWATCH_COMMAND_KEY": ""}
    proc = ManagedProcess.runwatch("sinks", args, tmp_path / "sinks.log", env=env)
    proc.metrics_port = int(args[args.index("--metrics-port") + 1])  # type: ignore[attr-defined]
    try:
        for sink in ("alerts", "metrics", "archive"):
            _wait_line(proc, f"{sink}: assigned")
        yield proc
    finally:
        proc.stop()


def test_no_record_stops_runwatch_sinks(
    kafka_bootstrap: str, topics: TopicNames, sinks_proc: ManagedProcess, tmp_path: Path
) -> None:
    """Finding 4 and a hypothesis-made batch of garbage and absurd records.

    After them a good verdict is still alerted and a good step still archived, and the
    100-'/' run id has its (bounded) archive directory.
    """
    producer = _raw_producer(kafka_bootstrap)
    slash_step = {"type": "step.v1", "run_id": SLASHES, "ts_ns": time.time_ns()}
    slash_step |= {"step": 1, "loss": 2.5, "step_time_s": 0.5}
    producer.send(topics.steps, key=SLASHES.encode(), value=json.dumps(slash_step).encode())
    # Finding 5: a run, then a heartbeat from 2191 that used to retire every other run.
    bystander = {"type": "step.v1", "run_id": "bystander", "ts_ns": time.time_ns()}
    bystander |= {"step": 3, "loss": 2.5, "step_time_s": 0.5}
    producer.send(topics.steps, key=b"bystander", value=json.dumps(bystander).encode())
    poison = {"type": "heartbeat.v1", "run_id": "poison", "ts_ns": 7 * 10**18}
    poison |= {"rank": 0, "step": 3}
    producer.send(topics.heartbeats, key=b"poison", value=json.dumps(poison).encode())
    sent: list[int] = []

    @settings(
        max_examples=25,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(batch=st.lists(_garbage(), min_size=1, max_size=20))
    def attack(batch: list[tuple[str, bytes | None, bytes]]) -> None:
        for role, key, value in batch:
            if role == "runs" and key is None:
                key = b"unkeyed"  # the compacted runs topic refuses unkeyed records
            producer.send(getattr(topics, role), key=key, value=value)
        sent.append(len(batch))

    attack()
    producer.flush(30)
    now_s = time.time()
    publish(
        kafka_bootstrap,
        [
            (topics.anomalies, anomaly(run="good", kind="hang", step=7, ts_s=now_s)),
            (topics.steps, step(run="good", n=7, ts_s=now_s)),
        ],
    )
    producer.close()
    _wait_line(sinks_proc, "run=good hang step=7")
    archive = tmp_path / "archive"
    _wait_path("run_id=good/*.parquet", archive, sinks_proc)
    slashed = _wait_path("run_id=%2F%2F*/*.parquet", archive, sinks_proc)
    assert all(len(p.parent.name) <= 255 for p in slashed)
    metrics = _scrape_until(sinks_proc, 'runwatch_run_last_step{run="good"} 7.0')
    tracked = [x for x in metrics.splitlines() if "runs_" in x or "run_last_step{" in x]
    assert 'runwatch_run_last_step{run="bystander"} 3.0' in metrics, tracked
    # the heartbeat from 2191 is a dead letter at intake now (an event's time is bounded by
    # its record's broker stamp, docs/core.md); were it read, the exporter would bound it
    poisoned = [x for x in metrics.splitlines() if x.startswith(POISON_LAST_EVENT)]
    assert all(float(x.split()[-1]) < time.time() + 3600 for x in poisoned), poisoned
    assert sum(sent) >= 25 and sinks_proc.returncode is None, sinks_proc.log_tail(60)


class _Fragile:
    """A sink whose handling raises on one record (as a sink bug an attacker found would)."""

    name = "fragile"

    def __init__(self) -> None:
        self.seen: list[bytes] = []
        self.done = threading.Event()

    def on_assigned(self, partitions: object) -> None:
        pass

    def handle(self, records: Sequence[RawRecord], now_s: float) -> None:
        for r in records:
            if r.value == b"poison":
                raise ZeroDivisionError("the record the sink cannot take")
        for r in records:
            if r.value not in self.seen:
                self.seen.append(r.value or b"")
            if r.value == b"after":
                self.done.set()

    def tick(self, now_s: float) -> None:
        pass

    def flush(self) -> None:
        pass

    def pending_offsets(self) -> dict[tuple[str, int], int]:
        return {}

    def on_lag(self, lag: object) -> None:
        pass


def test_a_record_that_raises_in_a_sink_costs_that_record_only(
    kafka_bootstrap: str, topics: TopicNames
) -> None:
    """The sinks' shared loop: the poison record is counted once, its neighbours handled."""
    sink = _Fragile()
    stop = threading.Event()
    loop = SinkLoop(
        sink,
        bootstrap=kafka_bootstrap,
        topics=[topics.steps],
        group_id=f"{topics.steps}-fragile",
        stop=stop,
        poll_timeout_s=0.1,
    )
    thread = start_thread(loop)
    try:
        assert loop.ready.wait(WAIT_S), "no partitions assigned"
        producer = _raw_producer(kafka_bootstrap)
        for value in (b"before", b"poison", b"poison", b"after"):
            producer.send(topics.steps, key=b"one-run", value=value)
        producer.flush(30)
        producer.close()
        assert sink.done.wait(WAIT_S), loop.error
    finally:
        stop.set()
        thread.join(30)
    assert loop.error is None, loop.error
    assert sink.seen == [b"before", b"after"]
    assert loop.bad.counts == {"handle: ZeroDivisionError": 2}


# ---------------------------------------------------------------- finding 9: the relay


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def _event_frame(seq: int, topic: str, key: bytes, value: bytes) -> bytes:
    """The wire's event frame, by hand: ``E``, ``>QHH`` seq and lengths, topic, key, value."""
    raw = topic.encode()
    return _frame(b"E" + struct.pack(">QHH", seq, len(raw), len(key)) + raw + key + value)


def _outcomes(sock: socket.socket, seqs: set[int]) -> dict[int, str]:
    """Read the relay's answers until every seq in ``seqs`` has one: "" ack, else the reason."""
    sock.settimeout(WAIT_S)
    buf, out = b"", {}
    while not seqs <= set(out):
        chunk = sock.recv(65536)
        assert chunk, f"the relay closed the connection; answers so far {out}"
        buf += chunk
        while len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">I", buf[:4])[0]:
            n = struct.unpack(">I", buf[:4])[0]
            body, buf = buf[4 : 4 + n], buf[4 + n :]
            (seq,) = struct.unpack(">Q", body[1:9])
            out[seq] = "" if body[:1] == b"A" else body[9:].decode()
    return out


def _hb(run_id: str, step_n: int) -> bytes:
    return json.dumps(
        {"type": "heartbeat.v1", "run_id": run_id, "ts_ns": time.time_ns(), "rank": 0}
        | {"step": step_n}
    ).encode()


def test_the_relay_speaks_only_for_its_run_and_one_topic_never_blocks_the_others(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Finding 9: other topics, other runs' keys, other runs' events are nacked at once.

    The checkpoints topic does not exist (no metadata: its records wait with backoff);
    the steps and heartbeats sent after a checkpoint record are acked all the same.
    """
    prefix = f"x{uuid.uuid4().hex[:10]}"
    specs = [s for s in admin.catalogue(prefix, 1) if not s.name.endswith(".checkpoints")]
    admin.create_topics(kafka_bootstrap, specs)
    topics = names(prefix)
    relay = RelayServer(tmp_path / "relay.sock", kafka_bootstrap, prefix, run_ids=["mine"])
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(tmp_path / "relay.sock"))
        command = _forged_command("mine", "c", "00" * 32, "k")
        step_ = {"type": "step.v1", "run_id": "mine", "ts_ns": time.time_ns(), "step": 1}
        step_ |= {"loss": 1.0, "step_time_s": 0.1}
        ckpt = {"type": "checkpoint.v1", "run_id": "mine", "ts_ns": 1, "step": 1}
        frames = [
            (1, topics.commands, b"mine", command),
            (2, topics.heartbeats, b"theirs", _hb("theirs", 1)),
            (3, topics.heartbeats, b"mine", _hb("theirs", 1)),
            (4, topics.checkpoints, b"mine", json.dumps(ckpt).encode()),
            (5, topics.heartbeats, b"mine", _hb("mine", 1)),
            (6, topics.steps, b"mine", json.dumps(step_).encode()),
        ]
        sock.sendall(b"".join(_event_frame(*f) for f in frames) + _frame(b"F"))
        answers = _outcomes(sock, {1, 2, 3, 5, 6})
    finally:
        sock.close()
        relay.close(timeout_s=5)
    assert "input topics" in answers[1]
    assert "another run" in answers[2]
    assert "another run under this run's key" in answers[3]
    assert answers[5] == "" and answers[6] == "", answers
    assert 4 not in answers or answers[4] != ""  # the missing topic: never acked
    assert sum(relay.refused.counts.values()) == 3


def test_a_long_state_dir_puts_the_socket_in_a_private_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 9: no predictable /tmp name; a directory opened to others is refused."""
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    state_dir = tmp_path / ("s" * 120)
    path = relay_socket_path(state_dir)
    assert path.parent == runtime / f"runwatch-{os.getuid()}"
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert relay_socket_path(state_dir) == path  # the same for an adopting controller
    path.parent.chmod(0o777)  # another user's trap, say
    with pytest.raises(OSError, match="not a private directory"):
        relay_socket_path(state_dir)


# ---------------------------------------------------------------- finding 11: the web view


@pytest.fixture
def ui() -> Iterator[UiServer]:
    """`runwatch ui`'s server on a free port over a store with one run (no Kafka needed)."""
    data = WebviewData("unused:1", prefix="p", app_id="p-app")
    stamp_ms = time.time_ns() // 1_000_000  # the broker's append time: an event's bound
    data.apply([RawRecord("p.steps", 0, 0, b"r1", json.dumps(_step("r1")).encode(), stamp_ms)])
    server = UiServer(data, port=0, allow_hosts=["runwatch.example"])
    server.start()
    yield server
    server.close()


def _step(run_id: str) -> dict[str, object]:
    body = {"type": "step.v1", "run_id": run_id, "ts_ns": time.time_ns(), "step": 1}
    return body | {"loss": 1.0, "step_time_s": 0.1}


def _raw_http(server: UiServer, request: bytes) -> tuple[int, bytes]:
    """Send ``request`` as is; the status and whatever came back before the server closed."""
    host, port = server.httpd.server_address[:2]
    with socket.create_connection((str(host), int(port)), timeout=10) as sock:
        sock.sendall(request)
        reply = b""
        while b"\r\n\r\n" not in reply or len(reply) < reply.find(b"\r\n\r\n") + 40:
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    return int(reply.split(b" ", 2)[1]), reply


def _post(server: UiServer, headers: dict[str, str], path: str = "/api/runs/r1/audit") -> int:
    host, port = server.httpd.server_address[:2]
    conn = http.client.HTTPConnection(str(host), int(port), timeout=10)
    try:
        conn.request("POST", path, body=b"", headers=headers)
        return conn.getresponse().status
    finally:
        conn.close()


def _token(server: UiServer) -> str:
    host, port = server.httpd.server_address[:2]
    with urllib.request.urlopen(f"http://{host}:{port}/run/r1", timeout=10) as reply:
        page = reply.read().decode()
    start = page.index('name="runwatch-csrf" content="') + len('name="runwatch-csrf" content="')
    return page[start : page.index('"', start)]


def test_a_huge_or_negative_body_is_refused_at_once(ui: UiServer) -> None:
    """Finding 11: 400 MiB announced is a 413 without reading it; -1 and junk are 400."""
    head = "POST /api/runs/r1/audit HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\n\r\n"
    status, _ = _raw_http(ui, head.format(400 * 2**20).encode())
    assert status == 413
    for bad in ("-1", "1e9", "x"):
        status, _ = _raw_http(ui, head.format(bad).encode())
        assert status == 400, bad


def test_dns_rebinding_is_refused_by_the_host_check(ui: UiServer) -> None:
    """Finding 11: a page of evil.example rebound to 127.0.0.1 reads nothing."""
    for host, want in (("evil.example", 403), ("evil.example:8470", 403), ("localhost", 200)):
        status, _ = _raw_http(ui, f"GET /api/fleet HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        assert status == want, host
    status, _ = _raw_http(ui, b"GET /api/fleet HTTP/1.1\r\nHost: runwatch.example\r\n\r\n")
    assert status == 200  # named by --allow-host


def test_a_cross_site_form_cannot_start_an_audit(ui: UiServer) -> None:
    """Finding 11: a form POST from another site (no token, foreign Origin) is a 403."""
    host, port = ui.httpd.server_address[:2]
    me = f"{host}:{port}"
    form = {"Content-Type": "application/x-www-form-urlencoded", "Host": me}
    assert _post(ui, form | {"Origin": "http://evil.example"}) == 403
    assert _post(ui, form) == 403  # no token
    token = _token(ui)
    assert _post(ui, form | {"X-Runwatch-CSRF": token, "Origin": "http://evil.example"}) == 403
    assert _post(ui, {"X-Runwatch-CSRF": "wrong", "Host": me}) == 403
    assert not ui.auditing("r1")
    # the page's own request: its token, its origin
    assert _post(ui, {"X-Runwatch-CSRF": token, "Origin": f"http://{me}", "Host": me}) == 202


def test_a_tombstone_on_the_controller_topic_does_not_stop_runwatch_status(
    kafka_bootstrap: str, topics: TopicNames
) -> None:
    """`runwatch status` reads the controller topic for the last stacks: a record with no
    value (a tombstone anyone with write access can send) or undecodable bytes is skipped."""
    from runwatch.processors.fleet import last_stacks

    producer = _raw_producer(kafka_bootstrap)
    producer.send(topics.controller, key=b"victim", value=None)
    producer.send(topics.controller, key=b"victim", value=b"\x00not an event")
    producer.flush(30)
    producer.close()
    assert last_stacks(kafka_bootstrap, topics.controller, timeout_s=10.0) == {}
