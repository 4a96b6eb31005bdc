"""Warm spares for replica groups: a restarted group starts in a spare, torchft imported.

Real processes, gloo on CPU, torchft 0.2.0 and its Lighthouse: two replica groups of one
rank of `examples/train_ft.py` under `controller.torchft_launcher.TorchFTLauncher` with the
pool ``runwatch launch --warm-spares`` gives it (`group_spares`: one group's worth,
preloading torch, torchft and the script's imports). Once the spare is preloaded, group
1's rank is SIGKILLed and group 1 restarted alone: its rank runs in the spare (the spare's
pid, its exit file behind the rank's), heals from group 0 and rejoins the quorum; group 0
keeps its pid; the run ends with equal weights and no spare left behind.

Waiting is a read of the ranks' output or of the spare's ready file with a deadline,
never a sleep.

Kill -> rejoined, cold against warm, is measured by running this file (the launcher
alone: the controller's detection, 0.1-0.2 s through Kafka, is not in it; the restart
starts when the launcher sees the exit)::

    PYTHONPATH=$PWD .venv/bin/python tests/integration/controller/test_fault_tolerance_spares.py \\
        --runs 3

It alternates cold and warm runs and prints, per mode, each run's seconds from the
SIGKILL to the restarted rank's first step line in the quorum of both groups (and to its
first line at all), the worst and the median, then one JSON line.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from runwatch.controller.launcher import RUNNING, WHOLE_NODE, Incarnation, Scope
from runwatch.controller.spares import SparePool
from runwatch.controller.state import ControllerState, LaunchSpec, WarmSparesSpec
from runwatch.controller.topology import NodeTopology, RunBinding

if importlib.util.find_spec("torchft") is None:  # the `ft` extra
    pytest.skip("torchft is not installed (the ft extra)", allow_module_level=True)

from runwatch.controller.torchft_compat import (
    LighthouseProcess,
    LighthouseSettings,
    start_lighthouse,
)
from runwatch.controller.torchft_launcher import (
    FT_PRELOAD,
    ReplicaLayout,
    TorchFTLauncher,
    group_spares,
)
from tests.integration.controller.test_fault_tolerance import python_child, steps

pytestmark = [pytest.mark.torch]

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "examples" / "train_ft.py"
WAIT_S = 150.0


def _wait(
    what: str,
    check: Callable[[], bool],
    timeout_s: float = WAIT_S,
    tick: Callable[[float], None] | None = None,
) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if tick is not None:
            tick(time.monotonic())  # the launcher's refill of its spares
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)  # polling the ranks' output and ready files, the event itself


@dataclass(frozen=True)
class Restart:
    """What one group restart showed.

    Attributes:
        warm: Ranks the restart started in spares.
        first_line_s: SIGKILL -> the restarted rank's first line in its log.
        rejoined_s: SIGKILL -> its first step in the quorum of both groups.
        survivor_kept: Group 0's pid was the same after the restart.
        spare_pid: The spare's pid the restarted rank runs in (0: started cold).
        rank_pid: The restarted rank's pid.
        sums: Both groups' final (step, checksum).
        spares_left: Spare processes still alive after the launcher closed.
    """

    warm: int
    first_line_s: float
    rejoined_s: float
    survivor_kept: bool
    spare_pid: int
    rank_pid: int
    sums: tuple[list[str], list[str]]
    spares_left: int


def restart_group_1(root: Path, lighthouse: LighthouseProcess, *, warm: bool) -> Restart:
    """Two groups stepping; SIGKILL group 1's rank; restart it alone; run to the end."""
    stop_file, sums = root / "stop", root / "sums"
    spec = LaunchSpec(
        run=RunBinding(run_id="ft-spares", bootstrap="", prefix="runwatch"),
        argv=(
            *(sys.executable, "-u", str(SCRIPT), "--no-emit", "--steps", "100000"),
            *("--step-delay-s", "0.05", "--timeout-s", "20", "--stop-file", str(stop_file)),
            *("--checksum-dir", str(sums)),
        ),
        env={"PYTHONPATH": str(REPO)},
        warm_spares=WarmSparesSpec() if warm else None,
    )
    state = ControllerState(root / "state")
    layout = ReplicaLayout(groups=2)
    launcher = TorchFTLauncher(
        state, spec, layout, lighthouse, spares=group_spares(state, spec, layout)
    )
    topology = NodeTopology(nproc_per_node=2)
    log0, log1 = state.log_path(0, 0), state.log_path(0, 1)
    spares = launcher.spares
    try:
        launcher.start(Incarnation(0, topology), WHOLE_NODE)
        group0 = launcher.pids(0)
        _wait("both groups stepping", lambda: any(p == (0, 1) for _, p in steps(log1)))
        spare_pid = 0
        if isinstance(spares, SparePool):
            _wait("the spare preloaded", lambda: spares.ready == 1, tick=launcher.tick)
            spare_pid = spares.spares[0].proc.pid
        killed_at = time.monotonic()
        os.kill(python_child(launcher.pids(1)[0]), signal.SIGKILL)
        _wait("group 1's exit", lambda: launcher.status(1) != RUNNING)
        launcher.stop(Scope(groups=(1,)), grace_s=1.0, kill_now=True)
        size = log1.stat().st_size
        before = len(steps(log1))
        started = launcher.start(Incarnation(0, topology), Scope(groups=(1,)))
        _wait("group 1's first line", lambda: log1.stat().st_size > size)
        first_line_s = time.monotonic() - killed_at
        _wait("group 1 back", lambda: any(p == (0, 1) for _, p in steps(log1)[before:]))
        rejoined_s = time.monotonic() - killed_at
        survivor_kept = launcher.pids(0) == group0
        rank_pid = launcher.pids(1)[0]
        last = max(steps(log0)[-1][0], steps(log1)[-1][0]) + 5
        (root / "stop.tmp").write_text(str(last))
        (root / "stop.tmp").rename(stop_file)
        _wait("the run to end", lambda: not launcher.running())
        assert launcher.status(0) == 0 and launcher.status(1) == 0
        s0 = (sums / "group0.rank0.txt").read_text().split()
        s1 = (sums / "group1.rank0.txt").read_text().split()
    finally:
        launcher.stop(WHOLE_NODE, grace_s=1.0, kill_now=True)
        waiting = [s.proc for s in spares.spares] if isinstance(spares, SparePool) else []
        launcher.spares.close()
    left = sum(1 for proc in waiting if proc.poll() is None)
    return Restart(
        started.warm, first_line_s, rejoined_s, survivor_kept, spare_pid, rank_pid, (s0, s1), left
    )


@pytest.fixture
def lighthouse() -> Iterator[LighthouseProcess]:
    lh = start_lighthouse(LighthouseSettings(min_replicas=1, groups=2))
    yield lh
    lh.stop()


def test_a_restarted_group_starts_in_its_warm_spare_and_heals(
    tmp_path: Path, lighthouse: LighthouseProcess
) -> None:
    got = restart_group_1(tmp_path, lighthouse, warm=True)
    assert got.warm == 1, "group 1 started cold"
    assert got.rank_pid == got.spare_pid != 0  # the spare is the rank now
    assert got.survivor_kept, "group 0 was restarted"
    s0, s1 = got.sums
    assert s0 == s1, "the groups ended on different weights"
    assert got.spares_left == 0
    exit_link = ControllerState(tmp_path / "state").exit_path(0, 1)
    assert exit_link.is_symlink() and exit_link.resolve().parent.name == "spares"


def test_the_spares_of_a_group_preload_torchft_and_keep_one_groups_worth(tmp_path: Path) -> None:
    spec = LaunchSpec(
        run=RunBinding(run_id="r", bootstrap="", prefix="runwatch"),
        argv=(sys.executable, "-u", str(SCRIPT)),
        warm_spares=WarmSparesSpec(preload=("torch",)),
    )
    pool = group_spares(ControllerState(tmp_path), spec, ReplicaLayout(groups=3, nproc_per_group=2))
    assert isinstance(pool, SparePool)
    assert pool.preload == ("torch", *FT_PRELOAD) and pool.size == 2
    cold = LaunchSpec(run=spec.run, argv=spec.argv)
    assert not isinstance(
        group_spares(ControllerState(tmp_path), cold, ReplicaLayout(2)), SparePool
    )


def main(argv: list[str] | None = None) -> int:
    """Kill -> rejoined for a group restart, cold and warm, alternating (module doc)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args(argv)
    lh = start_lighthouse(LighthouseSettings(min_replicas=1, groups=2))
    figures: dict[str, list[Restart]] = {"cold": [], "warm": []}
    try:
        for i in range(args.runs):
            for mode in ("cold", "warm"):
                with tempfile.TemporaryDirectory() as tmp:
                    got = restart_group_1(Path(tmp), lh, warm=mode == "warm")
                figures[mode].append(got)
                print(
                    f"run {i + 1} {mode}: first line {got.first_line_s:.2f} s, rejoined "
                    f"{got.rejoined_s:.2f} s (in spares: {got.warm})",
                    flush=True,
                )
    finally:
        lh.stop()
    out = {}
    for mode, runs in figures.items():
        rejoined = [r.rejoined_s for r in runs]
        first = [r.first_line_s for r in runs]
        out[mode] = {
            "rejoined_s": [round(x, 2) for x in rejoined],
            "rejoined_median_s": round(statistics.median(rejoined), 2),
            "rejoined_worst_s": round(max(rejoined), 2),
            "first_line_median_s": round(statistics.median(first), 2),
        }
        print(
            f"{mode}: kill -> rejoined median {out[mode]['rejoined_median_s']} s, worst "
            f"{out[mode]['rejoined_worst_s']} s; kill -> first line median "
            f"{out[mode]['first_line_median_s']} s"
        )
    print(json.dumps({"group_restart_spares": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
