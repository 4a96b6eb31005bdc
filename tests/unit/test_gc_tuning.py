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


ROUNDS_PROBE = """
import gc, json, weakref
from runwatch.common.gc_tuning import OLDER_EVERY, YOUNG_MIN, collect_between_rounds, tune_for_rounds

out = {"enabled_first": collect_between_rounds()}  # rule 1: the interpreter collects itself
tune_for_rounds()
out["disabled"] = not gc.isenabled()
gc.collect()  # a clean start for the counts below (an explicit collection still runs)


class Node:
    pass


def cycle():
    node = Node()
    node.me = node  # garbage only a collection frees
    return weakref.ref(node)


ref = cycle()
keep = [[] for _ in range(10)]  # a few allocations: under YOUNG_MIN
out["quiet"] = collect_between_rounds()  # rule 5
out["cycle_alive_without_collection"] = ref() is not None
keep = [[] for _ in range(YOUNG_MIN)]
out["young"] = collect_between_rounds()  # rule 4
out["cycle_freed"] = ref() is None
gens = []
for _ in range((OLDER_EVERY + 1) ** 2):
    keep.append([[] for _ in range(YOUNG_MIN)])
    gens.append(collect_between_rounds())
out["middle_at"] = gens.index(1)
out["full_at"] = gens.index(2)
print(json.dumps(out))
"""


def test_collections_run_only_between_rounds_in_cpythons_proportions() -> None:
    out = subprocess.run(
        [sys.executable, "-c", ROUNDS_PROBE], capture_output=True, text=True, check=True,
        timeout=60,
    )  # fmt: skip
    got = json.loads(out.stdout)
    assert got["enabled_first"] is None  # rule 1
    assert got["disabled"]
    assert got["quiet"] is None and got["cycle_alive_without_collection"]  # rule 5: no sweep
    assert got["young"] == 0 and got["cycle_freed"]  # rule 4
    assert got["middle_at"] == OLDER_EVERY  # rule 3: after OLDER_EVERY young ones
    assert got["full_at"] == OLDER_EVERY * (OLDER_EVERY + 1)  # rule 2: after OLDER_EVERY middle
