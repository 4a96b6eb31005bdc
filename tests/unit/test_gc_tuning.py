"""`common.gc_tuning`: what a worker or an audit sets on CPython's collector at start-up.

In a process of its own: freezing and thresholds are process-wide, and the test process's
own collector must stay as it is.
"""

from __future__ import annotations

import json
import subprocess
import sys

from runwatch.common.gc_tuning import OLDER_EVERY, YOUNG_THRESHOLD

PROBE = """
import gc, json
from runwatch.common.gc_tuning import tune_for_throughput
before = gc.get_freeze_count()
tune_for_throughput()
garbage = []
garbage.append(garbage)  # a cycle made after start-up: still collected
del garbage
print(json.dumps({"before": before, "frozen": gc.get_freeze_count(),
                  "threshold": gc.get_threshold(), "collected": gc.collect()}))
"""


def test_it_freezes_start_up_and_makes_collections_rarer_without_stopping_them() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    got = json.loads(out.stdout)
    assert got["before"] == 0 and got["frozen"] > 1000  # modules and all made at start-up
    assert got["threshold"] == [YOUNG_THRESHOLD, OLDER_EVERY, OLDER_EVERY]
    assert got["collected"] >= 1  # cyclic garbage made later is still found
