"""Schema evolution: what a decoder of today does with events of tomorrow and of yesterday."""

import json

import jsonschema
import msgspec
import pytest

from runwatch.schemas import codec, generate
from runwatch.schemas.events import (
    AgentReady,
    BackendDeclaration,
    Heartbeat,
    RankExited,
    RankStack,
    RunStarted,
    StepCompleted,
)

from .test_codec import ONE_OF_EACH


def test_unknown_extra_fields_are_ignored():
    future = (
        b'{"type":"step.v1","run_id":"r","ts_ns":1,"step":3,"loss":2.0,"step_time_s":0.1,'
        b'"moe_aux_loss":0.01,"expert_load":{"e0":0.5}}'
    )
    event = codec.decode(future)
    assert isinstance(event, StepCompleted) and event.step == 3 and event.loss == 2.0


def test_old_event_without_new_defaulted_fields_decodes_with_defaults():
    # An event written before `dropped`, `incarnation` and `vocab_size` existed.
    old = b'{"type":"run_started.v1","run_id":"r","ts_ns":1,"world_size":4}'
    event = codec.decode(old)
    assert isinstance(event, RunStarted)
    assert (event.dropped, event.incarnation, event.vocab_size) == (0, 0, None)


def test_a_new_version_lives_beside_the_old_one():
    class HeartbeatV2(
        msgspec.Struct, frozen=True, kw_only=True, tag="heartbeat.v2", tag_field="type"
    ):
        run_id: str
        ts_ns: int
        rank: int
        step: int
        gpu_temp_c: float

    raw = msgspec.json.encode(HeartbeatV2(run_id="r", ts_ns=1, rank=0, step=1, gpu_temp_c=70.0))
    with pytest.raises(codec.UnknownEventType):
        codec.decode(raw)
    # and the v1 event still decodes
    assert isinstance(
        codec.decode(codec.encode(Heartbeat(run_id="r", ts_ns=1, rank=0, step=1))), Heartbeat
    )


def test_checked_in_json_schema_is_current():
    for name, text in generate.render().items():
        path = generate.OUT_DIR / name
        assert path.exists(), f"{name} missing: run python -m runwatch.schemas.generate"
        assert path.read_text() == text, f"{name} is stale: run python -m runwatch.schemas.generate"


def test_generate_check_flags_stale_files(tmp_path, monkeypatch):
    monkeypatch.setattr(generate, "OUT_DIR", tmp_path)
    assert generate.main(["--check"]) == 1
    assert generate.main([]) == 0
    assert generate.main(["--check"]) == 0


@pytest.mark.parametrize("event", ONE_OF_EACH, ids=lambda e: type(e).__name__)
def test_wire_events_validate_against_the_json_schema(event):
    schema = json.loads((generate.OUT_DIR / "event.json").read_text())
    jsonschema.validate(json.loads(codec.encode(event)), schema)


def test_nan_event_validates_against_the_json_schema():
    schema = json.loads((generate.OUT_DIR / "event.json").read_text())
    event = StepCompleted(run_id="r", ts_ns=1, step=1, loss=float("nan"), step_time_s=0.1)
    jsonschema.validate(json.loads(codec.encode(event)), schema)


def test_rank_exited_v1_minimal_record_decodes_with_unknown_status():
    # The smallest rank_exited.v1 an agent can write: status unknown (neither field set).
    event = codec.decode(b'{"type":"rank_exited.v1","run_id":"r","ts_ns":5,"rank":1}')
    assert isinstance(event, RankExited)
    assert (event.incarnation, event.host, event.exit_code, event.signal) == (0, "", None, None)
    with pytest.raises(codec.DecodeError):
        codec.decode(b'{"type":"rank_exited.v1","run_id":"r","ts_ns":5,"rank":1,"signal":0}')


def test_a_run_started_from_before_backend_declarations_decodes_with_none():
    old = (
        b'{"type":"run_started.v1","run_id":"r","ts_ns":1,"world_size":2,"incarnation":3,'
        b'"tags":{"backend":"torch-ddp"}}'
    )
    event = codec.decode(old)
    assert isinstance(event, RunStarted)
    assert (event.incarnation, event.backend) == (3, None)


def test_a_run_started_with_a_backend_declaration_round_trips():
    declared = BackendDeclaration(
        name="torch-ddp", reshardable_checkpoint=True, elastic_restart=True
    )
    event = RunStarted(run_id="r", ts_ns=1, world_size=2, backend=declared)
    back = codec.decode(codec.encode(event))
    assert isinstance(back, RunStarted) and back.backend == declared
    # A declaration that names only the backend claims nothing.
    bare = codec.decode(
        b'{"type":"run_started.v1","run_id":"r","ts_ns":1,"world_size":2,'
        b'"backend":{"name":"megatron"}}'
    )
    assert isinstance(bare, RunStarted) and bare.backend == BackendDeclaration(name="megatron")
    assert not (bare.backend.reshardable_checkpoint or bare.backend.elastic_restart)


def test_an_agent_ready_without_stacks_decodes_and_one_with_stacks_round_trips():
    # Written before AgentReady carried its node's stacks.
    old = (
        b'{"type":"agent_ready.v1","run_id":"r","ts_ns":1,"command_id":"c","incarnation":1,'
        b'"node_rank":1,"nnodes":2,"host":"n1"}'
    )
    event = codec.decode(old)
    assert isinstance(event, AgentReady) and event.stacks == ()
    assert b"stacks" not in codec.encode(event)  # an empty one stays off the wire
    stacks = (RankStack(rank=1, host="n1", where="before_step (faults.py:1)"),)
    new = msgspec.structs.replace(event, stacks=stacks)
    again = codec.decode(codec.encode(new))
    assert isinstance(again, AgentReady) and again.stacks == stacks
