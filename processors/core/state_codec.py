"""Reducer states as bytes, for table values (msgpack: compact, and NaN survives it).

The liveness state's per-rank table (`processors.core.rank_table.RankTable`) is written
as packed arrays (integers as narrow offsets in deflated byte planes, step times as raw
float64), so a 4,096-rank run's state is a few kilobytes instead of tens. States encoded
before this format (per-rank tuples) do not decode: no changelog had to be migrated.

Step states are maps by field name. Layout 1 held every step detector's counters as
top-level fields (``nonfinite_loss_run``, ``loss_cusum``, ``restarts``...); layout 2 holds
one field per detector (`processors.core.detectors`). A layout-1 state decodes through
`_steps_from_layout1`, which moves those fields into their detectors' states: a changelog
written before the split restores without losing a streak, an open episode or a restart
record.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import Any, Final, TypeAlias

import msgspec

from runwatch.processors.core.checkpoints import CheckpointCatalogue
from runwatch.processors.core.liveness import LivenessState
from runwatch.processors.core.policy import PolicyState
from runwatch.processors.core.rank_table import RankTable
from runwatch.processors.core.steps import StepHealthState
from runwatch.schemas.topics import StateKind

State: TypeAlias = StepHealthState | LivenessState | PolicyState | CheckpointCatalogue
STATE_TYPES: Final[dict[StateKind, type[State]]] = {
    StateKind.STEPS: StepHealthState,
    StateKind.LIVENESS: LivenessState,
    StateKind.POLICY: PolicyState,
    StateKind.CHECKPOINTS: CheckpointCatalogue,
}
"""State kind (`schemas.topics.StateKind`) -> the reducer's state struct."""


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, RankTable):
        return obj.to_wire()
    raise NotImplementedError(f"cannot encode {type(obj).__name__} in a state")


def _dec_hook(kind: type, obj: Any) -> Any:
    if kind is RankTable:
        return RankTable.from_wire(obj)
    raise NotImplementedError(f"cannot decode {kind.__name__} in a state")


_ENCODER: Final = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_DECODERS: Final[dict[str, msgspec.msgpack.Decoder[Any]]] = {
    kind: msgspec.msgpack.Decoder(t, dec_hook=_dec_hook) for kind, t in STATE_TYPES.items()
}


_LAYOUT1_KEY: Final = b"nonfinite_loss_run"
"""A top-level field of layout-1 step states only (a cheap test before decoding)."""

_LAYOUT1_FIELDS: Final[dict[str, tuple[tuple[str, str, Any], ...]]] = {
    "nonfinite": (("nonfinite_loss_run", "loss_run", 0), ("nonfinite_grad_run", "grad_run", 0)),
    "ceiling": (
        ("divergence_run", "divergence_run", 0),
        ("collapse_run", "collapse_run", 0),
        ("best_loss", "best_loss", math.inf),
    ),
    "continuity": (
        ("check", "check", None),
        ("continuity_ok", "ok", True),
        ("restarts", "restarts", []),
    ),
    "loss_spike": (
        ("loss_spike_run", "run", 0),
        ("loss_cusum", "cusum", 0.0),
        ("loss_cusum_reported", "cusum_reported", False),
        ("loss_episode", "episode", None),
        ("loss_episode_starts", "starts", []),
    ),
    "grad_spike": (("grad_spike_run", "run", 0), ("grad_episode", "episode", None)),
}
"""Detector field -> (layout-1 field, its field in the detector's state, default)."""


def _steps_from_layout1(data: bytes) -> StepHealthState | None:
    """A layout-1 step state in layout 2; None when ``data`` is not layout 1.

    Raises:
        msgspec.DecodeError: Bytes that are not a step state.
        msgspec.ValidationError: A layout-1 map with fields of the wrong type.
    """
    raw = msgspec.msgpack.decode(data)
    if not isinstance(raw, dict) or "nonfinite_loss_run" not in raw:
        return None
    for field, moves in _LAYOUT1_FIELDS.items():
        raw[field] = {new: raw.pop(old, default) for old, new, default in moves}
    state: StepHealthState = msgspec.convert(raw, StepHealthState)
    return state


_BUFFER_BYTES: Final = 64 * 1024
"""What each thread's encoding buffer starts at: a step state at the ledger's horizon is
~13-16 KB, a liveness state of tens of thousands of ranks tens of KB."""


class _Buffer(threading.local):
    """One encoding buffer per thread (a fold running in another thread has its own)."""

    def __init__(self) -> None:
        self.data = bytearray(_BUFFER_BYTES)


_BUFFER: Final = _Buffer()


def encode_state(state: State) -> bytes:
    """Encode any reducer state as msgpack bytes.

    The state is encoded into this thread's buffer, then copied out once. msgspec's
    ``encode`` grows a fresh output 1.5x at a time, and each growth can copy all of it:
    a step state at the ledger's horizon (~13 KB) paid over a dozen such steps, and a fold
    encodes each touched run's state once per round. The buffer keeps its largest size
    (``encode_into`` shortens only its length), so it is grown only by the largest state
    this thread has encoded yet. The bytes are those ``encode`` gives. (`_enc_hook` must
    not call this: it would encode into the buffer being written.)
    """
    buffer = _BUFFER.data
    _ENCODER.encode_into(state, buffer)
    return bytes(buffer)


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
    if key == StateKind.STEPS and _LAYOUT1_KEY in data:
        old = _steps_from_layout1(data)
        if old is not None:
            return old
    state: State = decoder.decode(data)
    return state


class DecodedStates:
    """Decoded states of a table's runs, handed out while the table's bytes are still theirs.

    A processor folding small batches (a paced load: a round every few tens of
    milliseconds, each touching most runs) decoded every touched run's stored state on
    every round: 10 us a run, the largest cost per round after the fold itself. This
    keeps the state it last wrote (or handed back) per key beside the bytes it came from,
    and hands it out again while the table still holds those bytes (the same object, or
    equal ones): a state is a pure function of its bytes, so whatever the table went
    through (a rebalance, a recovery from the changelog, a write this cache never saw),
    the answer is the one `decode_state` gives. At most ``capacity`` keys are kept, least
    recently used first out.

    `take` hands a state over: the cache lets go of it until it is `put` back. Kept while
    a fold runs, it would pin every version the fold makes of the liveness state's
    `RankTable` (each older version points one step towards the newest, with its undo
    entries) for the whole round: measured, that made folding a round of heartbeats 1.6x
    slower than decoding afresh. Handed over, the fold owns the newest version, as it does
    a freshly decoded one.
    """

    def __init__(self, kind: StateKind, capacity: int) -> None:
        """Decode ``kind`` states; keep at most ``capacity`` of them."""
        self.kind = kind
        self.capacity = capacity
        self._entries: OrderedDict[bytes, tuple[bytes, State]] = OrderedDict()

    def __len__(self) -> int:
        """Keys held."""
        return len(self._entries)

    def take(self, key: bytes, data: bytes) -> State:
        """The state ``data`` (the table's bytes for ``key``) encodes, no longer held here.

        Raises:
            msgspec.DecodeError: Bytes that are not such a state.
        """
        entry = self._entries.pop(key, None)
        if entry is not None and (entry[0] is data or entry[0] == data):
            return entry[1]
        return decode_state(self.kind, data)

    def put(self, key: bytes, data: bytes, state: State) -> None:
        """Keep ``state``, which ``data`` (now the table's bytes for ``key``) encodes."""
        entries = self._entries
        entries[key] = (data, state)
        entries.move_to_end(key)
        if len(entries) > self.capacity:
            entries.popitem(last=False)

    def drop(self, key: bytes) -> None:
        """Forget ``key``'s state (its table value was deleted)."""
        self._entries.pop(key, None)

    def clear(self) -> None:
        """Forget every state."""
        self._entries.clear()


__all__ = ["STATE_TYPES", "DecodedStates", "State", "StateKind", "decode_state", "encode_state"]
