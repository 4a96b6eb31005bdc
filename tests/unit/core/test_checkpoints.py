"""Checkpoint catalogue and latest_checkpoint."""

from __future__ import annotations

import pytest

from runwatch.processors.core.checkpoints import fold_checkpoint, latest_checkpoint
from runwatch.schemas.events import CheckpointCommitted, CheckpointFailed
from tests.unit.core.factories import src


def ok(step: int, path: str | None = None) -> CheckpointCommitted:
    return CheckpointCommitted(run_id="r", ts_ns=step, step=step, path=path or f"/ck/{step}")


def bad(step: int, path: str | None = None) -> CheckpointFailed:
    return CheckpointFailed(
        run_id="r", ts_ns=step, step=step, path=path or f"/ck/{step}", reason="disk full"
    )


LOG = [ok(100), ok(200), bad(300), ok(400), ok(500), bad(500)]


@pytest.mark.parametrize(
    ("events", "max_step", "expected"),
    [
        pytest.param(LOG, None, 400, id="latest-skips-withdrawn-500"),
        pytest.param(LOG, 399, 200, id="at-or-before"),
        pytest.param(LOG, 400, 400, id="inclusive"),
        pytest.param(LOG, 99, None, id="none-before"),
        pytest.param([], None, None, id="empty"),
        pytest.param([ok(100), bad(100, "/other")], None, 100, id="failure-elsewhere"),
        pytest.param([ok(100), bad(100), ok(100)], None, 100, id="recommitted"),
    ],
)
def test_latest_checkpoint(events: list, max_step: int | None, expected: int | None) -> None:  # type: ignore[type-arg]
    found = latest_checkpoint(events, max_step)
    assert (found.step if found else None) == expected
    cat = None
    for i, e in enumerate(events):
        cat = fold_checkpoint(cat, e, src(i))
    if cat is not None:
        info = cat.latest(max_step)
        assert (info.step if info else None) == expected


def test_catalogue_keeps_last_failure_and_skips_old_offsets() -> None:
    cat = None
    for i, e in enumerate(LOG):
        cat = fold_checkpoint(cat, e, src(i))
    assert cat is not None
    assert [c.step for c in cat.committed] == [100, 200, 400]
    assert cat.failures == 2 and cat.last_failure is not None and cat.last_failure.step == 500
    assert fold_checkpoint(cat, ok(900), src(3)) is cat
