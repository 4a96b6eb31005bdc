"""The embedded broker's lifecycle: `EmbeddedBroker` start/stop/running and shortcuts."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from runwatch.broker.acls import Scope
from runwatch.broker.config import (
    DEFAULT_JVM_OPTS,
    HOST,
    KAFKA_VERSION,
    MAIN_CLASS,
    STORAGE_TOOL,
    TOOL_JVM_OPTS,
    default_data_dir,
    pick_port,
    port_free,
    random_cluster_id,
    server_properties,
)
from runwatch.broker.files import file_lock, no_lock, tail, write_json, write_private
from runwatch.broker.jars import ensure_jars
from runwatch.broker.pids import is_broker_process, reap, wait_pid_exit
from runwatch.broker.process import Launched, java_command, run_tool, spawn, terminate
from runwatch.broker.readiness import BrokerExited, await_ready, exit_probe
from runwatch.broker.security import (
    ADMIN_USER,
    Credentials,
    ensure_credentials,
    is_secure,
    write_env_files,
)
from runwatch.broker.state import BrokerInfo, ClusterMember
from runwatch.common.errors import RunwatchError

logger = logging.getLogger("runwatch.broker")  # the package's logger, as before the split


def _choose_ports(requested: int | None, previous: BrokerInfo | None) -> tuple[int, int, bool]:
    """The client port, the controller port, and whether the client port was picked.

    Args:
        requested: The client port asked for; None picks one (reusing ``previous``'s
            automatically chosen port while it is free).
        previous: The broker's last recorded state, if any.

    Raises:
        RunwatchError: when ``requested`` is taken.
    """
    if requested is not None:
        if not port_free(requested):
            raise RunwatchError(
                f"port {requested} on {HOST} is taken: stop what listens there or choose "
                "another with --port"
            )
        port, auto = requested, False
    elif previous is not None and previous.port_auto and port_free(previous.port):
        port, auto = previous.port, True
    else:
        port, auto = pick_port(), True
    if (
        previous is not None
        and previous.controller_port != port
        and port_free(previous.controller_port)
    ):
        controller_port = previous.controller_port
    else:
        controller_port = pick_port(avoid=(port,))
    return port, controller_port, auto


class EmbeddedBroker:
    """A single-node KRaft Apache Kafka broker (broker and controller) in a data directory.

    The broker outlives the Python process that starts it (it runs in its own session);
    any later `EmbeddedBroker` on the same data directory finds it through the pid and state
    files. Usable as a context manager: ``with EmbeddedBroker(d) as info: ...`` starts it
    and stops it again.

    A secure broker (``secure=True``, or a data directory made secure before) takes
    SASL/SCRAM clients only, checks ACLs, and has a user per role
    (`runwatch.broker.security`); every start applies the roles' ACLs of its `Scope`.
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
        secure: bool = False,
        scope: Scope | None = None,
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
            secure: Make a new data directory secure (one formatted without security
                cannot be made secure). A secure directory starts secure either way.
            scope: The prefix and app id whose ACLs a secure start grants the roles;
                None: `Scope.of` the topic prefix (``RUNWATCH_TOPIC_PREFIX``, ``runwatch``).
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
        self.secure = secure
        self.scope = scope
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
        if pid is not None and is_broker_process(pid):
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
        return java_command(
            libs,
            main,
            *args,
            jvm_opts=self.jvm_opts if jvm_opts is None else jvm_opts,
            logs_dir=self.data_dir / "logs",
        )

    def _formatted(self) -> bool:
        return (self.kafka_log_dir / "meta.properties").is_file()

    def _format_storage(self, libs: Path, credentials: Credentials | None) -> None:
        if self._formatted():
            return
        cmd = self._java_cmd(
            libs,
            STORAGE_TOOL,
            "format",
            "--cluster-id",
            self.member.cluster_id if self.member is not None else random_cluster_id(),
            "--config",
            str(self.properties_file),
            *(credentials.format_arguments() if credentials is not None else ()),
            jvm_opts=TOOL_JVM_OPTS,
        )
        run_tool(cmd, "formatting the broker's storage")

    def credentials(self) -> Credentials | None:
        """The secure broker's credentials (created on its first start); None: not secure.

        Raises:
            RunwatchError: ``secure`` was asked of a data directory formatted without
                security, or of a cluster's node.
        """
        if not (self.secure or is_secure(self.data_dir)):
            return None
        if self.member is not None:
            raise RunwatchError("a cluster's nodes cannot be secure (yet): use one broker")
        if not is_secure(self.data_dir) and self._formatted():
            raise RunwatchError(
                f"{self.data_dir} holds a broker formatted without security, and a data "
                "directory's security is fixed when it is formatted: start the secure broker "
                "in another --data-dir"
            )
        return ensure_credentials(self.data_dir)

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
        with self.lock():
            launched = self.spawn()
            if isinstance(launched, BrokerInfo):
                info = launched
            else:
                info = self.await_started(
                    launched, started_by=launched.started, timeout_s=timeout_s
                )
            if info.secure:
                self.grant(info)
            return info

    def grant(self, info: BrokerInfo, scope: Scope | None = None) -> None:
        """Give a secure broker's roles their users and the ACLs of ``scope``.

        Idempotent: existing users keep their passwords, existing ACLs stay. Writes each
        user's ``credentials/<user>.env`` with the broker's current address.

        Args:
            info: The running broker.
            scope: Whose ACLs; None: the broker's `scope`, else `Scope.of` the topic prefix.

        Raises:
            RunwatchError: the broker is not secure, or Kafka refused a user or an ACL.
        """
        from runwatch import admin
        from runwatch.broker.acls import bindings, principals
        from runwatch.common.settings import topic_prefix

        credentials = self.credentials()
        if credentials is None:
            raise RunwatchError(f"the broker of {self.data_dir} is not secure: nothing to grant")
        scope = scope or self.scope or Scope.of(topic_prefix())
        as_admin = credentials.client_config(ADMIN_USER)
        roles = {u: p for u, p in credentials.passwords.items() if u != ADMIN_USER}
        admin.ensure_scram_users(info.bootstrap, roles, client_config=as_admin)
        admin.apply_acls(info.bootstrap, bindings(scope, principals()), client_config=as_admin)
        write_env_files(self.data_dir, credentials, info.bootstrap)
        logger.info("granted the roles' ACLs for prefix %s, app id %s", scope.prefix, scope.app_id)

    def lock(self) -> contextlib.AbstractContextManager[None]:
        """The data directory's advisory lock: hold it around `spawn` and `terminate`."""
        return file_lock(self.data_dir / ".lock")

    def _properties(self, credentials: Credentials | None) -> tuple[int, int, bool, str]:
        """The client port, controller port, whether the port was picked, the properties."""
        if self.member is None:
            port, controller_port, auto = _choose_ports(self.port, self._read_state())
            security = credentials.broker_properties() if credentials is not None else None
            return (
                port,
                controller_port,
                auto,
                server_properties(port, controller_port, self.kafka_log_dir, security=security),
            )
        member = self.member
        for taken in (p for p in (member.port, member.controller_port) if not port_free(p)):
            raise RunwatchError(
                f"port {taken} on {HOST} of node {member.node_id} is taken: stop what "
                "listens there (the cluster's nodes keep their ports)"
            )
        properties = server_properties(
            member.port,
            member.controller_port,
            self.kafka_log_dir,
            node_id=member.node_id,
            voters=member.voters,
            replicas=member.nodes,
        )
        return member.port, member.controller_port, False, properties

    def spawn(self) -> BrokerInfo | Launched:
        """Launch the JVM without waiting for it (hold `lock`).

        Returns:
            The running broker's state when one runs already, else what `await_started`
            waits on.

        Raises:
            RunwatchError: another port was asked of a running broker, a broker process
                runs without a state file, a port is taken, or the jars or java are missing.
        """
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
        if orphan is not None and is_broker_process(orphan):
            raise RunwatchError(
                f"a broker process (pid {orphan}) runs from {self.data_dir} without a state "
                "file; stop it with `runwatch broker stop` first"
            )
        credentials = self.credentials()
        port, controller_port, auto, properties = self._properties(credentials)
        libs = ensure_jars(self.libs_dir, kafka_version=self.kafka_version)
        if credentials is not None:  # it holds the admin's password
            write_private(self.properties_file, properties)
        else:
            self.properties_file.write_text(properties)
        self._format_storage(libs, credentials)
        started = time.monotonic()
        proc = spawn(
            self._java_cmd(libs, MAIN_CLASS, str(self.properties_file)),
            out_file=self.out_file,
            cwd=self.data_dir,
            banner=f"starting Kafka {self.kafka_version} on {HOST}:{port}",
        )
        self._proc = proc
        self.pid_file.write_text(f"{proc.pid}\n")
        return Launched(proc, port, controller_port, auto, started)

    def await_started(
        self, launched: Launched, *, started_by: float, timeout_s: float
    ) -> BrokerInfo:
        """Wait until a `spawn`-ed broker answers; record and return its state.

        Args:
            launched: What `spawn` returned.
            started_by: `time.monotonic()` the ``timeout_s`` counts from.
            timeout_s: Longest to wait.

        Raises:
            RunwatchError: the broker exited, or did not answer in time (it is stopped).
        """
        proc = launched.proc
        bootstrap = f"{HOST}:{launched.port}"
        node_id = self.member.node_id if self.member is not None else None
        credentials = self.credentials()
        try:
            await_ready(
                bootstrap,
                deadline=started_by + timeout_s,
                exited=exit_probe(proc),
                node_id=node_id,
                client_config=credentials.client_config(ADMIN_USER) if credentials else None,
            )
        except BrokerExited as exc:
            self._proc = None
            self.pid_file.unlink(missing_ok=True)
            raise RunwatchError(
                self._failure(f"the broker exited with status {exc.status}")
            ) from None
        except KeyboardInterrupt:
            self.terminate(proc.pid, timeout_s=15.0)
            raise
        except TimeoutError:
            self.terminate(proc.pid, timeout_s=15.0)
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
            secure=credentials is not None,
        )
        write_json(self.state_file, info.to_json())
        return info

    def _failure(self, summary: str) -> str:
        body = "\n".join(f"  | {line}" for line in tail(self.out_file, 12))
        return f"{summary} during startup; last lines of {self.out_file}:\n{body}"

    # ---- stop
    def terminate(self, pid: int, *, timeout_s: float) -> None:
        """Stop the broker process ``pid`` (hold `lock`): SIGTERM, then SIGKILL; reap it.

        Args:
            pid: The broker's pid (`live_pid`, or a `Launched` process's).
            timeout_s: Longest to wait for a clean exit before SIGKILL.
        """
        terminate(pid, timeout_s=timeout_s, proc=self._proc)
        if self._proc is not None and self._proc.pid == pid:
            self._proc = None
        self.pid_file.unlink(missing_ok=True)

    def stop(self, *, timeout_s: float = 30.0) -> bool:
        """Stop the broker cleanly: SIGTERM, wait for exit, SIGKILL as the last resort.

        Args:
            timeout_s: Longest to wait for a clean shutdown before SIGKILL.

        Returns:
            True if a running broker was stopped, False if none ran.
        """
        with self.lock() if self.data_dir.is_dir() else no_lock():
            info = self.running()
            if info is None:
                pid = self._read_pid()
                if pid is None or not is_broker_process(pid):
                    return False
                self.terminate(pid, timeout_s=timeout_s)  # pid file without state
                return True
            self.terminate(info.pid, timeout_s=timeout_s)
            return True

    def live_pid(self) -> int | None:
        """The pid of this data directory's broker process while it lives, else None."""
        pid = self._read_pid()
        return pid if pid is not None and is_broker_process(pid) else None

    def signal_stop(self) -> None:
        """Send SIGTERM to the broker, if it runs, without waiting (`stop` then waits).

        A cluster asks every node at once, so none waits on a quorum that is going away.
        """
        pid = self.live_pid()
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
        with self.lock() if self.data_dir.is_dir() else no_lock():
            pid = self.live_pid()
            if pid is None:
                return False
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            if not wait_pid_exit(pid, timeout_s):
                raise RunwatchError(f"broker pid {pid} survived SIGKILL for {timeout_s:.0f} s")
            if self._proc is not None and self._proc.pid == pid:
                self._proc.wait(timeout=10.0)
                self._proc = None
            else:
                reap(pid)
            self.pid_file.unlink(missing_ok=True)
            return True

    # ---- context manager
    def __enter__(self) -> BrokerInfo:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


@contextlib.contextmanager
def ephemeral_broker(
    data_dir: Path,
    *,
    port: int | None = None,
    timeout_s: float = 120.0,
    secure: bool = False,
    scope: Scope | None = None,
) -> Iterator[BrokerInfo]:
    """Run a broker in ``data_dir`` for the duration of a ``with`` block (tests, demos).

    Args:
        data_dir: Its data directory (a temporary one, typically).
        port: Client port; None picks a free one.
        timeout_s: Longest to wait for it to answer.
        secure: Run it secure (`EmbeddedBroker`); `runwatch.broker.security.load_credentials`
            of ``data_dir`` then has every user's password.
        scope: Whose ACLs a secure broker grants (`EmbeddedBroker`).

    Yields:
        The running broker.
    """
    broker = EmbeddedBroker(data_dir, port=port, secure=secure, scope=scope)
    info = broker.start(timeout_s=timeout_s)
    try:
        yield info
    finally:
        broker.stop()
