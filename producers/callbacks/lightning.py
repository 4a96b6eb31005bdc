"""`RunwatchLightningCallback`: runwatch events from a PyTorch Lightning `Trainer`.

Install with ``pip install 'runwatch[lightning]'``::

    trainer = L.Trainer(callbacks=[RunwatchLightningCallback(seq_len=1024)])

What it sends, from the Trainer's own state (ranks are ``trainer.global_rank`` and
``trainer.world_size``):

* RunStarted (rank 0, ``on_train_start``): the FLOP config of the LightningModule, or of
  the model it holds as ``.model`` (`producers.callbacks.reporter.flop_config_for`), the
  precision from ``trainer.precision``; a resumed fit (``global_step`` > 0) marks its first
  step with ``restart_from_step``;
* a Heartbeat from every rank per optimizer step;
* a StepCompleted (rank 0) per optimizer step: the loss ``training_step`` returned for the
  step's last microbatch (averaged over the ranks when there are several: one all-reduce
  of a scalar per step), the gradient norm before clipping (measured in
  ``on_before_optimizer_step``, which Lightning calls before it clips; one device sync per
  step, ``grad_norm=False`` skips it), the first param group's learning rate, and
  ``tokens_per_step``;
* CheckpointCommitted (rank 0) for every file a `ModelCheckpoint` wrote, once it is on
  disk (``on_save_checkpoint`` runs before the file is written, so the checkpoint is
  reported at the next hook, at the latest at the end of fitting);
* RunEnded (rank 0, ``on_train_end``): ``completed`` when ``max_steps`` (or
  ``max_epochs``) was reached, else ``stopped``. An exception sends none (liveness then
  does its work).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from runwatch.producers.callbacks.reporter import TrainerReporter, flop_config_for, make_emitter
from runwatch.producers.emitter import RunEmitter
from runwatch.producers.torch_helpers import grad_norm as measure_grad_norm


def _dtype(precision: object) -> str:
    text = str(precision)
    if "bf16" in text:
        return "bf16"
    if "16" in text:
        return "fp16"
    return "fp32"


def _loss(outputs: Any) -> torch.Tensor | None:
    if isinstance(outputs, Mapping):
        outputs = outputs.get("loss")
    return outputs if isinstance(outputs, torch.Tensor) else None


class RunwatchLightningCallback(Callback):
    """A Lightning `Callback` that reports the run to runwatch; see the module doc.

    Args:
        emitter: The emitter to use; default: one created at ``on_train_start`` for the
            trainer's rank, configured from the arguments below and the environment.
        run_id: The run (default ``$RUNWATCH_RUN_ID``).
        bootstrap: Kafka bootstrap (default ``$RUNWATCH_BOOTSTRAP``).
        topic_prefix: Topic name prefix (default ``$RUNWATCH_TOPIC_PREFIX``).
        seq_len: Tokens per training sequence, for MFU (default: the model's context
            length, when its config has one).
        peak_flops_per_s_per_rank: One accelerator's peak for the training precision;
            None: no MFU.
        tokens_per_step: Tokens the gang processes per optimizer step.
        grad_norm: Measure the gradient norm before clipping (a device sync per step).
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
        grad_norm: bool = True,
        tags: Mapping[str, str] | None = None,
        close_timeout_s: float = 30.0,
    ) -> None:
        self._emitter = emitter
        self._settings = {"run_id": run_id, "bootstrap": bootstrap, "topic_prefix": topic_prefix}
        self.seq_len = seq_len
        self.peak_flops_per_s_per_rank = peak_flops_per_s_per_rank
        self.tokens_per_step = tokens_per_step
        self.measure_grad_norm = grad_norm
        self.tags = {"framework": "lightning", **(tags or {})}
        self.close_timeout_s = close_timeout_s
        self.reporter: TrainerReporter | None = None
        self._last_step = 0
        self._grad_norm: float | None = None
        self._loss_sum: torch.Tensor | None = None
        self._timing = False
        self._reported_paths: set[str] = set()
        self._pending_steps: list[int] = []

    # ------------------------------------------------------------------ start and end

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Create the emitter for this rank and announce the run (rank 0)."""
        world_size = max(1, int(trainer.world_size))
        emitter = make_emitter(
            self._emitter, rank=int(trainer.global_rank), world_size=world_size, **self._settings
        )
        self.reporter = TrainerReporter(emitter, close_timeout_s=self.close_timeout_s)
        self._last_step = int(trainer.global_step)
        model = pl_module
        inner = getattr(pl_module, "model", None)
        flop_config = flop_config_for(model, self.seq_len)
        if flop_config is None and isinstance(inner, torch.nn.Module):
            flop_config = flop_config_for(inner, self.seq_len)
        config = getattr(inner, "config", None) or getattr(pl_module, "config", None)
        peak = self.peak_flops_per_s_per_rank
        self.reporter.run_started(
            flop_config=flop_config,
            resumed_at_step=self._last_step,
            peak_flops_per_s=None if peak is None else peak * world_size,
            dtype=_dtype(trainer.precision),
            vocab_size=getattr(config, "vocab_size", None),
            tags=self.tags,
        )

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Fitting ended cleanly: report what was saved, RunEnded (rank 0), deliver."""
        if self.reporter is None:
            return
        self._commit_saved(trainer)
        step = int(trainer.global_step)
        done = (trainer.max_steps > 0 and step >= trainer.max_steps) or (
            trainer.max_epochs is not None
            and trainer.max_epochs > 0
            and trainer.current_epoch >= trainer.max_epochs
        )
        self.reporter.run_ended("completed" if done else "stopped", step if step > 0 else None)
        self.reporter.close()
        self.reporter = None

    # ------------------------------------------------------------------ steps

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """The first microbatch of an optimizer step starts the step's clock."""
        if self.reporter is not None and not self._timing:
            self.reporter.step_begun()
            self._timing = True

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        """Measure the gradient norm before Lightning clips it."""
        if self.reporter is not None and self.measure_grad_norm:
            self._grad_norm = measure_grad_norm(pl_module.parameters())

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Per microbatch: add up its loss; after the optimizer stepped: heartbeat and step."""
        self._commit_saved(trainer)
        if self.reporter is None:
            return
        loss = _loss(outputs)
        if loss is not None:
            # Lightning divides each microbatch's loss by the accumulation steps, so the
            # sum over an optimizer step is the mean over its microbatches.
            part = loss.detach()
            self._loss_sum = part if self._loss_sum is None else self._loss_sum + part
        step = int(trainer.global_step)
        if step == self._last_step:
            return  # an accumulation microbatch: the optimizer has not stepped
        self._last_step, self._timing = step, False
        self.reporter.step_ended(step)
        summed, self._loss_sum = self._loss_sum, None
        grad, self._grad_norm = self._grad_norm, None
        if summed is None:
            return  # a training_step that returned no loss (manual optimization)
        total = (
            summed if trainer.world_size <= 1 else trainer.strategy.reduce(summed, reduce_op="mean")
        )
        optimizers = trainer.optimizers
        lr = optimizers[0].param_groups[0].get("lr") if optimizers else None
        self.reporter.report_step(
            step,
            loss=float(total),
            grad_norm=grad,
            lr=lr,
            window_tokens=self.tokens_per_step,
            accumulation_steps=max(1, int(trainer.accumulate_grad_batches)),
        )

    # ------------------------------------------------------------------ checkpoints

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """A checkpoint is being written; it is reported once its file exists."""
        self._pending_steps.append(int(checkpoint.get("global_step", trainer.global_step)))

    def _commit_saved(self, trainer: pl.Trainer) -> None:
        """Report the new checkpoint files of the `ModelCheckpoint` callbacks (rank 0).

        The files are paired with the pending saves' steps newest to newest (one file per
        save in the usual case).
        """
        if self.reporter is None or not self._pending_steps:
            return
        found: set[str] = set()
        for callback in trainer.checkpoint_callbacks:
            if isinstance(callback, ModelCheckpoint):
                found.update(
                    [callback.last_model_path, callback.best_model_path, *callback.best_k_models]
                )
        new = [p for p in found if p and p not in self._reported_paths and os.path.isfile(p)]
        new.sort(key=os.path.getmtime)
        steps, self._pending_steps = self._pending_steps, []
        pairs = list(zip(reversed(new), reversed(steps), strict=False))
        for path, step in reversed(pairs):  # oldest first
            self._reported_paths.add(path)
            self.reporter.checkpoint(step, path)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Checkpoints saved at the end of validation are reported here or later."""
        self._commit_saved(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Checkpoints saved at the end of an epoch are reported here or later."""
        self._commit_saved(trainer)


__all__ = ["RunwatchLightningCallback"]
