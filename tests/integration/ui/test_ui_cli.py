"""`runwatch ui`'s edges: a taken port or a bad one is one line and a non-zero exit."""

from __future__ import annotations

import socket
import subprocess
import sys


def _ui(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runwatch.cli", "ui", "--bootstrap", "127.0.0.1:1", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_taken_port_is_one_line_before_kafka_is_touched():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _ui("--port", str(port))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"runwatch ui: cannot serve on 127.0.0.1:{port}: Address already in use"
    ]
    assert "Traceback" not in result.stderr


def test_a_port_out_of_range_is_a_usage_error():
    result = _ui("--port", "70000")
    assert result.returncode == 2
    assert result.stderr.strip() == "runwatch ui: --port must be between 0 and 65535, got 70000"
