"""Run the real `runwatch` command line in a subprocess, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TIMEOUT_S = 120.0
"""Generous for a loaded machine; an unfixed command waits on its client far longer."""


def runwatch(
    *args: str, env: Mapping[str, str] | None = None, timeout_s: float = TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """``python -m runwatch.cli ARGS`` with stdout and stderr captured (not a terminal)."""
    return subprocess.run(
        [sys.executable, "-m", "runwatch.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ if env is None else env),
        stdin=subprocess.DEVNULL,
        timeout=timeout_s,
        check=False,
    )


def env_without_broker(tmp_path: Path, **extra: str) -> dict[str, str]:
    """Our environment with no broker configured and a private RUNWATCH_HOME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNWATCH_")}
    env["RUNWATCH_HOME"] = str(tmp_path / "home")
    env.update(extra)
    return env
