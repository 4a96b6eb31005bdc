"""Elastic decisions: who caused a failure, and when the gang shrinks."""

from __future__ import annotations

import pytest

from runwatch.controller.elastic import RankExit, count_failures, culprits, next_world_size


@pytest.mark.parametrize(
    ("exits", "expected"),
    [
        ([], ()),
        ([RankExit(0, 0, 1.0), RankExit(1, 0, 1.0)], ()),
        ([RankExit(0, 1, 1.0), RankExit(1, -9, 1.0)], (1,)),  # SIGKILLed child, peer exit 1
        ([RankExit(0, 1, 1.0), RankExit(1, 137, 1.2)], (1,)),  # killed under a shell: 128+9
        ([RankExit(0, 1, 5.0), RankExit(1, 1, 1.0)], (1,)),  # no signal: first to exit
        ([RankExit(0, 1, 1.0), RankExit(1, 1, 1.3)], (0, 1)),  # within the window: both
        ([RankExit(0, None, 1.0), RankExit(1, 0, 1.0)], (0,)),  # unknown status is abnormal
        ([RankExit(0, -9, 1.0), RankExit(1, -15, 1.0)], (0, 1)),
    ],
)
def test_culprits(exits, expected):
    assert culprits(exits) == expected


def test_count_failures_pads_and_truncates():
    assert count_failures((), (1,), 2) == (0, 1)
    assert count_failures((0, 2), (1,), 2) == (0, 3)
    assert count_failures((1, 1, 1), (0, 5), 2) == (2, 1)


@pytest.mark.parametrize(
    ("ws", "counts", "budget", "min_nproc", "requested", "expected_ws", "expected_counts"),
    [
        (2, (0, 2), 2, 1, None, 2, (0, 2)),  # at the budget: keep
        (2, (0, 3), 2, 1, None, 1, (0,)),  # past it: shrink, counts start over
        (4, (3, 0, 0, 0), 2, 1, None, 3, (0, 0, 0)),
        (2, (0, 3), 2, 2, None, 2, (0, 3)),  # never below --min-nproc
        (1, (5,), 2, 1, None, 1, (5,)),  # never below 1
        (2, (0, 1), 0, 1, None, 1, (0,)),  # budget 0: the first failure shrinks
        (2, (0, 3), 2, 1, 2, 2, (0, 3)),  # the command's size equals the current one
        (2, (0, 0), 2, 1, 3, 3, (0, 0, 0)),  # the command asks for another size
    ],
)
def test_next_world_size(ws, counts, budget, min_nproc, requested, expected_ws, expected_counts):
    d = next_world_size(ws, counts, budget=budget, min_nproc=min_nproc, requested=requested)
    assert (d.world_size, d.counts) == (expected_ws, expected_counts)
    assert bool(d.reason) == (expected_ws != ws)
