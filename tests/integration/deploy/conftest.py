"""The compose tests run only when asked for (``-m deploy``, ``make test-deploy``).

They build images (minutes on a cold machine) and start the whole stack, so `make test`
leaves them out even where a Docker engine answers.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "deploy" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="compose stack test: run it with `make test-deploy` (-m deploy)")
    for item in items:
        if item.get_closest_marker("deploy"):
            item.add_marker(skip)
