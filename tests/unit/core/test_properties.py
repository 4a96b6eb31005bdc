"""Properties of exact replay: prefix + rest, crash and redelivery, interleaving, bytes."""

from __future__ import annotations

import hashlib
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runwatch.processors.core.config import DetectorConfig, with_overrides
from runwatch.processors.core.replay import Record, Replayer, ReplayResult, replay
from runwatch.processors.core.state_codec import decode_state, encode_state
from runwatch.schemas.codec import encode
from tests.unit.core.interpreter import run_python
from tests.unit.core.scenario import make_log, with_recorded_anomalies

CFG = with_overrides(
    DetectorConfig(),
    {
        "loss_window": 20,
        "loss_min_periods": 5,
        "grad_window": 20,
        "grad_min_periods": 5,
        "dead_rank_timeout_s": 40,
        "hang_timeout_s": 90,
        "startup_timeout_s": 200,
        "rank_heartbeat_threshold": 10,
        "straggler_steps": 5,
        "restart_check_steps": 10,
    },
)
PROPS = settings(max_examples=25, deadline=None)


def fingerprint(result: ReplayResult) -> bytes:
    """Every output byte that the audit would compare, in one blob."""
    parts = [encode(a) for a in result.anomalies] + [encode(c) for c in result.commands]
    for table in (result.steps, result.liveness, result.policy, result.checkpoints):
        for run_id in sorted(table):
            parts.append(run_id.encode() + b"=" + encode_state(table[run_id]))
    return b"\n".join(parts)


def records_for(seed: int, interleave: int = 0) -> list[Record]:
    return make_log(seed).records(interleave)


def test_scenarios_exercise_every_reducer() -> None:
    kinds: set[str] = set()
    commands = 0
    for seed in range(40):
        result = replay(records_for(seed), CFG)
        kinds |= {a.kind for a in result.anomalies}
        commands += len(result.commands)
    assert {"dead_rank", "hang", "loss_spike", "nonfinite_loss", "straggler"} <= kinds
    assert commands > 0


@PROPS
@given(st.integers(0, 10_000), st.floats(0.0, 1.0))
def test_prefix_then_rest_equals_everything(seed: int, cut: float) -> None:
    records = records_for(seed)
    k = int(cut * len(records))
    whole = replay(records, CFG)
    split = Replayer(CFG).feed(records[:k]).feed(records[k:]).result()
    assert fingerprint(split) == fingerprint(whole)


@PROPS
@given(st.integers(0, 10_000), st.floats(0.0, 1.0), st.integers(0, 50))
def test_crash_restore_and_redelivery_apply_nothing_twice(seed: int, cut: float, back: int) -> None:
    """States stored as bytes, the process dies, Kafka redelivers from an earlier offset."""
    records = records_for(seed)
    k = int(cut * len(records))
    first = Replayer(CFG).feed(records[:k])
    restored = Replayer(CFG)
    for name, kind in (
        ("steps", "steps"),
        ("liveness", "liveness"),
        ("checkpoints", "checkpoints"),
    ):
        stored = {run: encode_state(s) for run, s in getattr(first, name).items()}
        getattr(restored, name).update(
            {run: decode_state(kind, raw) for run, raw in stored.items()}  # type: ignore[arg-type]
        )
    restored.partition_runs = {p: set(runs) for p, runs in first.partition_runs.items()}
    restored.feed(records[max(0, k - back) :])
    combined = first.canonical_anomalies() + restored.canonical_anomalies()
    whole = replay(records, CFG)
    assert sorted(encode(a) for a in combined) == sorted(encode(a) for a in whole.anomalies)
    for name in ("steps", "liveness", "checkpoints"):
        mine, theirs = getattr(restored, name), getattr(whole, name)
        for run in theirs:
            expected = theirs[run] if run in mine else None
            if expected is not None:
                assert encode_state(mine[run]) == encode_state(expected)


@PROPS
@given(st.integers(0, 10_000), st.integers(0, 1000), st.integers(0, 1000))
def test_interleaving_across_roles_does_not_matter(seed: int, a: int, b: int) -> None:
    log = make_log(seed)
    assert fingerprint(replay(log.records(a), CFG)) == fingerprint(replay(log.records(b), CFG))


@PROPS
@given(st.integers(0, 10_000))
def test_policy_over_recorded_anomalies_reproduces_recomputed_commands(seed: int) -> None:
    records = records_for(seed)
    recomputed = replay(records, CFG)
    if not recomputed.anomalies:
        return
    recorded = replay(with_recorded_anomalies(records, recomputed.anomalies), CFG)
    assert recorded.policy_input == "recorded"
    strip = [
        (c.command_id, c.action, c.incarnation, c.max_checkpoint_step) for c in recomputed.commands
    ]
    assert strip == [
        (c.command_id, c.action, c.incarnation, c.max_checkpoint_step) for c in recorded.commands
    ]


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 10_000))
def test_no_verdict_reads_the_wall_clock(seed: int) -> None:
    records = records_for(seed)
    expected = fingerprint(replay(records, CFG))

    def boom(*_: object) -> float:
        raise AssertionError("a reducer read the clock")

    with pytest.MonkeyPatch.context() as mp:
        for name in (
            "time",
            "monotonic",
            "perf_counter",
            "time_ns",
            "monotonic_ns",
            "perf_counter_ns",
            "process_time",
        ):
            mp.setattr(time, name, boom)
        got = fingerprint(replay(records, CFG))
    assert got == expected


def test_same_input_gives_byte_identical_verdicts_across_processes() -> None:
    script = (
        "import hashlib\n"
        "from tests.unit.core.test_properties import CFG, fingerprint, records_for\n"
        "from runwatch.processors.core.replay import replay\n"
        "print(hashlib.sha256(b''.join(fingerprint(replay(records_for(s), CFG)) for s in range(5))).hexdigest())\n"
    )
    digests = set()
    for hash_seed in ("0", "12345"):
        out = run_python(["-c", script], {"PYTHONHASHSEED": hash_seed}, timeout_s=120)
        digests.add(out.strip())
    local = hashlib.sha256(b"".join(fingerprint(replay(records_for(s), CFG)) for s in range(5)))
    digests.add(local.hexdigest())
    assert len(digests) == 1
