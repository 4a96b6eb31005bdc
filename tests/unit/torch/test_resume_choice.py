"""Which checkpoint the training script resumes from (decided on rank 0, before any load)."""

from __future__ import annotations

import pytest

from examples.train_ddp import parse_args, resolve_resume
from runwatch.common.checkpoint_layout import checkpoint_dir

pytestmark = pytest.mark.torch


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.delenv("RUNWATCH_RESTART_FROM", raising=False)
    for step in (4, 8):
        checkpoint_dir(tmp_path, step).mkdir()
        (checkpoint_dir(tmp_path, step) / ".metadata").write_bytes(b"m")
    (tmp_path / "step_000012.tmp").mkdir()
    return tmp_path


def choose(*argv: str):
    return resolve_resume(parse_args(list(argv)))


def test_resume_takes_the_latest_complete(root):
    assert choose("--checkpoint-dir", str(root), "--resume") == checkpoint_dir(root, 8)


def test_resume_from_a_step_is_a_rollback_bound(root, monkeypatch):
    assert choose("--checkpoint-dir", str(root), "--resume-from", "7") == checkpoint_dir(root, 4)
    assert choose("--checkpoint-dir", str(root), "--resume-from", "3") is None
    monkeypatch.setenv("RUNWATCH_RESTART_FROM", "9")
    assert choose("--checkpoint-dir", str(root)) == checkpoint_dir(root, 8)


def test_resume_from_a_path_must_be_complete(root):
    path = checkpoint_dir(root, 4)
    assert choose("--resume-from", str(path)) == path
    with pytest.raises(SystemExit, match="not a complete checkpoint"):
        choose("--resume-from", str(root / "step_000012.tmp"))


def test_existing_checkpoints_need_resume_or_fresh(root, tmp_path_factory):
    with pytest.raises(SystemExit, match="--fresh"):
        choose("--checkpoint-dir", str(root))
    assert choose("--checkpoint-dir", str(root), "--fresh") is None
    empty = tmp_path_factory.mktemp("empty")
    assert choose("--checkpoint-dir", str(empty)) is None
    assert choose("--checkpoint-dir", str(empty), "--resume") is None
