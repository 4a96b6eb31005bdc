"""States as bytes for table values."""

from __future__ import annotations

import pytest

from processors.core.replay import replay
from processors.core.state_codec import STATE_TYPES, decode_state, encode_state
from processors.core.steps import StepHealthState
from tests.unit.core.test_properties import CFG, records_for


def test_every_state_round_trips_byte_identically() -> None:
    result = replay(records_for(7), CFG)
    tables = {
        "steps": result.steps,
        "liveness": result.liveness,
        "policy": result.policy,
        "checkpoints": result.checkpoints,
    }
    for kind, table in tables.items():
        for state in table.values():
            raw = encode_state(state)
            again = decode_state(kind, raw)  # type: ignore[arg-type]
            assert type(again) is STATE_TYPES[kind]
            assert encode_state(again) == raw


def test_decode_by_class_and_unknown_kind() -> None:
    state = StepHealthState(run_id="r")
    assert decode_state(StepHealthState, encode_state(state)) == state
    with pytest.raises(ValueError):
        decode_state("nope", b"")  # type: ignore[arg-type]
