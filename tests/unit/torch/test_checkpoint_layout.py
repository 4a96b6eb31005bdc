"""Which directories count as checkpoints; keep-last-N; a rollback moves aside. No torch."""

from __future__ import annotations

from pathlib import Path

import pytest

from runwatch.common.checkpoint_layout import (
    ROLLED_BACK_DIR,
    CheckpointMoveError,
    checkpoint_dir,
    commit_checkpoint,
    is_complete_checkpoint,
    latest_complete_checkpoint,
    list_complete_checkpoints,
    list_set_aside,
    prune_checkpoints,
    prune_set_aside,
    set_aside_after,
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


def test_commit_over_a_checkpoint_of_the_same_step_moves_the_old_one_aside(tmp_path):
    make(checkpoint_dir(tmp_path, 7))
    (checkpoint_dir(tmp_path, 7) / "old").write_text("old history")
    make(staging_dir(tmp_path, 7))
    (staging_dir(tmp_path, 7) / "new").write_text("new history")
    final = commit_checkpoint(tmp_path, 7)
    assert (final / "new").read_text() == "new history"
    assert sorted(p.name for p in tmp_path.iterdir()) == [ROLLED_BACK_DIR, "step_000007"]
    (aside,) = list_set_aside(tmp_path)
    assert aside.name.startswith("replaced-") and aside.entries == ("step_000007",)
    assert (aside.path / "step_000007" / "old").read_text() == "old history"


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


def _files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by name (its directory's name and its own) and content."""
    return {f"{p.parent.name}/{p.name}": p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_a_rollback_moves_the_abandoned_future_and_staging_aside_and_deletes_nothing(tmp_path):
    for step in (5, 10, 15):
        make(checkpoint_dir(tmp_path, step))
    make(staging_dir(tmp_path, 20), metadata=False)
    before = _files(tmp_path)
    moved = set_aside_after(tmp_path, 10, label="inc1-x")
    aside = tmp_path / ROLLED_BACK_DIR / "inc1-x"
    assert moved == [aside / "step_000015", aside / "step_000020.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ROLLED_BACK_DIR,
        "step_000005",
        "step_000010",
    ]
    assert _files(tmp_path) == before  # every file, byte for byte, only its place changed
    assert latest_complete_checkpoint(tmp_path)[0] == 10  # the set aside is never "latest"
    assert set_aside_after(tmp_path, 10, label="inc1-x") == []  # nothing more: no new set


def test_a_second_rollback_with_the_same_label_gets_its_own_set(tmp_path):
    for step in (5, 10):
        make(checkpoint_dir(tmp_path, step))
    set_aside_after(tmp_path, 5, label="inc2-t")
    make(checkpoint_dir(tmp_path, 8))
    set_aside_after(tmp_path, 0, label="inc2-t")
    sets = list_set_aside(tmp_path)
    assert [(s.name, s.entries) for s in sets] == [
        ("inc2-t", ("step_000010",)),
        ("inc2-t-2", ("step_000005", "step_000008")),
    ]
    assert list_complete_checkpoints(tmp_path) == []


def test_a_move_that_fails_deletes_nothing_and_says_why(tmp_path, monkeypatch):
    import errno
    import os

    for step in (5, 10):
        make(checkpoint_dir(tmp_path, step))

    def cross_device(src: object, dst: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "rename", cross_device)
    with pytest.raises(CheckpointMoveError, match=r"another file system.*nothing was deleted"):
        set_aside_after(tmp_path, 0, label="x")
    monkeypatch.undo()
    assert [s for s, _ in list_complete_checkpoints(tmp_path)] == [5, 10]


def test_a_label_is_one_path_component(tmp_path):
    make(checkpoint_dir(tmp_path, 5))
    for bad in ("", "..", "a/b"):
        with pytest.raises(ValueError):
            set_aside_after(tmp_path, 0, label=bad)


def test_prune_deletes_only_the_named_sets(tmp_path):
    for step in (5, 10, 15):
        make(checkpoint_dir(tmp_path, step))
    set_aside_after(tmp_path, 10, label="a")
    set_aside_after(tmp_path, 5, label="b")
    with pytest.raises(ValueError, match="'nope'"):
        prune_set_aside(tmp_path, ["a", "nope"])
    assert [s.name for s in list_set_aside(tmp_path)] == ["a", "b"]  # nothing removed
    assert prune_set_aside(tmp_path, ["a"]) == [tmp_path / ROLLED_BACK_DIR / "a"]
    assert [s.name for s in list_set_aside(tmp_path)] == ["b"]
    assert [s for s, _ in list_complete_checkpoints(tmp_path)] == [5]
