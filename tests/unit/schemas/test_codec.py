import math

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runwatch.schemas import codec
from runwatch.schemas.events import (
    ALL_TYPES,
    AgentReady,
    AnomalyDetected,
    CheckpointCommitted,
    CheckpointFailed,
    CommandRejected,
    DeadLetter,
    EventPack,
    Heartbeat,
    LoaderState,
    ModelFlopConfig,
    ParallelPlan,
    Provenance,
    RankExited,
    RestartCompleted,
    RestartFailed,
    RestartRequested,
    RunEnded,
    RunStarted,
    StepCompleted,
    Tick,
)

SRC = Provenance(topic="runwatch.steps", partition=3, offset=41)

ONE_OF_EACH = [
    RunStarted(
        run_id="r1",
        ts_ns=1,
        seq=1,
        world_size=2,
        flop_config=ModelFlopConfig(n_params=10, n_layer=1, n_head=2, d_model=4, seq_len=8),
        plan=ParallelPlan(dp_replicate=2),
        peak_flops_per_s=1e12,
        dtype="bf16",
        vocab_size=256,
        tags={"model": "tiny"},
        thresholds={"loss_z_thresh": 8.0},
        incarnation=1,
    ),
    StepCompleted(
        run_id="r1",
        ts_ns=2,
        seq=2,
        step=7,
        loss=2.5,
        step_time_s=0.25,
        grad_norm=1.5,
        tokens=4096,
        examples=64,
        lr=3e-4,
        restart_from_step=5,
    ),
    Heartbeat(run_id="r1", ts_ns=3, rank=1, step=7, step_time_s=0.2, host="h", pid=9),
    Tick(run_id="*", ts_ns=4, partition=3),
    CheckpointCommitted(
        run_id="r1",
        ts_ns=5,
        step=5,
        path="/ck/step_5",
        loader_states=(LoaderState(seed=0, epoch=0, rank=0, world_size=2, global_sample=320),),
        size_bytes=100,
        write_s=0.5,
        blocked_s=0.01,
    ),
    CheckpointFailed(run_id="r1", ts_ns=6, step=10, path="/ck/step_10", reason="disk full"),
    RunEnded(run_id="r1", ts_ns=7, status="completed", final_step=7),
    AnomalyDetected(
        run_id="r1",
        ts_ns=2,
        seq=41,
        verdict_id="abc",
        kind="loss_spike",
        step=7,
        value=9.0,
        baseline=2.0,
        scale=0.1,
        z=70.0,
        threshold=6.0,
        source=SRC,
        config_hash="c0ffee",
    ),
    RestartRequested(
        run_id="r1",
        ts_ns=2,
        command_id="cmd",
        action="rollback",
        cause_verdict_id="abc",
        cause_kind="nonfinite_loss",
        max_checkpoint_step=6,
        signature="00",
        key_id="k1",
    ),
    RestartCompleted(run_id="r1", ts_ns=8, command_id="cmd", checkpoint_step=5, world_size=2),
    RestartFailed(run_id="r1", ts_ns=8, command_id="cmd", reason="no checkpoint"),
    CommandRejected(run_id="r1", ts_ns=8, command_id="cmd", reason="bad signature", source=SRC),
    DeadLetter(run_id="", ts_ns=9, source=SRC, reason="not JSON", key=b"r1", payload=b"\x00\xff"),
    RankExited(run_id="r1", ts_ns=10, rank=1, incarnation=2, host="node-a", pid=4242, signal=9),
    AgentReady(run_id="r1", ts_ns=12, command_id="cmd", incarnation=3, node_rank=1, nnodes=2),
    EventPack(
        run_id="r1",
        ts_ns=11,
        events=(
            Heartbeat(run_id="r1", ts_ns=10, rank=0, step=8, step_time_s=0.2, host="h", pid=8),
            Heartbeat(run_id="r1", ts_ns=11, rank=1, step=8, step_time_s=0.3, host="h", pid=9),
        ),
    ),
]


def test_one_of_each_covers_every_type():
    assert {type(e) for e in ONE_OF_EACH} == set(ALL_TYPES)


@pytest.mark.parametrize("event", ONE_OF_EACH, ids=lambda e: type(e).__name__)
def test_round_trip(event):
    assert codec.decode(codec.encode(event)) == event


@pytest.mark.parametrize("event", ONE_OF_EACH, ids=lambda e: type(e).__name__)
def test_decode_gives_the_exact_type_and_no_type_subclasses_another(event):
    """What `schemas.records` checks a record's type with: ``type(event)`` in a set."""
    assert type(codec.decode(codec.encode(event))) is type(event)
    assert [t for t in ALL_TYPES if t is not type(event) and issubclass(type(event), t)] == []


@pytest.mark.parametrize("event", ONE_OF_EACH, ids=lambda e: type(e).__name__)
def test_tag_is_versioned_not_class_name(event):
    tag = msgspec.json.decode(codec.encode(event))["type"]
    assert tag.rsplit(".", 1)[1].startswith("v")
    assert tag != type(event).__name__


@pytest.mark.parametrize(
    ("value", "token"),
    [(math.nan, "NaN"), (math.inf, "Infinity"), (-math.inf, "-Infinity")],
)
def test_nonfinite_floats_travel_as_tokens(value, token):
    event = StepCompleted(run_id="r", ts_ns=1, step=1, loss=value, step_time_s=0.1, grad_norm=value)
    raw = msgspec.json.decode(codec.encode(event))
    assert raw["loss"] == token
    assert raw["grad_norm"] == token
    back = codec.decode(codec.encode(event))
    assert isinstance(back, StepCompleted)
    if math.isnan(value):
        assert math.isnan(back.loss) and back.grad_norm is not None and math.isnan(back.grad_norm)
    else:
        assert back.loss == value and back.grad_norm == value


def test_null_in_required_float_reads_as_nan():
    # What msgspec's plain encoder and JavaScript's JSON.stringify write for NaN.
    event = codec.decode(
        b'{"type":"step.v1","run_id":"r","ts_ns":1,"step":1,"loss":null,"step_time_s":0.1}'
    )
    assert isinstance(event, StepCompleted) and math.isnan(event.loss)


def test_null_in_optional_float_stays_none():
    event = codec.decode(
        b'{"type":"step.v1","run_id":"r","ts_ns":1,"step":1,"loss":1.0,"step_time_s":0.1,"grad_norm":null}'
    )
    assert isinstance(event, StepCompleted) and event.grad_norm is None


def test_token_in_string_field_stays_a_string():
    event = codec.decode(
        b'{"type":"heartbeat.v1","run_id":"r","ts_ns":1,"rank":0,"step":1,"host":"NaN"}'
    )
    assert isinstance(event, Heartbeat) and event.host == "NaN"


def test_nonfinite_inside_thresholds_dict_round_trips():
    event = RunStarted(run_id="r", ts_ns=1, world_size=1, thresholds={"max_loss": math.inf})
    back = codec.decode(codec.encode(event))
    assert isinstance(back, RunStarted) and back.thresholds == {"max_loss": math.inf}


@pytest.mark.parametrize(
    ("data", "error", "fragment"),
    [
        (b"\x00\x01garbage", codec.MalformedEvent, "not JSON"),
        (b"[1, 2]", codec.MalformedEvent, "JSON object"),
        (b'{"run_id":"r"}', codec.MalformedEvent, "type"),
        (b'{"type":"step.v9","run_id":"r","ts_ns":1}', codec.UnknownEventType, "step.v9"),
        (
            b'{"type":"step.v1","run_id":"r","ts_ns":1,"step":"3","loss":1,"step_time_s":0.1}',
            codec.MalformedEvent,
            "$.step",
        ),
        (
            b'{"type":"step.v1","run_id":"r","ts_ns":1,"loss":1,"step_time_s":0.1}',
            codec.MalformedEvent,
            "step",
        ),
        (
            b'{"type":"step.v1","run_id":"r","ts_ns":1,"step":1,"loss":"NaN","step_time_s":"x"}',
            codec.MalformedEvent,
            "step_time_s",
        ),
        (
            b'{"type":"run_ended.v1","run_id":"r","ts_ns":1,"status":"exploded"}',
            codec.MalformedEvent,
            "status",
        ),
    ],
)
def test_bad_input_is_reported_with_a_reason(data, error, fragment):
    with pytest.raises(error) as info:
        codec.decode(data)
    assert fragment in info.value.reason


def test_unknown_tag_error_names_the_tag():
    with pytest.raises(codec.UnknownEventType) as info:
        codec.decode(b'{"type":"future_thing.v1","run_id":"r","ts_ns":1}')
    assert info.value.tag == "future_thing.v1"


def test_defaults_are_omitted_on_the_wire():
    raw = msgspec.json.decode(codec.encode(Heartbeat(run_id="r", ts_ns=1, rank=0, step=1)))
    assert set(raw) == {"type", "run_id", "ts_ns", "rank", "step"}


def test_key_is_run_id():
    assert codec.encode_key("run-7") == b"run-7"


finite = st.floats(allow_nan=False, allow_infinity=False)
any_float = st.floats(allow_nan=True, allow_infinity=True)


@settings(max_examples=200, deadline=None)
@given(
    step=st.integers(min_value=0, max_value=2**62),
    loss=any_float,
    grad=st.none() | any_float,
    dt=finite,
    host=st.text(max_size=20),
)
def test_any_step_and_heartbeat_round_trip(step, loss, grad, dt, host):
    event = StepCompleted(run_id="r", ts_ns=5, step=step, loss=loss, step_time_s=dt, grad_norm=grad)
    back = codec.decode(codec.encode(event))
    assert isinstance(back, StepCompleted)
    assert back.step == step and back.step_time_s == dt
    assert (math.isnan(back.loss) and math.isnan(loss)) or back.loss == loss
    if grad is None:
        assert back.grad_norm is None
    else:
        assert back.grad_norm is not None
        assert (math.isnan(back.grad_norm) and math.isnan(grad)) or back.grad_norm == grad
    hb = Heartbeat(run_id="r", ts_ns=5, rank=1, step=step, host=host)
    assert codec.decode(codec.encode(hb)) == hb
