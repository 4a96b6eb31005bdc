"""What the benches under a paced load share: the generator's batches, the box's CPU split.

A load generator in Python shares the box with the worker it measures, so what it spends
is CPU the worker then waits for, and what it cannot offer is a load that was never
measured. `bench/latency.py` and `bench/fleet.py` load this file by path: a bench is run
as a script, and takes its own directory off ``sys.path`` so that its name does not shadow
the package it measures.

Where the CPU went under the load, beside the worker's own: `box_busy` (the whole machine)
and `broker_pid` (the broker's process, to read its CPU). Where it may go: `Cores` gives the
worker CPUs of its own (``--worker-cpus``), as a deployment that reserves cores does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import aiokafka


async def aio_producer(bootstrap: str, linger_ms: int) -> aiokafka.AIOKafkaProducer:
    """A started aiokafka producer: acks 1, batches up to 512 KiB."""
    # aiokafka, not kafka-python: its record batches and CRC32C are C; kafka-python's
    # pure-Python CRC costs ~320 us of CPU per 4 KB packed record here (aiokafka: ~11 us).
    out = aiokafka.AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks=1, linger_ms=linger_ms,
        max_batch_size=512 * 1024, max_request_size=8 * 1024 * 1024,
    )  # fmt: skip
    await out.start()
    return out


class Batches:
    """The load's records appended to one aiokafka batch per partition, sent together.

    ``AIOKafkaProducer.send`` per record (a coroutine, a future, the partitioner, the
    accumulator's bookkeeping) took the generator from 0.23-0.25 to 0.34-0.35 of a core at
    80 % of the worker's capacity, CPU the worker then waited for. A `BatchBuilder` per
    partition takes the records for a few milliseconds (`flush` at every pacing sleep and
    every ``max_steps`` run steps). The partition is the default partitioner's for the
    record's key, as ``send`` would choose it.

    ``max_steps`` bounds what the generator can offer: aiokafka's sender keeps one produce
    request in flight per broker, and ``send_batch`` waits until the partition's previous
    batch has left, so a flush is at most one batch per partition per broker round trip.
    With 64 steps a flush, the generator offered 63-71 % of a 405k-489k events/s capacity
    (``GENERATOR SHORT``) at 0.26 of a core: it waited on the broker, not on a CPU. With 256,
    it offered the 80 % asked for (323k-331k events/s) at the same 0.26 of a core.
    """

    def __init__(self, out: aiokafka.AIOKafkaProducer, partitions: Mapping[str, int],
                 max_steps: int = 256) -> None:  # fmt: skip
        """Batches for ``out``; ``partitions`` is each topic's partition count."""
        self.out, self.max_steps = out, max_steps
        self._all = {topic: list(range(count)) for topic, count in partitions.items()}
        self._partitioner = aiokafka.partitioner.DefaultPartitioner()
        self._placed: dict[tuple[str, bytes], int] = {}
        self._open: dict[tuple[str, int], Any] = {}
        self._steps = 0

    def partition(self, topic: str, key: bytes) -> int:
        """The default partitioner's partition of ``key`` in ``topic`` (as ``send``'s)."""
        placed = self._placed.get((topic, key))
        if placed is None:
            every = self._all[topic]
            placed = self._placed[topic, key] = int(self._partitioner(key, every, every))
        return placed

    async def add(self, records: list[tuple[str, bytes]], key: bytes) -> None:
        """Appends one run step's records (topic, value), sending when enough are held."""
        for topic, value in records:
            partition = self.partition(topic, key)
            batch = self._open.get((topic, partition))
            if batch is None:
                batch = self._open[(topic, partition)] = self.out.create_batch()
            if batch.append(key=key, value=value, timestamp=None) is None:  # full: send it
                await self.out.send_batch(batch, topic, partition=partition)
                batch = self._open[(topic, partition)] = self.out.create_batch()
                batch.append(key=key, value=value, timestamp=None)
        self._steps += 1
        if self._steps >= self.max_steps:
            await self.flush()

    async def flush(self) -> None:
        """Hands every open batch to the producer's sender."""
        for (topic, partition), batch in self._open.items():
            await self.out.send_batch(batch, topic, partition=partition)
        self._open.clear()
        self._steps = 0


class Pace:
    """A generator's run steps appended to `Batches` at ``rate`` events/s, and its report.

    After each run step: when the pace is ahead of the clock, the open batches are sent and
    the generator sleeps until the step is due; when behind, it notes by how much and lets
    the producer's sender run every 32 steps. Time and CPU count from construction.
    """

    def __init__(self, batches: Batches, rate: float) -> None:
        self.batches, self.rate = batches, rate
        self.events = self.steps = 0
        self.behind_max_s = 0.0
        self.cpu0 = time.process_time()
        self.t0 = time.monotonic()

    async def add(self, records: list[tuple[str, bytes]], key: bytes, events: int) -> None:
        """Appends one run step's records (carrying ``events`` events) and keeps the pace."""
        await self.batches.add(records, key)
        self.events += events
        self.steps += 1
        ahead_s = self.t0 + self.events / self.rate - time.monotonic()
        if ahead_s > 0.002:
            await self.batches.flush()
            await asyncio.sleep(ahead_s)  # pacing the load, not synchronisation
        else:
            self.behind_max_s = max(self.behind_max_s, -ahead_s)
            if self.steps % 32 == 0:
                await asyncio.sleep(0)  # let the sender run now and then

    async def finish(self) -> dict[str, float]:
        """Sends what is held; the report: events, elapsed_s, offered_events_per_s, ..."""
        elapsed_s = time.monotonic() - self.t0
        await self.batches.flush()
        await self.batches.out.flush()
        return {
            "events": self.events,
            "elapsed_s": elapsed_s,
            "offered_events_per_s": self.events / elapsed_s,
            "behind_max_s": self.behind_max_s,
            "cpu_s": time.process_time() - self.cpu0,
        }


def box_busy() -> tuple[float, float]:
    """(busy CPU seconds of the whole machine, elapsed CPU seconds) so far, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    total = sum(fields[:8])
    tick = os.sysconf("SC_CLK_TCK")
    return (total - idle) / tick, total / tick


def broker_pid(bootstrap: str) -> int | None:
    """The pid listening on the bootstrap port (``ss``), if this machine runs the broker."""
    port = bootstrap.rsplit(":", 1)[-1]
    try:
        out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        if f":{port} " in line and (m := re.search(r"pid=(\d+)", line)):
            return int(m.group(1))
    return None


class Cores(NamedTuple):
    """The CPUs the worker may run on, and those everything else the bench starts may.

    A bench puts the broker, the load generator and the probes beside the worker on one
    box. Left to the scheduler, they share every CPU with the worker's main thread, which
    then waits for a CPU while one of them runs and finds its caches cold after. A
    deployment that cares reserves cores instead (Kubernetes' static CPU manager policy,
    systemd's ``CPUAffinity=``, ``taskset``): `split` does that on one box. The bench's
    own process takes ``others`` before it starts anything (the broker, the generator and
    the watcher inherit it) and starts the worker inside `for_worker`. The default,
    `everywhere`, sets each to every CPU: the scheduler's choice, as before.

    Attributes:
        worker: CPUs the worker's process (every thread) may run on.
        others: CPUs the bench, the broker and the generator may run on.
    """

    worker: frozenset[int]
    others: frozenset[int]

    @classmethod
    def everywhere(cls) -> Cores:
        """No reservation: every CPU this process may use, for everyone."""
        cpus = frozenset(os.sched_getaffinity(0))
        return cls(cpus, cpus)

    @classmethod
    def split(cls, worker_cpus: str | None) -> Cores:
        """``worker_cpus`` ("1", "2,3") for the worker, the rest of this process's for others.

        Raises:
            SystemExit: A CPU this process may not use, or none left for the others.
        """
        if worker_cpus is None:
            return cls.everywhere()
        box = frozenset(os.sched_getaffinity(0))
        try:
            worker = frozenset(int(c) for c in worker_cpus.split(","))
        except ValueError:
            raise SystemExit(
                f"--worker-cpus {worker_cpus!r}: CPU numbers, comma-separated"
            ) from None
        if not worker or not worker <= box or not box - worker:
            raise SystemExit(
                f"--worker-cpus {worker_cpus!r}: name some of CPUs {sorted(box)}, leaving "
                "at least one for the broker and the generator"
            )
        return cls(worker, box - worker)

    def keep_others(self) -> None:
        """This thread, and every process or thread it starts after, runs on ``others``."""
        os.sched_setaffinity(0, self.others)

    @contextlib.contextmanager
    def for_worker(self) -> Iterator[None]:
        """Within it, processes this thread starts run on ``worker`` (a child inherits)."""
        os.sched_setaffinity(0, self.worker)
        try:
            yield
        finally:
            os.sched_setaffinity(0, self.others)
