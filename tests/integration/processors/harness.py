"""Helpers for the processor tests: real workers as subprocesses, a scripted trainer, waits.

Nothing here stands in for Kafka or faust: workers are `runwatch processors` processes
against the session broker, and events go through `RunEmitter`.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from runwatch.common.settings import kafka_client_config
from runwatch.procs import ManagedProcess
from runwatch.producers import RunEmitter
from runwatch.schemas.codec import decode
from runwatch.schemas.events import Event

COMMAND_KEY = "test-command-key-0123456789"
WAIT_S = 90.0


def wait_until(
    what: str,
    probe: Callable[[], Any],
    done: Callable[[Any], bool],
    timeout_s: float = WAIT_S,
) -> Any:
    """Probe until ``done(probe())`` and return that value.

    Raises:
        AssertionError: Naming ``what`` and the last value, after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last: {value!r}")
        time.sleep(0.2)  # polling metadata, a group or a changelog, not synchronising on time


def group_members(bootstrap: str, group_id: str) -> int:
    """Members of a consumer group once it is stable (-1 while it is not, or unreachable)."""
    from runwatch import admin

    try:
        with admin.admin_client(bootstrap) as client:
            group = client.describe_groups([group_id])[group_id]
    except Exception:  # no coordinator yet, or a broker between answers: not stable
        return -1
    state = group.get("group_state") or group.get("state")
    return len(group.get("members") or []) if state == "Stable" else -1


def one_run_per_partition(count: int) -> list[str]:
    """Run ids ``run-<i>``, one on each of ``count`` partitions (the producer's partitioner)."""
    from runwatch.processors.logread import partition_for

    found: dict[int, str] = {}
    i = 0
    while len(found) < count:
        found.setdefault(partition_for(f"run-{i}", count), f"run-{i}")
        i += 1
    return [found[p] for p in sorted(found)]


@contextmanager
def workers(
    bootstrap: str,
    prefix: str,
    tmp_path: Path,
    *,
    partitions: int | str | None,
    sets: Sequence[str] = (),
) -> Iterator[Callable[..., ManagedProcess]]:
    """Yield a function that starts one more worker of the same app; all stop at the end.

    ``partitions`` is the worker's ``--partitions`` (``2``, ``"heartbeats=4"``; None: the
    catalogue's): the counts of the topics it creates; existing topics keep theirs.

    ``start(env={...}, extra=[...])`` adds variables to that worker's environment and
    arguments to its command line.
    """
    started: list[ManagedProcess] = []
    app_id = f"{prefix}-app"

    def start(env: dict[str, str] | None = None, extra: Sequence[str] = ()) -> ManagedProcess:
        args = [
            "processors",
            "--bootstrap",
            bootstrap,
            "--prefix",
            prefix,
            "--app-id",
            app_id,
            *(["--partitions", str(partitions)] if partitions is not None else []),
            "--tick-interval",
            "0.5",
            "--session-timeout",
            "6",
        ]
        for s in sets:
            args += ["--set", s]
        args += list(extra)
        full = {
            **os.environ,
            "RUNWATCH_COMMAND_KEY": COMMAND_KEY,
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        worker = ManagedProcess.runwatch(
            f"worker{len(started)}", args, tmp_path / f"worker{len(started)}.log", env=full
        )
        started.append(worker)
        return worker

    try:
        yield start
    except BaseException:
        for worker in started:  # the workers' view of a failure, in the test report
            print(f"--- {worker.log_path.name}\n{worker.log_tail(60)}")
        raise
    finally:
        for worker in started:
            worker.stop()


class Reader:
    """Reads a topic from the beginning, accumulating decoded events across waits.

    It logs in with ``client_config`` (kafka-python security settings), else with the
    ``RUNWATCH_*`` variables of the environment (`kafka_client_config`), as runwatch does.
    """

    def __init__(
        self, bootstrap: str, topic: str, client_config: dict[str, Any] | None = None
    ) -> None:
        login = kafka_client_config() if client_config is None else client_config
        self.consumer = KafkaConsumer(
            bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, **login
        )
        parts = self.consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        self.consumer.assign(tps)
        self.consumer.seek_to_beginning(*tps)
        self.events: list[Event] = []
        self.raw: list[Any] = []

    def wait_for(
        self, done: Callable[[list[Event]], bool], timeout_s: float = WAIT_S
    ) -> list[Event]:
        """Consume until ``done(events)`` or the deadline; returns all events so far."""
        deadline = time.monotonic() + timeout_s
        while not done(self.events):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; have {[short(e) for e in self.events]}")
            for records in self.consumer.poll(timeout_ms=200).values():
                for r in records:
                    self.raw.append(r)
                    self.events.append(decode(r.value))
        return self.events

    def close(self) -> None:
        self.consumer.close()


def short(event: Event) -> tuple[Any, ...]:
    """A compact, comparable view of a verdict or command (None fields left out)."""
    d = {k: getattr(event, k, None) for k in ("kind", "action", "step", "rank", "incarnation")}
    return tuple(v for v in d.values() if v is not None)


class Trainer:
    """A scripted gang: rank 0 emits steps and checkpoints, every rank heartbeats."""

    def __init__(
        self,
        bootstrap: str,
        prefix: str,
        run_id: str,
        world_size: int = 2,
        seed: int = 0,
        client_config: dict[str, Any] | None = None,
    ) -> None:
        self.bootstrap, self.prefix, self.run_id, self.world_size = (
            bootstrap,
            prefix,
            run_id,
            world_size,
        )
        self.client_config = client_config  # a role's login (security settings)
        self.rng = random.Random(seed)
        self.emitters: list[RunEmitter] = []
        self.incarnation = 0

    def start(self, incarnation: int) -> None:
        self.close()
        self.incarnation = incarnation
        self.emitters = [
            RunEmitter(
                self.run_id,
                bootstrap=self.bootstrap,
                topic_prefix=self.prefix,
                rank=r,
                world_size=self.world_size,
                incarnation=incarnation,
                client_config=self.client_config,
            )
            for r in range(self.world_size)
        ]
        self.emitters[0].run_started(vocab_size=256, peak_flops_per_s=1e12)
        self.emitters[0].flush()

    def healthy_loss(self, step: int) -> float:
        return 4.0 - 0.01 * step + self.rng.gauss(0.0, 0.02)

    def step(
        self,
        step: int,
        *,
        loss: float | None = None,
        silent: Sequence[int] = (),
        restart_from: int | None = None,
        participants: tuple[int, ...] = (),
        flush: bool = True,
    ) -> None:
        """Emit one step: rank 0's step event and every rank's heartbeat.

        Args:
            step: The step.
            loss: Its loss (None: a healthy one).
            silent: Ranks that send no heartbeat.
            restart_from: The step the run resumed from (a restart's first step).
            participants: The replica groups in the step's quorum (torchft).
            flush: Wait until every event of the step is delivered. A caller stepping
                many gangs at once flushes them together after each step instead
                (`flush`), so their deliveries overlap.
        """
        e0 = self.emitters[0]
        e0.step(
            step,
            loss=self.healthy_loss(step) if loss is None else loss,
            step_time_s=0.05,
            grad_norm=1.0 + self.rng.gauss(0.0, 0.01),
            tokens=4096,
            examples=64,
            restart_from_step=restart_from,
            # a replica-group run's quorum (torchft): reported by its first group
            replica_group=participants[0] if participants else None,
            participants=participants,
        )
        for rank, emitter in enumerate(self.emitters):
            if rank not in silent:
                emitter.heartbeat(step, step_time_s=0.05)
        # Real ranks are a step time apart; a scripted gang that emitted everything at once
        # would let one rank's producer run many steps ahead of another's.
        if flush:
            self.flush()

    def checkpoint(self, step: int) -> None:
        self.emitters[0].checkpoint_committed(step, f"/ckpt/{self.run_id}/step_{step}")

    def end(self, status: str = "stopped") -> None:
        self.flush()  # every rank's events land before the end marker
        self.emitters[0].run_ended(status, final_step=None)
        self.flush()

    def flush(self) -> None:
        for e in self.emitters:
            assert e.flush(30.0), "events not delivered"

    def close(self) -> None:
        for e in self.emitters:
            e.close(30.0)
        self.emitters = []
