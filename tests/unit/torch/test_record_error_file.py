"""torch's own ``@record`` writes an error file the agent reads as the rank's root cause."""

from __future__ import annotations

import os
import subprocess
import sys

from runwatch.controller.error_file import read_root_cause

SCRIPT = """
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    raise ValueError("batch 7 has no tokens")

main()
"""


def test_a_recorded_exception_is_the_root_cause(tmp_path):
    path = tmp_path / "errors" / "inc0.rank1.json"
    path.parent.mkdir()
    env = dict(os.environ, TORCHELASTIC_ERROR_FILE=str(path))
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1, done.stderr  # @record re-raises: the rank still fails
    assert read_root_cause(path) == "ValueError: batch 7 has no tokens"
