"""A non-Python client reads runwatch's wire format: kcat (librdkafka) consumes a topic."""

from __future__ import annotations

import json
import math
import shutil
import subprocess

import pytest

from runwatch.producers import RunEmitter
from runwatch.schemas.topics import names

pytestmark = pytest.mark.integration


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed (make tools)")
def test_kcat_reads_every_field_and_the_nan(kafka_bootstrap, topic_prefix, make_topics):
    make_topics(topic_prefix, partitions=2)
    with RunEmitter("run-kcat", bootstrap=kafka_bootstrap, topic_prefix=topic_prefix) as emitter:
        emitter.step(7, loss=2.5, step_time_s=0.25, grad_norm=1.5, tokens=4096, lr=3e-4)
        emitter.step(8, loss=math.nan, step_time_s=0.25, grad_norm=math.inf)
        assert emitter.flush(30.0)
    out = subprocess.run(
        [
            "kcat",
            "-C",
            "-b",
            kafka_bootstrap,
            "-t",
            names(topic_prefix).steps,
            "-e",
            "-q",
            "-f",
            "%k\t%s\n",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    rows = [line.split("\t", 1) for line in out.splitlines() if line]
    assert [key for key, _ in rows] == ["run-kcat", "run-kcat"]
    first, second = (json.loads(value) for _, value in rows)
    assert first["type"] == "step.v1"
    assert (first["run_id"], first["step"], first["loss"], first["grad_norm"]) == (
        "run-kcat",
        7,
        2.5,
        1.5,
    )
    assert (first["tokens"], first["lr"], first["step_time_s"]) == (4096, 3e-4, 0.25)
    assert isinstance(first["ts_ns"], int) and first["ts_ns"] > 0
    # JSON has no NaN: the codec writes the tokens a JSON reader can parse and recognise
    assert (second["loss"], second["grad_norm"]) == ("NaN", "Infinity")
