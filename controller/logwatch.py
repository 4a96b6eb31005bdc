"""Zero-code monitoring: the events of a gang whose script only prints its progress.

Under ``runwatch launch --log-format FORMAT`` the controller loop hands each supervised run
to a `LogWatch` after every poll. The watch reads the new lines of rank 0's output (the
file the launcher already writes, ``logs/inc<I>.rank0.log``), parses them with the
``runwatch tail-log`` parsers (`producers.logtail`), and speaks for the script:

* **RunStarted** when an incarnation's gang is launched (the script sends none), with the
  gang's world size and incarnation;
* **StepCompleted** for each step line of rank 0; the first step after a respawn carries
  ``restart_from_step``: the checkpoint step the controller resumed from, or 0 when the
  gang started over;
* **Heartbeat** from every rank process that is alive, once per parsed step, with that
  rank's pid. Liveness is the launcher's view of its processes: a rank that died stops
  heartbeating while its peers go on (``dead_rank``), and a gang that stops printing
  (hung, or blocked on a dead peer) stops every heartbeat (``hang`` and ``dead_rank``
  from the processors' ticks). Nothing is sent on a timer, which would hide a hang;
* **RunEnded** ``completed`` when every rank exited 0 (the controller itself announces
  ``stopped`` before a restart and ``failed``).

Only rank 0's output is parsed: every rank of a data-parallel job prints the same steps,
and most scripts print on rank 0 alone.
"""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path

from runwatch.controller.state import GangRecord, LaunchSpec
from runwatch.controller.supervisor import RunSupervisor
from runwatch.producers.emitter import RunEmitter
from runwatch.producers.logtail import LineParser, make_parser
from runwatch.schemas.events import Event, Heartbeat, RestartCompleted
from runwatch.schemas.topics import names

log = logging.getLogger(__name__)

_READ_BYTES = 1 << 20


def emitter_for(spec: LaunchSpec, record: GangRecord) -> RunEmitter:
    """A `RunEmitter` speaking as rank 0 of ``record``'s incarnation (for the script).

    The controller uses one to announce RunEnded, a `LogWatch` to send a printing
    script's events; both as a rank of the gang would.
    """
    return RunEmitter(
        spec.run_id,
        bootstrap=spec.run.bootstrap,
        topic_prefix=spec.run.prefix,
        rank=0,
        world_size=max(1, record.world_size),
        incarnation=record.incarnation,
        launch_id=spec.run.launch_id,
    )


class LineReader:
    r"""The complete lines appended to a file since the last call (no waiting, no threads).

    A line counts once its ``\n`` is written (``\r``-separated pieces, as progress bars
    write them, are lines of their own); `drain` also returns an unterminated last line.
    A missing file reads as empty (the rank has not started writing yet).

    Attributes:
        path: The file.
        offset: Bytes consumed so far.
    """

    def __init__(self, path: Path, *, from_end: bool = False) -> None:
        """Read ``path`` from its start, or from its current end (an adopted gang)."""
        self.path = path
        self.offset = 0
        self._pending = b""
        if from_end:
            try:
                self.offset = path.stat().st_size
            except OSError:
                self.offset = 0
            self._skip_partial = self.offset > 0
        else:
            self._skip_partial = False

    def _read(self) -> bytes:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read(_READ_BYTES)
        except OSError:
            return b""
        self.offset += len(data)
        return data

    def lines(self) -> list[str]:
        """The complete lines written since the last call."""
        chunks = []
        while data := self._read():
            chunks.append(data)
            if len(data) < _READ_BYTES:
                break
        *complete, self._pending = (self._pending + b"".join(chunks)).split(b"\n")
        if self._skip_partial and complete:
            complete, self._skip_partial = complete[1:], False  # started mid-line
        return [p for raw in complete for p in _pieces(raw)]

    def drain(self) -> list[str]:
        """Every line left, the unterminated last one included (the writer has exited)."""
        out = self.lines()
        rest, self._pending = self._pending, b""
        return out + ([] if self._skip_partial else _pieces(rest))


def _pieces(raw: bytes) -> list[str]:
    return [p for p in raw.decode("utf-8", errors="replace").split("\r") if p]


class LogWatch:
    """Speaks for one run's script from rank 0's output; see the module doc.

    Args:
        parser: The step-line parser (`producers.logtail.make_parser`).
        tokens_per_step: Tokens per step for lines that do not say (0: unknown).
        adopted: The run's current incarnation was already running when the watch was
            made (a `runwatch controller` adopting it): its output is read from the end
            and no RunStarted is sent for it again.
        log_format: The format's name, for RunStarted's tags.
    """

    def __init__(
        self,
        parser: LineParser,
        *,
        tokens_per_step: int = 0,
        adopted: bool = False,
        log_format: str = "",
    ) -> None:
        self.parser = parser
        self.tokens_per_step = tokens_per_step
        self.log_format = log_format or parser.name
        self._adopted = adopted
        self._incarnation: int | None = None
        self._emitter: RunEmitter | None = None
        self._reader: LineReader | None = None
        self._resumed_from: int | None = None
        self._restart_from: int | None = None
        self._last_step: int | None = None
        self._host = socket.gethostname()
        self.steps = 0

    @classmethod
    def for_run(cls, spec: LaunchSpec, record: GangRecord) -> LogWatch | None:
        """The watch a run's spec asks for (``log_watch`` set), else None.

        Args:
            spec: What was asked.
            record: What happened: ranks already running are an adopted incarnation.

        Raises:
            ValueError: The recorded format or regex is invalid.
        """
        wanted = spec.log_watch
        if wanted is None:
            return None
        return cls(
            make_parser(wanted.format, wanted.regex),
            tokens_per_step=wanted.tokens_per_step,
            adopted=bool(record.ranks),
            log_format=wanted.format,
        )

    # ------------------------------------------------------------------ inputs

    def on_event(self, event: Event) -> None:
        """See a controller-side event: a RestartCompleted gives the next resume point."""
        if isinstance(event, RestartCompleted):
            step = event.checkpoint_step
            self._resumed_from = 0 if step is None else step

    def observe(self, run: RunSupervisor) -> None:
        """Turn what rank 0 printed since the last call into events; follow incarnations."""
        rec = run.record
        if rec.ranks and rec.incarnation != self._incarnation:
            self._begin(run)
        if self._reader is None:
            return
        if run.finished:
            self._emit_lines(run, self._reader.drain())
            if rec.status == "completed" and self._emitter is not None:
                self._emitter.run_ended("completed", final_step=self._last_step)
            self.close()
            return
        self._emit_lines(run, self._reader.lines())

    # ------------------------------------------------------------------ outputs

    def _begin(self, run: RunSupervisor) -> None:
        rec = run.record
        # What the old gang printed after the last poll is left unread: the controller has
        # already announced its end, and steps after that RunEnded would belong to nobody.
        self.close()
        adopted, self._adopted = self._adopted, False
        self._incarnation = rec.incarnation
        self._emitter = emitter_for(run.spec, rec)
        self._reader = LineReader(run.state.log_path(rec.incarnation, 0), from_end=adopted)
        self._restart_from, self._resumed_from = self._resumed_from, None
        self._last_step = None
        if not adopted:
            self._emitter.run_started(
                tags={"source": "runwatch launch", "log_format": self.log_format}
            )
        log.info(
            "run %s incarnation %d: watching rank 0's output (%s)",
            run.run_id,
            rec.incarnation,
            self.log_format,
        )

    def _emit_lines(self, run: RunSupervisor, lines: list[str]) -> None:
        emitter = self._emitter
        if emitter is None or not lines:
            return
        live = None
        heartbeats = names(run.spec.run.prefix).heartbeats
        for line in lines:
            parsed = self.parser.parse(line)
            if parsed is None:
                continue
            step_time_s = parsed.step_time_s or 0.0
            try:
                emitter.step(
                    parsed.step,
                    loss=parsed.loss,
                    step_time_s=step_time_s,
                    grad_norm=parsed.grad_norm,
                    tokens=self.tokens_per_step if parsed.tokens is None else parsed.tokens,
                    restart_from_step=self._restart_from,
                )
            except (TypeError, ValueError) as exc:
                log.warning("run %s: skipped %r: %s", run.run_id, line, exc)
                continue
            self._restart_from, self._last_step = None, parsed.step
            self.steps += 1
            if live is None:  # the processes alive now, once per batch of lines
                running = set(run.launcher.running())
                live = [p for p in run.record.ranks if p.rank in running]
            for proc in live:
                emitter.emit(
                    heartbeats,
                    Heartbeat(
                        run_id=run.run_id,
                        ts_ns=time.time_ns(),
                        rank=proc.rank,
                        step=parsed.step,
                        step_time_s=step_time_s,
                        host=self._host,
                        pid=proc.pid,
                    ),
                )

    def close(self) -> None:
        """Deliver what the current incarnation's emitter holds (up to 10 s) and drop it."""
        emitter, self._emitter, self._reader = self._emitter, None, None
        if emitter is not None and not emitter.close(timeout_s=10.0):
            log.warning("run %s: some step events may not have been delivered", emitter.run_id)


__all__ = ["LineReader", "LogWatch", "emitter_for"]
