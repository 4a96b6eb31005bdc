"""`RunwatchTrainerCallback`: runwatch events from a Hugging Face `transformers.Trainer`.

Install with ``pip install 'runwatch[hf]'``. Add it to the trainer; under ``runwatch
launch`` or ``torchrun`` (``RUNWATCH_BOOTSTRAP`` and ``RUNWATCH_RUN_ID`` set) it needs no
arguments::

    trainer = Trainer(model, args, train_dataset=ds, callbacks=[RunwatchTrainerCallback()])

What it sends, from the Trainer's own state (ranks are ``args.process_index`` and
``args.world_size``):

* RunStarted (rank 0, at ``on_train_begin``): the FLOP config from the model's config
  (`producers.callbacks.reporter.flop_config_for`), the precision from ``bf16`` / ``fp16``,
  the vocabulary size; a resumed trainer marks its first step with ``restart_from_step``;
* a Heartbeat from every rank at every optimizer step (``on_step_end``);
* a StepCompleted (rank 0) for every log the Trainer writes (``on_log`` with ``loss``): the
  logged ``loss`` (the Trainer's mean over its ``logging_steps`` window, gathered over the
  ranks), ``grad_norm`` (before clipping; absent when ``max_grad_norm`` is 0),
  ``learning_rate``, and tokens from ``num_input_tokens_seen`` when
  ``include_num_input_tokens_seen`` is on (else ``tokens_per_step``). Use
  ``logging_steps=1`` for a step event per step, and ``logging_nan_inf_filter=False``:
  the Trainer's default filter replaces a NaN or infinite loss by the running mean, hiding
  the very loss runwatch rolls back for;
* CheckpointCommitted (rank 0, ``on_save``) with ``<output_dir>/checkpoint-<step>``;
* RunEnded (rank 0, ``on_train_end``): ``completed`` at ``max_steps``, ``stopped`` when
  training ended early (early stopping, ``control.should_training_stop``). A crash sends
  none, so the processors' liveness checks see the silence and the controller respawns.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from runwatch.producers.callbacks.reporter import TrainerReporter, flop_config_for, make_emitter
from runwatch.producers.emitter import RunEmitter

PREFIX_CHECKPOINT_DIR = "checkpoint"
"""The Trainer's checkpoint folder prefix (``transformers.trainer_utils``)."""


def _dtype(args: TrainingArguments) -> str:
    if getattr(args, "bf16", False):
        return "bf16"
    if getattr(args, "fp16", False):
        return "fp16"
    return "fp32"


class RunwatchTrainerCallback(TrainerCallback):
    """A `transformers.TrainerCallback` that reports the run to runwatch; see the module doc.

    Args:
        emitter: The emitter to use; default: one created at ``on_train_begin`` for the
            Trainer's rank, configured from the arguments below and the environment.
        run_id: The run (default ``$RUNWATCH_RUN_ID``).
        bootstrap: Kafka bootstrap (default ``$RUNWATCH_BOOTSTRAP``).
        topic_prefix: Topic name prefix (default ``$RUNWATCH_TOPIC_PREFIX``).
        seq_len: Tokens per training sequence, for MFU (default: the model's context
            length).
        peak_flops_per_s_per_rank: One accelerator's peak for the training precision;
            None: no MFU.
        tokens_per_step: Tokens the gang processes per step, when the Trainer does not
            count them (``include_num_input_tokens_seen`` off).
        tags: Free-form labels for RunStarted.
        close_timeout_s: How long ``on_train_end`` waits for delivery.
    """

    def __init__(
        self,
        emitter: RunEmitter | None = None,
        *,
        run_id: str | None = None,
        bootstrap: str | None = None,
        topic_prefix: str | None = None,
        seq_len: int | None = None,
        peak_flops_per_s_per_rank: float | None = None,
        tokens_per_step: int = 0,
        tags: Mapping[str, str] | None = None,
        close_timeout_s: float = 30.0,
    ) -> None:
        self._emitter = emitter
        self._settings = {"run_id": run_id, "bootstrap": bootstrap, "topic_prefix": topic_prefix}
        self.seq_len = seq_len
        self.peak_flops_per_s_per_rank = peak_flops_per_s_per_rank
        self.tokens_per_step = tokens_per_step
        self.tags = {"framework": "transformers", **(tags or {})}
        self.close_timeout_s = close_timeout_s
        self.reporter: TrainerReporter | None = None
        self._tokens_seen = 0
        self._steps_logged = 0

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: Any = None,
        **kwargs: Any,
    ) -> None:
        """Create the emitter for this rank and announce the run (rank 0)."""
        world_size = max(1, int(args.world_size))
        emitter = make_emitter(
            self._emitter, rank=int(args.process_index), world_size=world_size, **self._settings
        )
        self.reporter = TrainerReporter(emitter, close_timeout_s=self.close_timeout_s)
        self._tokens_seen = int(getattr(state, "num_input_tokens_seen", 0) or 0)
        self._steps_logged = int(state.global_step)
        config = getattr(model, "config", None)
        peak = self.peak_flops_per_s_per_rank
        self.reporter.run_started(
            flop_config=flop_config_for(model, self.seq_len),
            resumed_at_step=int(state.global_step),
            peak_flops_per_s=None if peak is None else peak * world_size,
            dtype=_dtype(args),
            vocab_size=getattr(config, "vocab_size", None),
            tags=self.tags,
        )

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Start timing the optimizer step."""
        if self.reporter is not None:
            self.reporter.step_begun()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """The optimizer stepped: a heartbeat from this rank."""
        if self.reporter is not None:
            self.reporter.step_ended(int(state.global_step))

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        """A training log (one with ``loss``): the step event (rank 0)."""
        if self.reporter is None or not logs or "loss" not in logs:
            return  # evaluation logs and the final summary (``train_loss``) are not steps
        step = int(state.global_step)
        window = max(1, step - self._steps_logged)
        self._steps_logged = step
        if args.include_num_input_tokens_seen not in ("no", False, None):
            seen = int(state.num_input_tokens_seen or 0)
            window_tokens, self._tokens_seen = seen - self._tokens_seen, seen
        else:
            window_tokens = self.tokens_per_step * window
        accumulation = max(1, int(args.gradient_accumulation_steps))
        self.reporter.report_step(
            step,
            loss=logs["loss"],
            grad_norm=logs.get("grad_norm"),
            lr=logs.get("learning_rate"),
            window_tokens=window_tokens,
            examples=int(args.per_device_train_batch_size)
            * max(1, int(args.world_size))
            * accumulation,
            accumulation_steps=accumulation,
        )

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """The Trainer wrote ``checkpoint-<step>``: CheckpointCommitted (rank 0)."""
        if self.reporter is None:
            return
        step = int(state.global_step)
        path = os.path.join(args.output_dir or "", f"{PREFIX_CHECKPOINT_DIR}-{step}")
        if os.path.isdir(path):
            self.reporter.checkpoint(step, path)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Training ended cleanly: RunEnded (rank 0), then deliver what is buffered."""
        if self.reporter is None:
            return
        step = int(state.global_step)
        status = "completed" if state.max_steps <= 0 or step >= state.max_steps else "stopped"
        self.reporter.run_ended(status, step if step > 0 else None)
        self.reporter.close()
        self.reporter = None


__all__ = ["RunwatchTrainerCallback"]
