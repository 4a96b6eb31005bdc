"""Fixtures of the sink integration tests: the real Alertmanager."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.sinks.alertmanager import RealAlertmanager


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[RealAlertmanager]:
    """A started Alertmanager on a free loopback port (skipped when not installed)."""
    workdir = tmp_path / "alertmanager"
    workdir.mkdir()
    am = RealAlertmanager(workdir)
    am.start()
    try:
        yield am
    finally:
        am.stop()
