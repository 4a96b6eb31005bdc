"""Offsets acknowledged and not committed yet, per partition, as ranges of offsets.

faust tracks an acknowledged offset as one int in a list and an index set, and at every
commit sorts the list and walks it offset by offset (``consecutive_numbers``: a Python
lambda per offset) to find the end of its first run: ~0.2 us a record of the batch path,
whose rounds are acknowledged whole (`processors.engine.BatchIngest`). `AckedRanges` keeps
each partition's acknowledged offsets as merged ``[first, last]`` ranges instead, and
answers faust's question (`next_commit`) in the number of ranges, not of offsets. The
engine's consumer asks it in place of faust's ``Consumer._new_offset`` for the partitions
it holds ranges of.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field


@dataclass
class AckedRanges:
    """Per partition, the acknowledged offsets not committed yet, merged and sorted.

    Attributes:
        by_tp: Partition -> its ranges ``[first, last]`` (inclusive), sorted, disjoint and
            never adjacent (two ranges that touch are one).
    """

    by_tp: dict[Hashable, list[tuple[int, int]]] = field(default_factory=dict)

    def add(self, tp: Hashable, first: int, last: int) -> None:
        """Note offsets ``first..last`` of ``tp`` acknowledged (nothing when first > last)."""
        if first > last:
            return
        ranges = self.by_tp.setdefault(tp, [])
        if not ranges or ranges[-1][1] + 1 < first:  # the common case: after every range
            ranges.append((first, last))
            return
        if ranges[-1][1] + 1 == first:  # the next round of the same partition
            ranges[-1] = (ranges[-1][0], last)
            return
        merged: list[tuple[int, int]] = []
        for lo, hi in sorted([*ranges, (first, last)]):
            if merged and lo <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
            else:
                merged.append((lo, hi))
        ranges[:] = merged

    def holds(self, tp: Hashable) -> bool:
        """Whether offsets of ``tp`` were ever noted here (and not forgotten)."""
        return tp in self.by_tp

    def next_commit(self, tp: Hashable, committed: int | None) -> int | None:
        """The offset to commit for ``tp`` now, taking its first run; faust's rule.

        Rules, in order (faust 0.15.3's ``Consumer._new_offset`` on a list of offsets):
            1. No acknowledged offset: None.
            2. A commit exists (faust reads a committed offset of 0 as none) and the
               lowest acknowledged offset is more than one past it: None (the offsets
               between are not acknowledged yet).
            3. Otherwise the end of the first run of consecutive acknowledged offsets,
               plus one; the run is taken (the next call starts after it).

        One difference, on purpose: an offset acknowledged twice counts once (faust's
        list would keep both and end the run at the first of the two).

        Args:
            tp: The partition.
            committed: The offset faust holds as committed for it (None: no commit).

        Returns:
            The offset to commit, or None.
        """
        ranges = self.by_tp.get(tp)
        if not ranges:
            return None
        first, last = ranges[0]
        if committed and first - committed > 1:
            return None
        del ranges[0]
        return last + 1

    def forget(self, tps: Iterable[Hashable]) -> None:
        """Drop every range of ``tps`` (revoked: their offsets are another worker's now)."""
        for tp in tps:
            self.by_tp.pop(tp, None)
