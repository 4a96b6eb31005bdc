"""The embedded broker's lifecycle: `EmbeddedBroker` start/stop/running and shortcuts."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from runwatch.broker._files import _file_lock, _no_lock, _tail, _write_json
from runwatch.broker.config import (
    _ASSEMBLY_DIR,
    _MAIN_CLASS,
    _STORAGE_TOOL,
    _TOOL_JVM_OPTS,
    DEFAULT_JVM_OPTS,
    HOST,
    KAFKA_VERSION,
    _choose_ports,
    _port_free,
    _random_cluster_id,
    _server_properties,
    default_data_dir,
)
from runwatch.broker.jars import _last_meaningful_line, _require_java, ensure_jars
from runwatch.broker.pids import _is_broker_process, _reap, _wait_pid_exit
from runwatch.broker.readiness import _await_ready, _BrokerExited, _exit_probe
from runwatch.broker.state import BrokerInfo, ClusterMember
from runwatch.common.errors import RunwatchError

logger = logging.getLogger("runwatch.broker")  # the package's logger, as before the split


@dataclasses.dataclass(frozen=True)
class _Launched:
    """A broker JVM just spawned, not yet answering."""

    proc: subprocess.Popen[bytes]
    port: int
    controller_port: int
    auto: bool
    started: float


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
        member: ClusterMember | None = None,
    ) -> None:
        """Describe a broker; nothing starts until `start`.

        Args:
            data_dir: Its data directory; `default_data_dir()` when None.
            port: Client port; None picks a free one (reused on later starts while free).
            jvm_opts: Options for the JVM (heap and GC).
            libs_dir: Jar directory; `kafka_libs_dir(kafka_version)` when None.
            kafka_version: Apache Kafka release to run.
            member: This broker is a node of a cluster (`EmbeddedCluster` passes it): its
                id, ports, quorum and cluster id; None: a single-node cluster of its own.
        """
        self.member = member
        if member is not None:
            port = member.port
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
            self.member.cluster_id if self.member is not None else _random_cluster_id(),
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
        with self._lock():
            launched = self._spawn()
            if isinstance(launched, BrokerInfo):
                return launched
            return self._await(launched, started_by=launched.started, timeout_s=timeout_s)

    def _lock(self) -> contextlib.AbstractContextManager[None]:
        """The data directory's advisory lock, held while starting or stopping."""
        return _file_lock(self.data_dir / ".lock")

    def _spawn(self) -> BrokerInfo | _Launched:
        """Launch the JVM without waiting for it (hold `_lock`); a running broker's info."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
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
        if self.member is None:
            port, controller_port, auto = _choose_ports(self.port, self._read_state())
            properties = _server_properties(port, controller_port, self.kafka_log_dir)
        else:
            member = self.member
            port, controller_port, auto = member.port, member.controller_port, False
            for taken in (p for p in (port, controller_port) if not _port_free(p)):
                raise RunwatchError(
                    f"port {taken} on {HOST} of node {member.node_id} is taken: stop what "
                    "listens there (the cluster's nodes keep their ports)"
                )
            properties = _server_properties(
                port,
                controller_port,
                self.kafka_log_dir,
                node_id=member.node_id,
                voters=member.voters,
                replicas=member.nodes,
            )
        libs = ensure_jars(self.libs_dir, kafka_version=self.kafka_version)
        self.properties_file.write_text(properties)
        self._format_storage(libs)
        cmd = self._java_cmd(libs, _MAIN_CLASS, str(self.properties_file))
        started = time.monotonic()
        with self.out_file.open("ab") as out:
            out.write(
                f"--- runwatch: starting Kafka {self.kafka_version} on {HOST}:{port}\n".encode()
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
        return _Launched(proc, port, controller_port, auto, started)

    def _await(self, launched: _Launched, *, started_by: float, timeout_s: float) -> BrokerInfo:
        """Wait until a `_spawn`-ed broker answers; record and return its state.

        Args:
            launched: What `_spawn` returned.
            started_by: `time.monotonic()` the ``timeout_s`` counts from.
            timeout_s: Longest to wait.
        """
        proc = launched.proc
        bootstrap = f"{HOST}:{launched.port}"
        node_id = self.member.node_id if self.member is not None else None
        try:
            _await_ready(
                bootstrap,
                deadline=started_by + timeout_s,
                exited=_exit_probe(proc),
                node_id=node_id,
            )
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
            port=launched.port,
            controller_port=launched.controller_port,
            port_auto=launched.auto,
            kafka_version=self.kafka_version,
            startup_s=round(time.monotonic() - launched.started, 2),
            node_id=node_id or 1,
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
        with self._lock() if self.data_dir.is_dir() else _no_lock():
            info = self.running()
            if info is None:
                pid = self._read_pid()
                if pid is None or not _is_broker_process(pid):
                    return False
                self._terminate(pid, timeout_s=timeout_s)  # pid file without state
                return True
            self._terminate(info.pid, timeout_s=timeout_s)
            return True

    def _live_pid(self) -> int | None:
        pid = self._read_pid()
        return pid if pid is not None and _is_broker_process(pid) else None

    def signal_stop(self) -> None:
        """Send SIGTERM to the broker, if it runs, without waiting (`stop` then waits).

        A cluster asks every node at once, so none waits on a quorum that is going away.
        """
        pid = self._live_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def kill(self, *, timeout_s: float = 30.0) -> bool:
        """SIGKILL the broker's JVM, as a crash would, and wait until it is gone.

        Args:
            timeout_s: Longest to wait for the process to disappear.

        Returns:
            True if a running broker was killed, False if none ran.
        """
        with self._lock() if self.data_dir.is_dir() else _no_lock():
            pid = self._live_pid()
            if pid is None:
                return False
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            if not _wait_pid_exit(pid, timeout_s):
                raise RunwatchError(f"broker pid {pid} survived SIGKILL for {timeout_s:.0f} s")
            if self._proc is not None and self._proc.pid == pid:
                self._proc.wait(timeout=10.0)
                self._proc = None
            else:
                _reap(pid)
            self.pid_file.unlink(missing_ok=True)
            return True

    # ---- context manager
    def __enter__(self) -> BrokerInfo:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def running_bootstrap(data_dir: Path | None = None) -> str | None:
    """The address of the embedded broker if its state file exists and its process lives.

    For a cluster's directory (`EmbeddedCluster`): every node's address, comma-separated,
    while at least one node runs.

    Args:
        data_dir: The broker's data directory; `default_data_dir()` when None.
    """
    from runwatch.broker.cluster import EmbeddedCluster, is_cluster_dir

    directory = data_dir if data_dir is not None else default_data_dir()
    if is_cluster_dir(directory):
        cluster = EmbeddedCluster(directory).running()
        return cluster.bootstrap if cluster is not None else None
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
