from __future__ import annotations

import math
import time

import pytest
import torch
from torch import nn

from examples.tinylm import TinyLM, TinyLMConfig
from runwatch.producers.torch_helpers import (
    StepTimer,
    flop_config_from_causal_lm,
    grad_norm,
    matmul_param_count,
)
from runwatch.schemas.events import ModelFlopConfig

pytestmark = pytest.mark.torch


def hand_count(v: int, d: int, n_layer: int) -> int:
    """Matmul parameters of TinyLM, counted from its definition by hand."""
    layer_norm = 2 * d
    attention = (d * 3 * d + 3 * d) + (d * d + d)
    mlp = (d * 4 * d + 4 * d) + (4 * d * d + d)
    block = 2 * layer_norm + attention + mlp
    head = v * d  # tied with the token embedding: one matrix, counted as the head matmul
    return n_layer * block + layer_norm + head


def test_flop_config_matches_a_hand_count():
    model = TinyLM(TinyLMConfig(vocab_size=256, seq_len=64, d_model=64, n_layer=2, n_head=4))
    assert hand_count(256, 64, 2) == 116_480
    assert flop_config_from_causal_lm(model, seq_len=64) == ModelFlopConfig(
        n_params=116_480, n_layer=2, n_head=4, d_model=64, seq_len=64
    )
    # Everything else is the position embedding, a lookup.
    assert sum(p.numel() for p in model.parameters()) - 116_480 == 64 * 64


def test_untied_token_embedding_is_a_lookup_and_the_head_a_matmul():
    model = TinyLM(TinyLMConfig(n_layer=3, d_model=32, n_head=2))
    model.head.weight = nn.Parameter(model.tok_emb.weight.detach().clone())
    total = sum(p.numel() for p in model.parameters())
    assert total == hand_count(256, 32, 3) + 256 * 32 + 64 * 32
    assert matmul_param_count(model) == hand_count(256, 32, 3)


def test_hf_style_config_names_are_read():
    class Config:
        num_hidden_layers, num_attention_heads, hidden_size = 3, 2, 8

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = Config()
            self.wpe = nn.Embedding(16, 8)
            self.proj = nn.Linear(8, 8)

    cfg = flop_config_from_causal_lm(Model(), seq_len=16)
    assert (cfg.n_params, cfg.n_layer, cfg.n_head, cfg.d_model) == (72, 3, 2, 8)


def test_missing_shape_attribute_is_an_error():
    with pytest.raises(ValueError, match="n_layer"):
        flop_config_from_causal_lm(nn.Linear(2, 2), seq_len=4)


def test_grad_norm_is_the_global_norm_before_clipping():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    model(torch.randn(5, 4)).pow(2).sum().mul(100).backward()
    expected = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model.parameters()))
    assert grad_norm(model.parameters()) == pytest.approx(expected, rel=1e-6)
    assert grad_norm(model.parameters(), max_norm=1.0) == pytest.approx(expected, rel=1e-6)
    assert grad_norm(model.parameters()) == pytest.approx(1.0, rel=1e-4)


def test_grad_norm_reports_nonfinite_and_empty():
    p = nn.Parameter(torch.zeros(3))
    assert grad_norm([p]) == 0.0
    p.grad = torch.tensor([1.0, float("nan"), 0.0])
    assert math.isnan(grad_norm([p]))


def test_step_timer():
    timer = StepTimer()
    with timer:
        time.sleep(0.01)
    assert 0.009 < timer.elapsed_s < 1.0
    with pytest.raises(RuntimeError):
        timer.stop()
