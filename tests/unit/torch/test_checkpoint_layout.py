"""Which directories count as checkpoints; keep-last-N; rollback discards. No torch needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from runwatch.common.checkpoint_layout import (
    checkpoint_dir,
    commit_checkpoint,
    discard_checkpoints_after,
    is_complete_checkpoint,
    latest_complete_checkpoint,
    list_complete_checkpoints,
    prune_checkpoints,
    remove_staging_dirs,
    staging_dir,
)


def make(path: Path, *, metadata: bool = True) -> Path:
    path.mkdir(parents=True)
    (path / "__0_0.distcp").write_bytes(b"x" * 10)
    if metadata:
        (path / ".metadata").write_bytes(b"m")
    return path


def test_incomplete_and_foreign_directories_are_ignored(tmp_path):
    make(checkpoint_dir(tmp_path, 10))
    make(checkpoint_dir(tmp_path, 30), metadata=False)  # crashed before DCP's metadata
    make(staging_dir(tmp_path, 40))  # metadata written, never committed
    make(tmp_path / "step_abc")
    make(tmp_path / "notes")
    (tmp_path / "step_000050").write_text("a file, not a directory")
    assert list_complete_checkpoints(tmp_path) == [(10, checkpoint_dir(tmp_path, 10))]
    assert latest_complete_checkpoint(tmp_path) == (10, checkpoint_dir(tmp_path, 10))
    assert not is_complete_checkpoint(staging_dir(tmp_path, 40))


def test_latest_with_a_rollback_bound(tmp_path):
    for step in (5, 10, 15):
        make(checkpoint_dir(tmp_path, step))
    assert latest_complete_checkpoint(tmp_path)[0] == 15
    assert latest_complete_checkpoint(tmp_path, at_or_before=14)[0] == 10
    assert latest_complete_checkpoint(tmp_path, at_or_before=4) is None
    assert latest_complete_checkpoint(tmp_path / "missing") is None


def test_steps_beyond_six_digits_sort_numerically(tmp_path):
    make(checkpoint_dir(tmp_path, 999_999))
    make(checkpoint_dir(tmp_path, 1_000_000))
    assert latest_complete_checkpoint(tmp_path)[0] == 1_000_000


def test_commit_renames_only_after_metadata(tmp_path):
    make(staging_dir(tmp_path, 7), metadata=False)
    with pytest.raises(FileNotFoundError):
        commit_checkpoint(tmp_path, 7)
    (staging_dir(tmp_path, 7) / ".metadata").write_bytes(b"m")
    assert commit_checkpoint(tmp_path, 7) == checkpoint_dir(tmp_path, 7)
    assert not staging_dir(tmp_path, 7).exists()
    assert is_complete_checkpoint(checkpoint_dir(tmp_path, 7))


def test_commit_replaces_a_checkpoint_of_the_same_step(tmp_path):
    make(checkpoint_dir(tmp_path, 7))
    make(staging_dir(tmp_path, 7))
    (staging_dir(tmp_path, 7) / "new").write_text("new history")
    final = commit_checkpoint(tmp_path, 7)
    assert (final / "new").read_text() == "new history"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000007"]


def test_keep_last_n(tmp_path):
    for step in (2, 4, 6, 8):
        make(checkpoint_dir(tmp_path, step))
    make(checkpoint_dir(tmp_path, 1), metadata=False)
    removed = prune_checkpoints(tmp_path, keep=2)
    assert [p.name for p in removed] == ["step_000002", "step_000004"]
    assert [s for s, _ in list_complete_checkpoints(tmp_path)] == [6, 8]
    assert checkpoint_dir(tmp_path, 1).exists()  # incomplete: not a checkpoint, not pruned
    with pytest.raises(ValueError):
        prune_checkpoints(tmp_path, keep=0)


def test_rollback_discards_the_abandoned_future_and_stale_staging(tmp_path):
    for step in (5, 10, 15):
        make(checkpoint_dir(tmp_path, step))
    make(staging_dir(tmp_path, 20), metadata=False)
    assert [p.name for p in discard_checkpoints_after(tmp_path, 10)] == ["step_000015"]
    assert [p.name for p in remove_staging_dirs(tmp_path)] == ["step_000020.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000005", "step_000010"]
