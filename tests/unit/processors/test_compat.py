"""The internals of faust, aiokafka and mode the processors use are where the code expects.

`runwatch.processors.compat.INTERNALS` lists each private name runwatch calls, reads,
writes or overrides; these tests fail when the installed packages are not the pinned ones,
when pyproject.toml pins other versions, or when any listed internal moved (renamed, gone,
other parameters, no longer set by its class's constructor).
"""

from __future__ import annotations

import asyncio
import re
import tomllib
from pathlib import Path

import aiokafka
import pytest

from runwatch.processors import compat
from runwatch.processors.compat import PINS, Internal, InternalsMoved

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


def test_the_installed_packages_are_the_pinned_versions() -> None:
    assert compat.installed_versions() == dict(PINS)


def test_pyproject_pins_the_same_exact_versions() -> None:
    deps = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    pinned = {
        m.group(1): m.group(2) for d in deps if (m := re.fullmatch(r"([\w.-]+)==([\w.]+)", d))
    }
    assert {name: pinned.get(name) for name in PINS} == dict(PINS)


@pytest.mark.parametrize("internal", compat.INTERNALS, ids=lambda i: f"{i.owner}.{i.name}")
def test_every_internal_is_where_the_code_expects_it(internal: Internal) -> None:
    assert compat.problem(internal) is None


def test_check_names_what_moved() -> None:
    moved = [
        Internal("aiokafka.client.AIOKafkaClient", "_gone", "method", "test", ("self",)),
        Internal("aiokafka.client.AIOKafkaClient", "_metadata_update", "method", "test", ("x",)),
        Internal("faust.transport.consumer.Consumer", "_never_set", "attribute", "test"),
    ]
    problems = [compat.problem(i) for i in moved]
    assert problems[0] == "aiokafka.client.AIOKafkaClient._gone: missing"
    assert problems[1] is not None and "parameters" in problems[1]
    assert problems[2] == "faust.transport.consumer.Consumer._never_set: not set"
    compat.check()  # the real list holds


def test_the_consumer_settings_reach_a_real_aiokafka_consumer() -> None:
    async def build() -> aiokafka.AIOKafkaConsumer:
        return aiokafka.AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1")

    consumer = asyncio.run(build())  # built, never started: nothing connects
    compat.set_retry_backoff(consumer, 700)
    compat.set_fetch_max_wait(consumer, 40)
    assert consumer._retry_backoff_ms == 700
    assert compat.client_of(consumer)._retry_backoff == 0.7
    assert consumer._fetch_max_wait_ms == 40
    with pytest.raises(InternalsMoved, match="_fetch_max_wait_ms"):
        compat.set_fetch_max_wait(object(), 40)
