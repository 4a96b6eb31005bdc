"""`runwatch processors --store`: a store it does not know is one line and exit status 2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    ("args", "env"),
    [(["--store", "redis"], {}), ([], {"RUNWATCH_STORE": "redis"})],
    ids=["flag", "env"],
)
def test_unknown_store_is_a_usage_error(args: list[str], env: dict[str, str]) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "runwatch.cli", "processors", "--bootstrap", "127.0.0.1:1", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
    )
    assert out.returncode == 2
    lines = (out.stdout + out.stderr).strip().splitlines()
    assert lines == ["runwatch processors: --store expects one of memory, rocksdb, got 'redis'"]
