"""The embedded Kafka broker: a real single-node KRaft Apache Kafka run as a local JVM process.

The jars come from Maven Central (`ensure_jars`, through Maven and
``compose/kafka-embedded/pom.xml``) into ``$RUNWATCH_HOME/kafka/<version>/libs``. A broker
keeps everything in one data directory (default ``$RUNWATCH_HOME/broker``)::

    server.properties   generated on every start (ports may change)
    kafka-logs/         the KRaft metadata log and the topic partitions (durable)
    logs/server.log     the broker's log4j2 log (rolled)
    broker.out          the JVM's stdout/stderr (WARN and above, crashes)
    broker.pid          the pid while it runs
    broker.json         the state: bootstrap address, pid, ports, data dir

Readiness is a real metadata request (DescribeCluster) answered by the broker, never a sleep.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import logging
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from runwatch.errors import RunwatchError
from runwatch.settings import runwatch_home

logger = logging.getLogger(__name__)

KAFKA_VERSION = "4.4.0"
"""The Apache Kafka release the embedded broker runs (the pom's default, passed to Maven)."""

HOST = "127.0.0.1"
"""The embedded broker listens on loopback only."""

DEFAULT_JVM_OPTS: tuple[str, ...] = (
    "-Xms64m",
    "-Xmx512m",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)
"""JVM options: a small heap, for laptops and 2-core CI machines."""

_TOOL_JVM_OPTS = ("-Xmx256m", "-Djava.awt.headless=true")  # short-lived StorageTool
_PACKAGE_ROOT = Path(__file__).resolve().parents[1]
_ASSEMBLY_DIR = _PACKAGE_ROOT / "compose" / "kafka-embedded"
_MARKER = ".runwatch-complete"
_MAIN_CLASS = "kafka.Kafka"
_STORAGE_TOOL = "kafka.tools.StorageTool"
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Fully qualified, so a failed download names the artifact rather than "no plugin for prefix".
_MAVEN_HELP_REF = re.compile(r"\s*-> \[Help \d+\]$")
_COPY_GOAL = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies"
_MAVEN_BOILERPLATE = (
    "-> [Help",
    "[Help ",
    "To see the full stack trace",
    "Re-run Maven using",
    "For more information about the errors",
    "After correcting the problems",
    "mvn <args> -rf",
)


@dataclass(frozen=True)
class BrokerInfo:
    """A running embedded broker, as recorded in its state file.

    Attributes:
        bootstrap: ``host:port`` of the PLAINTEXT listener, for clients.
        pid: Process id of the broker's JVM.
        data_dir: The broker's data directory.
        port: Client (PLAINTEXT) port.
        controller_port: KRaft controller port.
        port_auto: True when the client port was picked automatically (and may be reused).
        kafka_version: The Apache Kafka release it runs.
        startup_s: Seconds from launching the JVM to the first answered metadata request.
    """

    bootstrap: str
    pid: int
    data_dir: Path
    port: int
    controller_port: int
    port_auto: bool
    kafka_version: str = KAFKA_VERSION
    startup_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """The state-file form (paths as strings)."""
        out = asdict(self)
        out["data_dir"] = str(self.data_dir)
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> BrokerInfo:
        """Parse the state-file form; raises KeyError/TypeError/ValueError when malformed."""
        return cls(
            bootstrap=str(raw["bootstrap"]),
            pid=int(raw["pid"]),
            data_dir=Path(raw["data_dir"]),
            port=int(raw["port"]),
            controller_port=int(raw["controller_port"]),
            port_auto=bool(raw.get("port_auto", True)),
            kafka_version=str(raw.get("kafka_version", KAFKA_VERSION)),
            startup_s=float(raw.get("startup_s", 0.0)),
        )


# --------------------------------------------------------------------------- jars


def kafka_libs_dir(kafka_version: str = KAFKA_VERSION) -> Path:
    """Where the broker's jars are cached: ``$RUNWATCH_HOME/kafka/<version>/libs``."""
    return runwatch_home() / "kafka" / kafka_version / "libs"


def assembly_pom() -> Path:
    """The Maven pom that assembles the broker's jars (``compose/kafka-embedded/pom.xml``).

    Raises:
        RunwatchError: when runwatch does not run from its source tree (editable install or
            checkout), so the pom is not there.
    """
    pom = _ASSEMBLY_DIR / "pom.xml"
    if not pom.is_file():
        raise RunwatchError(
            f"cannot find {pom}: fetching the Kafka jars needs runwatch's source tree "
            "(run from the repo or `pip install -e .`)"
        )
    return pom


def _jars_complete(libs_dir: Path, kafka_version: str) -> bool:
    marker = libs_dir / _MARKER
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    jars = recorded.get("jars") if isinstance(recorded, dict) else None
    if recorded.get("kafka_version") != kafka_version or not jars:
        return False
    return all((libs_dir / jar).is_file() for jar in jars)


def _require_tool(name: str, hint: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RunwatchError(f"no `{name}` on PATH: {hint}")
    return path


def _require_java() -> str:
    return _require_tool("java", "install a Java 17+ runtime (e.g. openjdk-17-jre-headless)")


def _last_meaningful_line(output: str) -> str:
    lines = []
    for raw in output.splitlines():
        line = _ANSI_ESCAPE.sub("", raw).strip()
        if line.startswith("[ERROR]"):
            line = line[len("[ERROR]") :].strip()
        line = _MAVEN_HELP_REF.sub("", line)
        if not line or any(line.startswith(b) for b in _MAVEN_BOILERPLATE):
            continue
        lines.append(line)
    if not lines:
        return "no output"
    line = lines[-1]  # Maven puts the root cause at the end of its long error line
    return line if len(line) <= 400 else f"{line[:150]} ... {line[-250:]}"


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (created if missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_jars(
    libs_dir: Path | None = None,
    *,
    kafka_version: str = KAFKA_VERSION,
    timeout_s: float = 900.0,
) -> Path:
    """Make sure the broker's jars are in ``libs_dir``; fetch them with Maven if not.

    Runs ``mvn dependency:copy-dependencies`` on the assembly pom only when the directory
    lacks a completion marker (or a jar it lists); writes the marker after success. Safe to
    call from several processes at once (a file lock serialises the fetch).

    Args:
        libs_dir: Target directory; `kafka_libs_dir(kafka_version)` when None.
        kafka_version: Apache Kafka release to fetch.
        timeout_s: Longest the Maven run may take.

    Returns:
        The directory holding the jars.

    Raises:
        RunwatchError: no ``java`` or ``mvn`` on PATH, or Maven failed (typically Maven
            Central unreachable); the message carries Maven's last meaningful line.
    """
    libs = kafka_libs_dir(kafka_version) if libs_dir is None else libs_dir
    if _jars_complete(libs, kafka_version):
        return libs
    with _file_lock(libs.parent / ".fetch.lock"):
        if _jars_complete(libs, kafka_version):
            return libs
        _require_java()
        mvn = _require_tool("mvn", "install Maven 3.6+ (e.g. apt-get install maven) to fetch Kafka")
        pom = assembly_pom()
        libs.mkdir(parents=True, exist_ok=True)
        cmd = [
            mvn,
            "-q",
            "-B",
            "-Dstyle.color=never",
            "-f",
            str(pom),
            f"-Dkafka.version={kafka_version}",
            f"-Dkafka.libs.dir={libs}",
            _COPY_GOAL,
        ]
        logger.warning(
            "fetching Apache Kafka %s jars from Maven Central into %s", kafka_version, libs
        )
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise RunwatchError(
                f"mvn took over {timeout_s:.0f} s fetching Kafka {kafka_version} jars "
                "(is Maven Central reachable?)"
            ) from exc
        if done.returncode != 0:
            line = _last_meaningful_line(done.stdout + "\n" + done.stderr)
            raise RunwatchError(
                f"mvn failed fetching Kafka {kafka_version} jars (is Maven Central reachable?): "
                f"{line}"
            )
        jars = sorted(p.name for p in libs.glob("*.jar"))
        if f"kafka_2.13-{kafka_version}.jar" not in jars:
            raise RunwatchError(f"mvn succeeded but {libs} has no kafka_2.13-{kafka_version}.jar")
        _write_json(libs / _MARKER, {"kafka_version": kafka_version, "jars": jars})
        return libs


# --------------------------------------------------------------------------- processes


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(tmp, path)


def _proc_state(pid: int) -> str | None:
    """The state letter from /proc/<pid>/stat (R, S, Z, ...), None when unreadable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[0]


def _is_broker_process(pid: int) -> bool:
    """True if ``pid`` is alive (not a zombie) and, where /proc tells, runs ``kafka.Kafka``."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if _proc_state(pid) == "Z":
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # no /proc (macOS): trust the pid
    return _MAIN_CLASS.encode() in cmdline


def _reap(pid: int) -> None:
    """Collect ``pid``'s exit status if it is our child, so it leaves no zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _wait_pid_exit(pid: int, timeout_s: float) -> bool:
    """Wait until ``pid`` exits (an event on Linux via pidfd); True if it did in time."""
    if not _is_broker_process(pid):
        return True
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is not None:
        try:
            fd = pidfd_open(pid)
        except ProcessLookupError:
            return True
        except OSError:
            fd = -1
        if fd >= 0:
            try:
                poller = select.poll()
                poller.register(fd, select.POLLIN)
                return bool(poller.poll(max(0.0, timeout_s) * 1000))
            finally:
                os.close(fd)
    deadline = time.monotonic() + timeout_s  # no pidfd: poll the pid
    while time.monotonic() < deadline:
        if not _is_broker_process(pid):
            return True
        time.sleep(0.1)
    return not _is_broker_process(pid)


def _port_free(port: int, host: str = HOST) -> bool:
    """True if nothing listens on ``host:port`` (a TIME_WAIT leftover counts as free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _pick_port(host: str = HOST, avoid: Sequence[int] = ()) -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in avoid:
            return port


def _random_cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding, no leading '-'."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


def _tail(path: Path, lines: int) -> list[str]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-lines:]


# --------------------------------------------------------------------------- the broker


def default_data_dir() -> Path:
    """The embedded broker's default data directory: ``$RUNWATCH_HOME/broker``."""
    return runwatch_home() / "broker"


class EmbeddedBroker:
    """A single-node KRaft Apache Kafka broker (broker and controller) in a data directory.

    The broker outlives the Python process that starts it (it runs in its own session);
    any later `EmbeddedBroker` on the same data directory finds it through the pid and state
    files. Usable as a context manager: ``with EmbeddedBroker(d) as info: ...`` starts it
    and stops it again.
    """

    def __init__(
        self,
        data_dir: Path | str | None = None,
        *,
        port: int | None = None,
        jvm_opts: Sequence[str] = DEFAULT_JVM_OPTS,
        libs_dir: Path | None = None,
        kafka_version: str = KAFKA_VERSION,
    ) -> None:
        """Describe a broker; nothing starts until `start`.

        Args:
            data_dir: Its data directory; `default_data_dir()` when None.
            port: Client port; None picks a free one (reused on later starts while free).
            jvm_opts: Options for the JVM (heap and GC).
            libs_dir: Jar directory; `kafka_libs_dir(kafka_version)` when None.
            kafka_version: Apache Kafka release to run.
        """
        self.data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
        self.data_dir = self.data_dir.expanduser().absolute()
        self.port = port
        self.jvm_opts = tuple(jvm_opts)
        self.kafka_version = kafka_version
        self.libs_dir = libs_dir
        self._proc: subprocess.Popen[bytes] | None = None

    # ---- files
    @property
    def pid_file(self) -> Path:
        """The pid file, present while the broker runs."""
        return self.data_dir / "broker.pid"

    @property
    def state_file(self) -> Path:
        """The JSON state file (bootstrap, pid, ports); kept after stop for port reuse."""
        return self.data_dir / "broker.json"

    @property
    def log_file(self) -> Path:
        """The broker's log4j2 log."""
        return self.data_dir / "logs" / "server.log"

    @property
    def out_file(self) -> Path:
        """The JVM's captured stdout and stderr."""
        return self.data_dir / "broker.out"

    @property
    def properties_file(self) -> Path:
        """The generated ``server.properties``."""
        return self.data_dir / "server.properties"

    @property
    def kafka_log_dir(self) -> Path:
        """Kafka's ``log.dirs``: metadata log and partitions."""
        return self.data_dir / "kafka-logs"

    # ---- state
    def _read_state(self) -> BrokerInfo | None:
        try:
            return BrokerInfo.from_json(json.loads(self.state_file.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _read_pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def running(self, *, clean_stale: bool = True) -> BrokerInfo | None:
        """The running broker of this data directory, or None.

        Args:
            clean_stale: Remove a pid file whose process is gone (and log a warning saying so).
        """
        if not self.pid_file.exists():
            return None
        pid = self._read_pid()
        if pid is not None and _is_broker_process(pid):
            state = self._read_state()
            if state is not None and state.pid == pid:
                return state
            return None  # starting right now (pid written, state not yet)
        if clean_stale:
            with contextlib.suppress(FileNotFoundError):
                self.pid_file.unlink()
            logger.warning("removed stale pid file %s (pid %s is not running)", self.pid_file, pid)
        return None

    # ---- start
    def _choose_ports(self, previous: BrokerInfo | None) -> tuple[int, int, bool]:
        if self.port is not None:
            if not _port_free(self.port):
                raise RunwatchError(
                    f"port {self.port} on {HOST} is taken: stop what listens there or choose "
                    "another with --port"
                )
            port, auto = self.port, False
        elif previous is not None and previous.port_auto and _port_free(previous.port):
            port, auto = previous.port, True
        else:
            port, auto = _pick_port(), True
        if (
            previous is not None
            and previous.controller_port != port
            and _port_free(previous.controller_port)
        ):
            controller_port = previous.controller_port
        else:
            controller_port = _pick_port(avoid=(port,))
        return port, controller_port, auto

    def _write_properties(self, port: int, controller_port: int) -> None:
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{HOST}:{controller_port}",
            "listeners": f"PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://{HOST}:{port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.kafka_log_dir),
            "num.partitions": "1",
            "default.replication.factor": "1",
            "min.insync.replicas": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "8",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "8",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            "num.network.threads": "2",
            "num.io.threads": "4",
            "num.recovery.threads.per.data.dir": "1",
            "log.retention.check.interval.ms": "60000",
        }
        body = "".join(f"{key}={value}\n" for key, value in props.items())
        self.properties_file.write_text(
            "# Generated by runwatch on every `broker start`; edits are overwritten.\n" + body
        )

    def _java_cmd(
        self, libs: Path, main: str, *args: str, jvm_opts: Sequence[str] | None = None
    ) -> list[str]:
        cmd = [_require_java(), *(self.jvm_opts if jvm_opts is None else jvm_opts)]
        log4j = _ASSEMBLY_DIR / "log4j2.xml"
        if log4j.is_file():
            cmd.append(f"-Dlog4j2.configurationFile={log4j}")
        cmd += [f"-Dkafka.logs.dir={self.data_dir / 'logs'}", "-cp", f"{libs}/*", main, *args]
        return cmd

    def _format_storage(self, libs: Path) -> None:
        if (self.kafka_log_dir / "meta.properties").is_file():
            return
        cmd = self._java_cmd(
            libs,
            _STORAGE_TOOL,
            "format",
            "--cluster-id",
            _random_cluster_id(),
            "--config",
            str(self.properties_file),
            jvm_opts=_TOOL_JVM_OPTS,
        )
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            line = _last_meaningful_line(done.stdout + "\n" + done.stderr)
            raise RunwatchError(f"formatting the broker's storage failed: {line}")

    def start(self, *, timeout_s: float = 120.0) -> BrokerInfo:
        """Start the broker (a no-op when it already runs) and wait until it answers.

        Formats the storage on the first start only; later starts reuse the data, and the
        automatically chosen port while it is still free.

        Args:
            timeout_s: Longest to wait for the first answered metadata request.

        Returns:
            The running broker.

        Raises:
            RunwatchError: no java/mvn, jars unavailable, the port is taken, or the broker
                exited or did not answer in time (with the tail of its output).
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with _file_lock(self.data_dir / ".lock"):
            current = self.running()
            if current is not None:
                if self.port is not None and current.port != self.port:
                    raise RunwatchError(
                        f"a broker already runs from {self.data_dir} on {current.bootstrap}; "
                        "stop it before choosing another port"
                    )
                logger.info("broker already running at %s", current.bootstrap)
                return current
            orphan = self._read_pid()
            if orphan is not None and _is_broker_process(orphan):
                raise RunwatchError(
                    f"a broker process (pid {orphan}) runs from {self.data_dir} without a state "
                    "file; stop it with `runwatch broker stop` first"
                )
            port, controller_port, auto = self._choose_ports(self._read_state())
            libs = ensure_jars(self.libs_dir, kafka_version=self.kafka_version)
            self._write_properties(port, controller_port)
            self._format_storage(libs)
            return self._launch(libs, port, controller_port, auto, timeout_s)

    def _launch(
        self, libs: Path, port: int, controller_port: int, auto: bool, timeout_s: float
    ) -> BrokerInfo:
        cmd = self._java_cmd(libs, _MAIN_CLASS, str(self.properties_file))
        bootstrap = f"{HOST}:{port}"
        started = time.monotonic()
        with self.out_file.open("ab") as out:
            out.write(
                f"--- runwatch: starting Kafka {self.kafka_version} on {bootstrap}\n".encode()
            )
            out.flush()
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,
            )
        self._proc = proc
        self.pid_file.write_text(f"{proc.pid}\n")
        try:
            _await_ready(bootstrap, deadline=started + timeout_s, exited=_exit_probe(proc))
        except _BrokerExited as exc:
            self._proc = None
            self.pid_file.unlink(missing_ok=True)
            raise RunwatchError(
                self._failure(f"the broker exited with status {exc.status}")
            ) from None
        except KeyboardInterrupt:
            self._terminate(proc.pid, timeout_s=15.0)
            raise
        except TimeoutError:
            self._terminate(proc.pid, timeout_s=15.0)
            raise RunwatchError(
                self._failure(f"the broker did not answer on {bootstrap} within {timeout_s:.0f} s")
            ) from None
        info = BrokerInfo(
            bootstrap=bootstrap,
            pid=proc.pid,
            data_dir=self.data_dir,
            port=port,
            controller_port=controller_port,
            port_auto=auto,
            kafka_version=self.kafka_version,
            startup_s=round(time.monotonic() - started, 2),
        )
        _write_json(self.state_file, info.to_json())
        return info

    def _failure(self, summary: str) -> str:
        tail = _tail(self.out_file, 12)
        body = "\n".join(f"  | {line}" for line in tail)
        return f"{summary} during startup; last lines of {self.out_file}:\n{body}"

    # ---- stop
    def _terminate(self, pid: int, *, timeout_s: float) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if not _wait_pid_exit(pid, timeout_s):
            logger.warning("broker pid %d ignored SIGTERM for %.0f s; killing it", pid, timeout_s)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _wait_pid_exit(pid, 10.0)
        if self._proc is not None and self._proc.pid == pid:
            self._proc.wait(timeout=10.0)
            self._proc = None
        else:
            _reap(pid)
        self.pid_file.unlink(missing_ok=True)

    def stop(self, *, timeout_s: float = 30.0) -> bool:
        """Stop the broker cleanly: SIGTERM, wait for exit, SIGKILL as the last resort.

        Args:
            timeout_s: Longest to wait for a clean shutdown before SIGKILL.

        Returns:
            True if a running broker was stopped, False if none ran.
        """
        with _file_lock(self.data_dir / ".lock") if self.data_dir.is_dir() else _no_lock():
            info = self.running()
            if info is None:
                pid = self._read_pid()
                if pid is None or not _is_broker_process(pid):
                    return False
                self._terminate(pid, timeout_s=timeout_s)  # pid file without state
                return True
            self._terminate(info.pid, timeout_s=timeout_s)
            return True

    # ---- context manager
    def __enter__(self) -> BrokerInfo:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


@contextlib.contextmanager
def _no_lock() -> Iterator[None]:
    yield


class _BrokerExited(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _exit_probe(proc: subprocess.Popen[bytes]) -> Callable[[float], int | None]:
    """A function that waits up to ``s`` seconds for ``proc`` to exit; its status or None."""

    def wait(timeout_s: float) -> int | None:
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    return wait


def _await_ready(bootstrap: str, *, deadline: float, exited: Callable[[float], int | None]) -> None:
    """Wait until the broker at ``bootstrap`` answers DescribeCluster with an unfenced broker.

    Between attempts it waits on the process's exit (``exited``), so a crash surfaces at
    once. Raises `_BrokerExited` or `TimeoutError`.
    """
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    host, _, port = bootstrap.rpartition(":")
    while True:
        status = exited(0.0)
        if status is not None:
            raise _BrokerExited(status)
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            raise TimeoutError(bootstrap)
        try:  # cheap probe first: keeps kafka-python's connection warnings out of the way
            with socket.create_connection((host, int(port)), timeout=min(1.0, remaining_s)):
                pass
        except OSError:
            status = exited(min(0.2, max(0.0, remaining_s)))
            if status is not None:
                raise _BrokerExited(status) from None
            continue
        try:
            admin = KafkaAdminClient(
                bootstrap_servers=bootstrap,
                client_id="runwatch-readiness",
                bootstrap_timeout_ms=int(min(5.0, remaining_s) * 1000),
                request_timeout_ms=int(min(10.0, max(1.0, remaining_s)) * 1000),
            )
            try:
                cluster = admin.describe_cluster()
            finally:
                admin.close()
            brokers = cluster.get("brokers") or []
            if any(not b.get("is_fenced", False) for b in brokers):
                return
        except (KafkaError, OSError) as exc:
            logger.debug("broker at %s not ready yet: %s", bootstrap, exc)
        status = exited(min(0.2, max(0.0, deadline - time.monotonic())))
        if status is not None:
            raise _BrokerExited(status)


# --------------------------------------------------------------------------- shortcuts


def running_bootstrap(data_dir: Path | None = None) -> str | None:
    """The address of the embedded broker if its state file exists and its process lives.

    Args:
        data_dir: The broker's data directory; `default_data_dir()` when None.
    """
    info = EmbeddedBroker(data_dir).running(clean_stale=False)
    return info.bootstrap if info is not None else None


@contextlib.contextmanager
def ephemeral_broker(
    data_dir: Path, *, port: int | None = None, timeout_s: float = 120.0
) -> Iterator[BrokerInfo]:
    """Run a broker in ``data_dir`` for the duration of a ``with`` block (tests, demos).

    Args:
        data_dir: Its data directory (a temporary one, typically).
        port: Client port; None picks a free one.
        timeout_s: Longest to wait for it to answer.

    Yields:
        The running broker.
    """
    broker = EmbeddedBroker(data_dir, port=port)
    info = broker.start(timeout_s=timeout_s)
    try:
        yield info
    finally:
        broker.stop()
