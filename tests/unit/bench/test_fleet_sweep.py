"""`bench/fleet.py --sweep`: the rates it takes and the CPU per event each rate adds."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import pytest

from .conftest import load_script

fleet = load_script("fleet")


def _point(offered: int, cores: float, rate: int | None = None) -> dict[str, Any]:
    asked = offered if rate is None else rate
    return {"rate": asked, "offered_events_per_s": offered, "cores": {"workers": cores}}


def test_marginal_is_the_cores_added_over_the_events_added() -> None:
    points = [_point(0, 0.1), _point(20_000, 0.26), _point(60_000, 0.48), _point(180_000, 0.96)]

    assert fleet.marginal(points) == [8.0, 5.5, 4.0]


@pytest.mark.parametrize(
    "points",
    [
        pytest.param([_point(50_000, 0.4), _point(50_000, 0.5)], id="generator-short"),
        pytest.param(
            [_point(179_685, 0.96, 180_000), _point(179_702, 0.98, 180_000)], id="rate-repeated"
        ),
    ],
)
def test_marginal_without_a_higher_rate_is_none(points: list[dict[str, Any]]) -> None:
    """No slope where no more was asked (a rate repeated to watch drift) or none came."""
    assert fleet.marginal(points) == [None]


@pytest.mark.parametrize(
    ("text", "rates"),
    [
        pytest.param("0,20000,180000", [0.0, 20_000.0, 180_000.0], id="with-idle"),
        pytest.param("1.5e5", [150_000.0], id="one"),
    ],
)
def test_rates_parse(text: str, rates: list[float]) -> None:
    assert fleet.rates(text) == rates


@pytest.mark.parametrize(
    ("text", "says"),
    [
        pytest.param("1,x", "comma-separated", id="not-a-number"),
        pytest.param("0,-5", "0 or more", id="negative"),
    ],
)
def test_rates_refuse(text: str, says: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=says):
        fleet.rates(text)


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        pytest.param("GC Thread#3", "GC Thread#", id="hash-numbered"),
        pytest.param("C2 CompilerThre", "C2 CompilerThre", id="cut-by-proc"),
        pytest.param("C1 CompilerThread0", "C1 CompilerThread", id="numbered"),
        pytest.param("kafka-1-raft-io", "kafka-1-raft-io", id="number-inside"),
        pytest.param("executor-Fetch", "executor-Fetch", id="no-number"),
        pytest.param("G1 Conc#0", "G1 Conc#", id="g1"),
        pytest.param("pool-12", "pool", id="dash-numbered"),
    ],
)
def test_thread_kind_drops_the_trailing_number(name: str, kind: str) -> None:
    assert fleet.thread_kind(name) == kind


def test_jvm_thread_cpu_counts_every_thread_of_a_real_process() -> None:
    """This process's threads by kind: no more than the process's own CPU (which also
    counts threads that ended), none negative; no process, nothing."""
    sum(i * i for i in range(200_000))  # some CPU of this thread to count
    kinds = fleet.jvm_thread_cpu(os.getpid())
    total_s = fleet.cpu_s(os.getpid())
    assert kinds and all(v >= 0 for v in kinds.values())
    assert 0 < sum(kinds.values()) <= total_s + 0.02
    assert fleet.jvm_thread_cpu(None) == {}


def test_states_written_are_the_window_s_stats_lines_write_kb(tmp_path: Path) -> None:
    """Only the lines stamped in the window count, from every worker's log; a line of no
    flush counts nothing."""

    def line(t: float, kb: float | None) -> str:
        body: dict[str, Any] = {"t": t}
        if kb is not None:
            body["write_kb"] = {"count": 1, "p50": kb, "p99": kb, "max": kb, "sum": kb}
        return f"[2026-12-05 12:00:00] INFO batch path stats: {json.dumps(body)}"

    one, two = tmp_path / "worker0.log", tmp_path / "worker1.log"
    one.write_text("\n".join([line(99.5, 4096), line(100.5, 1024), line(101.0, None)]) + "\n")
    two.write_text("\n".join([line(101.5, 2048), "an unrelated line", line(103.0, 4096)]) + "\n")

    assert fleet.states_written_mb([one, two], 100.0, 102.0) == pytest.approx(3 * 1024 * 1024 / 1e6)


@pytest.mark.parametrize(
    ("run", "window", "names"),
    [
        pytest.param(None, "", ["spy.worker0", "spy.worker1"], id="phase-3"),
        pytest.param(2, "", ["spy.run2.worker0", "spy.run2.worker1"], id="repeated"),
        pytest.param(None, "rate3", ["spy.rate3.worker0", "spy.rate3.worker1"], id="sweep"),
        pytest.param(1, "rate0", ["spy.run1.rate0.worker0", "spy.run1.rate0.worker1"], id="both"),
    ],
)
def test_spy_files_name_the_run_and_the_window(
    tmp_path: Path, run: int | None, window: str, names: list[str]
) -> None:
    files = fleet.spy_files(tmp_path / "spy", 2, run, window)

    assert [f.name for f in files] == names
    assert {f.parent for f in files} == {tmp_path}


def test_print_profile_orders_the_parts_and_prices_them(capsys: pytest.CaptureFixture[str]) -> None:
    fleet.print_profile({"decode": 0.25, "the fold": 0.75}, 4.0, "  ")

    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["the", "decode"]
    assert "3.00 us" in lines[0] and "75.0%" in lines[0]
    assert "1.00 us" in lines[1]


def test_print_profile_of_an_idle_window_gives_shares_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    fleet.print_profile({"other threads": 1.0}, None, "")

    out = capsys.readouterr().out
    assert "100.0%" in out and " us" not in out
