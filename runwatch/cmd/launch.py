"""`runwatch launch`: start a torch gang the way torchrun does and serve its restart commands.

It reads a torchrun command line as it is (`runwatch.cmd._torchrun`: torchrun's flags in
both spellings, the script without ``--``), as well as runwatch's own form
(``--nproc N -- COMMAND``). With ``--log-format`` the script needs no runwatch code: the
launcher turns rank 0's output into the run's events and heartbeats for its live ranks
(`controller.logwatch`).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import secrets
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from runwatch.cmd._supervision import add_supervision_args
from runwatch.cmd._torchrun import (
    DEFAULT_GRACE_S,
    CountDevices,
    LaunchSettings,
    add_torchrun_args,
    translate,
)
from runwatch.common.errors import UsageError
from runwatch.controller.state import DEFAULT_SPARE_PRELOAD, FaultToleranceSpec
from runwatch.controller.topology import PORT_SPAN, NodeTopology, TopologyError, resolve_topology
from runwatch.producers.logtail import FORMATS

if TYPE_CHECKING:
    from runwatch.controller.state import LaunchSpec
    from runwatch.controller.topology import RunBinding

HELP = "start a gang of N ranks (torchrun-style) and execute the restart commands for its run"

log = logging.getLogger("runwatch")


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of `runwatch launch`: one call per group of flags."""
    add_supervision_args(parser)
    _add_gang_args(parser)
    add_torchrun_args(parser)
    _add_node_args(parser)
    _add_watch_args(parser)
    _add_ft_args(parser)
    parser.add_argument(
        "argv",
        nargs=argparse.REMAINDER,
        help="SCRIPT ARGS... (torchrun's form: run with python -u, see -m and --no-python) "
        "or -- COMMAND ARGS...",
    )


def _add_gang_args(parser: argparse.ArgumentParser) -> None:
    """The run, its directories, and how its ranks are stopped and shrunk."""
    parser.add_argument("--nproc", type=int, help="one host: ranks to start")
    parser.add_argument(
        "--run-id",
        help="the run's id (default: --rdzv-id, slurm-<job>.<step> under srun, else "
        "<script>-<time>-<random>; required with --nnodes > 1)",
    )
    parser.add_argument(
        "--launch-id",
        help="this launch's id, which restart commands are bound to (default: "
        "$RUNWATCH_LAUNCH_ID, else a random one on one node; with --nnodes > 1 give every "
        "agent the same, or commands are not bound to the launch)",
    )
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        help="the gang's checkpoint root (RUNWATCH_CHECKPOINT_DIR); respawns resume from it",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        help="controller state (default: $RUNWATCH_HOME/controller/<run-id>, "
        "with several nodes .../<run-id>/node<I>)",
    )
    parser.add_argument(
        "--grace-s",
        type=float,
        help=f"SIGTERM grace before SIGKILL (default: {DEFAULT_GRACE_S:g}; "
        "torchrun's --shutdown-timeout)",
    )
    parser.add_argument(
        "--command-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="a dead gang without a restart command this long fails the run",
    )
    parser.add_argument(
        "--teardown-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop ranks still running this long after every local rank said its training "
        "finished (runwatch.mark_training_done): a hang in the process group's teardown; "
        "they count as finished (default: never, with a warning every minute)",
    )
    parser.add_argument(
        "--rank-failure-budget",
        type=int,
        default=2,
        help="failures a rank may cause; one more shrinks the gang by one rank",
    )
    parser.add_argument("--min-nproc", type=int, default=1, help="never shrink below this")
    parser.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE", help="extra rank variable"
    )


def _add_ft_args(parser: argparse.ArgumentParser) -> None:
    """Per-replica-group fault tolerance (torchft): only a lost group restarts."""
    ft = parser.add_argument_group("fault tolerance by replica groups (torchft)")
    ft.add_argument(
        "--fault-tolerance",
        choices=("torchft",),
        help="start a torchft Lighthouse and the ranks as replica groups; a lost group is "
        "restarted alone and heals from a live peer",
    )
    ft.add_argument(
        "--replica-groups",
        type=int,
        metavar="N",
        help="replica groups of the run (with --nnodes M: N / M on each node, node 0 serving "
        "the Lighthouse at --master-port + 16)",
    )
    ft.add_argument(
        "--nproc-per-group", type=int, default=1, metavar="K", help="ranks per replica group"
    )
    ft.add_argument(
        "--min-replicas",
        type=int,
        default=1,
        metavar="M",
        help="fewest groups a step commits with; a restart that would leave fewer "
        "stepping restarts the gang",
    )
    ft.add_argument(
        "--min-replicas-bound-s",
        type=float,
        metavar="S",
        help="let the survivors step below --min-replicas (torchft's quorum needs one "
        "group) for at most S seconds of log time; longer restarts the gang",
    )


def fault_tolerance(args: argparse.Namespace) -> FaultToleranceSpec | None:
    """``--fault-tolerance`` and its flags as the spec's part, checked.

    Raises:
        UsageError: A bad combination (one line).
    """
    if args.fault_tolerance is None:
        if args.replica_groups is not None:
            raise UsageError("--replica-groups goes with --fault-tolerance torchft")
        return None
    groups, per_group, least = args.replica_groups, args.nproc_per_group, args.min_replicas
    if groups is None or groups < 1:
        raise UsageError("--fault-tolerance torchft needs --replica-groups N (N >= 1)")
    if per_group < 1 or not 1 <= least <= groups:
        raise UsageError(
            f"--nproc-per-group must be >= 1 and --min-replicas in 1..{groups}, got "
            f"{per_group} and {least}"
        )
    if args.nproc is not None and args.nproc != groups * per_group:
        raise UsageError(
            f"--nproc {args.nproc} is not --replica-groups x --nproc-per-group "
            f"({groups} x {per_group}): give one or the other"
        )
    bound_s = args.min_replicas_bound_s
    if bound_s is not None and not 1.0 <= bound_s <= 86_400.0:
        raise UsageError(f"--min-replicas-bound-s must be in 1..86400 s, got {bound_s:g}")
    return FaultToleranceSpec(
        replica_groups=groups,
        nproc_per_group=per_group,
        min_replicas=least,
        min_replicas_bound_s=bound_s,
    )


def _add_node_args(parser: argparse.ArgumentParser) -> None:
    """The flags of a gang of several nodes that are runwatch's own (torchrun's: its group)."""
    nodes = parser.add_argument_group("several nodes (one agent per node)")
    nodes.add_argument(
        "--min-nnodes",
        type=int,
        help="a restart may go on with this many nodes when others are lost, if the run's "
        "backend declares reshardable checkpoints and elastic restarts (default: --nnodes, "
        "never shrink: a lost node fails the run)",
    )
    nodes.add_argument(
        "--node-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="on a restart, how long an agent waits for the other nodes' agents; one not "
        "heard from is lost",
    )
    nodes.add_argument(
        "--node-failure-budget",
        type=int,
        default=2,
        metavar="N",
        help="restarts a node may cause (its rank named by the dead_rank or hang verdict); "
        "one more and it is dropped like a lost node, when --min-nnodes and the backend allow",
    )


def _add_watch_args(parser: argparse.ArgumentParser) -> None:
    """How the ranks are watched and restarted: log lines, exit evidence, relay, spares."""
    parser.add_argument(
        "--log-format",
        choices=FORMATS,
        help="the script only prints: turn rank 0's step lines into step events (nanogpt: "
        "`iter 12: loss 3.1, time 250.00ms` or `step 12 | loss: 3.1 | ... | dt: 250.00ms`; "
        "seed: `step: 12, loss: 3.1, dt: 0.25`; regex: see --log-regex) and send RunStarted "
        "and the live ranks' heartbeats for it",
    )
    parser.add_argument(
        "--log-regex",
        metavar="PATTERN",
        help="for --log-format regex: a Python regex with named groups step and loss, "
        "optionally step_time_s or dt (seconds) or time_ms, grad_norm and tokens",
    )
    parser.add_argument(
        "--tokens-per-step",
        type=int,
        default=0,
        metavar="N",
        help="with --log-format: tokens the whole gang processes per step, for lines that "
        "do not say (MFU needs it)",
    )
    parser.add_argument(
        "--no-exit-evidence",
        dest="exit_evidence",
        action="store_false",
        help="do not publish rank exits (RankExited) to the heartbeats topic: the processors "
        "then learn of a dead rank only from its silence (dead_rank_timeout_s)",
    )
    parser.add_argument(
        "--relay",
        action="store_true",
        help="the ranks hand their events to this agent over a Unix socket in the state dir "
        "(RUNWATCH_RELAY_SOCKET) instead of running Kafka clients; the agent packs each run's "
        "heartbeats and produces with the node's one Kafka producer",
    )
    parser.add_argument(
        "--warm-spares",
        action="store_true",
        help="keep one process per local rank slot with torch imported, waiting to become a "
        "rank of the next incarnation: a restart skips the ranks' interpreter start and "
        "imports (the command must be `python [flags] script.py ...` or `python -m module`)",
    )
    parser.add_argument(
        "--spare-preload",
        default=",".join(DEFAULT_SPARE_PRELOAD),
        metavar="MODULES",
        help="with --warm-spares: comma-separated modules a spare imports while it waits "
        "(default %(default)s; add the script's own heavy imports)",
    )


def default_run_id(argv: list[str]) -> str:
    """``<script stem or module>-<yyyymmdd-hhmmss>-<4 hex>``."""
    if "-m" in argv[:-1]:
        script = argv[argv.index("-m") + 1].rpartition(".")[2]
    else:
        script = next((a for a in argv if a.endswith(".py")), argv[0])
    stem = Path(script).stem or "run"
    return f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def count_devices(kind: str) -> int:
    """``--nproc-per-node cpu|gpu|xpu|auto`` counted on this host, as torchrun counts them.

    Raises:
        UsageError: The kind of device is not available here (or torch is not installed).
    """
    if kind == "cpu":
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    try:
        import torch
    except ImportError:
        raise UsageError(f"--nproc-per-node {kind} counts devices with torch: not here") from None
    if kind == "auto":
        if not torch.accelerator.is_available():
            return count_devices("cpu")
        return int(torch.accelerator.device_count())
    module = torch.cuda if kind == "gpu" else torch.xpu
    if not module.is_available():
        raise UsageError(f"--nproc-per-node {kind}: no {kind.upper()} is available on this host")
    return int(module.device_count())


@dataclass(frozen=True)
class LaunchPlan:
    """Where this agent stands: its node, the run, its state directory, its command.

    Attributes:
        topology: This node's place in the gang.
        run_id: The run (the same on every node).
        state_dir: This agent's own state directory.
        settings: What the command line asks for (`runwatch.cmd._torchrun.translate`).
    """

    topology: NodeTopology
    run_id: str
    state_dir: Path
    settings: LaunchSettings


def resolve(
    args: argparse.Namespace,
    environ: Mapping[str, str],
    *,
    devices: CountDevices = count_devices,
) -> LaunchPlan:
    """This agent's topology, run id and state directory from the flags and SLURM.

    Args:
        args: The parsed command line.
        environ: The launcher's environment (SLURM's and torchrun's ``PET_*`` variables).
        devices: Counts ``--nproc-per-node cpu|gpu|xpu|auto``.

    Raises:
        UsageError: A bad combination (one line).
    """
    from runwatch.controller.state import default_state_dir

    ft = fault_tolerance(args)
    ft_nodes = 1
    if ft is not None:  # the node's ranks are its groups'
        args, ft_nodes = _ft_sizes(args, ft, environ)
    settings = translate(args, environ, python=sys.executable, count_devices=devices)
    try:
        resolved = resolve_topology(environ, **settings.topology_args())
    except TopologyError as exc:
        raise UsageError(str(exc)) from None
    topology = resolved.topology
    if ft is not None and topology.nnodes != ft_nodes:
        raise UsageError(
            f"--fault-tolerance torchft spreads its groups over the nodes --nnodes names; "
            f"give --nnodes {topology.nnodes} (the {topology.source} topology has "
            f"{topology.nnodes} nodes)"
        )
    if ft is not None and ft_nodes > 1 and topology.master_port + PORT_SPAN + 1 > 65535:
        raise UsageError(
            f"--master-port {topology.master_port} leaves no room for the torchft Lighthouse "
            f"(--master-port + {PORT_SPAN} and the next port)"
        )
    given = (settings.nproc, settings.nnodes, settings.nproc_per_node)
    if given == (None, None, None) and topology.source != "slurm":
        raise UsageError("give --nproc N (one host) or --nproc-per-node K (one node of several)")
    several = topology.nnodes > 1
    if several and resolved.run_id is None:
        raise UsageError(
            f"--nnodes {topology.nnodes} needs --run-id or --rdzv-id (every node's agent names "
            f"the same run)"
        )
    if several and args.log_format is not None:
        raise UsageError("--log-format reads rank 0's output on one host: it needs --nnodes 1")
    run_id = resolved.run_id or default_run_id(list(settings.command))
    state_dir = args.state_dir or default_state_dir(run_id)
    if several and args.state_dir is None:
        state_dir = state_dir / f"node{topology.node_rank}"
    return LaunchPlan(
        topology=topology, run_id=run_id, state_dir=state_dir.resolve(), settings=settings
    )


def _ft_sizes(
    args: argparse.Namespace, ft: FaultToleranceSpec, environ: Mapping[str, str]
) -> tuple[argparse.Namespace, int]:
    """The ranks this node starts for its replica groups, and the nodes they spread over.

    One node: ``--nproc`` is every group's ranks. ``--nnodes N`` (N > 1): each node's agent
    starts ``--replica-groups / N`` groups, ``--nproc-per-node`` is their ranks.

    Raises:
        UsageError: Groups that do not divide evenly over the nodes, an elastic node
            count, or a ``--nproc-per-node`` that says otherwise.
    """
    raw = args.nnodes if args.nnodes is not None else environ.get("PET_NNODES")
    low, _, high = str(raw or "1").partition(":")
    try:
        nodes, least = int(high or low), int(low)
    except ValueError:
        raise UsageError(f"--nnodes must be N or MIN:MAX, got {raw!r}") from None
    if least != nodes or (args.min_nnodes is not None and args.min_nnodes != nodes):
        raise UsageError(
            "--fault-tolerance torchft restarts lost replica groups, not nodes: an elastic "
            "--nnodes MIN:MAX or --min-nnodes does not go with it"
        )
    size = ft.replica_groups * ft.nproc_per_group
    if nodes <= 1:
        return argparse.Namespace(**{**vars(args), "nproc": size}), 1
    if ft.replica_groups % nodes:
        raise UsageError(
            f"--replica-groups {ft.replica_groups} must be a multiple of --nnodes {nodes} "
            f"(each node's agent runs as many groups)"
        )
    per_node = size // nodes
    given = args.nproc_per_node
    if given is not None and str(given) != str(per_node):
        raise UsageError(
            f"--nproc-per-node {given} is not --replica-groups / --nnodes x --nproc-per-group "
            f"= {per_node}"
        )
    return argparse.Namespace(**{**vars(args), "nproc_per_node": str(per_node)}), nodes


_LAUNCH_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


def launch_id_for(given: str | None, nnodes: int) -> str:
    """This launch's id: the one given, else a random one on one node, else none.

    Several nodes' agents must share it (each checks the commands against its own), and
    they cannot agree on a random one without talking; so with more than one node it is
    the operator's (``--launch-id``, e.g. one ``uuidgen`` in the job script), and without
    it commands are not bound to the launch (a WARNING says so).

    Args:
        given: ``--launch-id`` or ``$RUNWATCH_LAUNCH_ID``; None or empty: not given.
        nnodes: Nodes in the gang.

    Returns:
        The id; empty when there is none.

    Raises:
        UsageError: The id given is not 1-64 of ``A-Z a-z 0-9 . _ -``.
    """
    if given:
        if not _LAUNCH_ID.fullmatch(given):
            raise UsageError(f"--launch-id must be 1-64 of A-Z a-z 0-9 . _ -, got {given!r}")
        return given
    return secrets.token_hex(8) if nnodes == 1 else ""


def _validate(args: argparse.Namespace, settings: LaunchSettings) -> None:
    argv = settings.command
    if args.min_nproc < 1 or args.rank_failure_budget < 0:
        raise UsageError("--min-nproc must be >= 1, --rank-failure-budget >= 0")
    if settings.grace_s < 0 or args.command_timeout <= 0:
        raise UsageError("--grace-s must be >= 0 and --command-timeout > 0")
    if args.teardown_timeout is not None and not args.teardown_timeout > 0:
        raise UsageError(f"--teardown-timeout must be > 0, got {args.teardown_timeout:g}")
    if args.node_failure_budget < 0:
        raise UsageError(f"--node-failure-budget must be >= 0, got {args.node_failure_budget}")
    if not args.node_timeout > 0:
        raise UsageError(f"--node-timeout must be > 0, got {args.node_timeout}")
    for pair in args.env:
        if "=" not in pair:
            raise UsageError(f"--env expects NAME=VALUE, got {pair!r}")
    if args.warm_spares:
        from runwatch.controller.spares import split_python

        if split_python(argv) is None:
            raise UsageError(
                "--warm-spares needs a Python command (`python [flags] script.py ...` or "
                f"`python -m module ...`), got {' '.join(argv[:3])!r}"
            )
    if args.log_format is None:
        if args.log_regex is not None or args.tokens_per_step:
            raise UsageError("--log-regex and --tokens-per-step go with --log-format")
    else:
        from runwatch.producers.logtail import make_parser

        try:
            make_parser(args.log_format, args.log_regex)
        except ValueError as exc:
            message = (
                str(exc).replace("--regex", "--log-regex").replace("--format ", "--log-format ")
            )
            raise UsageError(message) from None
        if args.tokens_per_step < 0:
            raise UsageError(f"--tokens-per-step must be >= 0, got {args.tokens_per_step}")


def _rank_extra_env(args: argparse.Namespace) -> dict[str, str]:
    env = dict(pair.split("=", 1) for pair in args.env)
    if args.log_format is not None:
        # Python block-buffers a redirected stdout: without this the step lines would reach
        # the log file (and the processors) in 4 KiB bursts. An explicit --env wins.
        env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _spec(args: argparse.Namespace, plan: LaunchPlan, run: RunBinding) -> LaunchSpec:
    """What this agent is asked to do, from the flags (what happens goes in the record)."""
    from runwatch.controller.launcher import HOST
    from runwatch.controller.loop import commands_end_offsets
    from runwatch.controller.relay import relay_socket_path
    from runwatch.controller.state import LaunchSpec, LogWatchSpec, WarmSparesSpec

    relay = str(relay_socket_path(plan.state_dir)) if args.relay else None
    log_watch = None
    if args.log_format is not None:
        log_watch = LogWatchSpec(
            format=args.log_format, regex=args.log_regex, tokens_per_step=args.tokens_per_step
        )
    warm_spares = None
    if args.warm_spares:
        preload = tuple(m.strip() for m in args.spare_preload.split(",") if m.strip())
        warm_spares = WarmSparesSpec(preload=preload)
    return LaunchSpec(
        run=msgspec.structs.replace(
            run,
            checkpoint_dir=str(args.checkpoint_dir.resolve()) if args.checkpoint_dir else None,
            relay_socket=relay,
        ),
        argv=plan.settings.command,
        env=_rank_extra_env(args),
        topology=plan.topology,
        host=HOST,
        launch_offsets=commands_end_offsets(run.bootstrap, run.prefix),
        grace_s=plan.settings.grace_s,
        command_timeout_s=args.command_timeout,
        teardown_timeout_s=args.teardown_timeout,
        rank_failure_budget=args.rank_failure_budget,
        min_nproc=args.min_nproc,
        node_timeout_s=args.node_timeout,
        node_failure_budget=args.node_failure_budget,
        exit_evidence=args.exit_evidence,
        log_watch=log_watch,
        warm_spares=warm_spares,
        fault_tolerance=fault_tolerance(args),
    )


def run(args: argparse.Namespace) -> int:
    """Launch the gang, then serve its commands until the run ends."""
    from runwatch.admin import warn_if_no_authorizer
    from runwatch.common.settings import KafkaAuth, ranks_share_the_launchers_login, topic_prefix
    from runwatch.controller.agent import build_controller, load_keys
    from runwatch.controller.gang import Gang
    from runwatch.controller.settings import AgentEnv
    from runwatch.controller.state import ControllerState, GangFile, StateLocked, lock_state_dir
    from runwatch.controller.topology import RunBinding
    from runwatch.resolve import resolve_bootstrap

    plan = resolve(args, os.environ)
    _validate(args, plan.settings)
    topology, run_id, state_dir = plan.topology, plan.run_id, plan.state_dir
    for line in plan.settings.no_effect:
        log.warning("runwatch launch: %s (no effect)", line)
    bootstrap = resolve_bootstrap(args.bootstrap)
    prefix = topic_prefix(args.prefix)
    warn_if_no_authorizer(bootstrap, prefix, "controller")
    if ranks_share_the_launchers_login(os.environ):
        logging.getLogger("runwatch.controller").warning(
            "the ranks log in to Kafka with the launcher's own credential (%s): set "
            "RUNWATCH_TRAINER_SASL_USERNAME and RUNWATCH_TRAINER_SASL_PASSWORD to give them "
            "the trainer's (docs/security.md)",
            KafkaAuth.from_env().sasl_username,
        )
    try:
        lock_state_dir(state_dir)
    except StateLocked as exc:
        raise UsageError(str(exc)) from None
    state = ControllerState(state_dir)
    keys = load_keys()
    previous = state.load_gang()
    if previous is not None and previous.record.status == "running":
        ranks = previous.record.ranks
        exits = [state.exit_path(previous.record.incarnation, p.rank) for p in ranks]
        if Gang.adopt(ranks, exits).running():
            raise UsageError(
                f"{state_dir} holds a running gang of run {previous.spec.run_id} (pids "
                f"{[p.pid for p in ranks]}): adopt it with `runwatch controller "
                f"--state-dir {state_dir}`"
            )
    launch_id = launch_id_for(args.launch_id or AgentEnv.from_env().launch_id, topology.nnodes)
    if not launch_id:
        log.warning(
            "runwatch launch: no --launch-id on a %d-node launch: restart commands are not "
            "bound to this launch (a command signed for an earlier launch of run %s would "
            "be obeyed); give every agent the same --launch-id",
            topology.nnodes,
            run_id,
        )
    binding = RunBinding(run_id=run_id, bootstrap=bootstrap, prefix=prefix, launch_id=launch_id)
    spec = _spec(args, plan, binding)
    # A relaunch of a run id continues its incarnations: the processors' policy issues at
    # most one command per (run, incarnation), so incarnation 0 again would get none.
    first = 0 if previous is None else previous.record.incarnation + 1
    state.save_gang(GangFile(spec=spec, record=spec.first_record(first)))
    controller, (supervisor,) = build_controller([state], keys, bootstrap, prefix)
    supervisor.launch(None)
    print(
        f"runwatch launch: run {run_id}, node {topology.node_rank} of {topology.nnodes}, "
        f"ranks {list(topology.global_ranks)} of {topology.world_size}, incarnation "
        f"{first}, launch {launch_id or '(none)'}, state {state_dir} (pid {os.getpid()})"
        + (f", events from rank 0's {args.log_format} log lines" if args.log_format else ""),
        flush=True,
    )
    return controller.serve()
