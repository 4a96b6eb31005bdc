"""Resume checks on real 2-rank gloo gangs with real DCP checkpoints.

(a) a run stopped after its step-8 checkpoint and resumed reproduces the uninterrupted run's
losses exactly (dropout on, so the RNG state must be restored too); (b) the same resume
without the optimizer state matches at the first step and then diverges (seed 002's failure
to provoke); keep-last-N holds on the uninterrupted run.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from runwatch.common.checkpoint_layout import latest_complete_checkpoint, list_complete_checkpoints
from runwatch.producers.backend import THREADS_OUTLIVE_GROUP

pytestmark = pytest.mark.torch

STEPS, STOP = 16, 8
COMMON = [
    "--steps",
    str(STEPS),
    "--global-batch",
    "16",
    "--dropout",
    "0.1",
    "--seed",
    "3",
    "--checkpoint-every",
    "4",
]


@pytest.fixture(scope="module")
def runs(gang_runner, tmp_path_factory):
    ref_ckpt = tmp_path_factory.mktemp("ref_ckpt")
    stop_ckpt = tmp_path_factory.mktemp("stop_ckpt")
    ref = gang_runner(
        2, [*COMMON, "--checkpoint-dir", str(ref_ckpt), "--keep-checkpoints", "2"], "ref"
    )
    stopped = gang_runner(
        2, [*COMMON, "--checkpoint-dir", str(stop_ckpt), "--stop-at", str(STOP)], "stopped"
    )
    step8 = latest_complete_checkpoint(stop_ckpt)
    resumed = gang_runner(2, [*COMMON, "--checkpoint-dir", str(stop_ckpt), "--resume"], "resumed")
    no_optim = gang_runner(
        2,
        [*COMMON, "--resume-from", str(step8[1]) if step8 else "missing", "--drop-optimizer-state"],
        "no_optim",
    )
    return {
        "ref": ref,
        "stopped": stopped,
        "resumed": resumed,
        "no_optim": no_optim,
        "ref_ckpt": ref_ckpt,
        "stop_ckpt": stop_ckpt,
        "step8": step8,
    }


def test_every_run_exits_cleanly(runs):
    for name in ("ref", "stopped", "resumed", "no_optim"):
        gang = runs[name]
        assert gang.returncodes == [0, 0], f"{name}:\n" + "\n".join(gang.logs)
        # the groups and their threads are gone before the interpreter's teardown
        assert not [log for log in gang.logs if THREADS_OUTLIVE_GROUP in log], name


def test_stop_commits_a_checkpoint_and_reports_stopped(runs):
    stopped = runs["stopped"]
    assert runs["step8"] is not None and runs["step8"][0] == STOP
    assert sorted(stopped.losses()) == list(range(1, STOP + 1))
    (ended,) = stopped.events(0, "run_ended")
    assert ended["status"] == "stopped" and ended["final_step"] == STOP
    committed = stopped.events(0, "checkpoint_committed")
    assert [c["step"] for c in committed] == [4, 8]
    for c in committed:
        assert Path(c["path"]).name == f"step_{c['step']:06d}"
        assert c["blocked_s"] > 0 and c["write_s"] > 0 and c["size_bytes"] > 0
        assert [s["rank"] for s in c["loader_states"]] == [0, 1]
        assert {s["global_sample"] for s in c["loader_states"]} == {16 * c["step"]}


def test_resume_reproduces_the_uninterrupted_losses_exactly(runs):
    ref, resumed = runs["ref"].losses(), runs["resumed"].losses()
    assert sorted(resumed) == list(range(STOP + 1, STEPS + 1))
    assert runs["stopped"].losses() == {s: ref[s] for s in range(1, STOP + 1)}
    assert resumed == {s: ref[s] for s in range(STOP + 1, STEPS + 1)}


def test_first_step_after_resume_is_marked(runs):
    steps = runs["resumed"].events(0, "step")
    assert steps[0]["step"] == STOP + 1 and steps[0]["restart_from_step"] == STOP
    assert all(s["restart_from_step"] is None for s in steps[1:])
    beats = runs["resumed"].events(1, "heartbeat")
    assert [b["step"] for b in beats] == list(range(STOP + 1, STEPS + 1))


def test_resume_without_optimizer_state_diverges(runs):
    ref, dropped = runs["ref"].losses(), runs["no_optim"].losses()
    assert "optimizer DROPPED" in runs["no_optim"].logs[0]
    # The first step after the resume runs on the same weights (and RNG): same loss.
    assert dropped[STOP + 1] == ref[STOP + 1]
    # Then Adam restarts from zero moments: the trajectory leaves the reference.
    gaps = [abs(dropped[s] - ref[s]) for s in range(STOP + 3, STEPS + 1)]
    assert min(gaps) > 1e-2, gaps
    assert all(math.isfinite(v) for v in dropped.values())


def test_keep_last_n_checkpoints(runs):
    kept = [step for step, _ in list_complete_checkpoints(runs["ref_ckpt"])]
    assert kept == [12, 16]
    assert not [p for p in Path(runs["ref_ckpt"]).iterdir() if p.name.endswith(".tmp")]
