"""The alert sink's delivery log: which alert ids each receiver has had, on disk.

A JSON-lines file, one line per delivery (or suppression), appended and fsynced *before*
the consumer commits, so a crash between delivery and commit does not alert twice after
the restart. Lines::

    {"target": "console" | <webhook url>, "run": R, "ids": [...]}   delivered
    {"target": "_suppressed", "run": R, "ids": [...]}               rate-limited, counted
    {"target": "_reported", "run": R, "n": N}                       N suppressed reported
    {"target": "_pending", "to": URL, "run": R, "ids": [...],
     "pid": P, "group": {...}}                                      owed to URL, retried
    {"target": URL, "run": R, "ids": [...], "pid": P}               a pending one went out

A delivery whose retries were spent is not delivered: it is written as ``_pending`` (the
whole group, so it can be sent again after a restart) and counts as handled for that
receiver, so the records behind it can be committed without losing it. It leaves the
pending set when a delivery line with its ``pid`` is written.

The file is compacted on open once it exceeds ``max_lines``: the newest ``keep_ids`` ids
per target survive (older ones are far behind the committed offsets), and a compaction
writes ``{"target": "_unreported", "run": R, "n": N}`` for the suppressed counts not yet
reported and marks the suppressed ids it keeps ``"counted": false``.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final, NamedTuple

import msgspec

from runwatch.common.durable import open_private, replace_file
from runwatch.sinks.alert_format import AlertGroup

SUPPRESSED: Final = "_suppressed"
REPORTED: Final = "_reported"
UNREPORTED: Final = "_unreported"
PENDING: Final = "_pending"


class Pending(NamedTuple):
    """A delivery still owed to a receiver.

    Attributes:
        pid: Its id in the log.
        target: The receiver (webhook URL).
        group: What to send.
    """

    pid: str
    target: str
    group: AlertGroup


class DeliveryLog:
    """Delivered and suppressed alert ids per target, persisted as JSON lines.

    Args:
        path: The file (created with its directory).
        max_lines: Compact on open beyond this many lines.
        keep_ids: Ids kept per target by a compaction.
    """

    def __init__(self, path: Path, *, max_lines: int = 200_000, keep_ids: int = 50_000) -> None:
        self.path = path
        self.done: dict[str, dict[str, None]] = {}
        self.unreported: dict[str, int] = {}
        self.owed: dict[str, Pending] = {}
        # Private (issue 19, finding 12): the log names its receivers, webhook URLs with
        # their tokens: a 0700 directory, a 0600 file (an older 0644 one is tightened).
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)
        lines = self._load()
        if lines > max_lines:
            self._compact(keep_ids)
        fd = open_private(path, os.O_WRONLY | os.O_APPEND, 0o600)
        self._fh = os.fdopen(fd, "a", encoding="utf-8")

    def _load(self) -> int:
        if not self.path.exists():
            return 0
        count = 0
        with self.path.open(encoding="utf-8") as fh:
            for line in fh:
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line torn by a crash mid-write: nothing was committed after it
                count += 1
                self._apply(entry)
        return count

    def _apply(self, entry: dict[str, Any]) -> None:
        target, run = entry.get("target"), entry.get("run", "")
        if target == PENDING:
            group = msgspec.convert(entry["group"], AlertGroup)
            self.owed[entry["pid"]] = Pending(entry["pid"], str(entry["to"]), group)
            return
        if "pid" in entry:
            self.owed.pop(entry["pid"], None)
        if target == UNREPORTED:
            self.unreported[run] = self.unreported.get(run, 0) + int(entry.get("n", 0))
            return
        if target == REPORTED:
            left = self.unreported.get(run, 0) - int(entry.get("n", 0))
            if left > 0:
                self.unreported[run] = left
            else:
                self.unreported.pop(run, None)
            return
        ids = entry.get("ids", [])
        seen = self.done.setdefault(str(target), {})
        for alert_id in ids:
            seen[alert_id] = None
        if target == SUPPRESSED and entry.get("counted", True):
            self.unreported[run] = self.unreported.get(run, 0) + len(ids)

    def _compact(self, keep_ids: int) -> None:
        entries: list[dict[str, Any]] = [
            {"target": t, "run": "", "ids": list(ids)[-keep_ids:]}
            for t, ids in self.done.items()
            if t != SUPPRESSED
        ]
        kept = list(self.done.get(SUPPRESSED, {}))[-keep_ids:]
        entries.append({"target": SUPPRESSED, "run": "", "ids": kept, "counted": False})
        entries += [{"target": UNREPORTED, "run": r, "n": n} for r, n in self.unreported.items()]
        entries += [self._pending_entry(p) for p in self.owed.values()]
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = open_private(tmp, os.O_WRONLY | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(e) + "\n" for e in entries)
        replace_file(tmp, self.path)
        self.done, self.unreported, self.owed = {}, {}, {}
        self._load()

    @staticmethod
    def _pending_entry(p: Pending) -> dict[str, Any]:
        return {
            "target": PENDING,
            "to": p.target,
            "run": p.group.run_id,
            "ids": [a.alert_id for a in p.group.alerts],
            "pid": p.pid,
            "group": msgspec.to_builtins(p.group),
        }

    def _append(self, entry: dict[str, Any]) -> None:
        self._fh.write(json.dumps(entry) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._apply(entry)

    def has(self, target: str, alert_id: str) -> bool:
        """True when ``target`` has had ``alert_id``, or it is pending for ``target``."""
        if alert_id in self.done.get(target, {}):
            return True
        return any(
            p.target == target and any(a.alert_id == alert_id for a in p.group.alerts)
            for p in self.owed.values()
        )

    def seen(self, alert_id: str) -> bool:
        """True when any receiver has had the id (or owes it), or it was suppressed."""
        return any(alert_id in ids for ids in self.done.values()) or any(
            any(a.alert_id == alert_id for a in p.group.alerts) for p in self.owed.values()
        )

    def pending(self, target: str | None = None) -> list[Pending]:
        """Deliveries still owed (to ``target``, or to any), oldest first."""
        return [p for p in self.owed.values() if target is None or p.target == target]

    def pend(self, target: str, group: AlertGroup) -> Pending:
        """Record a delivery to ``target`` that did not go through: it stays owed."""
        p = Pending(uuid.uuid4().hex, target, group)
        self._append(self._pending_entry(p))
        return p

    def retried(self, p: Pending) -> None:
        """Record that the pending delivery ``p`` finally went out."""
        self._append(
            {
                "target": p.target,
                "run": p.group.run_id,
                "ids": [a.alert_id for a in p.group.alerts],
                "pid": p.pid,
            }
        )

    def handled(self, alert_id: str, targets: Iterable[str]) -> bool:
        """True when the id was suppressed, or every target has had it."""
        if self.has(SUPPRESSED, alert_id):
            return True
        return all(self.has(t, alert_id) for t in targets)

    def delivered(self, target: str, run_id: str, ids: Iterable[str]) -> None:
        """Record a delivery to ``target``."""
        self._append({"target": target, "run": run_id, "ids": list(ids)})

    def suppressed(self, run_id: str, ids: Iterable[str]) -> None:
        """Record ids the rate limiter held back (counted, not sent)."""
        self._append({"target": SUPPRESSED, "run": run_id, "ids": list(ids)})

    def reported(self, run_id: str, count: int) -> None:
        """Record that ``count`` suppressed alerts of the run were reported."""
        self._append({"target": REPORTED, "run": run_id, "n": count})

    def close(self) -> None:
        """Close the file."""
        self._fh.close()
