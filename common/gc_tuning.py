"""CPython's cyclic garbage collector, set for processes that fold millions of events.

Why: a worker allocates several objects per event (records, decoded events, provenances,
verdict candidates), nearly all freed by reference counting within the round. CPython's
defaults (a young-generation collection every 700 net allocations, an older one every 10 of
those) still ran a collection every ~70 heartbeats, promoted whatever the round in flight
held to the older generations, and so kept triggering full collections, each walking every
object of the process: faust, aiokafka, the tables. Measured (`bench/latency.py`, one
worker, the same box, alternated run by run): with the settings below the worker drained
158k-159k events/s at 3.9-4.2 µs CPU per event, against 112k-135k at 6.3-7.1 µs without,
and at 80 % of that larger capacity its p99 was 106 and 235 ms (without, at 80 % of the
smaller one: 563 ms and 1.14 s). The audit's replay of a 210k-record run gains the same way
(`bench/audit.py`).

What it does: `gc.freeze` moves everything alive at start-up (modules, the app) out of the
collector's view for good, and the thresholds make young collections 28x rarer and older
ones rarer still. Only cyclic garbage waits longer for its collection (ours has next to
none: states and events are acyclic); everything else is freed by reference counting as
before. Call it once, after start-up, in a long-lived or bulk process; stdlib only.

A processor worker goes one step further (`tune_for_rounds`, `collect_between_rounds`):
its collections run between its rounds, never in the middle of one. With the thresholds
above, a paced load at 80 % of the worker's capacity still ran 15 young collections a
second, each walking what the round in flight held (the fetched records, the decoded
packs, the round's lists: 2-22 ms each) and every 15th an older one (up to 36 ms): 7 % of
the main thread, and every pause a backlog the next rounds worked off. Between two rounds
that round's objects are already freed by reference counting, so a collection there walks
only what outlives it (the next fetch, new states). Alternated on the same box
(`bench/latency.py`, docs/processors.md): collections over 2 ms took 1.5-2.3 % of the load
window against 7 %, the longest 10-20 ms against 22-36 ms. (The loaded p99 of that one pair
of runs each, 158 / 158 ms against 268 / 504 ms, did not hold in later ten-run series,
where the box's own variation was larger: docs/processors.md.)
"""

from __future__ import annotations

import gc
from typing import Final

YOUNG_THRESHOLD: Final = 20_000
"""Net allocations between two young-generation collections (CPython: 700)."""
OLDER_EVERY: Final = 20
"""Collections of one generation between two of the next (CPython: 10)."""


def tune_for_throughput() -> None:
    """Freeze what exists now and make collections rarer (see the module docstring)."""
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, OLDER_EVERY, OLDER_EVERY)


YOUNG_MIN: Final = YOUNG_THRESHOLD
"""Net allocations below which `collect_between_rounds` leaves the young generation be: the
interpreter's own threshold under `tune_for_throughput`. It was 1,000 (enough to skip an
idle worker's quiet fetches, a few hundred objects each), and then a paced round almost
always passed it: a round ends with a thousand or more young objects still alive (the
states it made, what holds them until the flush, the next fetch), most of which the next
rounds free by reference counting anyway, and each collection walked them. Two workers of
`bench/fleet.py` at 140k events/s ran 235-355 young collections in 20 s each (after 60 % of
their rounds), 3-4 % of their wall clock and ~7 % of their CPU by py-spy; at 20,000, 0-1
(docs/processors.md)."""


def tune_for_rounds() -> None:
    """Freeze what exists now and turn automatic collection off for good.

    From then on nothing is collected unless the process calls `collect_between_rounds`
    (reference counting frees everything acyclic as before): call that after every round
    and every quiet fetch, or cyclic garbage is never freed.
    """
    gc.freeze()
    gc.disable()


def collect_between_rounds() -> int | None:
    """Run the collection due now, as CPython would have, if automatic collection is off.

    Rules, in order:

    1. Automatic collection is on (no `tune_for_rounds`: a test, a tool): nothing; the
       interpreter collects by itself.
    2. `OLDER_EVERY` collections of the middle generation since the last full one: a full
       collection.
    3. `OLDER_EVERY` young collections since the last of the middle generation: the middle
       generation (and the young one).
    4. `YOUNG_MIN` net allocations since the last collection: the young generation.
    5. Otherwise nothing.

    Returns:
        The generation collected, or None.
    """
    if gc.isenabled():
        return None
    young, middle, old = gc.get_count()
    generation = 2 if old >= OLDER_EVERY else 1 if middle >= OLDER_EVERY else 0
    if generation == 0 and young < YOUNG_MIN:
        return None
    gc.collect(generation)
    return generation
