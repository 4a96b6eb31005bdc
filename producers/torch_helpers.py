"""Torch-side helpers for instrumenting a training loop: FLOP config, step timing, grad norm.

Importing this module imports torch; ``producers`` itself does not need torch.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from types import TracebackType

import torch
from torch import nn

from runwatch.schemas.events import ModelFlopConfig

_LAYER_NAMES = ("n_layer", "num_hidden_layers", "num_layers", "n_layers")
_HEAD_NAMES = ("n_head", "num_attention_heads", "num_heads", "n_heads")
_WIDTH_NAMES = ("d_model", "hidden_size", "n_embd", "dim")


def _unwrap(model: nn.Module) -> nn.Module:
    """Strip DDP / FSDP / compile wrappers that keep the real model in ``.module``."""
    while True:
        inner = getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            inner = getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def _shape_attr(model: nn.Module, names: tuple[str, ...]) -> int:
    holders = [model, getattr(model, "config", None), getattr(model, "cfg", None)]
    for holder in holders:
        for name in names:
            value = getattr(holder, name, None) if holder is not None else None
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    raise ValueError(f"model exposes none of {names} (on itself, .config or .cfg)")


def matmul_param_count(model: nn.Module) -> int:
    """Parameters that take part in matmuls: every unique parameter but lookup-only tables.

    An ``nn.Embedding`` weight is a lookup, not a matmul, unless another (non-embedding)
    module also owns the same ``Parameter``. That one rule handles every case:

    * position embeddings: a lookup only, excluded (nanoGPT's ``non_embedding`` count);
    * a token embedding tied to the output head: the shared matrix is counted once, as the
      head's ``d_model x vocab`` matmul, which is exactly its per-token cost (the input side
      of the tie is a free lookup);
    * an untied token embedding: a lookup only, excluded; the separate head is counted.

    Norm weights and biases count as parameters, as in the usual ``6N`` convention.

    Args:
        model: The model, possibly wrapped in DDP.

    Returns:
        The parameter count ``N`` of the ``6N`` FLOPs-per-token rule.
    """
    model = _unwrap(model)
    embedding_ids: set[int] = set()
    matmul_ids: set[int] = set()
    for module in model.modules():
        own = [p for p in module._parameters.values() if p is not None]
        target = embedding_ids if isinstance(module, nn.Embedding) else matmul_ids
        target.update(id(p) for p in own)
    lookup_only = embedding_ids - matmul_ids
    return sum(p.numel() for p in model.parameters() if id(p) not in lookup_only)


def flop_config_from_causal_lm(model: nn.Module, seq_len: int) -> ModelFlopConfig:
    """Derive the FLOP-relevant shape of a decoder-only transformer.

    Shape attributes are read from the model, or its ``.config`` / ``.cfg``, under the usual
    names (``n_layer`` or ``num_hidden_layers``, ``n_head`` or ``num_attention_heads``,
    ``d_model`` or ``hidden_size`` or ``n_embd``). ``n_params`` is `matmul_param_count`.

    Args:
        model: The model, possibly wrapped in DDP.
        seq_len: Tokens per training sequence.

    Returns:
        The `ModelFlopConfig` for RunStarted.

    Raises:
        ValueError: If a shape attribute cannot be found.
    """
    inner = _unwrap(model)
    return ModelFlopConfig(
        n_params=matmul_param_count(inner),
        n_layer=_shape_attr(inner, _LAYER_NAMES),
        n_head=_shape_attr(inner, _HEAD_NAMES),
        d_model=_shape_attr(inner, _WIDTH_NAMES),
        seq_len=seq_len,
    )


class StepTimer:
    """Wall time of one training step, synchronising the accelerator so queued work counts.

    Use as ``with timer: ...`` then read ``elapsed_s``, or call `start` / `stop`.
    """

    def __init__(self, device: torch.device | None = None) -> None:
        self._sync = device is not None and device.type == "cuda"
        self._device = device
        self._t0: float | None = None
        self.elapsed_s = 0.0

    def _synchronize(self) -> None:
        if self._sync:
            torch.cuda.synchronize(self._device)

    def start(self) -> None:
        """Start timing (after the accelerator has drained earlier work)."""
        self._synchronize()
        self._t0 = time.perf_counter()

    def stop(self) -> float:
        """Stop timing; returns and stores the elapsed seconds.

        Raises:
            RuntimeError: If `start` was not called.
        """
        if self._t0 is None:
            raise RuntimeError("StepTimer.stop() before start()")
        self._synchronize()
        self.elapsed_s = time.perf_counter() - self._t0
        self._t0 = None
        return self.elapsed_s

    def __enter__(self) -> StepTimer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def grad_norm(parameters: Iterable[torch.Tensor], max_norm: float | None = None) -> float:
    """Global L2 norm of the gradients before clipping; clips in place when ``max_norm`` is set.

    With DDP the gradients are already averaged over the gang after ``backward()``, so the
    local norm is the global one and no communication is needed. (Sharded gradients, as in
    FSDP, need the sharded implementation's own ``clip_grad_norm_`` instead.)

    Args:
        parameters: Parameters whose ``.grad`` to measure; ones without a grad are skipped.
        max_norm: Clip to this norm when given; None measures only.

    Returns:
        The norm before clipping, as a float; NaN or Inf when a gradient is non-finite.
    """
    params = [p for p in parameters if p.grad is not None]
    if not params:
        return 0.0
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
    if max_norm is not None:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return float(total)
