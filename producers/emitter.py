"""`RunEmitter`: what a training process uses to put its events on Kafka, never blocking.

A call such as ``emitter.step(12, loss=3.1, step_time_s=0.25)`` checks its arguments,
builds the event and appends it to a bounded buffer; a background thread owns the Kafka
producer, encodes (``step`` and ``heartbeat``; rarer events are encoded at the call site
so that a bad one raises there) and delivers. Nothing on the calling thread waits for the
network: not the constructor (the producer is created in the background, with retries),
not a call while the broker is down (events wait in the buffer), not a full buffer (the
event is dropped, counted, logged at most every 30 s and reported in the ``dropped`` field
of the next event). Only `flush` and `close` wait, and only as long as their timeout; an
emitter never closed is closed at interpreter exit with `EXIT_FLUSH_TIMEOUT_S`.

Configuration comes from arguments or from the environment that ``torchrun`` or
``runwatch launch`` give a gang::

    RUNWATCH_BOOTSTRAP     host:port[,host:port]   (required unless passed)
    RUNWATCH_RUN_ID        the run                 (required unless passed)
    RANK, WORLD_SIZE       torchrun's; default 0 and 1
    RUNWATCH_TOPIC_PREFIX  default "runwatch"
    RUNWATCH_INCARNATION   restarts of the gang so far; default 0

Example::

    with RunEmitter() as emitter:
        emitter.run_started(flop_config=cfg, peak_flops_per_s=312e12, dtype="bf16")
        for step in range(steps):
            ...
            emitter.step(step, loss=loss.item(), step_time_s=dt, tokens=tokens)
        emitter.run_ended("completed", final_step=step)
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import socket
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from producers.buffer import EventBuffer
from producers.delivery import DeliveryThread, ProducerFactory, QueuedEvent
from producers.ratelimit import RateLimitedLog, quiet_library_loggers
from producers.validation import (
    as_bool,
    as_duration_s,
    as_float,
    as_int,
    as_optional_float,
    as_step,
    as_str,
)
from runwatch.settings import ENV_BOOTSTRAP, ENV_TOPIC_PREFIX, kafka_client_config
from schemas.codec import encode, encode_key
from schemas.events import (
    CheckpointCommitted,
    CheckpointFailed,
    Event,
    Heartbeat,
    LoaderState,
    ModelFlopConfig,
    ParallelPlan,
    RunEnded,
    RunStarted,
    StepCompleted,
)
from schemas.topics import names

logger = logging.getLogger(__name__)

ENV_RUN_ID: Final = "RUNWATCH_RUN_ID"
"""The run's id, set by ``runwatch launch`` for every rank of the gang."""
ENV_INCARNATION: Final = "RUNWATCH_INCARNATION"
"""The gang's incarnation (0, then +1 per restart), set by ``runwatch launch``."""
ENV_RANK: Final = "RANK"
"""torchrun's global rank."""
ENV_WORLD_SIZE: Final = "WORLD_SIZE"
"""torchrun's world size."""

RUN_STATUSES: Final = frozenset({"completed", "failed", "stopped"})
"""The values `RunEmitter.run_ended` accepts."""

PRODUCER_DEFAULTS: Final[Mapping[str, Any]] = {
    "acks": "all",
    "enable_idempotence": True,
    "linger_ms": 5,
    "batch_size": 256 * 1024,
    "compression_type": "gzip",
    "max_block_ms": 2_000,
    "bootstrap_timeout_ms": 5_000,
    "delivery_timeout_ms": 7 * 24 * 3600 * 1000,
    "reconnect_backoff_ms": 50,
    "reconnect_backoff_max_ms": 1_000,
}
"""kafka-python settings the emitter starts from (``client_config`` may override most).

gzip (zlib, always available) costs the process less CPU per event than no compression
with kafka-python, delivers more events/s and shrinks the retained topics about tenfold
(JSON events repeat their field names); see bench/producer.py.

``delivery_timeout_ms`` is a week: while the broker is away the producer keeps retrying
(idempotently, so without duplicates) instead of failing events, and the emitter's own
bound caps the memory. ``max_block_ms`` and ``bootstrap_timeout_ms`` are short because
they only ever block the delivery thread, which retries.
"""

_FIXED_SETTINGS: Final = frozenset(
    {"acks", "enable_idempotence", "bootstrap_servers", "key_serializer", "value_serializer"}
)

_THREAD_PREFIX: Final = "runwatch-emitter-"
"""Start of the names of the emitter's threads (its own and kafka-python's)."""

EXIT_FLUSH_TIMEOUT_S: Final = 5.0
"""How long an emitter that was never closed may delay interpreter exit to deliver."""


@dataclass(frozen=True, slots=True)
class EmitterStats:
    """Counts of events since the emitter started.

    An event routed to several topics counts once. ``enqueued == delivered + failed +
    buffered`` always holds.

    Attributes:
        enqueued: Events accepted into the buffer.
        delivered: Events the broker acknowledged (every copy).
        dropped: Events refused because the buffer was full (or the emitter was closed).
        failed: Events the producer gave up on (a non-retriable error, or `close` timed
            out with them in the producer).
        buffered: Events accepted and not yet delivered or failed.
    """

    enqueued: int
    delivered: int
    dropped: int
    failed: int
    buffered: int


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {raw!r}") from None


def _one_line(text: str, limit: int = 2000) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


class RunEmitter:
    """Produces one rank's events to Kafka from a background thread; see the module doc.

    Thread-safe: several threads (the training loop, a checkpoint thread) may call it.

    Attributes:
        run_id: The run; the Kafka key of every event.
        bootstrap: Kafka bootstrap servers.
        rank: The rank this emitter speaks for.
        world_size: Ranks in the gang.
        topic_prefix: Prefix of the topic names.
        incarnation: The gang's incarnation (restarts so far).
    """

    def __init__(
        self,
        run_id: str | None = None,
        *,
        bootstrap: str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        topic_prefix: str | None = None,
        incarnation: int | None = None,
        max_buffered: int = 100_000,
        client_config: Mapping[str, Any] | None = None,
        producer_factory: ProducerFactory | None = None,
    ) -> None:
        """Configure the emitter and start its delivery thread; never waits for Kafka.

        Args:
            run_id: The run; default ``$RUNWATCH_RUN_ID``.
            bootstrap: ``host:port[,host:port]``; default ``$RUNWATCH_BOOTSTRAP``.
            rank: This process's rank; default ``$RANK``, else 0.
            world_size: Ranks in the gang; default ``$WORLD_SIZE``, else 1.
            topic_prefix: Topic name prefix; default ``$RUNWATCH_TOPIC_PREFIX``, else
                ``runwatch``.
            incarnation: Restarts of the gang so far; default ``$RUNWATCH_INCARNATION``,
                else 0.
            max_buffered: Most events held (queued or awaiting the broker's
                acknowledgement) before new ones are dropped and counted.
            client_config: Extra kafka-python producer settings (``linger_ms``,
                ``compression_type``, security...), applied over `PRODUCER_DEFAULTS` and
                the ``RUNWATCH_*`` security variables. ``acks``, ``enable_idempotence``,
                ``bootstrap_servers`` and the serializers are fixed.
            producer_factory: Creates the producer from keyword arguments;
                ``kafka.KafkaProducer`` when None. Tests pass fakes.

        Raises:
            ValueError: No run id or bootstrap, a negative rank, a rank outside the world,
                a malformed environment variable, ``max_buffered`` < 1, or
                ``client_config`` overriding a fixed setting.
            TypeError: An argument of the wrong type.
        """
        run_id = run_id if run_id is not None else os.environ.get(ENV_RUN_ID)
        if run_id is None or run_id == "":
            raise ValueError(
                f"RunEmitter needs a run id: pass run_id=... or set {ENV_RUN_ID}"
            )
        self.run_id = as_str("run_id", run_id, allow_empty=False)
        bootstrap = bootstrap if bootstrap is not None else os.environ.get(ENV_BOOTSTRAP)
        if not bootstrap:
            raise ValueError(
                f"RunEmitter needs a Kafka address: pass bootstrap='host:port' or set "
                f"{ENV_BOOTSTRAP}"
            )
        self.bootstrap = as_str("bootstrap", bootstrap, allow_empty=False)
        self.rank = as_step("rank", rank if rank is not None else _env_int(ENV_RANK, 0))
        self.world_size = as_int(
            "world_size", world_size if world_size is not None else _env_int(ENV_WORLD_SIZE, 1)
        )
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if self.rank >= self.world_size:
            raise ValueError(f"rank {self.rank} is outside world_size {self.world_size}")
        self.incarnation = as_step(
            "incarnation",
            incarnation if incarnation is not None else _env_int(ENV_INCARNATION, 0),
        )
        prefix = topic_prefix or os.environ.get(ENV_TOPIC_PREFIX) or "runwatch"
        self.topic_prefix = as_str("topic_prefix", prefix, allow_empty=False)
        max_buffered = as_int("max_buffered", max_buffered)
        if max_buffered < 1:
            raise ValueError(f"max_buffered must be >= 1, got {max_buffered}")
        overrides = dict(client_config or {})
        fixed = sorted(_FIXED_SETTINGS & overrides.keys())
        if fixed:
            raise ValueError(f"client_config may not override {', '.join(fixed)}")

        topics = names(self.topic_prefix)
        self._run_topics = (topics.runs, topics.steps, topics.heartbeats)
        self._step_topics = (topics.steps,)
        self._heartbeat_topics = (topics.heartbeats,)
        self._checkpoint_topics = (topics.checkpoints,)
        self._key = encode_key(self.run_id)
        self._host = socket.gethostname()
        self._pid = os.getpid()
        self._seq = itertools.count(1)
        self._data_parallel_size = self.world_size
        # step() and heartbeat() build events from checked ints, floats and strs, which
        # always encode: they leave encoding to the delivery thread (about 1 us less on
        # the calling thread, see bench/producer.py). The rare events carry caller-made
        # structs and encode at the call site, so a bad one raises there. True: all do.
        self._encode_on_caller = False
        self._closed = False
        self._close_result: bool | None = None
        self._log = RateLimitedLog(logger)
        self._buffer: EventBuffer[QueuedEvent] = EventBuffer(max_buffered)

        config: dict[str, Any] = {
            **PRODUCER_DEFAULTS,
            # kafka-python names its network thread after the client id: with this
            # prefix, its connection chatter is rate-limited like the delivery thread's.
            "client_id": f"{_THREAD_PREFIX}{self.run_id}-rank{self.rank}",
            **kafka_client_config(),
            **overrides,
            "bootstrap_servers": self.bootstrap,
        }
        if producer_factory is None:
            from kafka import KafkaProducer

            unknown = sorted(config.keys() - KafkaProducer.DEFAULT_CONFIG.keys())
            if unknown:
                raise ValueError(f"unknown kafka-python producer setting(s): {', '.join(unknown)}")
            producer_factory = KafkaProducer
            quiet_library_loggers("kafka", _THREAD_PREFIX)
        self._exit_hook = _ExitHook(self)
        self._delivery = DeliveryThread(
            self._buffer,
            producer_factory=producer_factory,
            producer_config=config,
            name=f"{_THREAD_PREFIX}{self.run_id}-rank{self.rank}",
            log=self._log,
            on_connect=self._exit_hook.register_last,
        )
        self._exit_hook.register_last()
        self._delivery.start()
        # An emitter dropped without close() must not leave its thread and producer behind.
        weakref.finalize(self, _stop_delivery, self._delivery)

    # ------------------------------------------------------------------ context manager

    def __enter__(self) -> RunEmitter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ input events

    def run_started(
        self,
        *,
        flop_config: ModelFlopConfig | None = None,
        plan: ParallelPlan | None = None,
        peak_flops_per_s: float | None = None,
        dtype: str = "fp32",
        vocab_size: int | None = None,
        tags: Mapping[str, str] | None = None,
        thresholds: Mapping[str, float] | None = None,
    ) -> None:
        """Announce this incarnation of the run (to the runs, steps and heartbeats topics).

        Args:
            flop_config: Model shape for MFU; None: no MFU.
            plan: The parallel plan; its world size must equal the emitter's. It also
                gives later `step` calls their default ``data_parallel_size``.
            peak_flops_per_s: Hardware peak for ``dtype`` summed over the gang.
            dtype: Training precision, e.g. ``"bf16"``.
            vocab_size: For the loss-collapse check; None disables it.
            tags: Free-form labels.
            thresholds: Detector overrides, e.g. ``{"loss_z_thresh": 8.0}``.

        Raises:
            TypeError: An argument of the wrong type.
            ValueError: A plan for another world size, a non-positive peak or vocab size.
        """
        if flop_config is not None and not isinstance(flop_config, ModelFlopConfig):
            raise TypeError(
                f"flop_config must be a ModelFlopConfig, got {type(flop_config).__name__}"
            )
        if plan is None:
            plan = ParallelPlan()
        else:
            if not isinstance(plan, ParallelPlan):
                raise TypeError(f"plan must be a ParallelPlan, got {type(plan).__name__}")
            if plan.world_size != self.world_size:
                raise ValueError(
                    f"plan needs {plan.world_size} ranks but world_size is {self.world_size}"
                )
            self._data_parallel_size = plan.data_parallel_size
        peak = as_optional_float("peak_flops_per_s", peak_flops_per_s)
        if peak is not None and not peak > 0:
            raise ValueError(f"peak_flops_per_s must be > 0, got {peak!r}")
        if vocab_size is not None:
            vocab_size = as_int("vocab_size", vocab_size)
            if vocab_size < 2:
                raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
        tag_map = {as_str("tag name", k): as_str(f"tag {k!r}", v) for k, v in (tags or {}).items()}
        threshold_map = {
            as_str("threshold name", k): as_float(f"threshold {k!r}", v)
            for k, v in (thresholds or {}).items()
        }
        self._enqueue(
            self._run_topics,
            self._key,
            RunStarted(
                run_id=self.run_id,
                ts_ns=time.time_ns(),
                seq=next(self._seq),
                world_size=self.world_size,
                flop_config=flop_config,
                plan=plan,
                peak_flops_per_s=peak,
                dtype=as_str("dtype", dtype, allow_empty=False),
                vocab_size=vocab_size,
                tags=tag_map,
                thresholds=threshold_map,
                incarnation=self.incarnation,
            ),
        )

    def step(
        self,
        step: int,
        *,
        loss: float,
        step_time_s: float,
        grad_norm: float | None = None,
        tokens: int = 0,
        examples: int = 0,
        local_tokens: int = 0,
        local_examples: int = 0,
        lr: float | None = None,
        skipped: bool = False,
        restart_from_step: int | None = None,
        microbatches: int = 1,
        accumulation_steps: int = 1,
        data_parallel_size: int | None = None,
    ) -> None:
        """Report one completed optimizer step (to the steps topic).

        NaN and infinite losses and gradient norms are valid and are sent as such.

        Args:
            step: The optimizer step just completed (>= 0).
            loss: The step's loss, all-reduced over data parallelism.
            step_time_s: Wall time of the step (>= 0).
            grad_norm: Global gradient norm before clipping.
            tokens: Tokens the whole gang processed in the step.
            examples: Sequences the whole gang processed in the step.
            local_tokens: Tokens this rank processed.
            local_examples: Sequences this rank processed.
            lr: Learning rate used.
            skipped: The optimizer skipped the update (e.g. AMP overflow).
            restart_from_step: On the first step after a resume: the checkpoint's step.
            microbatches: Microbatches per step.
            accumulation_steps: Gradient-accumulation steps per optimizer step.
            data_parallel_size: Ranks whose gradients were averaged; default: the plan's
                (from `run_started`), else the world size.

        Raises:
            TypeError: An argument of the wrong type (e.g. a str loss, a float step).
            ValueError: A negative step, count or time.
        """
        # Plain ints and floats take one `type() is` test each; the helpers handle the rest.
        if type(step) is not int or step < 0:
            step = as_step("step", step)
        if type(loss) is not float:
            loss = as_float("loss", loss)
        if type(step_time_s) is not float or not step_time_s >= 0.0:
            step_time_s = as_duration_s("step_time_s", step_time_s)
        if grad_norm is not None and type(grad_norm) is not float:
            grad_norm = as_float("grad_norm", grad_norm)
        if type(tokens) is not int or tokens < 0:
            tokens = as_step("tokens", tokens)
        if type(examples) is not int or examples < 0:
            examples = as_step("examples", examples)
        if type(local_tokens) is not int or local_tokens < 0:
            local_tokens = as_step("local_tokens", local_tokens)
        if type(local_examples) is not int or local_examples < 0:
            local_examples = as_step("local_examples", local_examples)
        if lr is not None and type(lr) is not float:
            lr = as_float("lr", lr)
        if type(skipped) is not bool:
            skipped = as_bool("skipped", skipped)
        if restart_from_step is not None:
            restart_from_step = as_step("restart_from_step", restart_from_step)
        if type(microbatches) is not int or microbatches < 1:
            microbatches = _positive("microbatches", microbatches)
        if type(accumulation_steps) is not int or accumulation_steps < 1:
            accumulation_steps = _positive("accumulation_steps", accumulation_steps)
        if data_parallel_size is None:
            data_parallel_size = self._data_parallel_size
        elif type(data_parallel_size) is not int or data_parallel_size < 1:
            data_parallel_size = _positive("data_parallel_size", data_parallel_size)
        self._enqueue_hot(
            self._step_topics,
            StepCompleted(
                run_id=self.run_id,
                ts_ns=time.time_ns(),
                seq=next(self._seq),
                step=step,
                loss=loss,
                step_time_s=step_time_s,
                grad_norm=grad_norm,
                tokens=tokens,
                examples=examples,
                local_tokens=local_tokens,
                local_examples=local_examples,
                microbatches=microbatches,
                accumulation_steps=accumulation_steps,
                data_parallel_size=data_parallel_size,
                lr=lr,
                skipped=skipped,
                restart_from_step=restart_from_step,
                rank=self.rank,
            ),
        )

    def heartbeat(self, step: int, *, step_time_s: float = 0.0) -> None:
        """Report that this rank finished ``step`` and is alive (to the heartbeats topic).

        Host name and pid are filled in.

        Raises:
            TypeError: A non-int step or a non-numeric time.
            ValueError: A negative step or time.
        """
        if type(step) is not int or step < 0:
            step = as_step("step", step)
        if type(step_time_s) is not float or not step_time_s >= 0.0:
            step_time_s = as_duration_s("step_time_s", step_time_s)
        self._enqueue_hot(
            self._heartbeat_topics,
            Heartbeat(
                run_id=self.run_id,
                ts_ns=time.time_ns(),
                seq=next(self._seq),
                rank=self.rank,
                step=step,
                step_time_s=step_time_s,
                host=self._host,
                pid=self._pid,
            ),
        )

    def checkpoint_committed(
        self,
        step: int,
        path: str,
        *,
        loader_states: Sequence[LoaderState] = (),
        size_bytes: int = 0,
        write_s: float = 0.0,
        blocked_s: float = 0.0,
    ) -> None:
        """Report a checkpoint complete on disk (to the checkpoints topic).

        Args:
            step: The step whose state it holds.
            path: Its directory (a str or path-like).
            loader_states: Every rank's data-loader position at that step.
            size_bytes: Bytes written.
            write_s: Seconds the background write took.
            blocked_s: Seconds training was blocked.

        Raises:
            TypeError: An argument of the wrong type.
            ValueError: A negative step, size or time, or an empty path.
        """
        states = tuple(loader_states)
        for state in states:
            if not isinstance(state, LoaderState):
                raise TypeError(
                    f"loader_states must hold LoaderState, got {type(state).__name__}"
                )
        self._enqueue(
            self._checkpoint_topics,
            self._key,
            CheckpointCommitted(
                run_id=self.run_id,
                ts_ns=time.time_ns(),
                seq=next(self._seq),
                step=as_step("step", step),
                path=_path("path", path),
                loader_states=states,
                size_bytes=as_step("size_bytes", size_bytes),
                write_s=as_duration_s("write_s", write_s),
                blocked_s=as_duration_s("blocked_s", blocked_s),
                rank=self.rank,
            ),
        )

    def checkpoint_failed(self, step: int, path: str, reason: str) -> None:
        """Report a checkpoint write that failed (to the checkpoints topic).

        Args:
            step: The step it was meant to hold.
            path: Where it was being written.
            reason: The error; whitespace is collapsed to one line.

        Raises:
            TypeError: An argument of the wrong type.
            ValueError: A negative step or an empty path.
        """
        self._enqueue(
            self._checkpoint_topics,
            self._key,
            CheckpointFailed(
                run_id=self.run_id,
                ts_ns=time.time_ns(),
                seq=next(self._seq),
                step=as_step("step", step),
                path=_path("path", path),
                reason=_one_line(as_str("reason", reason)),
                rank=self.rank,
            ),
        )

    def run_ended(
        self, status: str = "completed", *, final_step: int | None = None, reason: str = ""
    ) -> None:
        """Announce the end of this incarnation (to the runs, steps and heartbeats topics).

        Args:
            status: ``completed``, ``failed`` or ``stopped``.
            final_step: Last completed step; None if none completed.
            reason: Free text, for failures.

        Raises:
            TypeError: An argument of the wrong type.
            ValueError: An unknown status or a negative step.
        """
        if status not in RUN_STATUSES:
            raise ValueError(
                f"status must be one of {sorted(RUN_STATUSES)}, got {status!r}"
            )
        self._enqueue(
            self._run_topics,
            self._key,
            RunEnded(
                run_id=self.run_id,
                ts_ns=time.time_ns(),
                seq=next(self._seq),
                status=status,  # type: ignore[arg-type]
                final_step=None if final_step is None else as_step("final_step", final_step),
                reason=as_str("reason", reason),
            ),
        )

    def emit(self, topic: str, event: Event) -> None:
        """Send any event, as given, to one topic (the full name); the low-level path.

        The event keeps its own ``run_id`` (the record key), ``ts_ns`` and ``seq``; only
        ``dropped`` is raised when earlier events were dropped.

        Args:
            topic: Full topic name, e.g. ``names(prefix).steps``.
            event: The event.

        Raises:
            TypeError: ``event`` is not an `Event`, or cannot be encoded.
            ValueError: An empty topic.
        """
        if not isinstance(event, Event):
            raise TypeError(f"event must be a runwatch Event, got {type(event).__name__}")
        topic = as_str("topic", topic, allow_empty=False)
        key = self._key if event.run_id == self.run_id else encode_key(event.run_id)
        self._enqueue((topic,), key, event)

    # ------------------------------------------------------------------ the hot path

    def _enqueue_hot(self, topics: tuple[str, ...], event: Event) -> None:
        if self._encode_on_caller:
            self._enqueue(topics, self._key, event)
        else:
            self._push(topics, self._key, event, event)

    def _enqueue(self, topics: tuple[str, ...], key: bytes, event: Event) -> None:
        try:
            payload = encode(event)
        except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as exc:
            raise TypeError(f"cannot encode {type(event).__name__}: {exc}") from None
        self._push(topics, key, event, payload)

    def _push(
        self, topics: tuple[str, ...], key: bytes, event: Event, payload: bytes | Event
    ) -> None:
        if self._closed:
            self._drop_after_close(event)
            return
        drops = self._buffer.reserve()
        if drops is None:
            self._log.warning(
                "dropped",
                "runwatch emitter: buffer full (%d events waiting for Kafka); dropping "
                "events, the next event sent reports how many",
                self._buffer.max_items,
            )
            return
        if drops:
            event = msgspec.structs.replace(event, dropped=event.dropped + drops)
            payload = encode(event) if type(payload) is bytes else event
        self._buffer.push((topics, key, payload))

    def _drop_after_close(self, event: Event) -> None:
        self._buffer.count_dropped()
        self._log.warning(
            "closed",
            "runwatch emitter: %s after close() was dropped",
            type(event).__name__,
        )

    # ------------------------------------------------------------------ lifecycle

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every event accepted so far is delivered (or ``timeout_s`` passes).

        Args:
            timeout_s: Longest to wait.

        Returns:
            True if all of them were delivered in time and none failed meanwhile.
        """
        target = self._buffer.enqueued
        _, _, _, failed_before = self._buffer.counts()
        if self._delivery.alive:
            self._delivery.request_flush(time.monotonic() + timeout_s)
        settled = self._buffer.wait_settled(target, timeout_s)
        _, _, _, failed_after = self._buffer.counts()
        return settled and failed_after == failed_before

    def close(self, timeout_s: float = 10.0) -> bool:
        """Deliver what is buffered (for at most ``timeout_s``), then stop the thread.

        Safe to call more than once: later calls return the first result. Events emitted
        after closing are dropped (counted and logged).

        Args:
            timeout_s: Longest to wait for delivery and for the producer to close.

        Returns:
            True if every accepted event was delivered; the counts are in `stats`.
        """
        if self._close_result is not None:
            return self._close_result
        self._closed = True
        self._exit_hook.unregister()
        self._delivery.stop(time.monotonic() + max(0.0, timeout_s))
        self._delivery.join(max(0.0, timeout_s) + 2.0)
        stats = self.stats
        result = stats.delivered == stats.enqueued
        if not result:
            logger.warning(
                "runwatch emitter for run %s closed with %d of %d event(s) undelivered "
                "(%d failed, %d still buffered, %d dropped)",
                self.run_id,
                stats.enqueued - stats.delivered,
                stats.enqueued,
                stats.failed,
                stats.buffered,
                stats.dropped,
            )
        self._close_result = result
        return result

    @property
    def closed(self) -> bool:
        """True once `close` was called."""
        return self._closed

    @property
    def stats(self) -> EmitterStats:
        """The emitter's counts, as one consistent snapshot."""
        enqueued, delivered, dropped, failed = self._buffer.counts()
        return EmitterStats(
            enqueued=enqueued,
            delivered=delivered,
            dropped=dropped,
            failed=failed,
            buffered=enqueued - delivered - failed,
        )


def _positive(name: str, value: Any) -> int:
    result = as_int(name, value)
    if result < 1:
        raise ValueError(f"{name} must be >= 1, got {result}")
    return result


def _path(name: str, value: Any) -> str:
    try:
        text: str | bytes = os.fspath(value)
    except TypeError:
        raise TypeError(f"{name} must be a str or path, got {type(value).__name__}") from None
    if isinstance(text, bytes):
        raise TypeError(f"{name} must be a str or path, got bytes")
    if not text:
        raise ValueError(f"{name} must not be empty")
    return text


class _ExitHook:
    """An ``atexit`` hook that closes the emitter if the program forgets to.

    It is re-registered after the Kafka producer is created, so it runs before the
    producer's own ``atexit`` close (``atexit`` runs hooks last-registered first).
    """

    def __init__(self, emitter: RunEmitter) -> None:
        self._ref = weakref.ref(emitter)
        self._active = True

    def __call__(self) -> None:
        emitter = self._ref()
        if emitter is not None:
            emitter.close(EXIT_FLUSH_TIMEOUT_S)

    def register_last(self) -> None:
        if not self._active:
            return
        atexit.unregister(self)
        atexit.register(self)

    def unregister(self) -> None:
        self._active = False
        atexit.unregister(self)


def _stop_delivery(delivery: DeliveryThread) -> None:
    delivery.stop(time.monotonic() + 1.0)


__all__ = [
    "ENV_INCARNATION",
    "ENV_RANK",
    "ENV_RUN_ID",
    "ENV_WORLD_SIZE",
    "EXIT_FLUSH_TIMEOUT_S",
    "PRODUCER_DEFAULTS",
    "RUN_STATUSES",
    "EmitterStats",
    "RunEmitter",
]
