"""`TrainerReporter`: what a trainer callback reports, independent of the trainer library.

The Hugging Face and Lightning callbacks translate their library's hooks into these calls:

* `run_started` once training begins (rank 0 sends RunStarted; a resumed trainer marks
  its first reported step with ``restart_from_step``);
* `step_begun` / `step_ended` around every optimizer step on every rank (a Heartbeat per
  rank and step, with the step's wall time);
* `report_step` on rank 0 for each step the library reports a loss for (StepCompleted;
  ``step_time_s`` is the mean wall time of the steps since the previous report);
* `checkpoint` when the library has saved (CheckpointCommitted), `run_ended` on a clean
  end of training (every rank tells its agent, `producers.rank_done`; rank 0 sends
  RunEnded), and `close`.

Emitting never raises into the training loop: `producers.RunEmitter` does not block, and
an argument it refuses (a library reporting something odd) is logged and skipped.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path

from torch import nn

from runwatch.producers.emitter import RunEmitter
from runwatch.producers.rank_done import mark_training_done
from runwatch.producers.torch_helpers import flop_config_from_causal_lm
from runwatch.schemas.events import ModelFlopConfig

log = logging.getLogger(__name__)

CONTEXT_NAMES = ("n_positions", "max_position_embeddings", "n_ctx", "block_size", "seq_len")
"""Config attributes that give a model's context length (the default ``seq_len``)."""


def _config_int(model: nn.Module, names: tuple[str, ...]) -> int | None:
    for holder in (model, getattr(model, "config", None), getattr(model, "cfg", None)):
        for name in names:
            value = getattr(holder, name, None) if holder is not None else None
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def flop_config_for(model: nn.Module | None, seq_len: int | None = None) -> ModelFlopConfig | None:
    """The FLOP config of a transformer, or None when the model does not say its shape.

    Any model whose config names its layers, heads and width (GPT-2, Llama, BERT...) gets
    the ``6N`` + attention estimate of `flop_config_from_causal_lm`; an encoder is costed
    as if causal, which overstates attention by at most its (small) share. Other models
    (a CNN, an MLP) get None: the run has no MFU rather than a made-up one.

    Args:
        model: The model (DDP-wrapped is fine); None gives None.
        seq_len: Tokens per training sequence; default: the model's context length
            (``n_positions``, ``max_position_embeddings``...), right for packed
            pretraining, an overestimate for shorter sequences.

    Returns:
        The config, or None.
    """
    if model is None:
        return None
    length = seq_len if seq_len is not None else _config_int(model, CONTEXT_NAMES)
    if length is None:
        log.info("runwatch: no seq_len and no context length on the model: no MFU")
        return None
    try:
        return flop_config_from_causal_lm(model, length)
    except ValueError as exc:
        log.info("runwatch: no FLOP config for %s (%s): no MFU", type(model).__name__, exc)
        return None


def path_size_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes in a checkpoint: a file's size, or the sum over a directory's files (0 if gone)."""
    root = Path(path)
    if root.is_file():
        return root.stat().st_size
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += (Path(dirpath) / name).stat().st_size
            except OSError:
                continue
    return total


class TrainerReporter:
    """Turns a trainer's progress into one rank's runwatch events.

    Attributes:
        emitter: Where the events go.
        reporting: True on rank 0, which sends RunStarted, steps, checkpoints, RunEnded.
        close_timeout_s: How long `close` waits for delivery.
    """

    def __init__(self, emitter: RunEmitter, *, close_timeout_s: float = 30.0) -> None:
        """Report through ``emitter`` (its rank decides who sends what)."""
        self.emitter = emitter
        self.reporting = emitter.rank == 0
        self.close_timeout_s = close_timeout_s
        self._step_t0: float | None = None
        self._window_s = 0.0
        self._window_steps = 0
        self._restart_from: int | None = None
        self._warned = False

    def _refused(self, what: str, exc: Exception) -> None:
        if not self._warned:
            log.warning("runwatch: %s not reported: %s (further refusals not logged)", what, exc)
            self._warned = True

    def run_started(
        self,
        *,
        flop_config: ModelFlopConfig | None,
        resumed_at_step: int = 0,
        peak_flops_per_s: float | None = None,
        dtype: str = "fp32",
        vocab_size: int | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> None:
        """Training begins: RunStarted from rank 0.

        Args:
            flop_config: The model's shape for MFU, or None.
            resumed_at_step: The step the trainer resumed at (0: a fresh start); the next
                reported step carries it as ``restart_from_step``.
            peak_flops_per_s: Hardware peak summed over the gang.
            dtype: Training precision.
            vocab_size: For the loss-collapse check.
            tags: Free-form labels.
        """
        self._restart_from = resumed_at_step if resumed_at_step > 0 else None
        if not self.reporting:
            return
        try:
            self.emitter.run_started(
                flop_config=flop_config,
                peak_flops_per_s=peak_flops_per_s,
                dtype=dtype,
                vocab_size=vocab_size if vocab_size is None or vocab_size >= 2 else None,
                tags=tags,
            )
        except (TypeError, ValueError) as exc:
            self._refused("RunStarted", exc)

    def step_begun(self) -> None:
        """An optimizer step (its first microbatch) starts now."""
        self._step_t0 = time.perf_counter()

    def step_ended(self, step: int) -> float:
        """Optimizer step ``step`` is done on this rank: a Heartbeat; returns its wall time."""
        now = time.perf_counter()
        dt = 0.0 if self._step_t0 is None else now - self._step_t0
        self._step_t0 = None
        self._window_s += dt
        self._window_steps += 1
        try:
            self.emitter.heartbeat(step, step_time_s=dt)
        except (TypeError, ValueError) as exc:
            self._refused("heartbeat", exc)
        return dt

    def report_step(
        self,
        step: int,
        *,
        loss: float,
        grad_norm: float | None = None,
        lr: float | None = None,
        window_tokens: int = 0,
        examples: int = 0,
        accumulation_steps: int = 1,
    ) -> None:
        """Rank 0 reports step ``step`` (a StepCompleted); other ranks do nothing.

        Args:
            step: The optimizer step.
            loss: The loss the library reports for it (a mean over its logging window).
            grad_norm: Gradient norm before clipping, if known.
            lr: Learning rate.
            window_tokens: Tokens the gang processed since the previous report; divided
                by the steps in that window for the event's per-step ``tokens``.
            examples: Sequences the gang processes per step.
            accumulation_steps: Gradient-accumulation steps per optimizer step.
        """
        steps = max(1, self._window_steps)
        step_time_s = self._window_s / steps
        self._window_s, self._window_steps = 0.0, 0
        if not self.reporting:
            return
        restart_from, self._restart_from = self._restart_from, None
        try:
            self.emitter.step(
                step,
                loss=float(loss),
                step_time_s=step_time_s,
                grad_norm=None if grad_norm is None else float(grad_norm),
                lr=None if lr is None else float(lr),
                tokens=max(0, int(window_tokens)) // steps,
                examples=max(0, int(examples)),
                accumulation_steps=max(1, int(accumulation_steps)),
                restart_from_step=restart_from,
            )
        except (TypeError, ValueError) as exc:
            self._refused(f"step {step}", exc)

    def checkpoint(self, step: int, path: str | os.PathLike[str]) -> None:
        """Rank 0 reports a checkpoint the library has written (CheckpointCommitted)."""
        if not self.reporting:
            return
        try:
            self.emitter.checkpoint_committed(step, str(path), size_bytes=path_size_bytes(path))
        except (TypeError, ValueError) as exc:
            self._refused(f"checkpoint {path}", exc)

    def run_ended(self, status: str, final_step: int | None) -> None:
        """Training ended cleanly: every rank tells its agent, rank 0 reports RunEnded.

        The agent's word (`producers.rank_done.mark_training_done`) is what keeps a crash
        in the interpreter's teardown that follows (the libraries leave their process
        groups to be freed at exit) from failing, or restarting, a run that finished.
        """
        mark_training_done(final_step)
        if not self.reporting:
            return
        try:
            self.emitter.run_ended(status, final_step=final_step)
        except (TypeError, ValueError) as exc:
            self._refused("RunEnded", exc)

    def close(self) -> bool:
        """Deliver what is buffered (up to ``close_timeout_s``); True if all was delivered."""
        return self.emitter.close(timeout_s=self.close_timeout_s)


def make_emitter(
    emitter: RunEmitter | None,
    *,
    rank: int,
    world_size: int,
    run_id: str | None,
    bootstrap: str | None,
    topic_prefix: str | None,
) -> RunEmitter:
    """The given emitter, or a new one for this rank (other settings from the environment)."""
    if emitter is not None:
        return emitter
    return RunEmitter(
        run_id, bootstrap=bootstrap, rank=rank, world_size=world_size, topic_prefix=topic_prefix
    )


__all__ = [
    "CONTEXT_NAMES",
    "TrainerReporter",
    "flop_config_for",
    "make_emitter",
    "path_size_bytes",
]
