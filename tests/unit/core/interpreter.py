"""A fresh interpreter at the repository's root, for what must not share this process.

Three kinds of test need one: the compiled core against its pure copy (`test_native`: the
choice is made once per process), a count that patches functions a compiled group calls
directly (`test_rank_table`), and a replay under other hash seeds (`test_properties`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def run_python(argv: Sequence[str], env: Mapping[str, str], timeout_s: float = 240.0) -> str:
    """Standard output of ``python ARGV`` run from the root with ``env`` over this one's.

    Raises:
        subprocess.CalledProcessError: It exited non-zero (its stderr is on the error).
    """
    merged = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        env=merged,
        capture_output=True,
        text=True,
        check=True,
        timeout=timeout_s,
    ).stdout
