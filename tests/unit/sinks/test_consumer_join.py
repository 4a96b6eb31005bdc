from __future__ import annotations

import pytest

from runwatch.sinks.consumer import join_stalled

LIMIT_S = 30.0


@pytest.mark.parametrize(
    ("pending_since_s", "now_s", "stalled"),
    [
        pytest.param(None, 1_000.0, False, id="the-last-join-ended"),
        pytest.param(100.0, 110.0, False, id="waiting-for-a-dead-member's-session"),
        pytest.param(100.0, 129.9, False, id="just-under-the-limit"),
        pytest.param(100.0, 130.0, True, id="at-the-limit-the-assignment-was-dropped"),
    ],
)
def test_a_join_is_stalled_only_past_the_limit(pending_since_s, now_s, stalled):
    assert join_stalled(pending_since_s, now_s, LIMIT_S) is stalled
