"""Elastic restart on another world size: a checkpoint written by 2 ranks resumes on 1.

`TorchDDPBackend` declares ``reshardable_checkpoint`` and ``elastic_restart``; this is the
proof. The gang consumes exactly the same samples, step for step, as the uninterrupted
2-rank run (none skipped, none repeated), and the losses agree to float32 rounding (one
rank averages 16 sequences where two ranks averaged 8 each).
"""

from __future__ import annotations

import pytest

from runwatch.common.checkpoint_layout import checkpoint_dir
from runwatch.producers.backend import TorchDDPBackend

pytestmark = pytest.mark.torch

STEPS, RESUME_AT, BATCH = 14, 6, 16
COMMON = ["--steps", str(STEPS), "--global-batch", str(BATCH), "--seed", "5"]


@pytest.fixture(scope="module")
def runs(gang_runner, tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("ckpt")
    two = gang_runner(
        2, [*COMMON, "--checkpoint-dir", str(ckpt), "--checkpoint-every", "3"], "two_ranks"
    )
    one = gang_runner(
        1, [*COMMON, "--resume-from", str(checkpoint_dir(ckpt, RESUME_AT))], "one_rank"
    )
    return two, one


def test_backend_declares_what_this_proves():
    caps = TorchDDPBackend.CAPABILITIES
    assert caps.reshardable_checkpoint and caps.elastic_restart


def test_both_runs_succeed(runs):
    for gang in runs:
        assert set(gang.returncodes) == {0}, "\n".join(gang.logs)
    assert "saved by 2 ranks, now 1" in runs[1].logs[0]


def test_sample_stream_continues_without_skip_or_repeat(runs):
    two, one = runs
    r0, r1, solo = two.samples(0), two.samples(1), one.samples(0)
    assert sorted(solo) == list(range(RESUME_AT + 1, STEPS + 1))
    for step in solo:
        # Rank 0 took positions g..g+7, rank 1 g+8..g+15; the lone rank takes g..g+15.
        assert solo[step] == r0[step] + r1[step]
    before = [i for s in range(1, RESUME_AT + 1) for i in r0[s] + r1[s]]
    after = [i for s in range(RESUME_AT + 1, STEPS + 1) for i in solo[s]]
    assert len(set(before + after)) == len(before) + len(after) == STEPS * BATCH


def test_loader_state_in_the_checkpoint_event(runs):
    two, _ = runs
    (event,) = [e for e in two.events(0, "checkpoint_committed") if e["step"] == RESUME_AT]
    states = event["loader_states"]
    assert [s["rank"] for s in states] == [0, 1]
    assert all(s["global_sample"] == RESUME_AT * BATCH and s["world_size"] == 2 for s in states)


def test_losses_match_the_two_rank_run(runs):
    two, one = runs
    ref, solo = two.losses(), one.losses()
    for step, loss in solo.items():
        assert loss == pytest.approx(ref[step], rel=1e-5, abs=1e-5)
    first = one.events(0, "step")[0]
    assert first["restart_from_step"] == RESUME_AT and first["data_parallel_size"] == 1
    assert first["examples"] == BATCH and first["local_examples"] == BATCH
