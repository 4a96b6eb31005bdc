"""Reducer states as bytes, for table values (msgpack: compact, and NaN survives it)."""

from __future__ import annotations

from typing import Final, Literal, TypeAlias

import msgspec

from processors.core.checkpoints import CheckpointCatalogue
from processors.core.liveness import LivenessState
from processors.core.policy import PolicyState
from processors.core.steps import StepHealthState

State: TypeAlias = StepHealthState | LivenessState | PolicyState | CheckpointCatalogue
StateKind = Literal["steps", "liveness", "policy", "checkpoints"]

STATE_TYPES: Final[dict[str, type[State]]] = {
    "steps": StepHealthState,
    "liveness": LivenessState,
    "policy": PolicyState,
    "checkpoints": CheckpointCatalogue,
}
_ENCODER: Final = msgspec.msgpack.Encoder()
_DECODERS: Final = {kind: msgspec.msgpack.Decoder(t) for kind, t in STATE_TYPES.items()}


def encode_state(state: State) -> bytes:
    """Encode any reducer state as msgpack bytes."""
    return _ENCODER.encode(state)


def decode_state(kind: StateKind | type[State], data: bytes) -> State:
    """Decode a state written by `encode_state`.

    Args:
        kind: ``steps``, ``liveness``, ``policy`` or ``checkpoints`` (or the state class).
        data: The bytes.

    Returns:
        The state, equal to the one encoded.

    Raises:
        ValueError: Unknown kind.
        msgspec.DecodeError: Bytes that are not such a state.
    """
    key = (
        kind
        if isinstance(kind, str)
        else next((k for k, t in STATE_TYPES.items() if t is kind), "")
    )
    decoder = _DECODERS.get(key)
    if decoder is None:
        raise ValueError(f"unknown state kind {kind!r}; valid: {', '.join(STATE_TYPES)}")
    state: State = decoder.decode(data)
    return state


__all__ = ["STATE_TYPES", "State", "StateKind", "decode_state", "encode_state"]
