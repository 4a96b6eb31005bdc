"""A gang's teardown frees its process groups while the interpreter is whole.

``destroy_process_group`` forgets a group, but its gloo threads end only when the group
object is freed; a DDP model still held keeps them running into the interpreter's teardown
at exit. Each case runs a 1-rank gloo gang in a process of its own (the test process never
initialises torch.distributed) and reads what `TorchDDPBackend.shutdown` left behind.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from runwatch.producers.backend import THREADS_OUTLIVE_GROUP

pytestmark = pytest.mark.torch

SCRIPT = textwrap.dedent(
    """
    import gc, sys
    import torch
    from runwatch.common.launch_env import LaunchEnv
    from runwatch.producers.backend import TorchDDPBackend, gloo_threads

    # as examples/train_ddp.py: without it, torch 2.15's DDP leaves something holding the
    # group after the model is freed (found while writing this test; the warning says so)
    torch.use_deterministic_algorithms(True)
    backend = TorchDDPBackend()
    backend.init(LaunchEnv.from_environ(), timeout_s=60)
    model = backend.wrap_model(torch.nn.Linear(4, 2))
    model(torch.ones(3, 4)).sum().backward()  # one all-reduce through the group
    print("before", len(gloo_threads()), flush=True)
    if sys.argv[1] == "drop":
        del model
        gc.collect()
    backend.shutdown()
    print("after", len(gloo_threads()), flush=True)
    """
)


def run_rank(mode: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("mode", "freed"),
    [
        pytest.param("drop", True, id="model-dropped-group-freed"),
        pytest.param("hold", False, id="model-held-warns"),
    ],
)
def test_shutdown_frees_the_group_or_says_what_outlives_it(solo_rank_env, mode, freed):
    done = run_rank(mode, solo_rank_env)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line.split() for line in done.stdout.splitlines()]
    threads = {
        when: int(count) for when, count in (w for w in lines if w[:1] in (["before"], ["after"]))
    }
    assert threads["before"] > 0  # the group's workers and socket loop ran
    assert (threads["after"] == 0) is freed
    assert (THREADS_OUTLIVE_GROUP in done.stderr) is not freed, done.stderr
