"""Verdict and command ids."""

from __future__ import annotations

import pytest

from runwatch.processors.core.verdicts import command_id, verdict_id

BASE = ("run", "loss_spike", 10, None, "abc")


def test_verdict_id_is_deterministic_hex() -> None:
    assert verdict_id(*BASE) == verdict_id(*BASE)
    assert len(verdict_id(*BASE)) == 20


@pytest.mark.parametrize(
    ("args", "kw"),
    [
        (("run2", "loss_spike", 10, None, "abc"), {}),
        (("run", "grad_norm_spike", 10, None, "abc"), {}),
        (("run", "loss_spike", 11, None, "abc"), {}),
        (("run", "loss_spike", 10, 0, "abc"), {}),
        (("run", "loss_spike", 10, None, "abd"), {}),
        (BASE, {"incarnation": 1}),
        (BASE, {"attempt": 1}),
    ],
)
def test_every_part_of_the_identity_matters(args: tuple, kw: dict) -> None:  # type: ignore[type-arg]
    assert verdict_id(*args, **kw) != verdict_id(*BASE)


def test_command_id() -> None:
    a = command_id("run", 0, "respawn", "v1")
    assert a == command_id("run", 0, "respawn", "v1")
    assert a != command_id("run", 1, "respawn", "v1")
    assert a != command_id("run", 0, "rollback", "v1")
