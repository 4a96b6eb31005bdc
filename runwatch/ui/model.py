"""The web view's data: what the processors keep, followed incrementally, queried per page.

This is the one adapter between `runwatch ui` and the processors. It reads the same
sources as `runwatch status` (the processors' table changelogs, decoded with
`processors.core.state_codec` and condensed with `processors.fleet.summarize`) and, for
the curves and the verdict feed, the steps, anomalies, commands and controller topics.
Nothing here judges a run: every verdict, count, continuity flag and receipt comes from
the processors' states or from the core (`health_report`, `step_accounting`); a change
of the state encodings changes this module only.

Reading is incremental: one background consumer (no consumer group, nothing committed)
starts at the beginning of every topic once and then follows the ends, keeping per run
the latest states and bounded series. A request reads memory, never Kafka.
"""

from __future__ import annotations

import heapq
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Final

import msgspec

from runwatch.common.isolate import BadRecords
from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.report import health_report
from runwatch.processors.core.runinfo import RunInfo
from runwatch.processors.core.state_codec import decode_state
from runwatch.processors.core.step_checks import step_accounting
from runwatch.processors.fleet import RunSummary, RunView, summarize
from runwatch.processors.settings import changelog_topic
from runwatch.schemas.events import (
    AnomalyDetected,
    CommandRejected,
    Event,
    EventPack,
    RestartCompleted,
    RestartFailed,
    RestartRequested,
    RunEnded,
    RunStarted,
    StepCompleted,
    event_name,
)
from runwatch.schemas.records import RawRecord, split
from runwatch.schemas.topics import FOLD_ORDER, StateKind, TopicRole, folding, names
from runwatch.ui.charts import degraded_spans

log = logging.getLogger(__name__)

MAX_POINTS: Final = 4000
"""Newest step points kept per run for the curves."""
MAX_FEED: Final = 300
"""Newest verdicts, commands and controller events kept per run."""
MAX_RUNS: Final = 10_000
"""Most runs the view keeps (issue 19, finding 10); past it the least recently updated go."""
ENDED_RETENTION_S: Final = 3600.0
"""An ended run (RunEnded read) is kept this long of log time after its end."""
MAX_FUTURE_MS: Final = 300_000
"""How far past the wall clock a record's timestamp counts as log time."""
MAX_PAGE_SIZE: Final = 500
"""Most fleet rows one request may ask for."""

SORT_KEYS: Final[tuple[str, ...]] = (
    "run",
    "status",
    "incarnation",
    "step",
    "loss",
    "mfu",
    "ranks",
    "anomalies",
    "restarts",
    "continuity",
)
"""Columns the fleet table can be sorted by."""


def finite(value: float | None) -> float | str | None:
    """A float for JSON: non-finite values as ``"NaN"``/``"Infinity"`` strings, as on the wire."""
    if value is None or math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


class AuditNote(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of the last audit of a run that this process ran or was told about.

    Attributes:
        agrees: Every recorded verdict was reproduced and none is missing.
        anomalies: Anomalies re-derived.
        commands: Commands re-derived.
        input_records: Input records replayed.
        at_unix_s: When the audit finished (the viewer's clock: it labels, never judges).
        error: Why the audit could not run, if it could not.
    """

    agrees: bool
    anomalies: int = 0
    commands: int = 0
    input_records: int = 0
    at_unix_s: float = 0.0
    error: str = ""


class FleetQuery(msgspec.Struct, frozen=True, kw_only=True):
    """One page of the fleet table.

    Attributes:
        text: Keep runs whose id contains this (case-insensitive).
        status: Keep runs with this liveness status ("" keeps all); ``anomalous`` keeps
            runs with any anomaly, ``broken`` runs whose continuity broke.
        sort: Column to sort by (one of `SORT_KEYS`).
        descending: Sort order.
        page: 0-based page.
        page_size: Rows per page (at most `MAX_PAGE_SIZE`).
    """

    text: str = ""
    status: str = ""
    sort: str = "run"
    descending: bool = False
    page: int = 0
    page_size: int = 50


class _Run:
    """Everything kept about one run; only the store's thread writes it, under its lock."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.states: dict[str, Any] = {}
        self.summary: RunSummary | None = None
        self.info: RunInfo | None = None
        self.points: deque[tuple[int, int, float, float | None, float | None]] = deque(
            maxlen=MAX_POINTS
        )  # (step, incarnation, loss, grad_norm, mfu)
        self.feed: deque[Event] = deque(maxlen=MAX_FEED)
        self.groups: frozenset[int] = frozenset()
        """Every replica group seen in a step's quorum (a fault-tolerant run)."""
        self.degraded: deque[tuple[int, int, int]] = deque(maxlen=MAX_POINTS)
        """``(step, groups in its quorum, groups known)`` of each degraded step."""
        self.audit: AuditNote | None = None
        self.touched_ms = 0
        """Log time (broker timestamp, bounded) of the run's newest record."""
        self.ended_ms: int | None = None
        """Log time its RunEnded was read; None while it runs."""

    def view(self) -> RunView:
        return RunView(
            run_id=self.run_id,
            steps=self.states.get(StateKind.STEPS),
            liveness=self.states.get(StateKind.LIVENESS),
            policy=self.states.get(StateKind.POLICY),
        )


def _sort_value(row: RunSummary, key: str) -> tuple[int, Any]:
    """(0, value) for present values, (1, 0) for absent ones: absent rows sort last."""
    value: Any
    if key == "run":
        value = row.run_id
    elif key == "status":
        value = row.status
    elif key == "incarnation":
        value = row.incarnation
    elif key == "step":
        value = row.last_step
    elif key == "loss":
        value = row.loss if row.loss is not None and math.isfinite(row.loss) else None
    elif key == "mfu":
        value = row.mfu
    elif key == "ranks":
        value = len(row.live_ranks)
    elif key == "anomalies":
        value = sum(row.anomalies.values())
    elif key == "restarts":
        value = row.restarts
    elif key == "continuity":
        value = int(row.continuity_ok)
    else:
        raise ValueError(f"unknown sort column {key!r}; valid: {', '.join(SORT_KEYS)}")
    return (1, 0) if value is None else (0, value)


def summary_json(row: RunSummary, audit: AuditNote | None) -> dict[str, Any]:
    """One fleet row as JSON-ready builtins."""
    out: dict[str, Any] = msgspec.to_builtins(row)
    out["loss"] = finite(row.loss)
    out["mfu"] = finite(row.mfu)
    out["mfu_avg"] = finite(row.mfu_avg)
    out["tokens_per_s"] = finite(row.tokens_per_s)
    out["anomalies_total"] = sum(row.anomalies.values())
    out["audit"] = None if audit is None else msgspec.to_builtins(audit)
    return out


def event_json(event: Event) -> dict[str, Any]:
    """A feed entry: the event's fields plus its name (`event_name`; NaN as strings)."""
    out: dict[str, Any] = {"type": event_name(event)}
    for name in event.__struct_fields__:
        value = getattr(event, name)
        if name in ("signature", "payload"):
            continue
        out[name] = finite(value) if isinstance(value, float) else msgspec.to_builtins(value)
    return out


class WebviewData:
    """The processors' view of the fleet, kept current by a background consumer.

    ``start()`` launches the thread; ``close()`` stops it. Every read method is safe to
    call from the HTTP server's threads.
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        prefix: str,
        app_id: str,
        cfg: DetectorConfig | None = None,
        client_config: dict[str, Any] | None = None,
        max_runs: int = MAX_RUNS,
        ended_retention_s: float = ENDED_RETENTION_S,
        wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        """Prepare the store (nothing is read before `start`).

        Args:
            bootstrap: Kafka bootstrap address.
            prefix: Topic name prefix of the pipeline.
            app_id: The processors' app id (the changelog topics' prefix).
            cfg: The processors' detector configuration (MFU convention, receipts, audits).
            client_config: Extra kafka-python settings (security).
            max_runs: Most runs kept; past it the least recently updated are evicted.
            ended_retention_s: An ended run is evicted this long (log time) after its end.
            wall_ms: Wall clock in ms: only an upper bound on records' timestamps.
        """
        self.max_runs = max_runs
        self.ended_retention_ms = int(ended_retention_s * 1000)
        self.wall_ms = wall_ms
        self.evicted = 0
        self._now_ms = 0
        self.bootstrap = bootstrap
        self.prefix = prefix
        self.app_id = app_id
        self.cfg = cfg or DetectorConfig()
        self._client_config = client_config
        topics = names(prefix)
        self._roles = topics.roles(
            TopicRole.STEPS, TopicRole.ANOMALIES, TopicRole.COMMANDS, TopicRole.CONTROLLER
        )
        self._changelogs = {
            changelog_topic(app_id, folding(role).table): folding(role).state for role in FOLD_ORDER
        }
        self._runs: dict[str, _Run] = {}
        self._dirty: set[str] = set()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._version = 0
        self._records = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self.error: str = ""
        self.bad = BadRecords("web view", log)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Connect, then follow the topics in a daemon thread.

        Raises:
            RunwatchError: Kafka cannot be reached at the bootstrap address.
        """
        from kafka import KafkaConsumer
        from kafka.errors import KafkaError

        from runwatch.common.errors import RunwatchError
        from runwatch.common.settings import kafka_client_config

        extra = self._client_config if self._client_config is not None else kafka_client_config()
        try:
            consumer = KafkaConsumer(
                bootstrap_servers=self.bootstrap,
                group_id=None,
                enable_auto_commit=False,
                max_poll_records=5000,
                **extra,
            )
        except KafkaError as exc:
            raise RunwatchError(f"cannot reach Kafka at {self.bootstrap}: {exc}") from None
        self._thread = threading.Thread(
            target=self._follow, args=(consumer,), name="webview-data", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop the thread and wake every waiter."""
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def wait_ready(self, timeout_s: float) -> bool:
        """Block until the history present at start has been read (or the timeout)."""
        return self._ready.wait(timeout_s)

    @property
    def version(self) -> int:
        """Bumped whenever anything the pages show changed."""
        return self._version

    def wait_for_change(self, seen: int, timeout_s: float) -> int:
        """Block until the version differs from ``seen`` (or the timeout); returns it."""
        with self._changed:
            self._changed.wait_for(
                lambda: self._version != seen or self._stop.is_set(), timeout=timeout_s
            )
            return self._version

    def _follow(self, consumer: Any) -> None:
        from kafka import TopicPartition

        wanted = [*self._changelogs, *self._roles]
        assigned: set[Any] = set()
        history_end: dict[Any, int] | None = None
        next_scan = 0.0
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= next_scan:  # topics appear as the pipeline starts: look again
                    next_scan = now + 2.0
                    found = {
                        TopicPartition(t, p)
                        for t in wanted
                        for p in consumer.partitions_for_topic(t) or ()
                    }
                    if found - assigned:
                        positions = {tp: consumer.position(tp) for tp in assigned}
                        consumer.assign(sorted(found, key=lambda tp: (tp.topic, tp.partition)))
                        for tp, pos in positions.items():
                            consumer.seek(tp, pos)
                        consumer.seek_to_beginning(*(found - assigned))
                        assigned = found
                    if history_end is None and assigned:
                        history_end = consumer.end_offsets(list(assigned))
                batch = consumer.poll(timeout_ms=300)
                records = [
                    RawRecord(m.topic, m.partition, m.offset, m.key, m.value, m.timestamp)
                    for tp in sorted(batch, key=lambda tp: (tp.topic, tp.partition))
                    for m in batch[tp]
                ]
                if records:
                    self.apply(records)
                if (
                    not self._ready.is_set()
                    and history_end is not None
                    and all(consumer.position(tp) >= n for tp, n in history_end.items())
                ):
                    self._ready.set()
                    self._bump()
        except Exception as exc:  # the page says so rather than showing stale figures
            log.exception("web view reader stopped")
            self.error = f"reading from Kafka stopped: {exc}"
            self._bump()
        finally:
            consumer.close()

    def _bump(self) -> None:
        with self._changed:
            self._version += 1
            self._changed.notify_all()

    # ------------------------------------------------------------------ folding records

    def apply(self, records: Iterable[RawRecord]) -> None:
        """Fold records read from the followed topics into the per-run store."""
        with self._changed:
            bound_ms = self.wall_ms() + MAX_FUTURE_MS
            for record in records:
                self._records += 1
                self._now_ms = max(self._now_ms, min(record.timestamp_ms, bound_ms))
                kind = self._changelogs.get(record.topic)
                if kind is not None:
                    where = (record.topic, record.partition, record.offset)
                    self.bad.guard("state", lambda r=record, k=kind: self._apply_state(k, r), where)  # type: ignore[misc]
                    continue
                role = self._roles.get(record.topic)
                if role is None:
                    continue
                good, _ = split([record], role)  # dead letters are the processors' business
                for _, event in good:
                    where = (record.topic, record.partition, record.offset)
                    self.bad.guard("event", lambda e=event: self._apply_event(e), where)  # type: ignore[misc]
            self._evict()
            self._version += 1
            self._changed.notify_all()

    def _run(self, run_id: str) -> _Run:
        run = self._runs.get(run_id)
        if run is None:
            run = self._runs[run_id] = _Run(run_id)
        run.touched_ms = max(run.touched_ms, self._now_ms)
        return run

    def _evict(self) -> None:
        """Drop ended runs past the retention, then the least recently updated past the cap."""
        gone = [
            r.run_id
            for r in self._runs.values()
            if r.ended_ms is not None and self._now_ms - r.ended_ms > self.ended_retention_ms
        ]
        excess = len(self._runs) - len(gone) - self.max_runs
        if excess > 0:
            dropped = set(gone)
            keep = (r for r in self._runs.values() if r.run_id not in dropped)
            order = heapq.nsmallest(
                excess, keep, key=lambda r: (r.ended_ms is None, r.ended_ms or r.touched_ms)
            )
            gone += [r.run_id for r in order]
        for run_id in gone:
            del self._runs[run_id]
            self._dirty.discard(run_id)
        self.evicted += len(gone)

    def _apply_state(self, kind: StateKind, record: RawRecord) -> None:
        if record.key is None or record.value is None:
            return
        run = self._run(record.key.decode(errors="replace"))
        try:
            run.states[kind] = decode_state(kind, record.value)
        except (msgspec.DecodeError, ValueError) as exc:
            self.bad.note(f"undecodable {kind} state", exc, run.run_id[:80])
            return
        self._dirty.add(run.run_id)

    def _apply_event(self, event: Event) -> None:
        if type(event) is EventPack:  # packed steps: each one a point of the curves
            for inner in event.events:
                self._apply_event(inner)
            return
        run = self._run(event.run_id)
        if isinstance(event, RunStarted):
            run.info = RunInfo.from_event(event)
            run.ended_ms = None
        elif isinstance(event, RunEnded):
            run.ended_ms = self._now_ms
        elif isinstance(event, StepCompleted):
            info = run.info or RunInfo()
            _, _, step_mfu, _ = step_accounting(info, event, info.config(self.cfg))
            run.points.append((event.step, info.incarnation, event.loss, event.grad_norm, step_mfu))
            if event.participants:  # a fault-tolerant run: degraded when a group is missing
                run.groups |= frozenset(event.participants)
                if len(event.participants) < len(run.groups):
                    run.degraded.append((event.step, len(event.participants), len(run.groups)))
        elif isinstance(
            event,
            AnomalyDetected | RestartRequested | RestartCompleted | RestartFailed | CommandRejected,
        ):
            run.feed.append(event)

    # ------------------------------------------------------------------ queries

    def _summaries(self) -> list[tuple[RunSummary, AuditNote | None]]:
        for run_id in self._dirty:
            run = self._runs.get(run_id)
            if run is not None:
                _, run.summary = self.bad.guard("summary", lambda r=run: summarize(r.view()))  # type: ignore[misc]
        self._dirty.clear()
        return [(r.summary, r.audit) for r in self._runs.values() if r.summary is not None]

    def fleet(self, query: FleetQuery) -> dict[str, Any]:
        """One page of the fleet table.

        Returns:
            ``total`` (runs after the filter), ``runs`` (all known), ``page``, ``pages``,
            ``rows`` (JSON-ready), ``statuses`` (counts by status over all runs), ``ready``
            (the history present at start has been read), ``version`` and ``error``.

        Raises:
            ValueError: An unknown sort column.
        """
        if query.sort not in SORT_KEYS:
            raise ValueError(f"unknown sort column {query.sort!r}; valid: {', '.join(SORT_KEYS)}")
        size = max(1, min(MAX_PAGE_SIZE, query.page_size))
        text = query.text.strip().lower()
        with self._lock:
            rows = self._summaries()
            version = self._version
        statuses: dict[str, int] = {}
        for r, _ in rows:
            statuses[r.status] = statuses.get(r.status, 0) + 1
        keep: Callable[[RunSummary], bool]
        if query.status == "anomalous":
            keep = lambda r: bool(r.anomalies)  # noqa: E731
        elif query.status == "broken":
            keep = lambda r: not r.continuity_ok  # noqa: E731
        elif query.status:
            keep = lambda r: r.status == query.status  # noqa: E731
        else:
            keep = lambda r: True  # noqa: E731
        picked = [(r, a) for r, a in rows if keep(r) and (not text or text in r.run_id.lower())]
        picked.sort(key=lambda ra: ra[0].run_id)
        present = [ra for ra in picked if _sort_value(ra[0], query.sort)[0] == 0]
        absent = [ra for ra in picked if _sort_value(ra[0], query.sort)[0] == 1]
        present.sort(key=lambda ra: _sort_value(ra[0], query.sort)[1], reverse=query.descending)
        ordered = present + absent
        pages = max(1, -(-len(ordered) // size))
        page = max(0, min(query.page, pages - 1))
        chunk = ordered[page * size : (page + 1) * size]
        return {
            "total": len(ordered),
            "runs": len(rows),
            "page": page,
            "pages": pages,
            "page_size": size,
            "rows": [summary_json(r, a) for r, a in chunk],
            "statuses": dict(sorted(statuses.items())),
            "ready": self._ready.is_set(),
            "version": version,
            "error": self.error,
        }

    def run(self, run_id: str) -> dict[str, Any] | None:
        """Everything the run page shows, or None for a run nobody has seen.

        Returns:
            ``summary`` (the fleet row), ``points`` (step, incarnation, loss, grad norm,
            MFU), ``restarts`` (the step-health state's resumes with their continuity
            verdicts), ``feed`` (verdicts, commands and controller events, oldest first),
            ``receipt`` (the core's health report from the live states), ``audit``,
            ``degraded`` (spans of steps where not every replica group took part:
            ``first``, ``last``, ``groups``, ``of``), ``version``.
        """
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                return None
            self._summaries()
            states = dict(run.states)
            points = list(run.points)
            degraded = degraded_spans(list(run.degraded))
            feed = sorted(run.feed, key=lambda e: e.ts_ns)  # topics interleave on arrival
            summary, audit, version = run.summary, run.audit, self._version
        steps = states.get(StateKind.STEPS)
        receipt = health_report(
            steps,
            states.get(StateKind.LIVENESS),
            policy=states.get(StateKind.POLICY),
            checkpoints=states.get(StateKind.CHECKPOINTS),
            anomalies=[e for e in feed if isinstance(e, AnomalyDetected)],
            commands=[e for e in feed if isinstance(e, RestartRequested)],
            cfg=self.cfg,
        )
        return {
            "run_id": run_id,
            "summary": None if summary is None else summary_json(summary, audit),
            "points": [[s, inc, finite(lo), finite(g), finite(m)] for s, inc, lo, g, m in points],
            "restarts": receipt.get("restarts", []),
            "feed": [event_json(e) for e in feed],
            "receipt": receipt,
            "audit": None if audit is None else msgspec.to_builtins(audit),
            "degraded": [d._asdict() for d in degraded],
            "version": version,
        }

    def run_ids(self) -> list[str]:
        """Every run seen so far."""
        with self._lock:
            return sorted(self._runs)

    def record_audit(self, run_id: str, note: AuditNote) -> None:
        """Remember the outcome of an audit of ``run_id`` (shown in the fleet and run pages)."""
        with self._changed:
            self._run(run_id).audit = note
            self._version += 1
            self._changed.notify_all()

    def audit_run(self, run_id: str, *, timeout_s: float = 60.0) -> AuditNote:
        """Audit one run from the log with `processors.audit` and remember the outcome."""
        from runwatch.processors.audit import audit, load_run_log

        try:
            run_log = load_run_log(self.bootstrap, self.prefix, run_id, timeout_s=timeout_s)
            receipt = audit(run_log, self.cfg)
            note = AuditNote(
                agrees=receipt.agrees,
                anomalies=len(receipt.anomalies.matched),
                commands=len(receipt.commands.matched),
                input_records=receipt.input_records,
                at_unix_s=time.time(),
            )
        except Exception as exc:  # shown on the page; the server keeps serving
            note = AuditNote(agrees=False, at_unix_s=time.time(), error=str(exc))
        self.record_audit(run_id, note)
        return note


__all__ = [
    "MAX_PAGE_SIZE",
    "SORT_KEYS",
    "AuditNote",
    "FleetQuery",
    "WebviewData",
    "event_json",
    "finite",
    "summary_json",
]
