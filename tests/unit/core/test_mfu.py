"""MFU accounting: seed 002's worked example and seed 000's formula."""

from __future__ import annotations

import pytest

from runwatch.processors.core.config import DetectorConfig, with_overrides
from runwatch.processors.core.mfu import (
    CONVENTION_6N,
    CONVENTION_6N_ATTN,
    attention_flops_per_token,
    flops_per_token,
    mfu,
    theoretical_flops_per_iter,
)
from runwatch.processors.core.steps import fold_step
from tests.unit.core.factories import GPT2_SMALL, src, started, step

TOKENS = 32_768
STEP_S = 0.25
PEAK = 312e12


@pytest.mark.parametrize(
    ("convention", "per_token", "percent"),
    [
        (CONVENTION_6N, 746_141_184, "31.35"),
        (CONVENTION_6N_ATTN, 746_141_184 + 113_246_208, "36.10"),
    ],
)
def test_seed_002_worked_example(convention: str, per_token: int, percent: str) -> None:
    assert flops_per_token(GPT2_SMALL, convention) == per_token  # type: ignore[arg-type]
    value = mfu(per_token * TOKENS, STEP_S, PEAK)
    assert value is not None
    assert f"{100 * value:.2f}" == percent


def test_attention_term_is_12_l_d_t() -> None:
    assert attention_flops_per_token(n_layer=12, n_head=12, d_model=768, seq_len=1024) == (
        12 * 12 * 1024 * 768
    )


def test_theoretical_flops_per_iter_is_per_token_times_tokens() -> None:
    kw = dict(n_params=1000, n_layer=2, n_head=4, d_model=64, seq_len=16, batch_size=3)
    assert theoretical_flops_per_iter(**kw) == (6 * 1000 + 12 * 2 * 64 * 16) * 16 * 3  # type: ignore[arg-type]
    assert theoretical_flops_per_iter(**kw, convention=CONVENTION_6N) == 6 * 1000 * 16 * 3  # type: ignore[arg-type]


@pytest.mark.parametrize(("time_s", "peak"), [(0.0, PEAK), (-1.0, PEAK), (0.25, None), (0.25, 0.0)])
def test_mfu_none_without_time_or_peak(time_s: float, peak: float | None) -> None:
    assert mfu(1e12, time_s, peak) is None


def test_unknown_convention() -> None:
    with pytest.raises(ValueError):
        flops_per_token(GPT2_SMALL, "9N")  # type: ignore[arg-type]


@pytest.mark.parametrize(("convention", "percent"), [("6N", "31.35"), ("6N+attn", "36.10")])
def test_reducer_reproduces_seed_002(convention: str, percent: str) -> None:
    cfg = with_overrides(DetectorConfig(), {"mfu_convention": convention})
    state, _ = fold_step(None, started(flop_config=GPT2_SMALL, peak_flops_per_s=PEAK), src(0), cfg)
    for n in range(1, 21):
        state, _ = fold_step(state, step(n, 4.0 - 0.05 * n, tokens=TOKENS, dt=STEP_S), src(n), cfg)
    assert state.last_tokens_per_s == 131_072.0
    assert state.tokens_per_s_avg == 131_072.0
    for value in (state.last_mfu, state.mfu_avg, state.mfu_mean):
        assert value is not None and f"{100 * value:.2f}" == percent
