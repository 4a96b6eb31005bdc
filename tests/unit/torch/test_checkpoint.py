"""AsyncCheckpointer and load_checkpoint in one process (real DCP, no process group)."""

from __future__ import annotations

import random
import shutil

import numpy as np
import pytest
import torch
from torch.nn import functional as F  # noqa: N812

from examples.tinylm import TinyLM, TinyLMConfig
from runwatch.common.checkpoint_layout import (
    checkpoint_dir,
    latest_complete_checkpoint,
    list_complete_checkpoints,
)
from runwatch.producers.checkpoint import AsyncCheckpointer, load_checkpoint
from runwatch.schemas.events import LoaderState

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::UserWarning")]


def trained(seed: int = 0) -> tuple[TinyLM, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = TinyLM(TinyLMConfig(n_layer=1, d_model=32, n_head=2, seq_len=16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randint(0, 256, (4, 16))
    F.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()
    opt.step()
    return model, opt


def loader(step: int) -> LoaderState:
    return LoaderState(
        seed=3, epoch=0, rank=0, world_size=1, batch_idx=step, global_sample=8 * step
    )


def test_save_commits_keeps_last_n_and_reports_timings(tmp_path):
    model, opt = trained()
    ckpt = AsyncCheckpointer(tmp_path, keep=2)
    for step in (1, 2, 3):
        ckpt.save(step, model, opt, loader_state=loader(step), gang_loader_states=(loader(step),))
    results = ckpt.close()
    assert [(r.step, r.status) for r in results] == [
        (1, "committed"),
        (2, "committed"),
        (3, "committed"),
    ]
    assert all(r.blocked_s > 0 and r.write_s > 0 and r.size_bytes > 0 for r in results)
    assert results[-1].loader_states == (loader(3),)
    assert [s for s, _ in list_complete_checkpoints(tmp_path)] == [2, 3]


def test_load_restores_model_optimizer_rng_and_loader(tmp_path):
    model, opt = trained()
    ckpt = AsyncCheckpointer(tmp_path)
    ckpt.save(5, model, opt, loader_state=loader(5))
    ckpt.close()
    other, other_opt = trained(seed=1)
    restored = load_checkpoint(checkpoint_dir(tmp_path, 5), other, other_opt)
    assert (restored.step, restored.loader, restored.saved_world_size) == (5, loader(5), 1)
    assert restored.optimizer_restored and restored.rng_restored
    torch.testing.assert_close(other.state_dict(), model.state_dict(), rtol=0, atol=0)
    for a, b in zip(other_opt.state.values(), opt.state.values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_rng_streams_continue_exactly(tmp_path):
    model, opt = trained()
    torch.manual_seed(11)
    random.seed(12)
    np.random.seed(13)
    ckpt = AsyncCheckpointer(tmp_path)
    ckpt.save(5, model, opt, loader_state=loader(5))
    ckpt.close()
    t, p, n = torch.rand(3), random.random(), float(np.random.rand())
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    load_checkpoint(checkpoint_dir(tmp_path, 5), *trained(seed=1))
    assert torch.equal(torch.rand(3), t)
    assert (random.random(), float(np.random.rand())) == (p, n)


def test_dropping_the_optimizer_state_leaves_it_fresh(tmp_path):
    model, opt = trained()
    ckpt = AsyncCheckpointer(tmp_path)
    ckpt.save(1, model, opt, loader_state=loader(1))
    ckpt.close()
    other, fresh = trained(seed=1)
    fresh.state.clear()
    restored = load_checkpoint(checkpoint_dir(tmp_path, 1), other, None)
    assert not restored.optimizer_restored and not fresh.state
    torch.testing.assert_close(other.state_dict(), model.state_dict(), rtol=0, atol=0)


def test_a_checkpoint_whose_metadata_is_missing_is_not_loaded(tmp_path):
    model, opt = trained()
    ckpt = AsyncCheckpointer(tmp_path)
    for step in (1, 2):
        ckpt.save(step, model, opt, loader_state=loader(step))
    ckpt.close()
    # A crash between the shards and the metadata leaves exactly this behind.
    shutil.copytree(checkpoint_dir(tmp_path, 2), tmp_path / "step_000003.tmp")
    (tmp_path / "step_000003.tmp" / ".metadata").unlink()
    (checkpoint_dir(tmp_path, 2) / ".metadata").unlink()
    assert latest_complete_checkpoint(tmp_path) == (1, checkpoint_dir(tmp_path, 1))


def test_the_training_loop_is_not_blocked_by_the_write(tmp_path):
    model, opt = trained()
    ckpt = AsyncCheckpointer(tmp_path)
    blocked = ckpt.save(1, model, opt, loader_state=loader(1))
    # Mutating the live weights right away must not leak into the checkpoint.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    (result,) = ckpt.close()
    assert blocked == result.blocked_s
    other, _ = trained(seed=1)
    load_checkpoint(result.path, other)
    changed = next(iter(model.parameters()))
    saved = next(iter(other.parameters()))
    torch.testing.assert_close(saved + 1.0, changed, rtol=0, atol=0)
