"""Packed records (`schemas.events.EventPack`): bounds, evolution and the codec's pack path."""

import json
import math
import re

import jsonschema
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runwatch.schemas import codec, generate
from runwatch.schemas.events import (
    MAX_PACK_EVENTS,
    EventPack,
    Heartbeat,
    Provenance,
    RunEnded,
    StepCompleted,
)


def hb(rank: int, step: int = 3, run_id: str = "r") -> Heartbeat:
    return Heartbeat(run_id=run_id, ts_ns=100 + rank, rank=rank, step=step, host="n0", pid=7)


def raw_pack(events: list[dict[str, object]], run_id: str = "r") -> bytes:
    return json.dumps({"type": "pack.v1", "run_id": run_id, "ts_ns": 1, "events": events}).encode()


def test_pack_round_trips_with_mixed_packable_events():
    step = StepCompleted(run_id="r", ts_ns=5, step=3, loss=2.0, step_time_s=0.1, grad_norm=1.0)
    pack = EventPack(run_id="r", ts_ns=5, events=(hb(0), step, hb(1)))
    assert codec.decode(codec.encode(pack)) == pack


def test_nonfinite_floats_inside_a_pack_stay_exact():
    # The one event runwatch must never lose: a NaN loss, also when it travels packed
    # (and an optional NaN grad norm must not come back as None).
    step = StepCompleted(
        run_id="r", ts_ns=5, step=3, loss=math.nan, step_time_s=0.1, grad_norm=-math.inf
    )
    data = codec.encode(EventPack(run_id="r", ts_ns=5, events=(step,)))
    assert b'"loss":"NaN"' in data and b'"grad_norm":"-Infinity"' in data
    (back,) = codec.decode(data).events  # type: ignore[union-attr]
    assert isinstance(back, StepCompleted)
    assert math.isnan(back.loss) and back.grad_norm == -math.inf


def test_encode_pack_joins_encoded_events_byte_for_byte():
    events = (
        hb(0, run_id='run "quoted"'),
        StepCompleted(
            run_id='run "quoted"', ts_ns=9, step=1, loss=math.nan, step_time_s=0.5, lr=1e-3
        ),
        hb(5, run_id='run "quoted"'),
    )
    pack = EventPack(run_id='run "quoted"', ts_ns=9, events=events)
    joined = codec.encode_pack(pack.run_id, 9, [codec.encode(e) for e in events])
    assert joined == codec.encode(pack)
    with pytest.raises(ValueError, match="1 to"):
        codec.encode_pack("r", 1, [])


def test_a_pack_with_another_runs_event_is_rejected_whole():
    with pytest.raises(ValueError, match="belongs to run 'other'"):
        EventPack(run_id="r", ts_ns=1, events=(hb(0), hb(1, run_id="other")))
    data = codec.encode(EventPack(run_id="r", ts_ns=1, events=(hb(0), hb(1))))
    forged = data.replace(b'"rank":1', b'"rank":1,"run_id":"other"')
    with pytest.raises(codec.MalformedEvent, match="event 1 of a pack of run 'r' belongs"):
        codec.decode(forged)


def test_packs_do_not_nest():
    inner = json.loads(codec.encode(EventPack(run_id="r", ts_ns=1, events=(hb(0),))))
    with pytest.raises(codec.MalformedEvent, match="packs do not nest"):
        codec.decode(raw_pack([inner]))


def test_only_packable_events_travel_packed():
    ended = json.loads(codec.encode(RunEnded(run_id="r", ts_ns=1, status="completed")))
    with pytest.raises(codec.MalformedEvent, match=r"'run_ended.v1' \(not a packable event"):
        codec.decode(raw_pack([json.loads(codec.encode(hb(0))), ended]))
    with pytest.raises(codec.MalformedEvent):
        codec.decode(raw_pack([{"type": "heartbeat.v9", "run_id": "r", "ts_ns": 1}]))


def test_pack_count_bounds():
    with pytest.raises(codec.MalformedEvent, match="length >= 1"):
        codec.decode(raw_pack([]))
    one = json.loads(codec.encode(hb(0)))
    full = codec.decode(raw_pack([one] * MAX_PACK_EVENTS))
    assert isinstance(full, EventPack) and len(full.events) == MAX_PACK_EVENTS
    with pytest.raises(codec.MalformedEvent, match=f"length <= {MAX_PACK_EVENTS}"):
        codec.decode(raw_pack([one] * (MAX_PACK_EVENTS + 1)))


def test_a_pack_at_the_cap_fits_a_default_kafka_record():
    # MAX_PACK_EVENTS heartbeats of a realistic size stay under Kafka's 1 MiB default.
    events = tuple(
        Heartbeat(
            run_id="llama3-405b-pretrain-0042",
            ts_ns=1_764_590_000_000_000_000 + r,
            seq=10_000_000 + r,
            rank=r,
            step=123_456,
            step_time_s=4.123456789,
            host=f"gpu-node-{r // 8:04d}",
            pid=123_456,
        )
        for r in range(MAX_PACK_EVENTS)
    )
    data = codec.encode(EventPack(run_id=events[0].run_id, ts_ns=1, events=events))
    assert len(data) < 1024 * 1024


def test_inner_field_bounds_still_apply():
    bad = json.loads(codec.encode(hb(0)))
    bad["rank"] = -1
    with pytest.raises(codec.MalformedEvent, match=r"\$.events\[0\].rank"):
        codec.decode(raw_pack([bad]))


def test_deep_nesting_in_a_pack_is_bounded():
    bomb = b'{"type":"pack.v1","run_id":"r","ts_ns":1,"events":[' + b"[" * 100_000
    bomb += b"]" * 100_000 + b"]}"
    with pytest.raises(codec.MalformedEvent, match="nested"):
        codec.decode(bomb)


# ----------------------------------------------------------------- evolution


def test_provenance_index_is_omitted_when_the_record_is_the_event():
    # Verdicts written before packs existed read back unchanged, and unpacked sources
    # encode as they always did (no "index" on the wire).
    old = b'{"topic":"t","partition":1,"offset":5}'
    source = msgspec.json.decode(old, type=Provenance)
    assert source.index == -1
    assert msgspec.json.encode(source) == old
    packed = Provenance(topic="t", partition=1, offset=5, index=3)
    assert msgspec.json.decode(msgspec.json.encode(packed), type=Provenance) == packed


def test_an_old_decoder_reports_a_pack_as_unknown_not_a_crash():
    # A decoder of yesterday does not know pack.v1: it names the tag (a dead letter with
    # a reason), which is how a pack reaches a processor that predates packs.
    class Yesterday(msgspec.Struct, frozen=True, tag="heartbeat.v1", tag_field="type"):
        run_id: str

    decoder = msgspec.json.Decoder(Yesterday)
    with pytest.raises(msgspec.ValidationError, match=r"pack\.v1"):
        decoder.decode(codec.encode(EventPack(run_id="r", ts_ns=1, events=(hb(0),))))


def test_pack_of_tomorrow_with_unknown_fields_decodes():
    obj = json.loads(raw_pack([json.loads(codec.encode(hb(0)))]))
    obj |= {"node": "n0", "compression": "none"}
    obj["events"][0]["gpu_temp_c"] = 71.5
    future = json.dumps(obj).encode()
    event = codec.decode(future)
    assert isinstance(event, EventPack) and event.events == (hb(0),)


def test_pack_validates_against_the_json_schema():
    schema = json.loads((generate.OUT_DIR / "event.json").read_text())
    step = StepCompleted(run_id="r", ts_ns=5, step=3, loss=math.nan, step_time_s=0.1)
    jsonschema.validate(
        json.loads(codec.encode(EventPack(run_id="r", ts_ns=5, events=(hb(0), step)))), schema
    )
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(json.loads(raw_pack([])), schema)


# ----------------------------------------------------------------- nesting, fast path

_JSON_VALUES = st.recursive(
    st.none() | st.integers() | st.text(alphabet='ab[]{}"\\ ', max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(alphabet='k[]"\\', max_size=3), inner, max_size=3)
    ),
    max_leaves=20,
)


def _depth(value: object) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(_JSON_VALUES)
def test_nesting_depth_is_exact_with_and_without_escapes(value: object) -> None:
    # Without a backslash the scan splits on quotes (a pack's fast path), with one it
    # skips strings by pattern: both must see exactly the JSON's nesting.
    data = json.dumps(value).encode()
    assert codec.nesting_depth(data) == _depth(value)


def _linear_depth(data: bytes) -> int:
    """The depth as the codec scanned it before it peeled pairs: one running count."""
    strings = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
    outside = b"".join(data.split(b'"')[::2]) if b"\\" not in data else strings.sub(b"", data)
    depth = deepest = 0
    for byte in outside:
        if byte in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        elif byte in b"]}":
            depth -= 1
    return deepest


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from([b"[", b"]", b"{", b"}", b'"', b"\\", b"a", b":"]), max_size=80))
def test_nesting_depth_of_any_bytes_is_the_running_count(parts: list[bytes]) -> None:
    # Broken JSON included (a close before its open, an unterminated string or array):
    # peeling pairs level by level must say what one running count of brackets says.
    data = b"".join(parts)
    assert codec.nesting_depth(data) == _linear_depth(data)
