"""Recovery time of the closed loop: from a SIGKILLed rank to the first step after the resume.

Runs the whole loop on real processes: a broker (``RUNWATCH_BOOTSTRAP`` / ``--bootstrap``,
else an embedded one in a temporary directory), one `runwatch processors` worker, and
`runwatch launch --nproc 2 -- python examples/train_ddp.py` (``--nnodes 2``: two agents,
``--nnodes 2 --nproc-per-node 1``, one per node on loopback). When the run has reported step
``--kill-at-step``, the bench SIGKILLs rank 1's process group and takes the kill time
(``time.time_ns()`` right after the signal). It then reads the topics and reports, in
seconds after the kill:

* ``rank_exited``: the launcher's exit evidence (RankExited of rank 1 on the heartbeats
  topic; none with ``--no-exit-evidence``);
* ``dead_rank``: the dead_rank verdict of the killed incarnation;
* ``command``: the RestartRequested it caused;
* ``restart_completed``: the controller's RestartCompleted (the new gang is started);
* ``first_step``: the first StepCompleted after the resume (``restart_from_step`` set).

Each is given twice: ``*_ts_s`` from the record's Kafka timestamp (CreateTime: when its
producer sent it; all processes share this host's clock) and ``*_read_s`` from when this
bench's consumer read it (what an observer sees, polling every 50 ms).

Two paths to the verdict are measured, ``--paths both`` (default) running ``--runs`` of
each: ``exit_evidence`` (the default launcher: the verdict is raised on its RankExited,
the goal is < 1 s) and ``silence`` (``runwatch launch --no-exit-evidence``: the verdict
waits for ``--dead-rank-timeout-s`` of log time, and both ranks are reported). One JSON
line per run follows the tables, then one with the medians per path.

``--warm-spares`` launches with ``runwatch launch --warm-spares`` (`controller.spares`):
the new incarnation's ranks start in processes that imported torch beforehand. The kill
then waits until every agent's spares are preloaded, so the figure is that of a warm node.

``--compare``: a group restart against a gang restart, through the same closed loop. The
gang run is the ``exit_evidence`` path above (`examples/train_ddp.py`, a DCP checkpoint
every 5 steps); the group run is ``runwatch launch --fault-tolerance torchft
--replica-groups 2 -- python examples/train_ft.py`` (gloo, torchft's Lighthouse), whose
group 1 rank is SIGKILLed the same way. Each reports ``lost_steps`` (steps committed
before the kill and committed again after it: the gang redoes those since its
checkpoint, the groups none) and seconds from the kill to ``command`` and
``restart_completed``; the group run also ``survivor_step`` (the first step the other
group commits without group 1) and ``rejoined`` (the first step with group 1 back, healed
from a live peer), the gang run ``first_step`` (the first resumed step). One JSON line
per run, then one comparing the medians.

    .venv/bin/python bench/recovery.py [--runs 3] [--paths both|exit_evidence|silence]
        [--nnodes 1|2] [--warm-spares] [--compare] [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kafka import KafkaConsumer, TopicPartition  # noqa: E402

from runwatch import admin  # noqa: E402
from runwatch.controller.state import DEFAULT_SPARE_PRELOAD  # noqa: E402
from runwatch.procs import exit_on_sigterm  # noqa: E402
from runwatch.schemas.codec import decode  # noqa: E402
from runwatch.schemas.events import (  # noqa: E402
    AnomalyDetected,
    RankExited,
    RestartCompleted,
    RestartRequested,
    StepCompleted,
    Tick,
)
from runwatch.schemas.topics import names  # noqa: E402

KEY = "bench-recovery-command-key-0123"
PHASES = ("rank_exited", "dead_rank", "command", "restart_completed", "first_step")
PATHS = ("exit_evidence", "silence")


@contextlib.contextmanager
def broker(explicit: str | None) -> Iterator[str]:
    bootstrap = explicit or os.environ.get("RUNWATCH_BOOTSTRAP")
    if bootstrap:
        yield bootstrap
        return
    from runwatch.broker import ephemeral_broker

    with tempfile.TemporaryDirectory() as tmp, ephemeral_broker(Path(tmp)) as info:
        yield info.bootstrap


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNWATCH_")}
    return env | {"RUNWATCH_COMMAND_KEY": KEY, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


@contextlib.contextmanager
def work_dir(keep: Path | None) -> Iterator[Path]:
    """Where logs and state dirs go: ``keep`` (left behind), else a temporary dir."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory() as tmp:
        yield Path(tmp)


def runwatch(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "runwatch.cli", *args],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env=child_env(),
        cwd=REPO,
        start_new_session=True,
    )


class Tail:
    """Reads topics from their current end, decoding every record."""

    def __init__(self, bootstrap: str, topics: list[str]) -> None:
        self.consumer = KafkaConsumer(
            bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False
        )
        tps = [
            TopicPartition(t, p)
            for t in topics
            for p in sorted(self.consumer.partitions_for_topic(t) or ())
        ]
        self.consumer.assign(tps)
        self.consumer.seek_to_end(*tps)
        for tp in tps:
            self.consumer.position(tp)

    def poll(self) -> Iterator[tuple[Any, Any, int]]:
        """``(event, record, read_ns)`` for each record that arrived."""
        for records in self.consumer.poll(timeout_ms=50).values():
            read_ns = time.time_ns()
            for r in records:
                yield decode(r.value), r, read_ns

    def close(self) -> None:
        self.consumer.close()


def wait_worker(bootstrap: str, prefix: str, timeout_s: float = 180.0) -> None:
    """Until the worker's clock writes a Tick (the worker is up and owns the partitions)."""
    tail = Tail(bootstrap, [names(prefix).heartbeats])
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if any(isinstance(e, Tick) for e, _, _ in tail.poll()):
                return
        raise SystemExit("the processors worker did not start")
    finally:
        tail.close()


def spares_ready(states: list[Path], per_node: int, warm: bool) -> bool:
    """With ``--warm-spares``: True once every agent has its spares preloaded (else True)."""
    if not warm:
        return True
    return all(len(list((s / "spares").glob("*.ready"))) >= per_node for s in states)


Stamp = tuple[int, int]
"""``(broker timestamp ns, read ns)`` of a record."""


@dataclass
class PhaseTimer:
    """A run's phases after its kill: when each was first seen, and the facts noted on the way.

    Attributes:
        run_id: The run.
        phases: Those the run waits for (its row reports them).
        kill_ns: When the bench killed the rank (None: not yet).
        seen: Phase -> its first record's `Stamp`.
        extra: What the row says besides the phases, in the order it was noted.
    """

    run_id: str
    phases: tuple[str, ...]
    kill_ns: int | None = None
    seen: dict[str, Stamp] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return all(phase in self.seen for phase in self.phases)

    def kill(self, state: Path, step: int) -> None:
        """SIGKILL rank 1's process group (the gang record of ``state`` names it)."""
        ranks = json.loads((state / "gang.json").read_text())["record"]["ranks"]
        (pid,) = [r["pid"] for r in ranks if r["rank"] == 1]
        os.killpg(pid, signal.SIGKILL)
        self.kill_ns = time.time_ns()
        self.extra["killed_after_step"] = step

    def mark(self, phase: str, stamp: Stamp) -> None:
        self.seen.setdefault(phase, stamp)

    def control(self, event: Any, stamp: Stamp) -> str | None:
        """Mark the control-plane phase ``event`` is (exit evidence to restart); its name."""
        phase = None
        if isinstance(event, RankExited) and event.rank == 1:
            phase = "rank_exited"
        elif isinstance(event, AnomalyDetected) and event.kind == "dead_rank":
            phase = "dead_rank"
        elif isinstance(event, RestartRequested):
            phase = "command"
        elif isinstance(event, RestartCompleted):
            phase = "restart_completed"
            self.extra["controller_duration_s"] = event.duration_s
        if phase is not None:
            self.mark(phase, stamp)
        return phase

    def row(self) -> dict[str, Any]:
        """The run's row: its facts, then each phase in seconds after the kill."""
        assert self.kill_ns is not None
        row: dict[str, Any] = {"run_id": self.run_id, **self.extra}
        for phase in self.phases:
            ts_ns, read_ns = self.seen[phase]
            row[f"{phase}_ts_s"] = round((ts_ns - self.kill_ns) / 1e9, 3)
            row[f"{phase}_read_s"] = round((read_ns - self.kill_ns) / 1e9, 3)
        return row


OnStep = Callable[[StepCompleted, Stamp], None]
OnControl = Callable[[str, Any], None]


def follow(
    bootstrap: str,
    prefix: str,
    timer: PhaseTimer,
    start: Callable[[], list[subprocess.Popen[bytes]]],
    args: argparse.Namespace,
    on_step: OnStep,
    on_control: OnControl,
    before_wait: Callable[[], None] = lambda: None,
) -> None:
    """Start the run's launchers (``start``, once this reads the topics' ends), read its
    records until every phase is seen, then wait for the launchers.

    Steps go to ``on_step`` (which kills, and marks the step phases); after the kill, every
    control-plane record is marked (`PhaseTimer.control`) and handed to ``on_control``.
    ``before_wait`` runs once the phases are in (a stop file). Launchers still running at
    the end are stopped.
    """
    topics = names(prefix)
    tail = Tail(
        bootstrap,
        [topics.steps, topics.heartbeats, topics.anomalies, topics.commands, topics.controller],
    )
    launchers = start()
    deadline = time.monotonic() + args.timeout_s
    try:
        while not timer.done:
            if time.monotonic() > deadline:
                raise SystemExit(f"{timer.run_id}: timed out; seen {sorted(timer.seen)}")
            for event, record, read_ns in tail.poll():
                if event.run_id != timer.run_id:
                    continue
                stamp = (record.timestamp * 1_000_000, read_ns)
                if isinstance(event, StepCompleted):
                    on_step(event, stamp)
                elif timer.kill_ns is not None and (phase := timer.control(event, stamp)):
                    on_control(phase, event)
        before_wait()
        codes = [launcher.wait(timeout=args.timeout_s) for launcher in launchers]
        if codes != [0] * len(launchers):
            said = f"launcher exited {codes[0]}" if len(codes) == 1 else f"launchers exited {codes}"
            raise SystemExit(f"{timer.run_id}: {said}")
    finally:
        for launcher in launchers:
            if launcher.poll() is None:
                launcher.send_signal(signal.SIGTERM)
                launcher.wait(timeout=60)
        tail.close()


def one_run(
    bootstrap: str, prefix: str, work: Path, args: argparse.Namespace, path: str
) -> dict[str, Any]:
    run_id = f"recovery-{uuid.uuid4().hex[:6]}"
    timer = PhaseTimer(run_id, PHASES if path == "exit_evidence" else PHASES[1:])
    timer.extra["path"] = path
    evidence = [] if path == "exit_evidence" else ["--no-exit-evidence"]
    script = [
        sys.executable, str(REPO / "examples" / "train_ddp.py"),
        "--steps", str(args.steps), "--checkpoint-every", "5",
        "--step-delay-s", str(args.step_delay_s),
    ]  # fmt: skip
    common = [
        "launch", "--bootstrap", bootstrap, "--prefix", prefix, "--run-id", run_id,
        "--checkpoint-dir", str(work / run_id / "ckpt"), *evidence,
        *(["--warm-spares", "--spare-preload", args.spare_preload] if args.warm_spares else []),
    ]  # fmt: skip
    if args.nnodes == 1:
        states = [work / run_id / "state"]
        topologies = [["--nproc", "2"]]
    else:  # one agent per node on loopback, 2 ranks in all: rank 1 is on the last node
        states = [work / run_id / f"node{i}" for i in range(args.nnodes)]
        port = str(29600 + uuid.uuid4().int % 20000)
        topologies = [
            ["--nnodes", str(args.nnodes), "--node-rank", str(i), "--master-addr", "127.0.0.1",
             "--master-port", port, "--nproc-per-node", str(2 // args.nnodes)]
            for i in range(args.nnodes)
        ]  # fmt: skip
    dead_rank_verdicts = 0

    def on_step(event: StepCompleted, stamp: Stamp) -> None:
        if (
            timer.kill_ns is None
            and event.step >= args.kill_at_step
            and spares_ready(states, 2 // args.nnodes, args.warm_spares)
        ):
            timer.kill(states[-1], event.step)  # the agent of rank 1
        elif timer.kill_ns and event.restart_from_step is not None:
            timer.mark("first_step", stamp)
            timer.extra["resumed_from_step"] = event.restart_from_step

    def on_control(phase: str, event: Any) -> None:
        nonlocal dead_rank_verdicts
        if phase == "dead_rank":
            timer.extra.setdefault("culprit_rank", event.rank)
            dead_rank_verdicts += event.incarnation == 0

    follow(
        bootstrap,
        prefix,
        timer,
        lambda: [
            runwatch(
                [*common, *topology, "--state-dir", str(state), "--", *script],
                work / f"{run_id}.{state.name}.log",
            )
            for topology, state in zip(topologies, states, strict=True)
        ],
        args,
        on_step,
        on_control,
    )
    # The killed incarnation's dead_rank verdicts read by the first resumed step (all of them:
    # the controller's RunEnded for it precedes the new gang on the heartbeats topic).
    timer.extra["dead_rank_verdicts"] = dead_rank_verdicts
    return timer.row()


GROUP_PHASES = (
    "rank_exited",
    "dead_rank",
    "command",
    "restart_completed",
    "survivor_step",
    "rejoined",
)


def one_group_run(
    bootstrap: str, prefix: str, work: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """SIGKILL group 1's rank of a torchft run of two groups; time its group restart."""
    run_id = f"recovery-ft-{uuid.uuid4().hex[:6]}"
    timer = PhaseTimer(run_id, GROUP_PHASES)
    timer.extra["path"] = "group_restart"
    state, stop = work / run_id / "state", work / run_id / "stop"
    script = [
        sys.executable, "-u", str(REPO / "examples" / "train_ft.py"), "--steps", "100000",
        "--step-delay-s", str(args.step_delay_s), "--timeout-s", "20", "--stop-file", str(stop),
    ]  # fmt: skip
    launch = [
        "launch", "--bootstrap", bootstrap, "--prefix", prefix, "--run-id", run_id,
        "--state-dir", str(state), "--grace-s", "2",
        "--fault-tolerance", "torchft", "--replica-groups", "2", "--", *script,
    ]  # fmt: skip
    last_before = 0
    after: list[int] = []

    def on_step(event: StepCompleted, stamp: Stamp) -> None:
        nonlocal last_before
        if timer.kill_ns is None:
            last_before = max(last_before, event.step)
            if event.step >= args.kill_at_step and event.participants == (0, 1):
                timer.kill(state, event.step)
            return
        after.append(event.step)
        if 1 not in event.participants:
            timer.mark("survivor_step", stamp)
        elif "restart_completed" in timer.seen:
            timer.mark("rejoined", stamp)
            timer.extra["rejoined_at_step"] = event.step

    def on_control(phase: str, event: Any) -> None:
        if phase == "command":
            timer.extra["action"] = event.action

    def stop_run() -> None:
        (work / run_id / "stop.tmp").write_text(str(max(after) + 5))
        (work / run_id / "stop.tmp").rename(stop)

    follow(
        bootstrap,
        prefix,
        timer,
        lambda: [runwatch(launch, work / f"{run_id}.log")],
        args,
        on_step,
        on_control,
        before_wait=stop_run,
    )
    timer.extra["lost_steps"] = sum(1 for s in set(after) if s <= last_before)
    timer.extra["steps_during_outage"] = len(
        {s for s in after if s < timer.extra["rejoined_at_step"]}
    )
    return timer.row()


def compare(rows: list[dict[str, Any]], settings: dict[str, Any]) -> dict[str, Any]:
    """One line: the medians of the group runs beside those of the gang runs."""
    group = [r for r in rows if r["path"] == "group_restart"]
    gang = [r for r in rows if r["path"] == "exit_evidence"]

    def med(mine: list[dict[str, Any]], key: str) -> float:
        return float(statistics.median(r[key] for r in mine))

    return {
        "bench": "recovery",
        "compare": "group_vs_gang",
        "runs": len(group),
        **settings,
        "group_lost_steps": med(group, "lost_steps"),
        "gang_lost_steps": med(gang, "lost_steps"),
        "group_command_s": med(group, "command_read_s"),
        "gang_command_s": med(gang, "command_read_s"),
        "group_restart_completed_s": med(group, "restart_completed_read_s"),
        "gang_restart_completed_s": med(gang, "restart_completed_read_s"),
        "group_survivor_step_s": med(group, "survivor_step_read_s"),
        "group_rejoined_s": med(group, "rejoined_read_s"),
        "gang_first_step_s": med(gang, "first_step_read_s"),
    }


def print_compare(rows: list[dict[str, Any]], settings: dict[str, Any]) -> None:
    """The group and gang runs side by side, then their JSON lines."""
    line = compare(rows, settings)
    print(f"group restart (torchft, 2 groups) vs gang restart (DCP every 5 steps); {settings}")
    print(f"{'':<38} {'group':>10} {'gang':>10}")
    lost = (line["group_lost_steps"], line["gang_lost_steps"])
    print(f"{'lost steps (redone)':<38} {lost[0]:>10g} {lost[1]:>10g}")
    for label, g, k in (
        ("kill -> command (s)", "group_command_s", "gang_command_s"),
        ("kill -> restart completed (s)", "group_restart_completed_s", "gang_restart_completed_s"),
        ("kill -> next committed step (s)", "group_survivor_step_s", "gang_first_step_s"),
    ):
        print(f"{label:<38} {line[g]:>10.2f} {line[k]:>10.2f}")
    print(f"{'kill -> lost group back (s)':<38} {line['group_rejoined_s']:>10.2f} {'-':>10}")
    for row in rows:
        print(json.dumps({"bench": "recovery", **settings, **row}))
    print(json.dumps(line))


def parse_args() -> argparse.Namespace:
    """The bench's command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap", help="Kafka (default: RUNWATCH_BOOTSTRAP, else embedded)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument(
        "--steps",
        type=int,
        help="steps per run (default 60; 200 with --warm-spares, whose kill waits for the "
        "spares to preload)",
    )
    p.add_argument("--kill-at-step", type=int, default=22)
    p.add_argument("--step-delay-s", type=float, default=0.05)
    p.add_argument("--dead-rank-timeout-s", type=float, default=3.0)
    p.add_argument("--hang-timeout-s", type=float, default=6.0)
    p.add_argument("--tick-interval-s", type=float, default=0.5)
    p.add_argument("--timeout-s", type=float, default=300.0)
    p.add_argument(
        "--warm-spares",
        action="store_true",
        help="launch with --warm-spares (the kill waits until every spare is preloaded)",
    )
    p.add_argument(
        "--spare-preload",
        default=",".join(DEFAULT_SPARE_PRELOAD),
        help="with --warm-spares: what the spares import (runwatch launch --spare-preload)",
    )
    p.add_argument("--keep", type=Path, help="keep logs and state dirs here (default: a temp dir)")
    p.add_argument("--paths", choices=(*PATHS, "both"), default="both")
    p.add_argument(
        "--nnodes",
        type=int,
        choices=(1, 2),
        default=1,
        help="2: one agent per node on loopback (1 rank each), rank 1's node is killed",
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="a torchft group restart against a gang restart (the exit_evidence path)",
    )
    args = p.parse_args()
    if args.steps is None:
        args.steps = 200 if args.warm_spares else 60
    return args


def run_all(args: argparse.Namespace, paths: tuple[str, ...]) -> list[dict[str, Any]]:
    """Every run of ``paths`` (and the group runs with --compare) against one worker."""
    with broker(args.bootstrap) as bootstrap, work_dir(args.keep) as work:
        prefix = f"bench{uuid.uuid4().hex[:8]}"
        admin.create_topics(bootstrap, admin.catalogue(prefix, 2))
        worker = runwatch(
            [
                "processors", "--bootstrap", bootstrap, "--prefix", prefix,
                "--app-id", f"{prefix}-app", "--partitions", "2",
                "--tick-interval", str(args.tick_interval_s), "--session-timeout", "6",
                "--set", f"dead_rank_timeout_s={args.dead_rank_timeout_s}",
                "--set", f"hang_timeout_s={args.hang_timeout_s}",
            ],
            work / "processors.log",
        )  # fmt: skip
        try:
            wait_worker(bootstrap, prefix)
            rows = [
                one_run(bootstrap, prefix, work, args, path)
                for path in paths
                for _ in range(args.runs)
            ]
            if args.compare:
                rows += [one_group_run(bootstrap, prefix, work, args) for _ in range(args.runs)]
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=60)
    for row in rows:
        if row["path"] == "exit_evidence":  # the steps the gang redoes: since its checkpoint
            row["lost_steps"] = row["killed_after_step"] - row["resumed_from_step"]
    return rows


def report(rows: list[dict[str, Any]], paths: tuple[str, ...], settings: dict[str, Any]) -> None:
    """Each path's phases (medians and per run), then a JSON line per run and per path."""
    print(f"recovery after SIGKILL of rank 1 (2 gloo ranks on CPU; {settings})")
    for path in paths:
        mine = [r for r in rows if r["path"] == path]
        print(f"\npath: {path}")
        print(f"{'phase':<20} {'broker ts (s)':>14} {'read (s)':>10}   per run")
        for phase in PHASES:
            if f"{phase}_ts_s" not in mine[0]:
                continue
            ts = [r[f"{phase}_ts_s"] for r in mine]
            read = [r[f"{phase}_read_s"] for r in mine]
            per_run = " ".join(f"{v:.2f}" for v in read)
            print(
                f"{phase:<20} {statistics.median(ts):>14.2f} {statistics.median(read):>10.2f}"
                f"   {per_run}"
            )
        print(f"dead_rank verdicts per kill: {[r['dead_rank_verdicts'] for r in mine]}")
    for row in rows:
        print(json.dumps({"bench": "recovery", **settings, **row}))
    for path in paths:
        mine = [r for r in rows if r["path"] == path]
        medians: dict[str, Any] = {
            f"median_{k}": statistics.median(r[k] for r in mine)
            for k in mine[0]
            if k.endswith("_s") and k != "controller_duration_s"
        }
        medians["median_controller_duration_s"] = statistics.median(
            r["controller_duration_s"] for r in mine
        )
        medians["max_dead_rank_verdicts"] = max(r["dead_rank_verdicts"] for r in mine)
        line = {"bench": "recovery", "path": path, "runs": len(mine), **settings, **medians}
        print(json.dumps(line))


def main() -> int:
    args = parse_args()
    exit_on_sigterm()  # stop the children it started when it is stopped itself
    settings = {
        "dead_rank_timeout_s": args.dead_rank_timeout_s,
        "hang_timeout_s": args.hang_timeout_s,
        "tick_interval_s": args.tick_interval_s,
        "nnodes": args.nnodes,
        "warm_spares": args.warm_spares,
        "spare_preload": args.spare_preload if args.warm_spares else "",
    }
    paths: tuple[str, ...] = PATHS if args.paths == "both" else (args.paths,)
    if args.compare:
        paths = ("exit_evidence",)
    rows = run_all(args, paths)
    if args.compare:
        print_compare(rows, settings)
    else:
        report(rows, paths, settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
