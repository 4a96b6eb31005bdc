"""`split`'s chunks decide exactly what `check` decides, record by record.

`split` decodes a chunk of small records in one C loop (`codec.decode_many`) and
admits a chunk of plain events at once (`records._admit_plain`). Whatever the records, its
result must be `check` of each record in order: the same `Decoded` (source and event) and
the same dead letters with the same reasons. Held here on the hostile corpus mixed into
good records, on records written to be read across their boundaries (which a chunk once
decoded as the lines of one buffer read as other records' events), at chunk
boundaries, on chunks that go on in pieces around their packs, Ticks and large records,
and on hypothesis-drawn batches.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runwatch.schemas import records as records_module
from runwatch.schemas.codec import (
    MANY_MAX_RECORD_BYTES,
    decode,
    decode_many,
    encode,
    encode_pack,
)
from runwatch.schemas.events import DeadLetter, Heartbeat, StepCompleted, Tick
from runwatch.schemas.records import (
    MAX_FUTURE_SKEW_NS,
    SPLIT_CHUNK,
    Decoded,
    RawRecord,
    check,
    split,
)
from runwatch.schemas.topics import TopicRole
from tests.unit.schemas.test_hostile_records import CORPUS

STAMP_MS = 1_767_000_000_000
TS_NS = STAMP_MS * 1_000_000


def heartbeat(run: str = "r", rank: int = 0, ts_ns: int = TS_NS) -> bytes:
    return encode(Heartbeat(run_id=run, ts_ns=ts_ns, rank=rank, step=1, step_time_s=0.05))


def step(run: str = "r", loss: float = 1.0, ts_ns: int = TS_NS) -> bytes:
    return encode(StepCompleted(run_id=run, ts_ns=ts_ns, step=1, loss=loss, step_time_s=0.1))


def pack(ranks: int, run: str = "r", inner_run: str = "r") -> bytes:
    return encode_pack(run, TS_NS, [heartbeat(run=inner_run, rank=i) for i in range(ranks)])


def records(
    values: Sequence[tuple[bytes | None, bytes | None]], stamp_ms: int = STAMP_MS
) -> list[RawRecord]:
    """(key, value) pairs as one partition's records from offset 100."""
    return [
        RawRecord("runwatch.t", 2, 100 + i, key, value, stamp_ms)
        for i, (key, value) in enumerate(values)
    ]


def one_by_one(batch: list[RawRecord], role: TopicRole) -> tuple[list[str], list[str]]:
    good: list[str] = []
    dead: list[str] = []
    for record in batch:
        out = check(record, role)
        (dead if type(out) is DeadLetter else good).append(repr(out))
    return good, dead


def assert_as_check(
    batch: list[RawRecord], role: TopicRole
) -> tuple[list[Decoded], list[DeadLetter]]:
    good, dead = split(batch, role)
    assert ([repr(g) for g in good], [repr(d) for d in dead]) == one_by_one(batch, role)
    return good, dead


@pytest.mark.parametrize(
    "index", range(len(CORPUS)), ids=[f"{c[0]}-{c[3] or 'bad'}"[:40] for c in CORPUS]
)
def test_a_hostile_record_among_good_ones(index: int) -> None:
    role, key, value, _ = CORPUS[index]
    good_value = heartbeat() if role == "heartbeats" else step()
    batch = records([(b"r", good_value)] * 5 + [(key, value)] + [(b"r", good_value)] * 5)
    _good, dead = assert_as_check(batch, TopicRole(role))
    assert len(dead) >= 1


@pytest.mark.parametrize(
    ("values", "dead_at"),
    [
        pytest.param(
            [
                (b"r", heartbeat(rank=1) + b" " + heartbeat(rank=2)),
                (b"r", b" "),
                (b"r", heartbeat()),
            ],
            [100, 101],
            id="two-values-then-a-blank",
        ),
        pytest.param(
            [(b"r", heartbeat(rank=1) + b"\n" + heartbeat(rank=2)), (b"r", heartbeat())],
            [100],
            id="a-newline-inside",
        ),
        pytest.param(
            [(b"r", heartbeat()[:-1] + b',"x":'), (b"r", heartbeat() + b"}"), (b"r", heartbeat())],
            [100, 101],
            id="one-event-across-two-records",
        ),
        pytest.param(
            [
                (b"r", heartbeat()[:-1] + b',"x":'),
                (b"r", heartbeat(rank=5) + b"}"),
                (b"r", heartbeat(rank=1) + b" " + heartbeat(rank=2)),
            ],
            [100, 101, 102],
            id="across-two-records-and-two-in-one",  # as many values as records, shifted
        ),
        pytest.param([(b"r", b"\n" + heartbeat()), (b"r", heartbeat())], [], id="leading-newline"),
        pytest.param([(b"r", heartbeat() + b"\r\n"), (b"r", heartbeat())], [], id="crlf"),
        pytest.param([(b"r", b""), (b"r", heartbeat())], [100], id="empty"),
    ],
)
def test_records_that_would_shift_lines(
    values: list[tuple[bytes, bytes]], dead_at: list[int]
) -> None:
    good, dead = assert_as_check(records(values), TopicRole.HEARTBEATS)
    assert [d.source.offset for d in dead if d.source is not None] == dead_at
    assert [g.source.offset for g in good] == [
        r.offset for r in records(values) if r.offset not in dead_at
    ]


@pytest.mark.parametrize("bad_at", [0, SPLIT_CHUNK - 1, SPLIT_CHUNK, 2 * SPLIT_CHUNK + 7])
def test_a_bad_record_at_a_chunk_boundary(bad_at: int) -> None:
    values: list[tuple[bytes | None, bytes | None]] = [
        (b"r", heartbeat(rank=i % 8)) for i in range(3 * SPLIT_CHUNK)
    ]
    values[bad_at] = (b"intruder", heartbeat())
    good, dead = assert_as_check(records(values), TopicRole.HEARTBEATS)
    assert len(good) == 3 * SPLIT_CHUNK - 1
    assert [d.source.offset for d in dead if d.source is not None] == [100 + bad_at]


def test_ticks_and_the_broker_time() -> None:
    tick = encode(Tick(run_id="*", ts_ns=TS_NS + 10**12, partition=2))  # later than the stamp
    future = heartbeat(ts_ns=TS_NS + MAX_FUTURE_SKEW_NS + 1)
    batch = records([(b"r", heartbeat()), (b"*", tick), (b"r", future), (b"r", heartbeat())])
    good, dead = assert_as_check(batch, TopicRole.HEARTBEATS)
    assert [type(g.event).__name__ for g in good] == ["Heartbeat", "Tick", "Heartbeat"]
    assert good[1].event.ts_ns == TS_NS  # clamped to the stamp
    assert [d.reason.split(":")[0] for d in dead] == ["future_ts"]


def test_a_future_event_among_plain_ones() -> None:
    future = heartbeat(ts_ns=TS_NS + MAX_FUTURE_SKEW_NS + 1)
    batch = records([(b"r", heartbeat())] * 3 + [(b"r", future)] + [(b"r", heartbeat())] * 3)
    good, dead = assert_as_check(batch, TopicRole.HEARTBEATS)
    assert len(good) == 6
    assert [d.source.offset for d in dead if d.source is not None] == [103]


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param({"timestamp_ms": None}, id="no-stamp"),
        pytest.param({"timestamp_ms": "soon"}, id="a-text-stamp"),
        pytest.param({"key": "r"}, id="a-text-key"),
        pytest.param({"offset": None}, id="no-offset"),
    ],
)
def test_a_record_of_wrong_field_types_fails_as_check_fails(bad: dict[str, Any]) -> None:
    """Not what Kafka gives (the consumer makes bytes keys and int stamps), but the chunk's
    rules must not turn into a different outcome: the same result, or the same error."""
    batch = records([(b"r", heartbeat())] * 4)
    batch[2] = batch[2]._replace(**bad)
    try:
        expected: Any = one_by_one(batch, TopicRole.HEARTBEATS)
    except Exception as exc:
        with pytest.raises(type(exc)):
            split(batch, TopicRole.HEARTBEATS)
        return
    assert_as_check(batch, TopicRole.HEARTBEATS)
    assert len(expected[0]) + len(expected[1]) == 4


def test_unstamped_records_are_not_bounded() -> None:
    batch = records([(b"r", heartbeat(ts_ns=2**62))] * 3, stamp_ms=0)
    good, _ = assert_as_check(batch, TopicRole.HEARTBEATS)
    assert len(good) == 3


def test_non_finite_losses_take_the_full_path() -> None:
    batch = records(
        [(b"r", step(loss=float("nan"))), (b"r", step(loss=float("inf"))), (b"r", step())]
    )
    good, _ = assert_as_check(batch, TopicRole.STEPS)
    assert [repr(g.event.loss) for g in good] == ["nan", "inf", "1.0"]


_VALUES = st.sampled_from(
    [
        heartbeat(),
        heartbeat(run="s", rank=3),
        heartbeat(ts_ns=TS_NS + MAX_FUTURE_SKEW_NS + 1),
        step(),
        step(loss=float("nan")),
        encode(Tick(run_id="*", ts_ns=TS_NS, partition=0)),
        json.dumps(
            {"type": "heartbeat.v1", "run_id": "r", "ts_ns": 1, "rank": 0, "step": 1, "x": [[[]]]}
        ).encode(),
        json.dumps(
            {"type": "heartbeat.v1", "run_id": "r", "ts_ns": 1, "rank": 0, "step": 1, "x": "{[{"}
        ).encode(),
        b'{"type":"heartbeat.v1","run_id":"r","ts_ns":1,"rank":0,"step":1,"x":'
        + b"[" * 40
        + b"]" * 40
        + b"}",
        heartbeat() + b" " + heartbeat(),
        pack(4),
        pack(64),
        pack(64, inner_run="s"),
        heartbeat()[:-1] + b',"x":',
        heartbeat(rank=5) + b"}",
        b"}",
        b" ",
        b"",
        b"{",
    ]
    + [v for role, _, v, _ in CORPUS if v is not None and len(v) < 5000]
)


_GOOD = st.sampled_from([heartbeat(), heartbeat(rank=5), step(), step(loss=2.0)])
"""Plain events of run "r": a batch of them (with its key) takes the chunk path."""


@pytest.mark.parametrize(
    "values",
    [
        pytest.param([heartbeat(rank=1) + b" " + heartbeat(rank=2), b" ", heartbeat()], id="blank"),
        pytest.param(
            [heartbeat()[:-1] + b',"x":', heartbeat(rank=5) + b"}", heartbeat() + heartbeat()],
            id="a-value-across-records",
        ),
        pytest.param([heartbeat(), b" " + heartbeat()], id="a-leading-space"),
        pytest.param([heartbeat(), None], id="no-value"),
    ],
)
def test_decode_many_declines_what_one_record_cannot_give(values: list[Any]) -> None:
    assert decode_many(values) is None
    assert decode_many([heartbeat(), heartbeat(rank=1)]) is not None


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.one_of(_GOOD, _VALUES), max_size=12))
def test_decode_many_is_decode_of_each_record(values: list[bytes]) -> None:
    events = decode_many(values)
    if events is not None:
        assert [repr(e) for e in events] == [repr(decode(v)) for v in values]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    role=st.sampled_from([TopicRole.HEARTBEATS, TopicRole.STEPS]),
    stamp_ms=st.sampled_from([STAMP_MS, 0, -1, 1]),
    batch=st.lists(
        st.tuples(
            st.sampled_from([b"r"] * 6 + [b"s", b"*", b"", None]),
            st.one_of(_GOOD, _VALUES, st.none()),
        ),
        max_size=40,
    ),
)
def test_split_is_check_of_each_record(
    role: TopicRole, stamp_ms: int, batch: list[tuple[bytes | None, bytes | None]]
) -> None:
    assert_as_check(records(batch, stamp_ms), role)


def records_checked_alone(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The places (from 0) of the records `split` will check one at a time (`_one_by_one`)."""
    places: list[int] = []
    real = records_module._one_by_one

    def counted(chunk: list[RawRecord], *args: Any) -> None:
        places.extend(record.offset - 100 for record in chunk)
        real(chunk, *args)

    monkeypatch.setattr(records_module, "_one_by_one", counted)
    return places


@pytest.mark.parametrize(
    "odd_at",
    [[0], [SPLIT_CHUNK - 1], [7, 8], [0, 100, SPLIT_CHUNK - 1], [3, SPLIT_CHUNK + 3]],
    ids=["first", "last", "adjacent", "first-middle-last", "two-chunks"],
)
@pytest.mark.parametrize("odd", ["large-pack", "small-pack", "tick"])
def test_a_chunk_goes_on_in_pieces_around_its_packs_and_ticks(
    monkeypatch: pytest.MonkeyPatch, odd: str, odd_at: list[int]
) -> None:
    # A fleet's heartbeats hold Ticks and large runs' packs among loose heartbeats: only
    # those records go one at a time; the loose ones between them are admitted at once.
    value = {
        "large-pack": pack(64),
        "small-pack": pack(4),
        "tick": encode(Tick(run_id="*", ts_ns=TS_NS, partition=2)),
    }[odd]
    assert (len(value) > MANY_MAX_RECORD_BYTES) == (odd == "large-pack")
    values: list[tuple[bytes | None, bytes | None]] = [
        (b"r", heartbeat(rank=i % 8)) for i in range(2 * SPLIT_CHUNK)
    ]
    for i in odd_at:
        values[i] = (b"*" if odd == "tick" else b"r", value)
    one_at_a_time = records_checked_alone(monkeypatch)
    good, dead = assert_as_check(records(values), TopicRole.HEARTBEATS)
    assert len(good) == len(values) and not dead
    assert sorted(one_at_a_time) == sorted(odd_at)


def test_a_chunk_of_a_failed_rule_still_goes_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    values: list[tuple[bytes | None, bytes | None]] = [(b"r", heartbeat())] * 10
    values[4] = (b"s", heartbeat())  # the key is not its run: no record of it is odd
    one_at_a_time = records_checked_alone(monkeypatch)
    _, dead = assert_as_check(records(values), TopicRole.HEARTBEATS)
    assert len(dead) == 1 and one_at_a_time == list(range(10))


@settings(max_examples=100, deadline=None)
@given(
    bad=st.lists(st.integers(0, 3 * SPLIT_CHUNK - 1), max_size=4),
    value=_VALUES,
)
def test_split_is_check_of_each_record_across_chunks(bad: list[int], value: bytes) -> None:
    values: list[tuple[bytes | None, bytes | None]] = [
        (b"r", heartbeat(rank=i % 8)) for i in range(3 * SPLIT_CHUNK)
    ]
    for i in bad:
        values[i] = (b"r", value)
    assert_as_check(records(values), TopicRole.HEARTBEATS)


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(
        st.tuples(st.integers(0, 7), st.booleans(), st.booleans(), st.booleans()),
        min_size=1,
        max_size=6,
    ),
    cuts=st.lists(st.integers(0, 10_000), max_size=2),
)
def test_values_cut_into_records_anywhere(
    values: list[tuple[int, bool, bool, bool]], cuts: list[int]
) -> None:
    # A stream of JSON values (heartbeats, some holding another in a field) cut into
    # records at some of their starts, some of the inner ones' starts, and a few places
    # anywhere: records that end inside a value, finish another's, or hold two. Each is
    # judged alone, whatever its neighbours (a chunk decoded as the lines of one buffer
    # once read as many such records as values as that many events, shifted).
    stream, places = b"", {0}
    for rank, nested, cut_before, cut_inside in values:
        if cut_before:
            places.add(len(stream))
        if nested:
            stream += heartbeat(rank=rank)[:-1] + b',"x":'
            if cut_inside:
                places.add(len(stream))
            stream += heartbeat(rank=rank) + b"}"
        else:
            stream += heartbeat(rank=rank)
    places |= {len(stream), *(c % (len(stream) + 1) for c in cuts)}
    pieces = [stream[a:b] for a, b in pairwise(sorted(places)) if b > a]
    assert_as_check(records([(b"r", v) for v in pieces]), TopicRole.HEARTBEATS)
