"""Reducer states as bytes, for table values (msgpack: compact, and NaN survives it).

The liveness state's per-rank table (`processors.core.rank_table.RankTable`) is written
as packed arrays (integers as narrow offsets in deflated byte planes, step times as raw
float64), so a 4,096-rank run's state is a few kilobytes instead of tens. States encoded
before this format (per-rank tuples) do not decode: no changelog had to be migrated.
"""

from __future__ import annotations

from typing import Any, Final, Literal, TypeAlias

import msgspec

from processors.core.checkpoints import CheckpointCatalogue
from processors.core.liveness import LivenessState
from processors.core.policy import PolicyState
from processors.core.rank_table import RankTable
from processors.core.steps import StepHealthState

State: TypeAlias = StepHealthState | LivenessState | PolicyState | CheckpointCatalogue
StateKind = Literal["steps", "liveness", "policy", "checkpoints"]

STATE_TYPES: Final[dict[str, type[State]]] = {
    "steps": StepHealthState,
    "liveness": LivenessState,
    "policy": PolicyState,
    "checkpoints": CheckpointCatalogue,
}


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, RankTable):
        return obj.to_wire()
    raise NotImplementedError(f"cannot encode {type(obj).__name__} in a state")


def _dec_hook(kind: type, obj: Any) -> Any:
    if kind is RankTable:
        return RankTable.from_wire(obj)
    raise NotImplementedError(f"cannot decode {kind.__name__} in a state")


_ENCODER: Final = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_DECODERS: Final = {
    kind: msgspec.msgpack.Decoder(t, dec_hook=_dec_hook) for kind, t in STATE_TYPES.items()
}


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
