"""`runwatch processors --store`: a value it does not know is one line and exit 2.

It is read from its flag, else its environment variable (`RUNWATCH_STORE`); both ways are
checked.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CASES = [
    (
        "--store",
        "RUNWATCH_STORE",
        "redis",
        {
            "flag": "--store expects one of memory, rocksdb, got 'redis'",
            "env": "RUNWATCH_STORE='redis' must be one of memory, rocksdb",
        },
    ),
]


@pytest.mark.parametrize("via", ["flag", "env"])
@pytest.mark.parametrize(("option", "env_name", "bad", "message"), CASES, ids=["store"])
def test_an_unknown_value_is_a_usage_error(
    option: str, env_name: str, bad: str, message: dict[str, str], via: str
) -> None:
    args = [option, bad] if via == "flag" else []
    env = {env_name: bad} if via == "env" else {}
    out = subprocess.run(
        [sys.executable, "-m", "runwatch.cli", "processors", "--bootstrap", "127.0.0.1:1", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
    )
    assert out.returncode == 2
    lines = (out.stdout + out.stderr).strip().splitlines()
    assert lines == [f"runwatch processors: {message[via]}"]
