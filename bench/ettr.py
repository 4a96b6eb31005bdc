"""Effective training time ratio (ETTR): gang restarts against replica-group restarts.

(a) **Measured here** (``--measure``, default on): two torchft replica groups of one rank
of `examples/train_ft.py` under `controller.torchft_launcher.TorchFTLauncher` (real
processes, gloo, torchft's Lighthouse; no Kafka: the closed loop's own latency is
bench/recovery.py's). The bench SIGKILLs group 1's rank, restarts group 1 as soon as the
launcher sees the exit (what ``respawn_group`` does), and times, from the kill:

* ``detect_s``: the launcher sees the exit (it looks every 50 ms here);
* ``survivor_next_step_s``: group 0's first committed step without group 1;
* ``rejoined_s``: group 1's first step back in the quorum (healed from group 0);
* ``heal_s``: from the respawn to that step (interpreter, imports, quorum, state copy);
* ``lost_steps``: group 0's steps that did not commit (the step the kill broke);
* steps/s of group 0 before the kill and during the outage.

With ``--gang``, the same run and kill once more, carried out as today's gang restart:
every group stopped and restarted from the latest DCP checkpoint (``--checkpoint-every``
steps): ``gang_first_step_s`` (kill -> the first resumed step) and ``gang_lost_steps``
(the steps since that checkpoint, redone).

(b) **A model** of a 16,384-GPU run at Llama 3's interruption rate (419 unexpected
interruptions in 54 days: one every ~3.1 h), fed with the measured costs
(docs/controller.md, "ETTR at scale", has the assumptions):

* gang restart: every failure costs the whole job ``C/2`` (half a checkpoint interval of
  work, on average) + detection + restart + checkpoint load;
* group restart: the failed group's share of the job is out for detection + restart +
  heal (the others step on), plus one step of the whole job (the step the failure broke).

    .venv/bin/python bench/ettr.py [--no-measure] [--gang] [--groups-at-scale G]

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
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from runwatch.controller.launcher import RUNNING, WHOLE_NODE, Incarnation, Scope  # noqa: E402
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


def _steps(log: Path) -> list[tuple[int, tuple[int, ...]]]:
    out = []
    for line in log.read_text(errors="replace").splitlines() if log.exists() else ():
        m = STEP.match(line)
        if m:
            out.append((int(m[2]), tuple(int(g) for g in m[3].split(",") if g.strip())))
    return out


def _wait(check: Any, timeout_s: float = 300.0) -> float:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("the bench run did not get there")
        time.sleep(0.05)
    return time.monotonic()


def measure(root: Path, step_delay_s: float) -> dict[str, float]:
    """One kill of group 1 under the torchft launcher; the figures in the module doc."""
    from runwatch.controller.torchft_compat import LighthouseSettings, start_lighthouse
    from runwatch.controller.torchft_launcher import ReplicaLayout, TorchFTLauncher

    stop = root / "stop"
    argv = (sys.executable, "-u", str(REPO / "examples" / "train_ft.py"), "--no-emit")
    argv += ("--steps", "100000", "--step-delay-s", str(step_delay_s), "--timeout-s", "20")
    argv += ("--stop-file", str(stop))
    spec = LaunchSpec(
        run=RunBinding(run_id="ettr", bootstrap="", prefix="runwatch"),
        argv=argv,
        env={"PYTHONPATH": str(REPO)},
    )
    state = ControllerState(root / "state")
    lighthouse = start_lighthouse(LighthouseSettings(min_replicas=1, groups=2))
    launcher = TorchFTLauncher(state, spec, ReplicaLayout(groups=2), lighthouse)
    topo = NodeTopology(nproc_per_node=2)
    log0, log1 = state.log_path(0, 0), state.log_path(0, 1)
    try:
        launcher.start(Incarnation(0, topo), WHOLE_NODE)
        _wait(lambda: len([s for s, p in _steps(log0) if p == (0, 1)]) >= 30)
        t_a, n_a = time.monotonic(), len(_steps(log0))
        _wait(lambda: len(_steps(log0)) >= n_a + 50)
        before_rate = 50 / (time.monotonic() - t_a)
        wrapper = launcher.pids(1)[0]
        child = int(Path(f"/proc/{wrapper}/task/{wrapper}/children").read_text().split()[0])
        at_kill = _steps(log0)[-1][0]
        os.kill(child, signal.SIGKILL)
        t_kill = time.monotonic()
        t_detect = _wait(lambda: launcher.status(1) != RUNNING)
        launcher.stop(Scope(groups=(1,)), grace_s=1.0, kill_now=True)
        t_respawn = time.monotonic()
        before = len(_steps(log1))
        launcher.start(Incarnation(0, topo), Scope(groups=(1,)))
        t_next = _wait(lambda: any(s > at_kill and p == (0,) for s, p in _steps(log0)))
        t_back = _wait(lambda: any(p == (0, 1) for _, p in _steps(log1)[before:]))
        alone = [s for s, p in _steps(log0) if s > at_kill and p == (0,)]
        outage_rate = len(alone) / max(1e-9, t_back - t_next)
        not_committed = log0.read_text(errors="replace").count("not committed")
        last = max(_steps(log0)[-1][0], _steps(log1)[-1][0]) + 5
        (root / "stop.tmp").write_text(str(last))
        (root / "stop.tmp").rename(stop)
        _wait(lambda: not launcher.running(), 120.0)
        return {
            "detect_s": round(t_detect - t_kill, 3),
            "survivor_next_step_s": round(t_next - t_kill, 3),
            "rejoined_s": round(t_back - t_kill, 3),
            "heal_s": round(t_back - t_respawn, 3),
            "lost_steps": float(not_committed),
            "steps_per_s_before": round(before_rate, 2),
            "steps_per_s_outage": round(outage_rate, 2),
        }
    finally:
        launcher.stop(WHOLE_NODE, grace_s=1.0, kill_now=True)
        launcher.close()


def measure_gang(root: Path, step_delay_s: float, checkpoint_every: int) -> dict[str, float]:
    """The same run and kill, carried out as a gang restart from the latest DCP checkpoint."""
    from runwatch.controller.launcher import resolve_resume
    from runwatch.controller.torchft_compat import LighthouseSettings, start_lighthouse
    from runwatch.controller.torchft_launcher import ReplicaLayout, TorchFTLauncher

    stop, ckpt = root / "stop", root / "ckpt"
    argv = (sys.executable, "-u", str(REPO / "examples" / "train_ft.py"), "--no-emit")
    argv += ("--steps", "100000", "--step-delay-s", str(step_delay_s), "--timeout-s", "20")
    argv += ("--stop-file", str(stop), "--checkpoint-every", str(checkpoint_every))
    spec = LaunchSpec(
        run=RunBinding(
            run_id="ettr-gang", bootstrap="", prefix="runwatch", checkpoint_dir=str(ckpt)
        ),
        argv=argv,
        env={"PYTHONPATH": str(REPO)},
    )
    state = ControllerState(root / "state")
    lighthouse = start_lighthouse(LighthouseSettings(min_replicas=1, groups=2))
    launcher = TorchFTLauncher(state, spec, ReplicaLayout(groups=2), lighthouse)
    topo = NodeTopology(nproc_per_node=2)
    log0 = state.log_path(0, 0)
    try:
        launcher.start(Incarnation(0, topo), WHOLE_NODE)
        _wait(lambda: len([s for s, p in _steps(log0) if p == (0, 1)]) >= 30 + checkpoint_every)
        wrapper = launcher.pids(1)[0]
        child = int(Path(f"/proc/{wrapper}/task/{wrapper}/children").read_text().split()[0])
        at_kill = _steps(log0)[-1][0]
        os.kill(child, signal.SIGKILL)
        t_kill = time.monotonic()
        t_detect = _wait(lambda: launcher.status(1) != RUNNING)
        launcher.stop(WHOLE_NODE, grace_s=1.0, kill_now=True)
        resume = resolve_resume(str(ckpt), None)
        launcher.start(Incarnation(1, topo, resume), WHOLE_NODE)
        new0 = state.log_path(1, 0)
        t_first = _wait(lambda: bool(_steps(new0)))
        first = _steps(new0)[0][0]
        last = first + 5
        (root / "stop.tmp").write_text(str(last))
        (root / "stop.tmp").rename(stop)
        _wait(lambda: not launcher.running(), 120.0)
        return {
            "gang_detect_s": round(t_detect - t_kill, 3),
            "gang_first_step_s": round(t_first - t_kill, 3),
            "gang_resumed_from": float(resume.step or 0),
            "gang_lost_steps": float(at_kill - (resume.step or 0)),
        }
    finally:
        launcher.stop(WHOLE_NODE, grace_s=1.0, kill_now=True)
        launcher.close()


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
    p.add_argument("--step-delay-s", type=float, default=0.05)
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
    p.add_argument(
        "--gang",
        action="store_true",
        help="also measure the same kill as a gang restart from DCP (checkpoint every "
        "--checkpoint-every steps)",
    )
    p.add_argument("--checkpoint-every", type=int, default=50)
    args = p.parse_args(argv)
    measured: dict[str, float] = {}
    if not args.no_measure:
        with tempfile.TemporaryDirectory(prefix="ettr-") as tmp:
            measured = measure(Path(tmp), args.step_delay_s)
        if args.gang:
            with tempfile.TemporaryDirectory(prefix="ettr-gang-") as tmp:
                measured |= measure_gang(Path(tmp), args.step_delay_s, args.checkpoint_every)
    detect = measured.get("detect_s", 0.13)
    heal = measured.get("heal_s", 25.0)
    group = Costs(detect_s=detect, restart_s=0.0, heal_s=heal, step_s=args.step_s)
    gang = Costs(detect_s=detect, restart_s=args.gang_restart_s, heal_s=0.0, step_s=args.step_s)
    figures = model(group, gang, args.groups_at_scale)
    if measured:
        print("measured here (2 groups x 1 rank, gloo, CPU; seconds after the SIGKILL):")
        for key, value in measured.items():
            print(f"  {key:<24} {value}")
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
    line = {"bench": "ettr", **measured, **figures, "costs_group": asdict(group)}
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
