"""Per-rank tables of the liveness reducer: mutable containers behind persistent versions.

Why: a run of 16,384 ranks gets one heartbeat per rank per step. A frozen per-rank tuple
rebuilt on every heartbeat costs O(world) per event (122 µs at 4,096 ranks). Here the
per-rank data lives in plain lists and dicts that a fold updates in place, O(1) per
heartbeat, while every `RankTable` value still behaves as an immutable value.

The ownership rule (it replaces "frozen states, never mutated in place" for these
containers):

1. A `RankTable` is one *version* of the containers. Only the newest version of a chain
   (the *root*) holds them; every older version holds the undo entries that turn the root's
   contents back into its own, and a pointer one step towards the root (Baker's rerooted
   persistent arrays).
2. A fold calls `RankTable.begin` on the version its input state holds: it gets a fresh
   version for its output state and a `Journal`; every write goes through the journal,
   which records the old value, so the input version can always be restored.
3. Reading or folding an older version *reroots* the chain (applies the undo entries back
   to it, keeping the redo entries for the newer versions): it is always correct, and O(1)
   when the caller only ever folds the newest state (the processors, the audit, the
   in-process monitor), which is the only case that has to be fast. A caller that keeps an
   old state to re-apply a batch on a crash therefore gets exactly the state it kept, and
   the stored bytes (`processors.core.state_codec`) are an independent copy anyway.
4. No container is ever written except through a `Journal`, and a container taken out of
   the table (a closed straggler bucket) is never written again.

An old version keeps its undo entries alive only while something references it; a
processor that drops the loaded state after a batch lets them go.
"""

from __future__ import annotations

import zlib
from typing import Any, Final

import numpy as np

NEVER: Final = -1
"""Step of a rank that has not reported in this incarnation."""

ABSENT: Final[Any] = object()
"""Marks a list slot or dict key that did not exist (undo: drop it again)."""
_ABSENT: Final[Any] = ABSENT

Container = list[Any] | dict[Any, Any]
Entry = tuple[Container, Any, Any]


class TableData:
    """The containers of one run's rank table (read them through a `RankTable`).

    Attributes:
        steps: Last step per rank (`NEVER`: not reported in this incarnation).
        ts: Timestamp of that last report per rank.
        dead: Ranks flagged dead (keys; values None).
        buckets: The two open straggler buckets, older then newer: rank -> step time.
        streaks: Consecutive slow closed steps per rank (nonzero ones only).
        flagged: Ranks flagged as stragglers (keys; values None).
    """

    __slots__ = ("buckets", "dead", "flagged", "steps", "streaks", "ts")

    def __init__(
        self,
        steps: list[int],
        ts: list[int],
        dead: dict[int, None],
        buckets: list[dict[int, float]],
        streaks: dict[int, int],
        flagged: dict[int, None],
    ) -> None:
        self.steps = steps
        self.ts = ts
        self.dead = dead
        self.buckets = buckets
        self.streaks = streaks
        self.flagged = flagged

    @classmethod
    def empty(cls, width: int) -> TableData:
        """A table of ``width`` ranks that have not reported."""
        return cls([NEVER] * width, [0] * width, {}, [{}, {}], {}, {})

    def snapshot(self) -> tuple[Any, ...]:
        """An independent copy of every container, comparable with ``==``."""
        return (
            list(self.steps),
            list(self.ts),
            sorted(self.dead),
            [list(b.items()) for b in self.buckets],
            sorted(self.streaks.items()),
            sorted(self.flagged),
        )


class Journal(list[Entry]):
    """The undo log of one fold: every write to a table's containers goes through it.

    Its items are ``(container, key, old value or ABSENT)``. Hot paths may append such an
    entry and write the container themselves, the two always together.
    """

    __slots__ = ()

    def set(self, container: Container, key: Any, value: Any) -> None:
        """``container[key] = value`` for an existing list index or dict key."""
        self.append((container, key, container[key]))
        container[key] = value

    def put(self, mapping: dict[Any, Any], key: Any, value: Any) -> None:
        """``mapping[key] = value``, the key new or not."""
        self.append((mapping, key, mapping.get(key, _ABSENT)))
        mapping[key] = value

    def discard(self, mapping: dict[Any, Any], key: Any) -> None:
        """Remove ``key`` from ``mapping`` if present."""
        if key in mapping:
            self.append((mapping, key, mapping.pop(key)))

    def push(self, values: list[Any], value: Any) -> None:
        """``values.append(value)``."""
        self.append((values, len(values), _ABSENT))
        values.append(value)

    def rollback(self, mark: int) -> None:
        """Undo every write recorded after the first ``mark`` entries, newest first.

        A fold of many events through one journal (`processors.core.liveness_pack`) uses
        it to take back the writes of one event that raised, keeping the others'.
        """
        while len(self) > mark:
            container, key, old = self.pop()
            _put(container, key, old)


def _get(container: Container, key: Any) -> Any:
    if isinstance(container, list):
        return container[key] if key < len(container) else _ABSENT
    return container.get(key, _ABSENT)


def _put(container: Container, key: Any, value: Any) -> None:
    if isinstance(container, list):
        if value is _ABSENT:
            container.pop()
        elif key == len(container):
            container.append(value)
        else:
            container[key] = value
    elif value is _ABSENT:
        del container[key]
    else:
        container[key] = value


class RankTable:
    """One version of a run's rank table (a value: see the module's ownership rule)."""

    __slots__ = ("_data", "_diffs", "_next")

    def __init__(self, data: TableData | None = None) -> None:
        """A table holding ``data`` (default: empty), the root of a new chain."""
        self._data: TableData | None = data if data is not None else TableData.empty(0)
        self._diffs: list[Entry]
        self._next: RankTable | None

    @classmethod
    def of_width(cls, width: int) -> RankTable:
        """A fresh table of ``width`` ranks that have not reported."""
        return cls(TableData.empty(width))

    def read(self) -> TableData:
        """This version's containers, for reading only (valid until another version is used)."""
        data = self._data
        return data if data is not None else self._reroot()

    def begin(self) -> tuple[RankTable, TableData, Journal]:
        """Start a fold from this version.

        Returns:
            The output version, the containers to update (through the journal only) and
            the journal that keeps this version restorable.
        """
        data = self._data
        if data is None:
            data = self._reroot()
        out = _new_table(RankTable)
        out._data = data  # a root reads only _data; _diffs and _next are set on leaving it
        journal = Journal()
        self._data = None
        self._diffs = journal
        self._next = out
        return out, data, journal

    def undo_entries(self) -> int:
        """Undo entries this version holds: the writes of the fold that left it (root: 0)."""
        return 0 if self._data is not None else len(self._diffs)

    def _reroot(self) -> TableData:
        path: list[RankTable] = []
        node = self
        while node._data is None:
            path.append(node)
            assert node._next is not None
            node = node._next
        data = node._data
        for older in reversed(path):
            redo: list[Entry] = []
            for container, key, old in reversed(older._diffs):
                redo.append((container, key, _get(container, key)))
                _put(container, key, old)
            node._data, node._diffs, node._next = None, redo, older
            older._data, older._diffs, older._next = data, [], None
            node = older
        return data

    def __eq__(self, other: object) -> bool:
        """Same contents (whatever the versions' positions in their chains)."""
        if not isinstance(other, RankTable):
            return NotImplemented
        return self is other or self.read().snapshot() == other.read().snapshot()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        data = self.read()
        return f"RankTable(width={len(data.steps)}, dead={sorted(data.dead)})"

    def to_wire(self) -> list[Any]:
        """The contents as msgpack-able values: packed integer arrays, raw float64 bytes."""
        data = self.read()
        if len(data.steps) <= SMALL:
            plain = _plain_wire(data)
            if plain is not None:
                return plain
        return _packed_wire(data)

    @classmethod
    def from_wire(cls, wire: Any) -> RankTable:
        """A table from `to_wire`'s values.

        Raises:
            ValueError: Values that `to_wire` did not write.
        """
        if not isinstance(wire, list) or len(wire) != 10:
            raise ValueError("a rank table is a list of 10 packed arrays")
        steps, ts, dead, a_ranks, a_times, b_ranks, b_times, s_ranks, s_values, flagged = wire
        buckets: list[dict[int, float]] = []
        for ranks, times in ((a_ranks, a_times), (b_ranks, b_times)):
            keys = unpack_ints(ranks)
            values = _unpack_floats(times)
            if len(keys) != len(values):
                raise ValueError("a straggler bucket's ranks and times differ in length")
            buckets.append(dict(zip(keys, values, strict=True)))
        steps_l, ts_l = unpack_ints(steps), unpack_ints(ts)
        if len(steps_l) != len(ts_l):
            raise ValueError("a rank table's steps and timestamps differ in length")
        return cls(
            TableData(
                steps_l,
                ts_l,
                dict.fromkeys(unpack_ints(dead)),
                buckets,
                dict(zip(unpack_ints(s_ranks), unpack_ints(s_values), strict=True)),
                dict.fromkeys(unpack_ints(flagged)),
            )
        )


def _packed_wire(data: TableData) -> list[Any]:
    """`RankTable.to_wire` of any table, each array through `pack_ints` or `_pack_floats`."""
    streaks = sorted(data.streaks.items())  # sets: canonical order, whatever the history
    buckets: list[Any] = []
    for bucket in data.buckets:
        buckets += [pack_ints(list(bucket)), _pack_floats(list(bucket.values()))]
    return [
        pack_ints(data.steps),
        pack_ints(data.ts),
        pack_ints(sorted(data.dead)),
        *buckets,
        pack_ints([rank for rank, _ in streaks]),
        pack_ints([streak for _, streak in streaks]),
        pack_ints(sorted(data.flagged)),
    ]


def _plain_wire(data: TableData) -> list[Any] | None:
    """`_packed_wire` of a table whose every array is plain (`SMALL` values or fewer), or None.

    A fleet's small runs have only such tables, and the fold encodes each one a round
    (`processors.core.state_codec`), so their wire form is built here in one call instead
    of nine: the same values `pack_ints` and `_pack_floats` give arrays that short (an
    empty one ``[]``, any other ``["list", values]``, a bucket's step times as they are).
    None when an array is longer: `_packed_wire` packs it.
    """
    steps, ts, dead, streaks, flagged = data.steps, data.ts, data.dead, data.streaks, data.flagged
    older, newer = data.buckets
    if not (dead or streaks or flagged or older or newer):  # a healthy run between steps
        if len(ts) > SMALL:
            return None
        first = ["list", steps.copy()] if steps else []
        return [first, ["list", ts.copy()] if ts else [], [], [], [], [], [], [], [], []]
    if max(len(ts), len(dead), len(streaks), len(flagged), len(older), len(newer)) > SMALL:
        return None
    wire: list[Any] = [
        ["list", steps.copy()] if steps else [],
        ["list", ts.copy()] if ts else [],
        ["list", sorted(dead)] if dead else [],
    ]
    for bucket in (older, newer):
        if bucket:
            wire += (["list", list(bucket)], list(bucket.values()))
        else:
            wire += ([], [])
    if streaks:
        ranks = sorted(streaks)  # canonical order, whatever the history (`_packed_wire`)
        wire += (["list", ranks], ["list", [streaks[rank] for rank in ranks]])
    else:
        wire += ([], [])
    wire.append(["list", sorted(flagged)] if flagged else [])
    return wire


_new_table: Final = object.__new__

SMALL: Final = 64
"""Arrays up to this length are written as plain msgpack lists (cheaper to pack, as small)."""

_WIDTHS: Final = ((0xFF, "u1"), (0xFFFF, "<u2"), (0xFFFFFFFF, "<u4"))


def pack_ints(values: list[int]) -> list[Any]:
    """Integers as ``[base, dtype, zlib(byte-planes of values - base)]`` (exact).

    The offsets from the smallest value are stored in the narrowest unsigned width that
    holds them, byte planes first (all low bytes, then the next...), deflated
    (`_deflate`): steps of a gang in lockstep take about a byte per thousand ranks,
    timestamps spread over a second about three bytes per rank. Up to `SMALL` values, and
    values outside int64, are kept as a plain list (msgpack ints: packing has a fixed cost
    of ~10 µs an array, which a fleet of small runs would pay on every batch).
    """
    if not values:
        return []
    if len(values) <= SMALL:
        return ["list", list(values)]
    try:
        arr = np.array(values, dtype=np.int64)
    except OverflowError:
        return ["list", values]
    base = int(arr.min())
    span = int(arr.max()) - base
    dtype = next((d for limit, d in _WIDTHS if span <= limit), "<u8")
    offsets = (arr - base).astype(np.uint64).astype(dtype)
    planes = offsets.view(np.uint8).reshape(len(values), -1).T.tobytes()
    return [base, dtype, _deflate(planes)]


def _deflate(planes: bytes) -> bytes:
    """``planes`` deflated with run-length matches only (zlib's ``Z_RLE``), at level 1.

    A zlib stream like any other: `unpack_ints` inflates it, and what earlier versions
    wrote (``zlib.compress(planes, 1)``) inflates the same way, so stored states stay
    readable both ways. Why not the default matcher: the timestamps of a run's ranks
    differ in their low two or three bytes, planes that no matcher shrinks, and level 1
    spent ~0.9 ms of a 16,384-rank state's 1.46 ms encode searching them for nothing;
    run-length matching costs a third of that and shrinks the planes that do
    repeat (steps in lockstep, high bytes) as well or better. It does worse only on a
    pattern that repeats every few bytes, as ranks one in eight of which lag a step
    (233 → 689 bytes at 16,384 ranks), which a real table rarely holds
    (docs/processors.md, "a large run's table, encoded each round").
    """
    deflate = zlib.compressobj(1, zlib.DEFLATED, zlib.MAX_WBITS, 8, zlib.Z_RLE)
    return deflate.compress(planes) + deflate.flush()


def unpack_ints(packed: Any) -> list[int]:
    """The integers `pack_ints` packed.

    Raises:
        ValueError: Not something `pack_ints` wrote.
    """
    if packed == []:
        return []
    if isinstance(packed, list) and len(packed) == 2 and packed[0] == "list":
        return [int(v) for v in packed[1]]
    if not isinstance(packed, list) or len(packed) != 3:
        raise ValueError("packed integers are [base, dtype, bytes]")
    base, dtype, raw = packed
    if dtype not in ("u1", "<u2", "<u4", "<u8") or not isinstance(base, int):
        raise ValueError(f"unknown packed integer width {dtype!r}")
    width = np.dtype(dtype).itemsize
    planes = np.frombuffer(zlib.decompress(_bytes(raw)), dtype=np.uint8)
    if planes.size % width:
        raise ValueError("packed integers of a truncated length")
    offsets = planes.reshape(width, -1).T.copy().view(dtype).ravel()
    out: list[int] = (offsets.astype(np.int64) + base).tolist()
    return out


def _pack_floats(values: list[float]) -> list[float] | bytes:
    return values if len(values) <= SMALL else np.array(values, dtype="<f8").tobytes()


def _unpack_floats(packed: Any) -> list[float]:
    if isinstance(packed, list):
        if not all(isinstance(v, float) for v in packed):
            raise ValueError("packed floats are a list of floats or float64 bytes")
        return packed
    out: list[float] = np.frombuffer(_bytes(packed), dtype="<f8").tolist()
    return out


def _bytes(raw: Any) -> bytes:
    if not isinstance(raw, bytes | bytearray | memoryview):
        raise ValueError("expected raw bytes")
    return bytes(raw)


__all__ = [
    "ABSENT",
    "NEVER",
    "SMALL",
    "Journal",
    "RankTable",
    "TableData",
    "pack_ints",
    "unpack_ints",
]
