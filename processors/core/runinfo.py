"""What a run announced about itself (RunStarted), as the detectors keep it."""

from __future__ import annotations

import math
from typing import Literal

import msgspec

from runwatch.processors.core.config import DetectorConfig, effective_config
from runwatch.processors.core.mfu import CONVENTION_6N, CONVENTION_6N_ATTN, flops_per_token
from runwatch.schemas.events import ModelFlopConfig, RunEnded, RunStarted

RunStatus = Literal["running", "completed", "failed", "stopped"]


class RunInfo(msgspec.Struct, frozen=True, gc=False):
    """The latest RunStarted / RunEnded of a run, reduced to what detectors need.

    Attributes:
        incarnation: Gang incarnation (0 first launch, +1 per controller restart).
        status: ``running`` until a RunEnded says otherwise.
        world_size: Ranks in the gang (0: unknown).
        flop_config: Model shape for MFU.
        peak_flops_per_s: Peak of the whole gang for ``dtype``.
        dtype: Training precision.
        vocab_size: Vocabulary size, for the collapse check.
        thresholds: The run's own detector overrides.
        started_ns: Timestamp of the RunStarted of this incarnation (0: none seen).
        final_step: ``RunEnded.final_step``.
        ln_vocab: ln(vocab_size), the loss of uniform guessing; None when unknown.
        flops_per_token_6n: FLOPs per token under ``6N``; None without a flop config.
        flops_per_token_attn: FLOPs per token under ``6N+attn``; None without one.
        launch_id: ``RunStarted.launch_id`` (empty: none); the run's verdicts carry it.
    """

    incarnation: int = 0
    status: RunStatus = "running"
    world_size: int = 0
    flop_config: ModelFlopConfig | None = None
    peak_flops_per_s: float | None = None
    dtype: str = ""
    vocab_size: int | None = None
    thresholds: dict[str, float] = {}
    started_ns: int = 0
    final_step: int | None = None
    ln_vocab: float | None = None
    flops_per_token_6n: float | None = None
    flops_per_token_attn: float | None = None
    launch_id: str = ""

    @classmethod
    def from_event(cls, event: RunStarted) -> RunInfo:
        """The info a RunStarted announces."""
        vocab = event.vocab_size
        flop_config = event.flop_config
        return cls(
            incarnation=event.incarnation,
            world_size=event.world_size,
            flop_config=event.flop_config,
            peak_flops_per_s=event.peak_flops_per_s,
            dtype=event.dtype,
            vocab_size=event.vocab_size,
            thresholds=dict(event.thresholds),
            started_ns=event.ts_ns,
            ln_vocab=math.log(vocab) if vocab is not None and vocab >= 2 else None,
            flops_per_token_6n=None
            if flop_config is None
            else flops_per_token(flop_config, CONVENTION_6N),
            flops_per_token_attn=None
            if flop_config is None
            else flops_per_token(flop_config, CONVENTION_6N_ATTN),
            launch_id=event.launch_id,
        )

    def ended(self, event: RunEnded) -> RunInfo:
        """The info after a RunEnded."""
        return msgspec.structs.replace(self, status=event.status, final_step=event.final_step)

    def config(self, cfg: DetectorConfig) -> DetectorConfig:
        """The processor's configuration with this run's thresholds applied."""
        return effective_config(cfg, self.thresholds)

    def loss_ceiling(self, cfg: DetectorConfig) -> float | None:
        """The divergence ceiling: ``max_loss``, else a multiple of ln(vocab), else None."""
        if cfg.max_loss is not None:
            return cfg.max_loss
        ln_v = self.ln_vocab
        if ln_v is None or cfg.divergence_uniform_factor <= 0.0:
            return None
        return cfg.divergence_uniform_factor * ln_v

    def flops_per_token(self, cfg: DetectorConfig) -> float | None:
        """FLOPs per token under the configured convention; None without a flop config."""
        if cfg.mfu_convention == CONVENTION_6N:
            return self.flops_per_token_6n
        return self.flops_per_token_attn


__all__ = ["RunInfo", "RunStatus"]
