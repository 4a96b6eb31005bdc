"""The web view's browser tests share one headless Chromium per test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .browser import MISSING, chrome


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless Chromium driven by selenium, quit after the test (skipped without one)."""
    if MISSING:
        pytest.skip(MISSING)
    driver = chrome()
    try:
        yield driver
    finally:
        driver.quit()
