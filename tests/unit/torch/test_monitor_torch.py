"""Seed 000's monitor on a real (tiny) causal LM: FLOP config, MFU, and real resumes.

"the tests drive a real (tiny) ... causal LM for a handful of steps": a TinyLM trained
with AdamW on CPU, a checkpoint of model and optimizer at step 60, then two resumes from
it: one restoring both (continuity ok) and one that silently drops the optimizer state,
whose fresh AdamW makes a real loss jump (restart_discontinuity).
"""

from __future__ import annotations

import copy
import json
import time

import pytest

torch = pytest.importorskip("torch")

from examples.tinylm import TinyLM, TinyLMConfig  # noqa: E402
from runwatch.processors.core.monitor import (  # noqa: E402
    TrainingHealthMonitor,
    flop_config_from_causal_lm,
)
from runwatch.producers.torch_helpers import flop_config_from_causal_lm as producers_flop_config  # noqa: E402

pytestmark = pytest.mark.torch

CFG = TinyLMConfig(vocab_size=64, seq_len=32, d_model=32, n_layer=2, n_head=4)
CHECKPOINT_STEP = 60
LAST_STEP = 80


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A learnable stream (token i+1 follows token i), the same for a step on every try."""
    gen = torch.Generator().manual_seed(1000 + step)
    start = torch.randint(0, CFG.vocab_size, (8, 1), generator=gen)
    x = (start + torch.arange(CFG.seq_len + 1)) % CFG.vocab_size
    return x[:, :-1], x[:, 1:]


def fresh() -> tuple[TinyLM, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = TinyLM(CFG)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_step(model: TinyLM, opt: torch.optim.Optimizer, step: int) -> tuple[float, float]:
    x, y = batch(step)
    loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, CFG.vocab_size), y.reshape(-1))
    opt.zero_grad()
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
    opt.step()
    return loss.item(), grad_norm.item()


@pytest.fixture(scope="module")
def first_attempt() -> tuple[TrainingHealthMonitor, dict[str, object], dict[str, object]]:
    torch.set_num_threads(1)
    model, opt = fresh()
    monitor = TrainingHealthMonitor(
        flop_config=flop_config_from_causal_lm(model, seq_len=CFG.seq_len),
        peak_flops_per_sec=1e12,
    )
    saved: tuple[dict[str, object], dict[str, object]] | None = None
    for step in range(1, LAST_STEP + 1):
        t0 = time.perf_counter()
        loss, grad_norm = train_step(model, opt, step)
        monitor.observe_step(
            step, loss, grad_norm=grad_norm, step_time_s=time.perf_counter() - t0, batch_size=8
        )
        if step == CHECKPOINT_STEP:
            saved = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    assert saved is not None
    return monitor, saved[0], saved[1]


def resume(
    first: tuple[TrainingHealthMonitor, dict[str, object], dict[str, object]],
    *,
    keep_optimizer: bool,
) -> TrainingHealthMonitor:
    monitor, model_state, opt_state = first
    monitor = copy.deepcopy(monitor)
    model, opt = fresh()
    model.load_state_dict(model_state)
    if keep_optimizer:
        opt.load_state_dict(opt_state)
    for step in range(CHECKPOINT_STEP + 1, LAST_STEP + 1):
        loss, grad_norm = train_step(model, opt, step)
        monitor.observe_step(
            step,
            loss,
            grad_norm=grad_norm,
            step_time_s=0.01,
            batch_size=8,
            restart=step == CHECKPOINT_STEP + 1,
        )
    return monitor


def test_flop_config_comes_from_the_producers_helper() -> None:
    model = TinyLM(CFG)
    assert flop_config_from_causal_lm(model, CFG.seq_len) == producers_flop_config(
        model, CFG.seq_len
    )


def test_a_real_training_gives_mfu_samples_and_a_json_report(
    first_attempt: tuple[TrainingHealthMonitor, dict[str, object], dict[str, object]],
) -> None:
    monitor = first_attempt[0]
    assert len(monitor.mfu_samples) == LAST_STEP
    assert all(s.mfu is not None and s.mfu > 0 for s in monitor.mfu_samples)
    assert not [a for a in monitor.anomalies if a.kind.startswith("nonfinite")]
    report = monitor.report()
    assert json.loads(json.dumps(report, allow_nan=False)) == report
    assert report["steps"]["observed"] == LAST_STEP and report["continuity_ok"] is True


def test_a_resume_with_the_optimizer_state_keeps_continuity(
    first_attempt: tuple[TrainingHealthMonitor, dict[str, object], dict[str, object]],
) -> None:
    monitor = resume(first_attempt, keep_optimizer=True)
    assert monitor.continuity_ok()
    assert [r["continuity"] for r in monitor.report()["restarts"]] == ["ok"]


def test_a_resume_that_drops_the_optimizer_state_is_caught(
    first_attempt: tuple[TrainingHealthMonitor, dict[str, object], dict[str, object]],
) -> None:
    monitor = resume(first_attempt, keep_optimizer=False)
    breaks = [a for a in monitor.anomalies if a.kind == "restart_discontinuity"]
    assert len(breaks) == 1 and breaks[0].latency(CHECKPOINT_STEP + 1) <= 2
    assert not monitor.continuity_ok()
