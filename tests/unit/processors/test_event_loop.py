"""`processors.event_loop.install`: which loop a worker's process makes, by its rules.

Each test makes a real loop through the policy `install` leaves (asyncio's, or uvloop's
from the installed wheel) and puts the process's policy back afterwards.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import Iterator

import pytest
import uvloop

from runwatch.processors.event_loop import install


@pytest.fixture(autouse=True)
def _policy_restored() -> Iterator[None]:
    before = asyncio.get_event_loop_policy()
    yield
    asyncio.set_event_loop_policy(before)


def _new_loop_type() -> type:
    loop = asyncio.new_event_loop()
    try:
        return type(loop)
    finally:
        loop.close()


def test_rule_1_asyncio_leaves_the_standard_loop() -> None:
    asyncio.set_event_loop_policy(None)
    assert install("asyncio") == "asyncio"
    assert not issubclass(_new_loop_type(), uvloop.Loop)


def test_rule_2_uvloop_makes_every_new_loop_uvloop_s() -> None:
    asyncio.set_event_loop_policy(None)
    assert install("uvloop") == "uvloop"
    assert issubclass(_new_loop_type(), uvloop.Loop)


def test_a_loop_made_in_another_thread_is_uvloop_s_too() -> None:
    """faust's consumer thread makes its own loop after start-up (mode's ServiceThread)."""
    asyncio.set_event_loop_policy(None)
    install("uvloop")
    made: list[type] = []
    thread = threading.Thread(target=lambda: made.append(_new_loop_type()))
    thread.start()
    thread.join()
    assert made and issubclass(made[0], uvloop.Loop)


def test_rule_3_uvloop_missing_runs_the_standard_loop_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    asyncio.set_event_loop_policy(None)
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` raises ImportError
    with caplog.at_level(logging.WARNING, logger="runwatch.processors.event_loop"):
        assert install("uvloop") == "asyncio"
    assert not issubclass(_new_loop_type(), uvloop.Loop)
    assert "uvloop does not import" in caplog.text
