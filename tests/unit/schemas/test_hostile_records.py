"""Hostile records: each one is a dead letter with a reason, none raises, none stops a batch.

A corpus of records that broke (or could break) a partition, then hypothesis fuzzing of
the whole path an input record takes: decode (`schemas.records`), fold
(`processors.pipeline.fold_batch`, the replay the audit runs) and state encoding.
"""

from __future__ import annotations

import contextlib
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.state_codec import decode_state, encode_state
from runwatch.processors.pipeline import fold_batch
from runwatch.schemas.codec import DecodeError, decode, encode, nesting_depth
from runwatch.schemas.events import (
    MAX_DEADLETTER_PAYLOAD_BYTES,
    MAX_NESTING,
    MAX_RECORD_BYTES,
    DeadLetter,
    Heartbeat,
    RunStarted,
    StepCompleted,
)
from runwatch.schemas.records import Decoded, RawRecord, check, split
from runwatch.schemas.topics import FOLD_ORDER, TopicRole, folding

CFG = DetectorConfig()
RUN = "r"


def _step(**fields: object) -> bytes:
    base: dict[str, object] = {
        "type": "step.v1",
        "run_id": RUN,
        "ts_ns": 1,
        "step": 1,
        "loss": 1.0,
        "step_time_s": 0.1,
    }
    base.update(fields)
    return json.dumps(base).encode()


def _started(**fields: object) -> bytes:
    base: dict[str, object] = {"type": "run_started.v1", "run_id": RUN, "ts_ns": 1}
    base["world_size"] = 2
    base.update(fields)
    return json.dumps(base).encode()


DEEP = b"[" * 100_000 + b"]" * 100_000


def _pack(*events: dict[str, object] | bytes, run_id: str = RUN) -> bytes:
    inner = [json.loads(e) if isinstance(e, bytes) else e for e in events]
    return json.dumps({"type": "pack.v1", "run_id": run_id, "ts_ns": 1, "events": inner}).encode()


_HB = encode(Heartbeat(run_id=RUN, ts_ns=1, rank=0, step=1))
_OTHER_HB = encode(Heartbeat(run_id="other", ts_ns=1, rank=0, step=1))

# (role, key, value, a part of the reason)
CORPUS: list[tuple[str, bytes | None, bytes | None, str]] = [
    ("steps", b"r", _step(step=2**70), "$.step"),
    ("steps", b"r", _step(step=2**63), "$.step"),
    ("steps", b"r", _step(step=-1), ">= 0"),
    ("steps", b"r", _step(ts_ns=-5), "$.ts_ns"),
    ("steps", b"r", _step(tokens=2**64), "$.tokens"),
    ("steps", b"r", _step(rank=2**40), "$.rank"),
    ("steps", b"r", _step(microbatches=0), "$.microbatches"),
    ("steps", b"r", _step(restart_from_step=-3), "$.restart_from_step"),
    ("steps", b"r", _step(step=1.5), "$.step"),
    ("steps", b"r", _step(step="NaN"), "$.step"),
    ("steps", b"r", _step().replace(b'"step": 1', b'"step": NaN'), "not JSON"),
    ("steps", b"r", _step(step=None), "$.step"),
    ("steps", b"r", _step(loss="lots"), "$.loss"),
    ("steps", b"r", DEEP, "nested"),
    ("steps", b"r", _step(junk=json.loads("[" * 500 + "]" * 500)), "nested"),
    ("steps", b"r", b'{"type":"step.v1","x":' + DEEP + b"}", "nested"),
    ("steps", b"r", _step(run_id="r" * 10_000), "$.run_id"),
    ("steps", b"r", b" " * (MAX_RECORD_BYTES + 1), "exceeds"),
    ("steps", b"r", _step(junk="x" * (MAX_RECORD_BYTES + 10)), "exceeds"),
    ("steps", b"r", b'{"type":"step.v1","run_id":"r","ts_ns":1}', "missing required field"),
    ("steps", b"r", b'{"tipe":"step.v1","run_id":"r"}', "type"),
    ("steps", b"r", b'{"type":"step.v9","run_id":"r","ts_ns":1}', "unknown event type"),
    ("steps", b"r", b"\xff\xfe\x00garbage\x80", "not JSON"),
    ("steps", b"r", b'{"type":"step.v1","run_id":"\\ud800","ts_ns":1}', ""),
    ("steps", b"r", "\u202e\u0000\U0001f4a5".encode(), "not JSON"),
    ("steps", b"r", b"", "not JSON"),
    ("steps", b"r", b"[]", "JSON object"),
    ("steps", b"r", b"12", "JSON object"),
    ("steps", b"r", None, "tombstone"),
    ("steps", b"other", _step(), "not the run id"),
    ("steps", None, _step(), "not the run id"),
    ("steps", b"k" * 100_000, _step(), "not the run id"),
    ("steps", b"", _step(run_id=""), ""),
    ("steps", b"r", encode(Heartbeat(run_id=RUN, ts_ns=1, rank=0, step=1)), "does not belong"),
    ("heartbeats", b"r", _step(), "does not belong"),
    ("heartbeats", b"r", _pack(_HB, _OTHER_HB), "event 1 of a pack of run 'r' belongs"),
    ("heartbeats", b"other", _pack(_HB), "not the run id"),
    ("heartbeats", b"r", _pack(_HB, _step()), "event 1 of a pack is a StepCompleted"),
    ("steps", b"r", _pack(_step(), _HB), "event 1 of a pack is a Heartbeat"),
    ("heartbeats", b"r", _pack(_pack(_HB)), "packs do not nest"),
    ("heartbeats", b"r", _pack(_started()), "not a packable event"),
    ("heartbeats", b"r", _pack(), "length >= 1"),
    ("heartbeats", b"r", _pack(*[_HB] * 5000), "length <= 4096"),
    ("heartbeats", b"r", _pack(_HB, {"type": "heartbeat.v1", "run_id": "r"}), "$.events[1]"),
    ("checkpoints", b"r", _pack(_HB), "EventPack does not belong"),
    ("anomalies", b"r", _pack(_HB), "EventPack does not belong"),
    ("heartbeats", b"r", _started(world_size=0), "$.world_size"),
    ("heartbeats", b"r", _started(world_size=2**62), "$.world_size"),
    ("heartbeats", b"r", _started(tags={str(i): "v" for i in range(1000)}), "$.tags"),
    ("heartbeats", b"r", _started(tags={"k": "v" * 100_000}), "$.tags"),
    ("heartbeats", b"r", _started(incarnation=-1), "$.incarnation"),
    (
        "heartbeats",
        b"r",
        b'{"type":"heartbeat.v1","run_id":"r","ts_ns":1,"rank":-2,"step":1}',
        "$.rank",
    ),
    (
        "checkpoints",
        b"r",
        json.dumps(
            {
                "type": "checkpoint_committed.v1",
                "run_id": "r",
                "ts_ns": 1,
                "step": 1,
                "path": "/p",
                "size_bytes": 2**64,
            }
        ).encode(),
        "$.size_bytes",
    ),
    (
        "anomalies",
        b"r",
        json.dumps(
            {
                "type": "anomaly.v1",
                "run_id": "r",
                "ts_ns": 1,
                "verdict_id": "v",
                "kind": "dead_rank",
                "step": 2**66,
            }
        ).encode(),
        "$.step",
    ),
]


@pytest.mark.parametrize(("role", "key", "value", "reason"), CORPUS)
def test_a_hostile_record_is_a_dead_letter_with_its_reason(
    role: str, key: bytes | None, value: bytes | None, reason: str
) -> None:
    record = RawRecord(f"t.{role}", 3, 17, key, value, 5)
    out = check(record, role)
    assert isinstance(out, DeadLetter), out
    assert out.stage == "decode"
    assert reason in out.reason
    assert out.source.offset == 17 and out.source.partition == 3
    # the dead letter is itself a valid event that fits a Kafka record
    wire = encode(out)
    assert len(wire) < 1024 * 1024
    assert decode(wire) == out
    if value is not None and len(value) <= MAX_DEADLETTER_PAYLOAD_BYTES:
        assert out.payload == value  # nothing lost
    elif value is not None:
        assert out.payload == value[:MAX_DEADLETTER_PAYLOAD_BYTES] and "cut to" in out.reason


def test_a_batch_with_hostile_records_goes_on_around_them() -> None:
    good = [
        encode(RunStarted(run_id=RUN, ts_ns=1, world_size=2)),
        *(
            encode(StepCompleted(run_id=RUN, ts_ns=10 + s, step=s, loss=1.0, step_time_s=0.1))
            for s in range(1, 40)
        ),
        encode(StepCompleted(run_id=RUN, ts_ns=100, step=40, loss=math.nan, step_time_s=0.1)),
    ]
    hostile = [v for role, k, v, _ in CORPUS if role == "steps" and k == b"r" and v is not None]
    values: list[bytes] = []
    for i, g in enumerate(good):
        values.append(g)
        values.extend(hostile[i : i + 1])
    records = [RawRecord("t.steps", 0, i, b"r", v) for i, v in enumerate(values)]
    items, dead = split(records, "steps")
    assert len(items) == len(good) and len(dead) == len(values) - len(good)
    result = fold_batch("steps", items, lambda _: None, lambda _: (), CFG)
    assert result.dead == []
    assert [a.kind for a in result.outputs] == ["nonfinite_loss"]  # the NaN after them judged
    assert encode_state(decode_state("steps", result.encoded[RUN])) == result.encoded[RUN]
    assert encode_state(result.states[RUN]) == result.encoded[RUN]


def test_nesting_depth_ignores_brackets_in_strings() -> None:
    assert nesting_depth(b'{"a": "[[[[{{{{", "b": [[1], {"c": []}]}') == 4
    assert nesting_depth(b'"\\"[["') == 0
    assert nesting_depth(DEEP) == 100_000


def test_a_checkpoint_with_many_loader_states_still_decodes() -> None:
    states = [{"seed": 1, "epoch": 0, "rank": r, "world_size": 4096} for r in range(4096)]
    value = json.dumps(
        {
            "type": "checkpoint_committed.v1",
            "run_id": "r",
            "ts_ns": 1,
            "step": 3,
            "path": "/p",
            "write_s": "NaN",  # the lenient path, past the bracket count
            "loader_states": states,
        }
    ).encode()
    assert value.count(b"{") > MAX_NESTING
    assert len(decode(value).loader_states) == 4096  # type: ignore[union-attr]


# --------------------------------------------------------------------------- fuzzing

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False)
    | st.sampled_from(["NaN", "Infinity", "-Infinity", "", "r", "*", "\u0000\ud7ff"])
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = [
    "type",
    "run_id",
    "ts_ns",
    "seq",
    "step",
    "loss",
    "step_time_s",
    "grad_norm",
    "tokens",
    "rank",
    "world_size",
    "incarnation",
    "restart_from_step",
    "thresholds",
    "tags",
    "plan",
    "flop_config",
    "partition",
    "status",
    "final_step",
    "path",
    "loader_states",
    "skipped",
]
TAGS = [
    "run_started.v1",
    "step.v1",
    "heartbeat.v1",
    "tick.v1",
    "run_ended.v1",
    "checkpoint_committed.v1",
    "checkpoint_failed.v1",
    "anomaly.v1",
]


@st.composite
def records(draw: st.DrawFn) -> bytes:
    """A JSON object shaped like an event, with fields of any type and value."""
    obj: dict[str, object] = {"type": draw(st.sampled_from(TAGS)), "run_id": RUN, "ts_ns": 1}
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=8)):
        obj[name] = draw(json_values)
    if draw(st.booleans()):
        obj.setdefault("world_size", draw(st.integers(1, 8)))
        obj.setdefault("step", draw(st.integers(0, 2**63)))
        obj.setdefault("loss", 1.0)
        obj.setdefault("step_time_s", 0.1)
        obj.setdefault("rank", draw(st.integers(0, 8)))
    return json.dumps(obj).encode()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_decode_raises_only_decode_errors_on_any_bytes(data: bytes) -> None:
    with contextlib.suppress(DecodeError):
        decode(data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(records(), min_size=1, max_size=25), st.sampled_from(FOLD_ORDER))
def test_decode_fold_encode_never_raises_and_accounts_for_every_record(
    values: list[bytes], role: TopicRole
) -> None:
    key = b"*" if role == "heartbeats" else RUN.encode()
    raw = [RawRecord(f"t.{role}", 0, i, RUN.encode(), v) for i, v in enumerate(values)]
    raw.append(RawRecord(f"t.{role}", 0, len(raw), key, b'{"type":"tick.v1","run_id":"*"}'))
    items, dead = split(raw, role)
    assert len(items) + len(dead) == len(raw)
    assert all(isinstance(i, Decoded) for i in items)
    result = fold_batch(role, items, lambda _: None, lambda _: (), CFG)
    kind = folding(role).state
    for run_id, data in result.encoded.items():
        assert encode_state(decode_state(kind, data)) == data  # type: ignore[arg-type]
        assert encode_state(result.states[run_id]) == data
    for letter in [*dead, *result.dead]:
        assert decode(encode(letter)) == letter
