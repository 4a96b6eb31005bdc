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
    RUNWATCH_RELAY_SOCKET  the node agent's relay (``runwatch launch --relay``): no
                           Kafka client in this process; default unset

Example::

    with RunEmitter() as emitter:
        emitter.run_started(flop_config=cfg, peak_flops_per_s=312e12, dtype="bf16")
        for step in range(steps):
            ...
            emitter.step(step, loss=loss.item(), step_time_s=dt, tokens=tokens)
        emitter.run_ended("completed", final_step=step)

`RunEmitter` is assembled from one concept per module: `producers.emitter_config`
(arguments and environment), `producers.emitter_core` (buffer, delivery thread, `flush`,
`close`, `stats`), `producers.lifecycle` (the exit hook), `producers.run_events` (the rare
events, checked and encoded at the call site) and this module (the constructor and the hot
path, ``step`` and ``heartbeat``). The names above stay importable from here.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from runwatch.producers.delivery import ProducerFactory
from runwatch.producers.emitter_config import (
    ENV_INCARNATION,
    ENV_RANK,
    ENV_RUN_ID,
    ENV_WORLD_SIZE,
    PRODUCER_DEFAULTS,
    resolve_config,
)
from runwatch.producers.emitter_core import EmitterStats
from runwatch.producers.lifecycle import EXIT_FLUSH_TIMEOUT_S
from runwatch.producers.run_events import RUN_STATUSES, RunEvents
from runwatch.producers.stackdump import install_stack_dump
from runwatch.producers.validation import as_bool, as_duration_s, as_float, as_positive, as_step
from runwatch.schemas.events import Heartbeat, StepCompleted


class RunEmitter(RunEvents):
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
        pack_heartbeats: bool = False,
        pack_steps: bool = False,
        pack_max_events: int = 512,
        pack_linger_ms: float = 100.0,
        relay_socket: str | None = None,
        launch_id: str | None = None,
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
            pack_heartbeats: Send heartbeats queued within ``pack_linger_ms`` as one
                packed record (`schemas.events.EventPack`; see `producers.packing`).
                Off by default: one record per event, the wire format of old consumers.
            pack_steps: The same for steps.
            pack_max_events: Most events per packed record (2..4096).
            pack_linger_ms: Longest an event waits for others to share its record; what
                the processors see that much later (a hang, a dead rank).
            relay_socket: The node agent's relay (`producers.relay_client`); default
                ``$RUNWATCH_RELAY_SOCKET`` (``runwatch launch --relay`` sets it), else
                none: a Kafka producer of the emitter's own.
            launch_id: The launch (``runwatch launch``) the gang belongs to, carried by
                RunStarted (restart commands are bound to it); default
                ``$RUNWATCH_LAUNCH_ID``, else none.

        Raises:
            ValueError: No run id or bootstrap, a negative rank, a rank outside the world,
                a malformed environment variable, ``max_buffered`` < 1,
                ``client_config`` overriding a fixed setting, or a packing bound out of
                range.
            TypeError: An argument of the wrong type.
        """
        config = resolve_config(
            run_id,
            bootstrap=bootstrap,
            rank=rank,
            world_size=world_size,
            topic_prefix=topic_prefix,
            incarnation=incarnation,
            max_buffered=max_buffered,
            client_config=client_config,
            pack_heartbeats=pack_heartbeats,
            pack_steps=pack_steps,
            pack_max_events=pack_max_events,
            pack_linger_ms=pack_linger_ms,
            relay_socket=relay_socket,
            launch_id=launch_id,
        )
        super().__init__(config, producer_factory)
        install_stack_dump()  # the agent that launched us may ask where we are (SIGUSR1)

    # ------------------------------------------------------------------ the hot path

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
        replica_group: int | None = None,
        participants: tuple[int, ...] = (),
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
            replica_group: This rank's replica group (torchft); None: no replica groups.
            participants: The replica groups in this step's quorum (torchft), ascending.

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
            microbatches = as_positive("microbatches", microbatches)
        if type(accumulation_steps) is not int or accumulation_steps < 1:
            accumulation_steps = as_positive("accumulation_steps", accumulation_steps)
        if data_parallel_size is None:
            data_parallel_size = self._data_parallel_size
        elif type(data_parallel_size) is not int or data_parallel_size < 1:
            data_parallel_size = as_positive("data_parallel_size", data_parallel_size)
        if replica_group is not None:
            replica_group = as_step("replica_group", replica_group)
        participants = tuple(sorted(as_step("participants", g) for g in participants))
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
                replica_group=replica_group,
                participants=participants,
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
