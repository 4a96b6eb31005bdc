from __future__ import annotations

import pytest

from runwatch.sinks.consumer import commit_offsets


@pytest.mark.parametrize(
    ("positions", "pending", "expected"),
    [
        ({("t", 0): 10}, {}, {("t", 0): 10}),
        ({("t", 0): 10}, {("t", 0): 4}, {("t", 0): 4}),
        ({("t", 0): 10, ("t", 1): 3}, {("t", 1): 2, ("u", 0): 1}, {("t", 0): 10, ("t", 1): 2}),
    ],
)
def test_commit_never_passes_pending_work(positions, pending, expected):
    assert commit_offsets(positions, pending) == expected
