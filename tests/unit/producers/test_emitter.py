"""RunEmitter against a fake producer: configuration, validation, routing, the bound."""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from collections.abc import Callable, Iterator

import msgspec
import numpy as np
import pytest

from runwatch.producers import EmitterStats, RunEmitter
from runwatch.schemas.codec import decode
from runwatch.schemas.events import (
    CheckpointCommitted,
    CheckpointFailed,
    Heartbeat,
    LoaderState,
    ModelFlopConfig,
    ParallelPlan,
    RunEnded,
    RunStarted,
    StepCompleted,
)
from runwatch.schemas.topics import names
from tests.unit.producers.fakes import FakeBroker

ENV_VARS = (
    "RUNWATCH_BOOTSTRAP",
    "RUNWATCH_RUN_ID",
    "RANK",
    "WORLD_SIZE",
    "RUNWATCH_TOPIC_PREFIX",
    "RUNWATCH_INCARNATION",
)


def wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def broker() -> FakeBroker:
    return FakeBroker()


@pytest.fixture
def emitter(broker: FakeBroker) -> Iterator[RunEmitter]:
    em = RunEmitter("run-a", bootstrap="fake:9092", producer_factory=broker, topic_prefix="p")
    yield em
    em.close(timeout_s=2.0)


def sent_events(broker: FakeBroker) -> list[tuple[str, bytes | None, object]]:
    return [(topic, key, decode(value)) for topic, key, value in broker.records if value]


# ---------------------------------------------------------------- configuration


def test_configuration_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNWATCH_BOOTSTRAP", "k1:9092,k2:9092")
    monkeypatch.setenv("RUNWATCH_RUN_ID", "env-run")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("RUNWATCH_TOPIC_PREFIX", "envp")
    monkeypatch.setenv("RUNWATCH_INCARNATION", "2")
    broker = FakeBroker()
    with RunEmitter(producer_factory=broker) as em:
        assert (em.run_id, em.bootstrap, em.rank, em.world_size) == (
            "env-run",
            "k1:9092,k2:9092",
            3,
            8,
        )
        assert (em.topic_prefix, em.incarnation) == ("envp", 2)
        em.run_started()
        assert em.flush(5.0)
    config = broker.producers[0].config
    assert config["bootstrap_servers"] == "k1:9092,k2:9092"
    assert config["enable_idempotence"] is True
    assert config["acks"] == "all"
    (topic, key, event), *_ = sent_events(broker)
    assert topic == "envp.runs" and key == b"env-run"
    assert isinstance(event, RunStarted)
    assert (event.incarnation, event.world_size) == (2, 8)


def test_arguments_win_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNWATCH_RUN_ID", "env-run")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with RunEmitter(
        "arg-run", bootstrap="b:1", rank=0, world_size=4, producer_factory=FakeBroker()
    ) as em:
        assert (em.run_id, em.rank, em.world_size, em.incarnation) == ("arg-run", 0, 4, 0)
        assert em.topic_prefix == "runwatch"


def test_defaults_without_torchrun_variables() -> None:
    with RunEmitter("r", bootstrap="b:1", producer_factory=FakeBroker()) as em:
        assert (em.rank, em.world_size, em.incarnation) == (0, 1, 0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bootstrap": "b:1"}, "RUNWATCH_RUN_ID"),
        ({"run_id": "", "bootstrap": "b:1"}, "RUNWATCH_RUN_ID"),
        ({"run_id": "r"}, "RUNWATCH_BOOTSTRAP"),
        ({"run_id": "r", "bootstrap": "b:1", "rank": 2, "world_size": 2}, "outside"),
        ({"run_id": "r", "bootstrap": "b:1", "world_size": 0}, "world_size"),
        ({"run_id": "r", "bootstrap": "b:1", "rank": -1}, "rank"),
        ({"run_id": "r", "bootstrap": "b:1", "max_buffered": 0}, "max_buffered"),
        ({"run_id": "r", "bootstrap": "b:1", "client_config": {"acks": 1}}, "acks"),
        (
            {"run_id": "r", "bootstrap": "b:1", "client_config": {"enable_idempotence": False}},
            "enable_idempotence",
        ),
    ],
)
def test_bad_configuration_is_a_clear_value_error(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RunEmitter(**kwargs, producer_factory=FakeBroker())


def test_unknown_kafka_setting_is_refused_before_any_thread_starts() -> None:
    with pytest.raises(ValueError, match="lingerr_ms"):
        RunEmitter("r", bootstrap="b:1", client_config={"lingerr_ms": 5})


def test_malformed_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "zero")
    with pytest.raises(ValueError, match="RANK"):
        RunEmitter("r", bootstrap="b:1", producer_factory=FakeBroker())


def test_security_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNWATCH_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("RUNWATCH_SASL_MECHANISM", "PLAIN")
    broker = FakeBroker()
    with RunEmitter(
        "r", bootstrap="b:1", producer_factory=broker, client_config={"linger_ms": 7}
    ) as em:
        em.heartbeat(0)
        assert em.flush(5.0)
    config = broker.producers[0].config
    assert config["security_protocol"] == "SASL_SSL"
    assert config["sasl_mechanism"] == "PLAIN"
    assert config["linger_ms"] == 7


# ---------------------------------------------------------------- routing and content


def test_every_input_event_is_routed_keyed_and_numbered(
    emitter: RunEmitter, broker: FakeBroker
) -> None:
    topics = names("p")
    flops = ModelFlopConfig(n_params=124_000_000, n_layer=12, n_head=12, d_model=768, seq_len=1024)
    emitter.run_started(
        flop_config=flops,
        peak_flops_per_s=312e12,
        dtype="bf16",
        vocab_size=50257,
        tags={"model": "gpt2"},
        thresholds={"loss_z_thresh": 8},
    )
    emitter.step(1, loss=3.1, step_time_s=0.25, tokens=32768, grad_norm=1.5, lr=6e-4)
    emitter.heartbeat(1, step_time_s=0.24)
    state = LoaderState(seed=0, epoch=0, rank=0, world_size=1, batch_idx=1, global_sample=16)
    emitter.checkpoint_committed(1, "/ckpt/1", loader_states=[state], size_bytes=10, write_s=0.5)
    emitter.checkpoint_failed(2, "/ckpt/2", "disk full\n  on /ckpt")
    emitter.run_ended("completed", final_step=2)
    assert emitter.flush(5.0)

    sent = sent_events(broker)
    assert all(key == b"run-a" for _, key, _ in sent)
    by_topic: dict[str, list[object]] = {}
    for topic, _, event in sent:
        by_topic.setdefault(topic, []).append(event)
    assert [type(e) for e in by_topic[topics.runs]] == [RunStarted, RunEnded]
    assert [type(e) for e in by_topic[topics.steps]] == [RunStarted, StepCompleted, RunEnded]
    assert [type(e) for e in by_topic[topics.heartbeats]] == [RunStarted, Heartbeat, RunEnded]
    assert [type(e) for e in by_topic[topics.checkpoints]] == [
        CheckpointCommitted,
        CheckpointFailed,
    ]
    started = by_topic[topics.runs][0]
    assert isinstance(started, RunStarted)
    assert started.flop_config == flops and started.thresholds == {"loss_z_thresh": 8.0}
    assert started.tags == {"model": "gpt2"} and started.dtype == "bf16"
    # One event, one seq, whatever the number of copies; seq grows per emitter call.
    seqs = sorted({event.seq for _, _, event in sent})  # type: ignore[attr-defined]
    assert seqs == list(range(1, 7))
    heartbeat = by_topic[topics.heartbeats][1]
    assert isinstance(heartbeat, Heartbeat)
    assert heartbeat.host == socket.gethostname() and heartbeat.pid == os.getpid()
    committed = by_topic[topics.checkpoints][0]
    assert isinstance(committed, CheckpointCommitted) and committed.loader_states == (state,)
    failed = by_topic[topics.checkpoints][1]
    assert isinstance(failed, CheckpointFailed) and failed.reason == "disk full on /ckpt"
    assert emitter.stats == EmitterStats(6, 6, 0, 0, 0)


def test_rank_and_incarnation_fill_the_events(broker: FakeBroker) -> None:
    with RunEmitter(
        "r", bootstrap="b:1", rank=2, world_size=4, incarnation=5, producer_factory=broker
    ) as em:
        em.run_started(plan=ParallelPlan(dp_shard=2, tp=2))
        em.step(0, loss=1.0, step_time_s=0.1)
        em.heartbeat(0)
        em.checkpoint_committed(0, "/c")
        assert em.flush(5.0)
    events = [event for _, _, event in sent_events(broker)]
    started = next(e for e in events if isinstance(e, RunStarted))
    assert started.incarnation == 5 and started.world_size == 4
    step = next(e for e in events if isinstance(e, StepCompleted))
    assert step.rank == 2
    assert step.data_parallel_size == 2  # from the plan: dp_shard=2 (tp does not count)
    assert next(e for e in events if isinstance(e, Heartbeat)).rank == 2
    assert next(e for e in events if isinstance(e, CheckpointCommitted)).rank == 2


def test_ts_ns_is_taken_at_the_call(emitter: RunEmitter, broker: FakeBroker) -> None:
    before = time.time_ns()
    emitter.heartbeat(0)
    after = time.time_ns()
    assert emitter.flush(5.0)
    ((_, _, event),) = sent_events(broker)
    assert before <= event.ts_ns <= after  # type: ignore[attr-defined]


def test_nonfinite_losses_are_sent(emitter: RunEmitter, broker: FakeBroker) -> None:
    emitter.step(0, loss=math.nan, step_time_s=0.1, grad_norm=math.inf)
    emitter.step(1, loss=-math.inf, step_time_s=0.1)
    assert emitter.flush(5.0)
    first, second = (event for _, _, event in sent_events(broker))
    assert isinstance(first, StepCompleted) and math.isnan(first.loss)
    assert first.grad_norm == math.inf
    assert isinstance(second, StepCompleted) and second.loss == -math.inf


def test_numpy_scalars_are_accepted(emitter: RunEmitter, broker: FakeBroker) -> None:
    emitter.step(np.int64(4), loss=np.float32(2.5), step_time_s=np.float64(0.5), tokens=np.int32(8))
    assert emitter.flush(5.0)
    ((_, _, event),) = sent_events(broker)
    assert isinstance(event, StepCompleted)
    assert (event.step, event.loss, event.step_time_s, event.tokens) == (4, 2.5, 0.5, 8)
    assert type(event.step) is int


def test_low_level_emit_keeps_the_event_as_given(emitter: RunEmitter, broker: FakeBroker) -> None:
    event = StepCompleted(run_id="other-run", ts_ns=5, seq=77, step=1, loss=1.0, step_time_s=1.0)
    emitter.emit("custom.topic", event)
    assert emitter.flush(5.0)
    assert sent_events(broker) == [("custom.topic", b"other-run", event)]


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda em: em.step(-1, loss=1.0, step_time_s=0.1), ValueError, "step must be >= 0"),
        (lambda em: em.step(1.0, loss=1.0, step_time_s=0.1), TypeError, "step must be an int"),
        (lambda em: em.step("1", loss=1.0, step_time_s=0.1), TypeError, "step must be an int"),
        (lambda em: em.step(True, loss=1.0, step_time_s=0.1), TypeError, "step must be an int"),
        (lambda em: em.step(1, loss="3.1", step_time_s=0.1), TypeError, "loss must be a float"),
        (lambda em: em.step(1, loss=None, step_time_s=0.1), TypeError, "loss must be a float"),
        (lambda em: em.step(1, loss=1.0, step_time_s=-0.1), ValueError, "step_time_s"),
        (lambda em: em.step(1, loss=1.0, step_time_s=math.nan), ValueError, "step_time_s"),
        (lambda em: em.step(1, loss=1.0, step_time_s="fast"), TypeError, "step_time_s"),
        (lambda em: em.step(1, loss=1.0, step_time_s=0.1, tokens=-5), ValueError, "tokens"),
        (lambda em: em.step(1, loss=1.0, step_time_s=0.1, tokens=5.0), TypeError, "tokens"),
        (lambda em: em.step(1, loss=1.0, step_time_s=0.1, grad_norm="x"), TypeError, "grad_norm"),
        (lambda em: em.step(1, loss=1.0, step_time_s=0.1, lr="x"), TypeError, "lr"),
        (lambda em: em.step(1, loss=1.0, step_time_s=0.1, skipped="no"), TypeError, "skipped"),
        (
            lambda em: em.step(1, loss=1.0, step_time_s=0.1, microbatches=0),
            ValueError,
            "microbatches",
        ),
        (
            lambda em: em.step(1, loss=1.0, step_time_s=0.1, restart_from_step=-2),
            ValueError,
            "restart_from_step",
        ),
        (lambda em: em.heartbeat(-3), ValueError, "step"),
        (lambda em: em.heartbeat(1, step_time_s=-1.0), ValueError, "step_time_s"),
        (lambda em: em.checkpoint_committed(1, ""), ValueError, "path"),
        (lambda em: em.checkpoint_committed(1, 5), TypeError, "path"),
        (lambda em: em.checkpoint_committed(1, "/c", size_bytes=-1), ValueError, "size_bytes"),
        (lambda em: em.checkpoint_committed(1, "/c", loader_states=[1]), TypeError, "LoaderState"),
        (lambda em: em.checkpoint_failed(1, "/c", 42), TypeError, "reason"),
        (lambda em: em.run_ended("crashed"), ValueError, "status"),
        (lambda em: em.run_started(plan=ParallelPlan(tp=2)), ValueError, "plan needs 2 ranks"),
        (lambda em: em.run_started(flop_config={"n_params": 1}), TypeError, "flop_config"),
        (lambda em: em.run_started(peak_flops_per_s=0), ValueError, "peak_flops_per_s"),
        (lambda em: em.run_started(thresholds={"z": "high"}), TypeError, "threshold"),
        (lambda em: em.emit("t", {"run_id": "r"}), TypeError, "Event"),
    ],
)
def test_bad_calls_raise_at_the_call_site(
    emitter: RunEmitter, broker: FakeBroker, call: Callable, error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        call(emitter)
    assert emitter.stats.enqueued == 0


# ---------------------------------------------------------------- the bound and drops


def test_broker_down_buffers_counts_drops_and_reports_them_on_the_next_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broker = FakeBroker(up=False)
    caplog.set_level(logging.WARNING, logger="producers")
    em = RunEmitter("r", bootstrap="b:1", max_buffered=10, producer_factory=broker)
    try:
        started = time.perf_counter()
        for step in range(15):
            em.step(step, loss=1.0, step_time_s=0.1)
        assert time.perf_counter() - started < 1.0  # never waits for the broker
        assert em.stats == EmitterStats(enqueued=10, delivered=0, dropped=5, failed=0, buffered=10)
        drop_warnings = [r for r in caplog.records if "buffer full" in r.getMessage()]
        assert len(drop_warnings) == 1  # rate-limited, not one per drop
        assert not em.flush(0.2)

        broker.up = True  # the broker comes back: the buffer drains in order
        assert em.flush(10.0)
        em.step(15, loss=1.0, step_time_s=0.1)
        assert em.flush(5.0)
    finally:
        em.close(2.0)
    steps = [event for _, _, event in sent_events(broker)]
    assert [e.step for e in steps] == [*range(10), 15]  # type: ignore[attr-defined]
    assert [e.dropped for e in steps] == [0] * 10 + [5]  # type: ignore[attr-defined]
    assert em.stats == EmitterStats(enqueued=11, delivered=11, dropped=5, failed=0, buffered=0)
    assert broker.connect_attempts >= 2


def test_bound_includes_events_awaiting_acknowledgement() -> None:
    broker = FakeBroker(auto_ack=False)  # connected, but nothing is acknowledged yet
    with RunEmitter("r", bootstrap="b:1", max_buffered=4, producer_factory=broker) as em:
        for step in range(4):
            em.heartbeat(step)
        assert wait_until(lambda: len(broker.records) == 4)
        em.heartbeat(4)  # the producer holds 4 unacknowledged events: this one is dropped
        assert em.stats.dropped == 1
        broker.ack_all()
        assert em.flush(5.0)
        em.heartbeat(5)
        assert wait_until(lambda: len(broker.records) == 5)
        broker.ack_all()
        assert em.flush(5.0)
    events = [event for _, _, event in sent_events(broker)]
    assert [(e.step, e.dropped) for e in events] == [  # type: ignore[attr-defined]
        (0, 0),
        (1, 0),
        (2, 0),
        (3, 0),
        (5, 1),
    ]


def test_drop_count_is_recorded_once_on_a_multi_topic_event() -> None:
    broker = FakeBroker(up=False)
    em = RunEmitter("r", bootstrap="b:1", max_buffered=1, producer_factory=broker)
    try:
        em.heartbeat(0)
        em.heartbeat(1)
        em.heartbeat(2)
        broker.up = True
        assert em.flush(10.0)
        em.run_ended("completed", final_step=2)
        assert em.flush(5.0)
    finally:
        em.close(2.0)
    ended = [event for _, _, event in sent_events(broker) if isinstance(event, RunEnded)]
    assert len(ended) == 3 and all(e.dropped == 2 for e in ended)


# ---------------------------------------------------------------- failures and lifecycle


def test_constructor_does_not_wait_for_a_broker_that_never_comes() -> None:
    broker = FakeBroker(up=False)
    started = time.perf_counter()
    em = RunEmitter("r", bootstrap="b:1", producer_factory=broker)
    em.step(0, loss=1.0, step_time_s=0.1)
    assert time.perf_counter() - started < 0.5
    started = time.perf_counter()
    assert em.close(timeout_s=0.3) is False
    assert time.perf_counter() - started < 3.0
    assert em.stats == EmitterStats(enqueued=1, delivered=0, dropped=0, failed=0, buffered=1)


def test_close_without_events_does_not_connect() -> None:
    broker = FakeBroker(up=False)
    em = RunEmitter("r", bootstrap="b:1", producer_factory=broker)
    assert em.close(timeout_s=5.0) is True
    assert em.close() is True  # idempotent


def test_metadata_timeouts_are_retried_without_duplicates() -> None:
    broker = FakeBroker()
    broker.metadata_timeouts = 2
    with RunEmitter("r", bootstrap="b:1", producer_factory=broker) as em:
        em.run_started()
        assert em.flush(10.0)
    assert [topic for topic, _, _ in broker.records] == [
        "runwatch.runs",
        "runwatch.steps",
        "runwatch.heartbeats",
    ]
    assert em.stats == EmitterStats(enqueued=1, delivered=1, dropped=0, failed=0, buffered=0)


def test_failed_delivery_is_counted_once_per_event(caplog: pytest.LogCaptureFixture) -> None:
    from kafka.errors import TopicAuthorizationFailedError

    broker = FakeBroker()
    broker.fail_topics["runwatch.heartbeats"] = TopicAuthorizationFailedError()
    with RunEmitter("r", bootstrap="b:1", producer_factory=broker) as em:
        em.run_started()  # three copies, one fails: the event failed
        em.step(0, loss=1.0, step_time_s=0.1)
        assert not em.flush(5.0)
        assert em.stats == EmitterStats(enqueued=2, delivered=1, dropped=0, failed=1, buffered=0)
    assert any("delivery to runwatch.heartbeats failed" in r.getMessage() for r in caplog.records)
    assert em.close() is False


def test_close_fails_what_the_producer_still_holds() -> None:
    broker = FakeBroker(auto_ack=False)
    em = RunEmitter("r", bootstrap="b:1", producer_factory=broker)
    em.heartbeat(0)
    assert wait_until(lambda: len(broker.records) == 1)
    assert em.close(timeout_s=0.5) is False
    assert em.stats == EmitterStats(enqueued=1, delivered=0, dropped=0, failed=1, buffered=0)
    assert broker.producers[0].closed


def test_events_after_close_are_dropped_not_raised(broker: FakeBroker) -> None:
    em = RunEmitter("r", bootstrap="b:1", producer_factory=broker)
    em.heartbeat(0)
    assert em.close(5.0) is True
    em.heartbeat(1)
    assert em.stats == EmitterStats(enqueued=1, delivered=1, dropped=1, failed=0, buffered=0)
    assert em.closed


def test_flush_asks_the_producer_to_skip_linger(emitter: RunEmitter, broker: FakeBroker) -> None:
    emitter.heartbeat(0)
    assert emitter.flush(5.0)
    assert wait_until(lambda: broker.flushes >= 1)


@pytest.mark.parametrize("encode_on_caller", [False, True])
def test_both_encoding_places_give_the_same_records(
    broker: FakeBroker, encode_on_caller: bool
) -> None:
    with RunEmitter("r", bootstrap="b:1", producer_factory=broker) as em:
        em._encode_on_caller = encode_on_caller
        em.step(0, loss=math.nan, step_time_s=0.1)
        em.heartbeat(0)
        assert em.flush(5.0)
    (_, _, step), (_, _, heartbeat) = sent_events(broker)
    assert isinstance(step, StepCompleted) and math.isnan(step.loss)
    assert isinstance(heartbeat, Heartbeat) and heartbeat.step == 0


def test_rare_events_that_cannot_be_encoded_raise_at_the_call_site(
    emitter: RunEmitter,
) -> None:
    flops = ModelFlopConfig(n_params=object(), n_layer=1, n_head=1, d_model=1, seq_len=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="cannot encode RunStarted"):
        emitter.run_started(flop_config=flops)
    assert emitter.stats.enqueued == 0


def test_stats_is_a_frozen_snapshot(emitter: RunEmitter) -> None:
    stats = emitter.stats
    with pytest.raises(AttributeError):
        stats.enqueued = 3  # type: ignore[misc]
    assert msgspec.structs is not None  # msgspec is importable alongside
