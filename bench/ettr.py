"""Effective training time ratio (ETTR): gang restarts against replica-group restarts.

(a) **Measured here** (``--measure``, default on): the same run and the same fault
schedule under each restart mode. The run: ``--groups`` torchft replica groups (default
3) of one rank of `examples/train_ft.py` under `controller.torchft_launcher.TorchFTLauncher`
(real processes, gloo, torchft's Lighthouse, a DCP checkpoint every ``--checkpoint-every``
steps; no Kafka: the closed loop's own latency is bench/recovery.py's). The schedule,
each fault ``--fault-gap`` committed steps after the run recovered from the previous one:
SIGKILL group 1's rank, hang group 2 (``--hang-file``: it stops stepping, its torchft
threads still heartbeat), SIGKILL group 0's rank. The bench plays the controller, the way
runwatch decides for each mode:

* **torchft** (group restarts; the quorum needs one group): a group whose rank exited
  (exit evidence), or a group missing from a committed step's quorum (``replica_lost``: the
  hang), is stopped and restarted alone; it heals from a live peer while the others step on.
* **gang** (gang restarts; the quorum needs every group, as DDP without torchft): an exit,
  or no committed step for ``--hang-timeout-s`` (the ``hang`` verdict), stops every group
  and restarts them all from the latest committed DCP checkpoint.

Per mode it reports steps/s (the run's final steps over its wall time, from a healthy
window of ``--fault-gap`` steps before the first fault to ``--fault-gap`` steps after the
last recovery), ``lost_steps`` (committed steps redone after a restart), ``uncommitted``
(step attempts that did not commit) and the measured **ETTR**: the work of the final
steps, each counted at its real throughput (participating groups / groups), over what
the wall time would have computed at the healthy window's rate. Per fault: ``detect_s``
(the fault -> the bench acts) and ``recovered_s`` (the fault -> every group in a
committed step again).

(b) **A model** of a 16,384-GPU run at Llama 3's interruption rate (419 unexpected
interruptions in 54 days: one every ~3.1 h), fed with the measured costs of torchft
mode's first SIGKILL (detect, and respawn -> rejoined as the heal; docs/controller.md,
"ETTR at scale", has the assumptions):

* gang restart: every failure costs the whole job ``C/2`` (half a checkpoint interval of
  work, on average) + detection + restart + checkpoint load;
* group restart: the failed group's share of the job is out for detection + restart +
  heal (the others step on), plus one step of the whole job (the step the failure broke).

    .venv/bin/python bench/ettr.py [--no-measure] [--modes torchft,gang] [--groups 3]

Prints the figures, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from runwatch.controller.launcher import (  # noqa: E402
    RUNNING,
    WHOLE_NODE,
    Incarnation,
    Scope,
    resolve_resume,
)
from runwatch.controller.state import ControllerState, LaunchSpec  # noqa: E402
from runwatch.controller.topology import NodeTopology, RunBinding  # noqa: E402

STEP = re.compile(r"^group (\d+) step (\d+) .* participants \[([\d, ]*)\]$")
LLAMA3_DAYS = 54.0
LLAMA3_INTERRUPTIONS = 419
LLAMA3_GPUS = 16_384


@dataclass(frozen=True)
class Costs:
    """What one failure costs, in seconds (measured here, or given)."""

    detect_s: float
    restart_s: float
    heal_s: float
    step_s: float


def ettr_gang(mtbf_s: float, checkpoint_interval_s: float, c: Costs) -> float:
    """ETTR of gang restarts: each failure loses half an interval plus detect + restart."""
    lost = checkpoint_interval_s / 2 + c.detect_s + c.restart_s
    return max(0.0, 1.0 - lost / mtbf_s)


def ettr_group(mtbf_s: float, groups: int, c: Costs) -> float:
    """ETTR of group restarts: 1/groups of the job out for detect + restart + heal, plus a step."""
    lost = (c.detect_s + c.restart_s + c.heal_s) / groups + c.step_s
    return max(0.0, 1.0 - lost / mtbf_s)


@dataclass(frozen=True)
class Fault:
    """One fault of the schedule: ``kill`` (SIGKILL the group's rank) or ``hang``."""

    kind: Literal["kill", "hang"]
    group: int


SCHEDULE = (Fault("kill", 1), Fault("hang", 2), Fault("kill", 0))
"""The same for both modes; a hang needs 3 groups (with 2, a hung group that still
heartbeats is half of them and torchft forms no quorum: the gang path in both modes)."""


class Trajectory:
    """The committed steps the groups' rank logs report (every incarnation), read as they grow.

    ``steps`` maps a step to the groups that committed it (a step redone after a gang
    restart: its last report); ``first_seen`` to when this reader first saw it, in
    ``time.monotonic()`` seconds; ``last_new_s`` is when it last read a step line (the
    gang mode's silence check).
    """

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.offsets: dict[Path, int] = {}
        self.steps: dict[int, tuple[int, ...]] = {}
        self.first_seen: dict[int, float] = {}
        self.full_seen: list[float] = []  # when each step with every group was read
        self.uncommitted = 0
        self.last_new_s = time.monotonic()
        self.groups = 0

    def poll(self) -> None:
        """Read the new complete lines of every log."""
        now = time.monotonic()
        for log in sorted(self.logs.glob("*.log")):
            with log.open("rb") as f:
                f.seek(self.offsets.get(log, 0))
                data = f.read()
            end = data.rfind(b"\n") + 1
            self.offsets[log] = self.offsets.get(log, 0) + end
            for line in data[:end].decode(errors="replace").splitlines():
                self._line(line, now)

    def _line(self, line: str, now: float) -> None:
        if "not committed" in line:
            self.uncommitted += 1
            return
        m = STEP.match(line)
        if m is None:
            return
        step, groups = int(m[2]), tuple(int(g) for g in m[3].split(",") if g.strip())
        self.first_seen.setdefault(step, now)
        self.last_new_s = now  # a step redone after a restart is progress too
        self.steps[step] = groups
        if len(groups) == self.groups:
            self.full_seen.append(now)

    @property
    def last(self) -> int:
        return max(self.steps, default=0)


class ScheduleRun:
    """One mode's run of the schedule: the launcher, the bench's own controller, figures."""

    def __init__(self, root: Path, mode: str, args: argparse.Namespace) -> None:
        from runwatch.controller.torchft_compat import LighthouseSettings, start_lighthouse
        from runwatch.controller.torchft_launcher import ReplicaLayout, TorchFTLauncher

        self.root, self.mode, self.args, self.groups = root, mode, args, args.groups
        self.hang, self.ckpt = root / "hang", root / "ckpt"
        argv: tuple[str, ...] = (sys.executable, "-u", str(REPO / "examples" / "train_ft.py"))
        argv += ("--no-emit",)
        argv += ("--steps", "100000", "--step-delay-s", str(args.step_delay_s))
        argv += ("--timeout-s", "20", "--stop-file", str(root / "stop"))
        argv += ("--checkpoint-every", str(args.checkpoint_every), "--hang-file", str(self.hang))
        run = RunBinding(
            run_id=f"ettr-{mode}", bootstrap="", prefix="runwatch", checkpoint_dir=str(self.ckpt)
        )
        spec = LaunchSpec(
            run=run,
            argv=argv,
            env={"PYTHONPATH": str(REPO)},
        )
        floor = self.groups if mode == "gang" else 1  # gang: every group in every step
        self.state = ControllerState(root / "state")
        self.lighthouse = start_lighthouse(LighthouseSettings(floor, self.groups))
        layout = ReplicaLayout(groups=self.groups, min_replicas=floor)
        self.launcher = TorchFTLauncher(self.state, spec, layout, self.lighthouse)
        self.topo = NodeTopology(nproc_per_node=self.groups)
        self.incarnation = 0
        self.traj = Trajectory(self.state.root / "logs")
        self.traj.groups = self.groups
        self.lost_steps = 0

    def until(self, check: Any, timeout_s: float = 300.0) -> float:
        """Poll the logs until ``check()``; the monotonic time it held."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.traj.poll()
            if check():
                return time.monotonic()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.mode}: the bench run did not get there")
            time.sleep(0.05)

    def inject(self, fault: Fault) -> float:
        """Cause ``fault``; its monotonic time."""
        if fault.kind == "hang":
            (self.root / "hang.tmp").write_text(str(fault.group))
            (self.root / "hang.tmp").rename(self.hang)
            return time.monotonic()
        wrapper = self.launcher.pids(fault.group)[0]
        child = int(Path(f"/proc/{wrapper}/task/{wrapper}/children").read_text().split()[0])
        os.kill(child, signal.SIGKILL)
        return time.monotonic()

    def restart(self, groups: tuple[int, ...] | None) -> float:
        """Restart ``groups`` alone (heal from a peer), or the gang from DCP (None)."""
        self.hang.unlink(missing_ok=True)  # a restarted group would hang again
        if groups is not None:
            self.launcher.stop(Scope(groups=groups), grace_s=1.0, kill_now=True)
            self.launcher.start(Incarnation(self.incarnation, self.topo), Scope(groups=groups))
            return time.monotonic()
        self.launcher.stop(WHOLE_NODE, grace_s=1.0, kill_now=True)
        self.traj.poll()
        resume = resolve_resume(str(self.ckpt), None)
        self.lost_steps += self.traj.last - (resume.step or 0)
        self.incarnation += 1
        self.launcher.start(Incarnation(self.incarnation, self.topo, resume), WHOLE_NODE)
        return time.monotonic()

    def exited(self) -> tuple[int, ...]:
        return tuple(g for g in range(self.groups) if self.launcher.status(g) != RUNNING)

    def lost(self, since: int) -> tuple[int, ...]:
        """Groups missing from the newest committed step after ``since`` (replica_lost)."""
        newest = self.traj.last
        if newest <= since:
            return ()
        return tuple(g for g in range(self.groups) if g not in self.traj.steps[newest])

    def detect(self, t_fault: float, at_step: int) -> tuple[float, tuple[int, ...] | None]:
        """Wait for the mode's evidence of the fault; ``(time, groups to restart or None)``."""
        found: tuple[int, ...] = ()

        def seen() -> bool:
            nonlocal found
            found = self.exited()
            if self.mode == "torchft":
                found = found or self.lost(at_step)
            else:
                silent_s = time.monotonic() - max(self.traj.last_new_s, t_fault)
                found = found or (() if silent_s < self.args.hang_timeout_s else (-1,))
            return bool(found)

        t = self.until(seen)
        return t, (found if self.mode == "torchft" else None)

    def recover(self, fault: Fault) -> dict[str, Any]:
        """Inject ``fault``, carry out the mode's restart, wait until every group steps."""
        at_step = self.traj.last
        t_fault = self.inject(fault)
        t_detect, groups = self.detect(t_fault, at_step)
        t_restart = self.restart(groups)
        t_back = self.until(lambda: any(t > t_restart for t in self.traj.full_seen))
        return {
            "fault": f"{fault.kind} group {fault.group}",
            "at_step": at_step,
            "detect_s": round(t_detect - t_fault, 3),
            "heal_s": round(t_back - t_restart, 3),
            "recovered_s": round(t_back - t_fault, 3),
        }

    def run(self) -> dict[str, Any]:
        """The schedule from start to end; the mode's figures."""
        gap = self.args.fault_gap
        try:
            self.launcher.start(Incarnation(0, self.topo), WHOLE_NODE)
            self.until(lambda: len(self.traj.full_seen) >= 10, 600.0)
            t0, step0 = time.monotonic(), self.traj.last
            t1 = self.until(lambda: self.traj.last >= step0 + gap)
            healthy = (self.traj.last - step0) / (t1 - t0)
            faults = []
            for fault in SCHEDULE:
                faults.append(self.recover(fault))
                back = self.traj.last
                self.until(lambda: self.traj.last >= back + gap)  # noqa: B023
            t_end, end = time.monotonic(), self.traj.last
            (self.root / "stop.tmp").write_text(str(end + 3))
            (self.root / "stop.tmp").rename(self.root / "stop")
            self.until(lambda: not self.launcher.running(), 120.0)
        finally:
            self.launcher.stop(WHOLE_NODE, grace_s=1.0, kill_now=True)
            self.launcher.close()
            self.lighthouse.stop()
        work = sum(len(self.traj.steps.get(s, ())) for s in range(step0 + 1, end + 1))
        wall = t_end - t0
        return {
            "mode": self.mode,
            "steps_per_s_healthy": round(healthy, 2),
            "steps_per_s": round((end - step0) / wall, 2),
            "lost_steps": self.lost_steps,
            "uncommitted": self.traj.uncommitted,
            "ettr": round(work / self.groups / (wall * healthy), 4),
            "wall_s": round(wall, 1),
            "faults": faults,
        }


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each mode of ``--modes`` runs the schedule once, in a directory of its own."""
    out = []
    for mode in args.modes.split(","):
        with tempfile.TemporaryDirectory(prefix=f"ettr-{mode}-") as tmp:
            out.append(ScheduleRun(Path(tmp), mode, args).run())
    return out


def model(costs: Costs, gang: Costs, groups: int) -> dict[str, float]:
    """ETTR at 16,384 GPUs, Llama 3's rate, checkpoints every 10 and 30 minutes."""
    mtbf_s = LLAMA3_DAYS * 86_400 / LLAMA3_INTERRUPTIONS
    out = {"mtbf_h": round(mtbf_s / 3600, 3), "groups_at_scale": float(groups)}
    for minutes in (10, 30):
        out[f"ettr_gang_{minutes}min"] = round(ettr_gang(mtbf_s, minutes * 60, gang), 5)
        out[f"ettr_group_{minutes}min"] = round(ettr_group(mtbf_s, groups, costs), 5)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--no-measure", action="store_true", help="model only, with the defaults")
    p.add_argument("--modes", default="torchft,gang", help="which modes run the schedule")
    p.add_argument("--groups", type=int, default=3, help="replica groups of one rank (>= 3)")
    p.add_argument(
        "--step-delay-s",
        type=float,
        default=0.25,
        help="sleep per step: steps mostly wait, so their time hardly depends on how many "
        "groups share the CPUs (on a cluster each group has its own GPUs)",
    )
    p.add_argument("--checkpoint-every", type=int, default=10, help="DCP checkpoint, steps")
    p.add_argument("--fault-gap", type=int, default=20, help="steps between recovery and fault")
    p.add_argument(
        "--hang-timeout-s",
        type=float,
        default=6.0,
        help="gang mode: no committed step this long is a hang (bench/recovery.py's loop)",
    )
    p.add_argument(
        "--groups-at-scale",
        type=int,
        default=128,
        help="replica groups of the 16,384-GPU job (128 GPUs each: TP x PP inside a group)",
    )
    p.add_argument(
        "--gang-restart-s",
        type=float,
        default=2.0,
        help="gang restart, kill to first resumed step (bench/recovery.py, warm spares)",
    )
    p.add_argument("--step-s", type=float, default=10.0, help="a step of the job at scale")
    args = p.parse_args(argv)
    if args.groups < 3:
        p.error("--groups must be >= 3: the schedule hangs group 2")
    modes = [] if args.no_measure else measure(args)
    first_kill = next((m["faults"][0] for m in modes if m["mode"] == "torchft"), None)
    detect = first_kill["detect_s"] if first_kill else 0.13
    heal = first_kill["heal_s"] if first_kill else 25.0
    group = Costs(detect_s=detect, restart_s=0.0, heal_s=heal, step_s=args.step_s)
    gang = Costs(detect_s=detect, restart_s=args.gang_restart_s, heal_s=0.0, step_s=args.step_s)
    figures = model(group, gang, args.groups_at_scale)
    print_measured(modes, args)
    print(
        f"model: {LLAMA3_GPUS} GPUs, MTBF {figures['mtbf_h']} h, "
        f"{args.groups_at_scale} replica groups"
    )
    for minutes in (10, 30):
        gang_ettr, group_ettr = (
            figures[f"ettr_gang_{minutes}min"],
            figures[f"ettr_group_{minutes}min"],
        )
        every = f"checkpoint every {minutes:>2} min"
        print(f"  {every}: ETTR gang {gang_ettr:.4f}  group {group_ettr:.4f}")
    line = {"bench": "ettr", "measured": modes, **figures, "costs_group": asdict(group)}
    print(json.dumps(line))
    return 0


def print_measured(modes: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """The measured table: a row per mode, then each mode's faults."""
    if not modes:
        return
    print(
        f"measured here ({args.groups} groups x 1 rank, gloo, CPU; faults "
        f"{', '.join(f'{f.kind} group {f.group}' for f in SCHEDULE)}, each "
        f"{args.fault_gap} steps after the last recovery; DCP every "
        f"{args.checkpoint_every} steps):"
    )
    keys = ("steps_per_s_healthy", "steps_per_s", "lost_steps", "uncommitted", "ettr", "wall_s")
    print(f"  {'mode':<8}" + "".join(f"{k:>20}" for k in keys))
    for m in modes:
        print(f"  {m['mode']:<8}" + "".join(f"{m[k]:>20}" for k in keys))
    for m in modes:
        for f in m["faults"]:
            print(
                f"  {m['mode']:<8} {f['fault']:<14} at step {f['at_step']:<5} "
                f"detect {f['detect_s']:.2f} s, every group back {f['recovered_s']:.2f} s "
                f"(restart -> back {f['heal_s']:.2f} s)"
            )


if __name__ == "__main__":
    sys.exit(main())
