"""`runwatch replay --all`: a fleet calibration report over a real broker's history."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from runwatch.processors.logread import read_history
from runwatch.schemas.topics import names
from runwatch.sinks.archive import ArchiveSink
from runwatch.ui.calibration import calibration_json
from runwatch.ui.model import WebviewData
from runwatch.ui.server import UiServer

from .harness import Reader, Trainer, workers
from .test_audit_lag import spiked

pytestmark = pytest.mark.integration

RUNS = ("run-a", "run-b", "run-c")
STEPS = 25
SPIKE_STEP = 20
SPIKE_LOSS = 6.0
"""About 1.6x the healthy curve: past the spike episodes' magnitude floor (1.5x), so it pages
at the default settings though it is back at the next step (a smaller one that recovers is
an info episode, not a page)."""
QUIET = ("--set", "loss_z_thresh=400", "--set", "loss_shift_h=0")
"""Settings under which the planted spike pages nobody."""


def runwatch_replay(bootstrap: str, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *(sys.executable, "-m", "runwatch.cli", "replay", "--all"),
            *("--bootstrap", bootstrap, "--prefix", prefix, *args),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_replay_all_reports_today_and_proposed_pages_exactly(
    kafka_bootstrap, topic_prefix, make_topics, tmp_path
):
    make_topics(topic_prefix, partitions=2)
    anomalies = Reader(kafka_bootstrap, names(topic_prefix).anomalies)
    trainers = {r: Trainer(kafka_bootstrap, topic_prefix, r, seed=i) for i, r in enumerate(RUNS)}
    with workers(kafka_bootstrap, topic_prefix, tmp_path, partitions=2) as start:
        start()
        for tr in trainers.values():
            tr.start(0)
        for s in range(1, STEPS + 1):
            for r, tr in trainers.items():
                tr.step(s, loss=SPIKE_LOSS if (r == "run-b" and s == SPIKE_STEP) else None)
        for tr in trainers.values():
            tr.end("completed")
        anomalies.wait_for(spiked("run-b"))  # the live verdict is recorded
    for tr in trainers.values():
        tr.close()
    anomalies.close()

    today = runwatch_replay(kafka_bootstrap, topic_prefix, "--json")
    assert today.returncode == 0, today.stderr
    doc = json.loads(today.stdout)
    page = {
        "run_id": "run-b",
        "step": SPIKE_STEP,
        "kind": "loss_spike",
        "severity": "warning",
        "rank": None,
    }
    figures = {
        "runs": 3,
        "steps_judged": 3 * STEPS,
        "pages": 1,
        "pages_per_10k_steps": round(10_000 / (3 * STEPS), 3),
        "pages_by_kind": {"loss_spike": 1},
        "pages_per_10k_steps_by_kind": {"loss_spike": 133.333},
        "info_by_kind": {},
        "commands_by_action": {},
        "commands_per_run_by_action": {},
        "runs_paging": 1,
    }
    for side in ("proposed", "recorded"):
        got = doc[side]
        assert {k: got[k] for k in figures} == figures, (side, got)
        [top] = got["top_runs"]
        assert (top["run_id"], top["pages"], top["steps_judged"]) == ("run-b", 1, STEPS)
        [first] = top["first_pages"]
        assert {k: first[k] for k in page} == page
        assert "loss" in first["detail"]
    assert doc["differs"] is False and doc["overrides"] == {} and doc["notes"] == []

    proposed = runwatch_replay(kafka_bootstrap, topic_prefix, *QUIET, "--json")
    assert proposed.returncode == 0, proposed.stderr
    doc = json.loads(proposed.stdout)
    assert doc["differs"] is True
    assert doc["overrides"] == {"loss_z_thresh": "400", "loss_shift_h": "0"}
    assert (doc["proposed"]["pages"], doc["proposed"]["top_runs"]) == (0, [])
    assert doc["proposed"]["steps_judged"] == 3 * STEPS
    assert doc["recorded"]["pages_by_kind"] == {"loss_spike": 1}

    text = runwatch_replay(kafka_bootstrap, topic_prefix, *QUIET, "--runs", "2")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith(
        f"fleet calibration: 2 runs, {2 * STEPS} steps judged, "
        "settings loss_z_thresh=400 loss_shift_h=0"
    ), text.stdout
    assert "  pages (severity >= warning): 0 (0.00 per 10k steps) in 0 of 2 runs" in lines

    # the same history archived (the archive sink's writer, fed the broker's records)
    t = names(topic_prefix)
    roles = (t.runs, t.steps, t.heartbeats, t.checkpoints, t.anomalies, t.commands)
    sink = ArchiveSink(tmp_path / "archive")
    sink.handle(
        [r for records in read_history(kafka_bootstrap, roles).values() for r in records], 0
    )
    sink.flush()
    archived = runwatch_replay(
        kafka_bootstrap, topic_prefix, *QUIET, "--json", "--archive", str(tmp_path / "archive")
    )
    assert archived.returncode == 0, archived.stderr
    assert json.loads(archived.stdout) == doc

    # the web view: the fleet page links the endpoint, which answers the same document
    data = WebviewData(kafka_bootstrap, prefix=topic_prefix, app_id=f"{topic_prefix}-app")
    server = UiServer(data)
    server.start()
    try:
        with urllib.request.urlopen(server.url, timeout=30) as page:
            html = page.read().decode()
        assert "runwatch replay --all" in html and 'href="/api/calibration"' in html
        query = "api/calibration?set=loss_z_thresh=400&set=loss_shift_h=0"
        with urllib.request.urlopen(server.url + query, timeout=120) as answer:
            assert json.loads(answer.read()) == doc
        with pytest.raises(urllib.error.HTTPError) as bad:
            urllib.request.urlopen(server.url + "api/calibration?set=no_such_knob=1", timeout=60)
        assert bad.value.code == 400 and "no_such_knob" in json.loads(bad.value.read())["error"]
    finally:
        server.close()
    over, status = calibration_json(data, {}, max_runs=2)
    assert status == 422 and over["error"].startswith("3 runs in the log; the view calibrates")
    two, status = calibration_json(data, {"runs": ["2"]}, max_runs=2)
    assert status == 200 and two["proposed"]["runs"] == 2


def test_replay_all_says_when_an_archive_holds_no_inputs(tmp_path: Path) -> None:
    out = runwatch_replay("127.0.0.1:1", "p", "--archive", str(tmp_path))
    assert out.returncode == 1
    assert "holds no input records" in out.stderr
    missing = runwatch_replay("127.0.0.1:1", "p", "--archive", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "is not a directory" in missing.stderr
