"""Both callbacks in a real two-rank gloo gang under `runwatch launch`: every rank
heartbeats, rank 0 alone sends RunStarted, the steps and RunEnded, all from the
library's own view of the ranks (no callback arguments: the launcher's environment)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runwatch.producers.backend import THREADS_OUTLIVE_GROUP
from runwatch.schemas.events import Heartbeat, RunEnded, RunStarted, StepCompleted
from runwatch.schemas.topics import names

from .conftest import read_all

pytestmark = [pytest.mark.integration, pytest.mark.torch]

SCRIPT = Path(__file__).with_name("train_two_ranks.py")
REPO = Path(__file__).resolve().parents[3]
STEPS = 4


@pytest.mark.parametrize(
    ("framework", "module"), [("hf", "transformers"), ("lightning", "lightning")]
)
def test_two_ranks_report_through_the_callback(
    framework: str,
    module: str,
    tmp_path: Path,
    kafka_bootstrap: str,
    topic_prefix: str,
    make_topics: Any,
) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (extra {framework})")
    make_topics(topic_prefix)
    run_id = f"{framework}-gang"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNWATCH_")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    state = tmp_path / "state"
    cmd = [sys.executable, "-m", "runwatch.cli", "launch", "--nproc", "2", "--run-id", run_id]
    cmd += ["--bootstrap", kafka_bootstrap, "--prefix", topic_prefix, "--state-dir", str(state)]
    cmd += [
        "--",
        sys.executable,
        str(SCRIPT),
        "--framework",
        framework,
        "--out",
        str(tmp_path / "o"),
    ]
    done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=280)
    logs = "\n".join(p.read_text()[-3000:] for p in sorted((state / "logs").glob("*.log")))
    assert done.returncode == 0, done.stderr + logs
    # the script frees and destroys the framework's process group (`end_process_group`);
    # gloo threads left running can abort a rank in the interpreter's teardown
    assert THREADS_OUTLIVE_GROUP not in logs, logs
    # every rank told its agent that its training finished, from the callback's train end:
    # a crash in the teardown after it would not fail the run (`producers.rank_done`)
    for rank in (0, 1):
        said = json.loads((state / "done" / f"inc0.rank{rank}.json").read_text())
        assert said["final_step"] == STEPS, said

    topics = names(topic_prefix)
    runs = [e for e in read_all(kafka_bootstrap, topics.runs) if e.run_id == run_id]
    assert [type(e) for e in runs] == [RunStarted, RunEnded]
    assert runs[0].world_size == 2 and runs[0].tags["framework"] in ("transformers", "lightning")
    assert runs[1].status == "completed" and runs[1].final_step == STEPS

    steps = [e for e in read_all(kafka_bootstrap, topics.steps) if isinstance(e, StepCompleted)]
    assert [(s.step, s.rank) for s in steps] == [(s, 0) for s in range(1, STEPS + 1)]
    assert all(s.data_parallel_size == 2 for s in steps)

    beats = [e for e in read_all(kafka_bootstrap, topics.heartbeats) if isinstance(e, Heartbeat)]
    assert sorted((b.rank, b.step) for b in beats) == [
        (r, s) for r in (0, 1) for s in range(1, STEPS + 1)
    ]
    assert len({b.pid for b in beats}) == 2  # two processes
