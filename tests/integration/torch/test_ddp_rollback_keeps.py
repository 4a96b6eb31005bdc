"""A rollback deletes no checkpoint: real 2-rank gloo gangs, real DCP checkpoints.

A run checkpoints steps 4, 8, 12 and 16. A second incarnation is started the way the
controller starts a rollback's (``RUNWATCH_RESTART_FROM=9``, ``RUNWATCH_INCARNATION=1``):
it resumes from step 8 and trains on to 16. Every file of the first run's checkpoints is
still on disk afterwards, byte for byte: 4 and 8 where they were, 12 and 16 moved into
``rolled_back/inc1-<time>/``, and `runwatch checkpoints list` names them. The resumed run
read step 8 (its losses equal the first run's from step 9 on).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from runwatch.common.checkpoint_layout import (
    ROLLED_BACK_DIR,
    list_complete_checkpoints,
    list_set_aside,
)

pytestmark = pytest.mark.torch

COMMON = ["--steps", "16", "--global-batch", "8", "--seed", "5", "--checkpoint-every", "4"]


def _files(root: Path) -> dict[str, str]:
    """Every file of every checkpoint (``step_N/name``) under ``root``, by content hash."""
    return {
        f"{p.parent.name}/{p.name}": hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file() and p.parent.name.startswith("step_")
    }


@pytest.fixture(scope="module")
def rolled(gang_runner, tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("ckpt")
    first = gang_runner(2, [*COMMON, "--checkpoint-dir", str(ckpt)], "first")
    assert first.returncodes == [0, 0], "\n".join(first.logs)
    before = _files(ckpt)
    second = gang_runner(
        2,
        [*COMMON, "--checkpoint-dir", str(ckpt)],
        "second",
        env={"RUNWATCH_RESTART_FROM": "9", "RUNWATCH_INCARNATION": "1"},
    )
    assert second.returncodes == [0, 0], "\n".join(second.logs)
    return first, second, ckpt, before


def test_every_checkpoint_file_is_still_on_disk(rolled):
    _, _, ckpt, before = rolled
    assert {name.split("/")[0] for name in before} == {f"step_{s:06d}" for s in (4, 8, 12, 16)}
    (aside,) = list_set_aside(ckpt)
    assert aside.name.startswith("inc1-") and aside.entries == ("step_000012", "step_000016")
    kept_in_place = _files(ckpt / "step_000004") | _files(ckpt / "step_000008")
    moved = _files(aside.path)
    for name, digest in before.items():
        where = kept_in_place if name.split("/")[0] in ("step_000004", "step_000008") else moved
        assert where.get(name) == digest, f"{name} lost or changed"
    # the new history wrote its own 12 and 16; the old ones are not "latest" any more
    assert [s for s, _ in list_complete_checkpoints(ckpt)] == [4, 8, 12, 16]
    assert not any(name.startswith(ROLLED_BACK_DIR) for name in _files(ckpt / "step_000016"))


def test_the_resumed_run_read_step_8(rolled):
    first, second, ckpt, _ = rolled
    assert f"resumed from {ckpt / 'step_000008'} at step 8" in second.logs[0]
    assert "moved step_000012 aside" in second.logs[0]
    steps = second.events(0, "step")
    assert steps[0]["step"] == 9 and steps[0]["restart_from_step"] == 8
    ref = first.losses()
    assert second.losses() == {s: ref[s] for s in range(9, 17)}


def test_runwatch_checkpoints_lists_and_prunes_only_what_it_is_told(rolled, tmp_path):
    _, _, ckpt, _ = rolled
    (aside,) = list_set_aside(ckpt)
    cli = [sys.executable, "-m", "runwatch.cli", "checkpoints"]
    shown = subprocess.run([*cli, "list", str(ckpt)], capture_output=True, text=True, check=True)
    assert f"set aside {aside.name}: step_000012 step_000016" in shown.stdout
    dry = subprocess.run(
        [*cli, "prune", str(ckpt), "--all", "--dry-run"], capture_output=True, text=True
    )
    assert dry.returncode == 0 and f"would delete {aside.path}" in dry.stdout
    assert aside.path.is_dir()
    wrong = subprocess.run([*cli, "prune", str(ckpt), "nope"], capture_output=True, text=True)
    assert wrong.returncode == 2 and "no set 'nope'" in wrong.stderr
    assert aside.path.is_dir()
