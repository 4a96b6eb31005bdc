"""`runwatch replay --report` over a real broker: the fleet calibration report.

Two runs are written to the topics as their trainers would (no processors needed: the
report replays the inputs): a healthy one and one with a NaN loss and a large loss spike.
The report, a `runwatch replay` subprocess as a user runs it, counts their steps, pages and
commands, lists the pages by run and step, and with ``--shadow`` shows the command the
NaN would cause as shadow instead.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .harness import Trainer

pytestmark = pytest.mark.integration


def report(bootstrap: str, prefix: str, *args: str) -> dict:  # type: ignore[type-arg]
    out = subprocess.run(
        [
            *(sys.executable, "-m", "runwatch.cli", "replay", "--report", "--json"),
            *("--bootstrap", bootstrap, "--prefix", prefix, *args),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, (out.stdout, out.stderr)
    return json.loads(out.stdout)


def test_the_fleet_report_counts_what_each_run_would_page_and_command(
    kafka_bootstrap, topic_prefix, make_topics
):
    make_topics(topic_prefix, partitions=2)
    for run, bad in (("fleet-healthy", {}), ("fleet-broken", {40: float("nan"), 60: 8.0})):
        trainer = Trainer(kafka_bootstrap, topic_prefix, run)
        trainer.start(0)
        for s in range(1, 81):
            trainer.step(s, loss=bad.get(s))
        trainer.end("completed")
        trainer.close()

    got = report(kafka_bootstrap, topic_prefix)
    runs = {r["run_id"]: r for r in got["runs"]}
    assert set(runs) == {"fleet-healthy", "fleet-broken"} and got["steps"] == 160
    assert (runs["fleet-healthy"]["pages"], runs["fleet-healthy"]["commands"]) == (0, 0)
    assert (runs["fleet-broken"]["pages"], runs["fleet-broken"]["commands"]) == (2, 1)
    assert [(p["run_id"], p["step"], p["kind"]) for p in got["pages"]] == [
        ("fleet-broken", 40, "nonfinite_loss"),
        ("fleet-broken", 60, "loss_spike"),
    ]

    shadow = report(kafka_bootstrap, topic_prefix, "--shadow", "nonfinite_loss")
    (broken,) = [r for r in shadow["runs"] if r["run_id"] == "fleet-broken"]
    assert (broken["commands"], broken["shadow_commands"]) == (0, 1)
    assert shadow["config_hash"] != got["config_hash"]
