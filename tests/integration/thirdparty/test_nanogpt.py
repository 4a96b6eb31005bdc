"""An unmodified third-party training script, watched as a user would: nanoGPT + tail-log.

karpathy/nanoGPT's ``train.py`` (vendored byte for byte in ``tests/thirdparty/nanogpt``,
MIT, provenance in its README; a test pins the hashes) trains a tiny character-level GPT on
CPU, printing its ``iter N: loss L, time Tms, mfu M%`` lines to a log file. ``runwatch
tail-log`` turns the file into step events, real `runwatch processors` judge them, and
``runwatch audit`` replays the log. Nothing of runwatch runs inside the script.

- A healthy run (learning rate 3e-3): the loss falls from 4.36 to about 2.3 with the noise
  of 512-token batches; nothing pages.
- The same run with a learning rate far too high (3.0, a real cause): the loss leaves the
  ceiling that ``--vocab-size`` gives (twice ln V) within a few steps; a critical
  ``loss_divergence`` and a rollback command.
- The audit reproduces every verdict and command of both runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from runwatch.cli import main
from runwatch.processors.logread import read_history
from runwatch.schemas.codec import decode
from runwatch.schemas.events import AnomalyDetected, RestartRequested
from runwatch.schemas.topics import names
from tests.integration.processors.harness import workers

pytestmark = pytest.mark.integration

NANOGPT = Path(__file__).resolve().parents[2] / "thirdparty" / "nanogpt"

UNMODIFIED = {
    "train.py": "413bd97b40bb400a2a0d01230e2946f056c263ebac1b7281c2367d964a123085",
    "model.py": "7c01703240dbec5d554527dc666e35b3df8391d0b117fddc07afcf325a21d11c",
    "configurator.py": "5cc23aca26b4ab3c0d9e5f82740f4781f9444f42718c15abcee70d93c5aabe8f",
    "LICENSE": "a59ec5cdb1c1e447e5266a014b3e7ded511f8d6e5a08931e931c87490ff821fe",
}
"""sha256 of each vendored file at karpathy/nanoGPT 3adf61e1."""

ITERS = {"nanogpt-healthy": 200, "nanogpt-lr-too-high": 60}
"""Steps per run: the healthy run long enough for its noise to show; the other diverges fast."""

# nanoGPT's own configurator takes --key=value overrides of train.py's globals: a tiny model
# on the CPU, one batch per step, a log line per step, no evaluation but the first.
ARGS = (
    "--dataset=chars",
    "--device=cpu",
    "--compile=False",
    "--dtype=float32",
    "--eval_iters=1",
    "--eval_interval=100000",
    "--log_interval=1",
    "--gradient_accumulation_steps=1",
    "--batch_size=8",
    "--block_size=64",
    "--n_layer=2",
    "--n_head=2",
    "--n_embd=64",
    "--dropout=0.0",
    "--warmup_iters=20",
    "--out_dir=out",
)


def test_the_vendored_script_is_unmodified():
    got = {name: hashlib.sha256((NANOGPT / name).read_bytes()).hexdigest() for name in UNMODIFIED}
    assert got == UNMODIFIED


def prepare(workdir: Path) -> int:
    """nanoGPT's files and a character-level data set (its own sources as text); the vocab."""
    for name in ("train.py", "model.py", "configurator.py"):
        shutil.copy(NANOGPT / name, workdir / name)
    text = (NANOGPT / "model.py").read_text() + (NANOGPT / "train.py").read_text()
    chars = sorted(set(text))
    ids = np.array([chars.index(c) for c in text], dtype=np.uint16)
    data = workdir / "data" / "chars"
    data.mkdir(parents=True)
    cut = len(ids) * 9 // 10
    ids[:cut].tofile(data / "train.bin")
    ids[cut:].tofile(data / "val.bin")
    (data / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": len(chars)}))
    return len(chars)


def train(workdir: Path, learning_rate: float, iters: int) -> Path:
    """Run nanoGPT's train.py to its end, its output in ``train.log`` as ``| tee`` would."""
    log = workdir / "train.log"
    with log.open("w") as out:
        subprocess.run(
            [
                *(sys.executable, "-u", "train.py", *ARGS),
                *(f"--learning_rate={learning_rate}", f"--min_lr={learning_rate / 10}"),
                *(f"--max_iters={iters}", f"--lr_decay_iters={iters}"),
            ],
            cwd=workdir,
            env={**os.environ, "OMP_NUM_THREADS": "1"},  # one thread: 2 shared cores
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=600,
            check=True,
        )
    return log


def audit(bootstrap: str, prefix: str, run: str) -> dict:
    out = subprocess.run(
        [
            *(sys.executable, "-m", "runwatch.cli", "audit", "--bootstrap", bootstrap),
            *("--prefix", prefix, "--app-id", f"{prefix}-app", "--run", run),
            *("--wait", "180", "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, (out.returncode, out.stdout, out.stderr)
    return json.loads(out.stdout)


def test_nanogpt_watched_through_tail_log_pages_only_when_it_diverges(
    kafka_bootstrap, topic_prefix, make_topics, tmp_path
):
    make_topics(topic_prefix, partitions=2)
    topics = names(topic_prefix)
    runs = {"nanogpt-healthy": 3e-3, "nanogpt-lr-too-high": 3.0}
    with workers(kafka_bootstrap, topic_prefix, tmp_path, partitions=2) as start:
        start()
        for run, learning_rate in runs.items():
            workdir = tmp_path / run
            workdir.mkdir()
            vocab = prepare(workdir)
            log = train(workdir, learning_rate, ITERS[run])
            assert log.read_text().count("\niter ") == ITERS[run] + 1  # iter 0 to the last
            code = main(
                [
                    *("tail-log", str(log), "--run-id", run, "--format", "nanogpt"),
                    *("--from-start", "--exit-at-eof", "--bootstrap", kafka_bootstrap),
                    *("--topic-prefix", topic_prefix, "--tokens-per-step", "512"),
                    *("--vocab-size", str(vocab), "--tag", "script=nanoGPT"),
                ]
            )
            assert code == 0
        receipts = {run: audit(kafka_bootstrap, topic_prefix, run) for run in runs}

    for run, receipt in receipts.items():
        assert receipt["verdict"] == "AGREES", (run, receipt)
    # the audit waited for the workers, who publish before they commit: the topics are whole
    history = read_history(kafka_bootstrap, [topics.anomalies, topics.commands])
    published = [decode(r.value) for r in history[topics.anomalies]]
    sent = [decode(r.value) for r in history[topics.commands]]
    assert all(isinstance(e, AnomalyDetected) for e in published)
    assert all(isinstance(c, RestartRequested) for c in sent)
    healthy = [e for e in published if e.run_id == "nanogpt-healthy"]
    assert [e for e in healthy if e.severity in ("warning", "critical")] == []
    diverged = [e for e in published if e.run_id == "nanogpt-lr-too-high"]
    first = min(diverged, key=lambda e: e.step)
    assert (first.kind, first.severity) == ("loss_divergence", "critical")
    assert first.step <= 10, first  # within a few steps, still in the warm-up
    assert [(c.run_id, c.action, c.cause_kind) for c in sent] == [
        ("nanogpt-lr-too-high", "rollback", "loss_divergence")
    ]
