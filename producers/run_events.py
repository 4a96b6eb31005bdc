"""`RunEmitter`'s rare events: the run's start and end, checkpoints, and any event.

They carry caller-made structs (a `ModelFlopConfig`, `LoaderState`s...), so they are
checked and encoded on the calling thread: a bad one raises there, not in the delivery
thread. ``step`` and ``heartbeat``, the hot path, are in `producers.emitter`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Final

from runwatch.producers.emitter_core import EmitterCore
from runwatch.producers.validation import (
    as_duration_s,
    as_float,
    as_int,
    as_optional_float,
    as_path,
    as_step,
    as_str,
    one_line,
)
from runwatch.schemas.codec import encode_key
from runwatch.schemas.events import (
    BackendDeclaration,
    CheckpointCommitted,
    CheckpointFailed,
    Event,
    LoaderState,
    ModelFlopConfig,
    ParallelPlan,
    RunEnded,
    RunStarted,
)

RUN_STATUSES: Final = frozenset({"completed", "failed", "stopped"})
"""The values `RunEmitter.run_ended` accepts."""


class RunEvents(EmitterCore):
    """The rare events of `producers.emitter.RunEmitter`, encoded at the call site."""

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
        backend: BackendDeclaration | None = None,
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
            backend: What the training backend declares
                (``producers.backend.BackendCapabilities.declaration()``); a controller
                shrinks a run by whole nodes only when it declares it can.

        Raises:
            TypeError: An argument of the wrong type.
            ValueError: A plan for another world size, a non-positive peak or vocab size.
        """
        if flop_config is not None and not isinstance(flop_config, ModelFlopConfig):
            raise TypeError(
                f"flop_config must be a ModelFlopConfig, got {type(flop_config).__name__}"
            )
        if backend is not None and not isinstance(backend, BackendDeclaration):
            raise TypeError(f"backend must be a BackendDeclaration, got {type(backend).__name__}")
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
                backend=backend,
                launch_id=self.launch_id,
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
                raise TypeError(f"loader_states must hold LoaderState, got {type(state).__name__}")
        self._enqueue(
            self._checkpoint_topics,
            self._key,
            CheckpointCommitted(
                run_id=self.run_id,
                ts_ns=time.time_ns(),
                seq=next(self._seq),
                step=as_step("step", step),
                path=as_path("path", path),
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
                path=as_path("path", path),
                reason=one_line(as_str("reason", reason)),
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
            raise ValueError(f"status must be one of {sorted(RUN_STATUSES)}, got {status!r}")
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


__all__ = ["RUN_STATUSES", "RunEvents"]
