"""The rendezvous port: free now, and outside the range outgoing connections are given."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from runwatch.controller import gang
from runwatch.controller.gang import RENDEZVOUS_PORT_FLOOR, ephemeral_ports, free_port


def _binds(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
        return True


def test_a_port_below_the_ephemeral_range_that_binds() -> None:
    ports = [free_port(range(32768, 61000)) for _ in range(20)]
    assert all(RENDEZVOUS_PORT_FLOOR <= p < 32768 for p in ports), ports
    assert all(_binds(p) for p in ports)


def test_a_taken_port_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        draws = iter([busy, busy, 23_456 if _binds(23_456) else 23_457])
        monkeypatch.setattr(gang.random, "randrange", lambda *_: next(draws))
        port = free_port(range(busy + 1, 61_000))
    assert port != busy and port in (23_456, 23_457)


@pytest.mark.parametrize(
    "ephemeral",
    [
        pytest.param(range(10_500, 61_000), id="no-room-below"),
        pytest.param(range(1024, 2048), id="low"),
    ],
)
def test_a_range_with_no_room_below_falls_back_to_the_kernels_pick(ephemeral: range) -> None:
    port = free_port(ephemeral)
    assert _binds(port)
    assert port in ephemeral_ports(), port  # the kernel's own pick, from its range


def test_every_draw_taken_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        monkeypatch.setattr(gang.random, "randrange", lambda *_: busy)
        port = free_port(range(40_000, 61_000), tries=3)
    assert port != busy


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("32768\t60999\n", range(32768, 61000), id="linux-default"),
        pytest.param("15000 25000\n", range(15000, 25001), id="narrowed"),
        pytest.param("garbage\n", range(32768, 61000), id="unparsable"),
    ],
)
def test_the_ephemeral_range_is_read_from_the_kernel(
    tmp_path: Path, text: str, expected: range
) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text(text)
    assert ephemeral_ports(path) == expected
    assert ephemeral_ports(tmp_path / "missing") == range(32768, 61000)


def test_draws_are_spread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gang, "random", random.Random(7))
    assert len({free_port(range(32768, 61000)) for _ in range(50)}) > 40
