"""Model FLOPs utilisation: theoretical FLOPs of a decoder-only transformer, and MFU.

Two conventions are in use and they differ by several points of MFU, so every figure
names its convention:

* ``6N``: 6 FLOPs per parameter per token (forward + backward of every weight matmul;
  a multiply-add is 2 FLOPs and the backward pass costs twice the forward).
* ``6N+attn``: 6N plus the attention score matmuls (QK^T and attention @ V), which have
  no parameters: 12·L·H·Q·T per token, with H heads of width Q (H·Q = d_model) and context
  length T. This is the accounting of the PaLM paper's appendix and of nanoGPT.

N counts parameters that take part in matmuls: position embeddings are a lookup and are
excluded. ``flop_config_from_causal_lm`` (which needs torch) lives in ``producers``.
"""

from __future__ import annotations

from typing import Final

from runwatch.processors.core.config import MfuConvention
from runwatch.schemas.events import ModelFlopConfig

CONVENTION_6N: Final[MfuConvention] = "6N"
CONVENTION_6N_ATTN: Final[MfuConvention] = "6N+attn"
CONVENTIONS: Final[tuple[MfuConvention, ...]] = (CONVENTION_6N, CONVENTION_6N_ATTN)


def dense_flops_per_token(n_params: int) -> float:
    """FLOPs per token of the weight matmuls, forward and backward: 6N."""
    return 6.0 * n_params


def attention_flops_per_token(*, n_layer: int, n_head: int, d_model: int, seq_len: int) -> float:
    """FLOPs per token of the attention score matmuls, forward and backward: 12·L·H·Q·T.

    Args:
        n_layer: Transformer blocks (L).
        n_head: Heads per block (H).
        d_model: Hidden width; the head width Q is ``d_model // n_head``.
        seq_len: Context length (T).

    Returns:
        The FLOPs.
    """
    head_dim = d_model // n_head
    return 12.0 * n_layer * n_head * head_dim * seq_len


def flops_per_token(cfg: ModelFlopConfig, convention: MfuConvention = CONVENTION_6N_ATTN) -> float:
    """Training FLOPs per token of a model under a convention.

    Args:
        cfg: The model's shape.
        convention: ``6N`` or ``6N+attn``.

    Returns:
        FLOPs per token (forward + backward).

    Raises:
        ValueError: Unknown convention.
    """
    dense = dense_flops_per_token(cfg.n_params)
    if convention == CONVENTION_6N:
        return dense
    if convention == CONVENTION_6N_ATTN:
        return dense + attention_flops_per_token(
            n_layer=cfg.n_layer, n_head=cfg.n_head, d_model=cfg.d_model, seq_len=cfg.seq_len
        )
    raise ValueError(f"unknown MFU convention {convention!r}; valid: {', '.join(CONVENTIONS)}")


def theoretical_flops_per_iter(
    *,
    n_params: int,
    n_layer: int,
    n_head: int,
    d_model: int,
    seq_len: int,
    batch_size: int,
    convention: MfuConvention = CONVENTION_6N_ATTN,
) -> float:
    """Theoretical forward + backward FLOPs of one iteration over ``batch_size`` sequences.

    Args:
        n_params: Matmul parameters (position embeddings excluded).
        n_layer: Transformer blocks.
        n_head: Heads per block.
        d_model: Hidden width.
        seq_len: Tokens per sequence.
        batch_size: Sequences in the iteration (of the whole gang, for the gang's FLOPs).
        convention: ``6N+attn`` (the default, as in seed 000) or ``6N``.

    Returns:
        FLOPs of the iteration.
    """
    cfg = ModelFlopConfig(
        n_params=n_params, n_layer=n_layer, n_head=n_head, d_model=d_model, seq_len=seq_len
    )
    return flops_per_token(cfg, convention) * seq_len * batch_size


def achieved_flops_per_s(step_flops: float, step_time_s: float) -> float | None:
    """FLOP/s achieved by a step; None when the step time is not positive."""
    if not step_time_s > 0.0:
        return None
    return step_flops / step_time_s


def mfu(step_flops: float, step_time_s: float, peak_flops_per_s: float | None) -> float | None:
    """Model FLOPs utilisation of one step, as a fraction (0.3135 for 31.35 %).

    Args:
        step_flops: Theoretical FLOPs of the step (of the whole gang).
        step_time_s: Wall time of the step.
        peak_flops_per_s: Hardware peak for the training dtype (of the whole gang).

    Returns:
        The fraction, or None when the time or the peak is missing or not positive.
    """
    if peak_flops_per_s is None or not peak_flops_per_s > 0.0:
        return None
    achieved = achieved_flops_per_s(step_flops, step_time_s)
    if achieved is None:
        return None
    return achieved / peak_flops_per_s


__all__ = [
    "CONVENTIONS",
    "CONVENTION_6N",
    "CONVENTION_6N_ATTN",
    "ModelFlopConfig",
    "achieved_flops_per_s",
    "attention_flops_per_token",
    "dense_flops_per_token",
    "flops_per_token",
    "mfu",
    "theoretical_flops_per_iter",
]
