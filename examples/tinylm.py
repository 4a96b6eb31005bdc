"""A tiny decoder-only transformer (GPT-style, pre-norm, tied output head).

Small enough that one training step takes a few milliseconds on one CPU thread, big enough to
have the parts a FLOP count cares about: token and position embeddings, attention, an MLP,
and an output head tied to the token embedding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812


@dataclass(frozen=True)
class TinyLMConfig:
    """Shape of a `TinyLM`.

    Attributes:
        vocab_size: Tokens in the vocabulary.
        seq_len: Context length (rows of the position embedding).
        d_model: Hidden width.
        n_layer: Transformer blocks.
        n_head: Attention heads per block; must divide ``d_model``.
        dropout: Dropout probability after attention and MLP (consumes the torch RNG).
    """

    vocab_size: int = 256
    seq_len: int = 64
    d_model: int = 64
    n_layer: int = 2
    n_head: int = 4
    dropout: float = 0.0


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with a fused QKV projection."""

    def __init__(self, cfg: TinyLMConfig) -> None:
        super().__init__()
        if cfg.d_model % cfg.n_head:
            raise ValueError("n_head must divide d_model")
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attend over the past; ``x`` is ``(batch, time, d_model)``."""
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.dropout(self.proj(y.transpose(1, 2).reshape(b, t, d)))


class Block(nn.Module):
    """Pre-norm transformer block: attention then a 4x GELU MLP, each residual."""

    def __init__(self, cfg: TinyLMConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.out = nn.Linear(4 * cfg.d_model, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block to ``(batch, time, d_model)``."""
        x = x + self.attn(self.ln1(x))
        return x + self.dropout(self.out(F.gelu(self.fc(self.ln2(x)))))


class TinyLM(nn.Module):
    """Decoder-only language model; the output head shares the token embedding's weight.

    Exposes ``n_layer``, ``n_head``, ``d_model`` and ``seq_len`` as attributes, which is what
    `producers.torch_helpers.flop_config_from_causal_lm` reads.
    """

    def __init__(self, cfg: TinyLMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.n_layer, self.n_head, self.d_model = cfg.n_layer, cfg.n_head, cfg.d_model
        self.seq_len = cfg.seq_len
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits ``(batch, time, vocab)`` for token ids ``idx`` of shape ``(batch, time)``."""
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))
