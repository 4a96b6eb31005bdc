"""Fixtures: the compose file parsed raw and interpolated with compose/.env.example."""

from __future__ import annotations

from typing import Any

import pytest

from .support import COMPOSE_FILE, ENV_EXAMPLE, interpolate_tree, parse_env_file


@pytest.fixture(scope="session")
def env_example() -> dict[str, str]:
    """compose/.env.example as a dict."""
    return parse_env_file(ENV_EXAMPLE)


@pytest.fixture(scope="session")
def raw_compose() -> dict[str, Any]:
    """docker-compose.yml as YAML (anchors merged), before variable interpolation."""
    yaml = pytest.importorskip("yaml", reason="pyyaml (dev extra) reads the compose files")
    doc = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(doc, dict)
    return doc


@pytest.fixture(scope="session")
def compose(raw_compose: dict[str, Any], env_example: dict[str, str]) -> dict[str, Any]:
    """docker-compose.yml interpolated with the values of .env.example."""
    return interpolate_tree(raw_compose, env_example)


@pytest.fixture(scope="session")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The compose services by name."""
    return compose["services"]
