"""torchrun's command line as `runwatch launch` reads it: flags in, launch settings out.

Replacing ``torchrun`` with ``runwatch launch`` in a job script keeps the line's meaning:
`add_torchrun_args` gives the launcher torchrun's flags in both spellings
(``--nproc-per-node``/``--nproc_per_node``), with the defaults torchrun reads from its
``PET_*`` variables (``PET_NPROC_PER_NODE``, as a Kubeflow PyTorchJob sets them), and the
script may follow the flags without ``--``. `translate` turns the parsed flags into
`LaunchSettings`: what `controller.topology.resolve_topology` is given, the command each
rank runs, and the SIGTERM grace. Pure: no process, no clock, no torch (device counts are
asked of a callable).

The rules, numbered as in the code:

Command

1. ``--`` first: runwatch's own form, the command as given; torchrun's ``-m``,
   ``--no-python`` and ``--run-path`` shape a script given without ``--`` and are refused.
2. Otherwise torchrun's form: the first word is the script, the rest its arguments, run
   as torchrun runs them: ``PYTHON -u SCRIPT ARGS`` (``--run-path`` too),
   ``PYTHON -u -m MODULE ARGS`` with ``-m``, ``SCRIPT ARGS`` with ``--no-python`` (not with
   ``-m``). PYTHON is ``PYTHON_EXEC``, else the interpreter running runwatch.

Sizes

3. ``--nnodes N``; ``--nnodes MIN:MAX`` is ``--nnodes MAX --min-nnodes MIN``: the gang
   starts on MAX nodes and a restart may go on with MIN (runwatch's elasticity is by whole
   nodes at a restart, see docs/controller.md); a ``--min-nnodes`` that says otherwise is
   refused.
4. ``--nproc-per-node K``, or ``cpu``, ``gpu``, ``xpu``, ``auto`` counted on this host as
   torchrun counts them.
5. torchrun's form with no size at all, outside an ``srun`` step: one rank (torchrun's
   default). runwatch's form keeps asking for ``--nproc`` or ``--nproc-per-node``.

Rendezvous (runwatch's ranks meet in torch's TCP store, served by global rank 0 at
``MASTER_ADDR:MASTER_PORT``; see `controller.topology` for the port of each incarnation)

6. ``--rdzv-backend`` is ``static`` (torchrun's default) or ``c10d``; any other (``etcd``,
   ``etcd-v2``, a plugin) is refused: its rendezvous cannot be a store on node 0.
7. ``--standalone``: one node on this host, a free port per incarnation; a ``--nnodes``
   above 1 is refused, and ``--rdzv-backend``, ``--rdzv-endpoint`` and ``--rdzv-id`` are
   ignored, as torchrun ignores them.
8. ``--rdzv-endpoint HOST[:PORT]`` is ``--master-addr HOST --master-port PORT`` (c10d's
   default port 29400; static needs one, as in torchrun; port 0: a free port, one node
   only); a ``--master-addr`` or ``--master-port`` that says otherwise is refused. HOST
   must be node 0's: rank 0 serves the store there.
9. c10d on several nodes numbers the nodes in the order they join; runwatch's node ranks
   are fixed, so each node needs ``--node-rank`` (or SLURM's): said in the error.
10. ``--rdzv-id`` is the run id (``--run-id``); a ``--run-id`` that says otherwise is
    refused.

The rest

11. ``--max-restarts`` and ``--role`` as given; ``--shutdown-timeout`` is ``--grace-s`` (a
    ``--grace-s`` that says otherwise is refused).
12. `NO_EFFECT` flags (torchrun's console output, its agent's internals) are accepted and
    have no effect here, each said once in the launcher's log with why; `REFUSED` flags,
    and ``--signals-to-handle`` naming a signal beyond torchrun's default, are refused.

Every refusal is one line that says why (a `common.errors.UsageError`).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from runwatch.common.errors import UsageError
from runwatch.common.launch_env import ROLE_NAME
from runwatch.controller.topology import in_srun_step

DEFAULT_GRACE_S = 10.0
"""``--grace-s`` when neither it nor ``--shutdown-timeout`` is given."""
C10D_DEFAULT_PORT = 29400
"""The port of a c10d ``--rdzv-endpoint`` that names none (torchrun's)."""
BACKENDS = ("static", "c10d")
"""The ``--rdzv-backend`` values that mean a store on node 0 (rule 6)."""
DEVICE_KINDS = ("cpu", "gpu", "xpu", "auto")
"""``--nproc-per-node`` values counted on this host (rule 4)."""
DEFAULT_SIGNALS = frozenset({"SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"})
"""torchrun's ``--signals-to-handle``: naming no other signal has no effect here (rule 12)."""

CountDevices = Callable[[str], int]
"""``kind -> count`` of one of `DEVICE_KINDS` on this host (raises `UsageError` if none)."""


@dataclass(frozen=True)
class TorchrunFlag:
    """A torchrun flag that maps to nothing here: accepted with no effect, or refused.

    Attributes:
        names: Its spellings (torchrun's, both).
        why: Why it has no effect, or why it is refused (completes "FLAG: ...").
        takes_value: False for a switch.
    """

    names: tuple[str, ...]
    why: str
    takes_value: bool = True

    @property
    def dest(self) -> str:
        """The attribute argparse stores it under (``torchrun_`` + torchrun's dest)."""
        long = next(name for name in self.names if name.startswith("--"))
        return "torchrun_" + long[2:].replace("-", "_")


_OUTPUT = "runwatch writes each rank's output to <state>/logs/inc<I>.rank<R>.log"
_NO_AGENT_RENDEZVOUS = "there is no agent rendezvous here: the ranks meet at --master-addr"

NO_EFFECT: tuple[TorchrunFlag, ...] = (
    TorchrunFlag(("--log-dir", "--log_dir"), _OUTPUT),
    TorchrunFlag(("-r", "--redirects"), _OUTPUT),
    TorchrunFlag(("-t", "--tee"), _OUTPUT),
    TorchrunFlag(("--log-line-prefix-template", "--log_line_prefix_template"), _OUTPUT),
    TorchrunFlag(("--local-ranks-filter", "--local_ranks_filter"), _OUTPUT),
    TorchrunFlag(("--duplicate-stdout-filters", "--duplicate_stdout_filters"), _OUTPUT),
    TorchrunFlag(("--duplicate-stderr-filters", "--duplicate_stderr_filters"), _OUTPUT),
    TorchrunFlag(("--logs-specs", "--logs_specs"), _OUTPUT),
    TorchrunFlag(
        ("--monitor-interval", "--monitor_interval"),
        "runwatch's agent looks at its ranks every 100 ms",
    ),
    TorchrunFlag(
        ("--start-method", "--start_method"),
        "a command line is always started as a new process (in torchrun too)",
    ),
    TorchrunFlag(("--event-log-handler", "--event_log_handler"), "runwatch's events go to Kafka"),
    TorchrunFlag(("--rdzv-conf", "--rdzv_conf"), _NO_AGENT_RENDEZVOUS),
    TorchrunFlag(("--local-addr", "--local_addr"), _NO_AGENT_RENDEZVOUS),
)
"""torchrun flags accepted with no effect (rule 12)."""

REFUSED: tuple[TorchrunFlag, ...] = (
    TorchrunFlag(
        ("--numa-binding", "--numa_binding"),
        "runwatch does not bind ranks to NUMA nodes (put numactl in the command instead)",
    ),
    TorchrunFlag(
        ("--virtual-local-rank", "--virtual_local_rank"),
        "runwatch gives LOCAL_RANK = the rank's index on its node and leaves "
        "CUDA_VISIBLE_DEVICES as it is",
        takes_value=False,
    ),
)
"""torchrun flags refused (rule 12)."""


@dataclass(frozen=True, kw_only=True)
class LaunchSettings:
    """What a `runwatch launch` command line asks for, in runwatch's terms.

    The sizes and places are `controller.topology.resolve_topology`'s arguments (None: not
    given, SLURM's or the default applies there).

    Attributes:
        command: What each rank runs.
        torchrun_form: True when the command came in torchrun's form (no ``--``).
        nproc: ``--nproc``: one host, this many ranks.
        nnodes: Nodes in the gang.
        min_nnodes: The fewest nodes a restart may go on with.
        node_rank: This node's index.
        nproc_per_node: Ranks this node starts.
        master_addr: Host of node 0.
        master_port: Base rendezvous port (0: a free one per incarnation, one node).
        max_restarts: Restart commands to execute; None: no limit.
        run_id: The run id.
        role: torchrun's ``ROLE_NAME``.
        grace_s: SIGTERM grace before SIGKILL.
        no_effect: One line per torchrun flag given that has no effect here, with why.
    """

    command: tuple[str, ...]
    torchrun_form: bool = False
    nproc: int | None = None
    nnodes: int | None = None
    min_nnodes: int | None = None
    node_rank: int | None = None
    nproc_per_node: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    max_restarts: int | None = None
    run_id: str | None = None
    role: str = ROLE_NAME
    grace_s: float = DEFAULT_GRACE_S
    no_effect: tuple[str, ...] = ()

    def topology_args(self) -> dict[str, Any]:
        """The keyword arguments of `controller.topology.resolve_topology`."""
        return {
            "nproc": self.nproc,
            "nnodes": self.nnodes,
            "node_rank": self.node_rank,
            "nproc_per_node": self.nproc_per_node,
            "master_addr": self.master_addr,
            "master_port": self.master_port,
            "min_nnodes": self.min_nnodes,
            "max_restarts": self.max_restarts,
            "run_id": self.run_id,
            "role": self.role,
        }


# --------------------------------------------------------------------------- the flags


def add_torchrun_args(parser: argparse.ArgumentParser) -> None:
    """Add torchrun's flags (both spellings) to `runwatch launch`'s parser.

    Every flag defaults to None so that `translate` can tell a flag given from one not
    given (and then read torchrun's ``PET_*`` variable).
    """
    g = parser.add_argument_group(
        "torchrun's flags (replace `torchrun` with `runwatch launch`: the script may follow "
        "them without --; under srun the defaults come from SLURM)"
    )
    g.add_argument(
        "--nnodes",
        metavar="N|MIN:MAX",
        help="nodes in the gang, one agent each (SLURM_NNODES); MIN:MAX starts MAX and lets "
        "a restart go on with MIN (--min-nnodes)",
    )
    g.add_argument(
        "--nproc-per-node",
        "--nproc_per_node",
        metavar="K|cpu|gpu|xpu|auto",
        help="ranks this node starts (SLURM_GPUS_ON_NODE, else SLURM_NTASKS_PER_NODE; "
        "torchrun's form: 1)",
    )
    g.add_argument(
        "--node-rank",
        "--node_rank",
        type=int,
        metavar="I",
        help="this node's index (SLURM_PROCID / SLURM_NODEID)",
    )
    g.add_argument(
        "--master-addr",
        "--master_addr",
        metavar="HOST",
        help="host of node 0 (the first host of SLURM_JOB_NODELIST)",
    )
    g.add_argument(
        "--master-port",
        "--master_port",
        type=int,
        metavar="PORT",
        help="base rendezvous port; incarnation I uses PORT + I %% 16 (default 29500; "
        "SLURM: MASTER_PORT or derived from SLURM_JOB_ID; one host: a free port)",
    )
    g.add_argument(
        "--max-restarts",
        "--max_restarts",
        type=int,
        metavar="M",
        help="restart commands to execute; one more fails the run (default: no limit; "
        "torchrun's is 0: give 0 for its behaviour)",
    )
    _add_rendezvous_args(g)
    _add_command_args(g)
    for flag in (*NO_EFFECT, *REFUSED):
        why = ("no effect: " if flag in NO_EFFECT else "refused: ") + flag.why
        if flag.takes_value:
            g.add_argument(*flag.names, dest=flag.dest, metavar="VALUE", help=why)
        else:
            g.add_argument(*flag.names, dest=flag.dest, action="store_true", default=None, help=why)


def _add_rendezvous_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--rdzv-backend",
        "--rdzv_backend",
        metavar="static|c10d",
        help="both mean a TCP store served by rank 0 at the endpoint (etcd is refused)",
    )
    g.add_argument(
        "--rdzv-endpoint",
        "--rdzv_endpoint",
        metavar="HOST[:PORT]",
        help="node 0's host and the rendezvous port (--master-addr, --master-port; c10d's "
        "default port 29400)",
    )
    g.add_argument("--rdzv-id", "--rdzv_id", metavar="ID", help="the run id (--run-id)")
    g.add_argument(
        "--standalone",
        action="store_true",
        default=None,
        help="one node on this host, a free port (--rdzv-* are ignored, as in torchrun)",
    )
    g.add_argument("--role", metavar="NAME", help="the ranks' ROLE_NAME (default: default)")
    g.add_argument(
        "--shutdown-timeout",
        "--shutdown_timeout",
        type=float,
        metavar="SECONDS",
        help="the same as --grace-s",
    )
    g.add_argument(
        "--signals-to-handle",
        "--signals_to_handle",
        metavar="SIGNALS",
        help="no effect for torchrun's default signals (runwatch's agent stops the gang on "
        "SIGTERM and SIGINT); any other signal is refused",
    )


def _add_command_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "-m",
        "--module",
        action="store_true",
        default=None,
        help="run SCRIPT as a module: python -u -m SCRIPT ARGS",
    )
    g.add_argument(
        "--no-python",
        "--no_python",
        action="store_true",
        default=None,
        help="run SCRIPT itself, not with python",
    )
    g.add_argument(
        "--run-path",
        "--run_path",
        action="store_true",
        default=None,
        help="run SCRIPT with python (torchrun runs it with runpy in its worker)",
    )


# --------------------------------------------------------------------------- translation


class _Given:
    """A torchrun flag's value: the flag, else its ``PET_*`` variable, else None."""

    def __init__(self, args: argparse.Namespace, environ: Mapping[str, str]) -> None:
        self.args = args
        self.environ = environ

    def text(self, dest: str) -> str | None:
        value = getattr(self.args, dest, None)
        if value is not None:
            return str(value)
        return self.environ.get("PET_" + dest.upper()) or None

    def number(self, dest: str) -> int | None:
        text = self.text(dest)
        if text is None:
            return None
        try:
            return int(text)
        except ValueError:
            raise UsageError(f"--{_flag(dest)} must be an integer, got {text!r}") from None

    def switch(self, dest: str) -> bool:
        value = getattr(self.args, dest, None)
        if value is not None:
            return bool(value)
        raw = self.environ.get("PET_" + dest.upper(), "0")
        return raw.strip().lower() not in ("", "0", "false")


def _flag(dest: str) -> str:
    return dest.replace("_", "-")


def translate(
    args: argparse.Namespace,
    environ: Mapping[str, str],
    *,
    python: str,
    count_devices: CountDevices,
) -> LaunchSettings:
    """The launch settings `runwatch launch`'s parsed flags ask for (the module's rules).

    Args:
        args: The parsed command line (`add_torchrun_args` and runwatch's own flags; the
            command in ``args.argv``).
        environ: The launcher's environment (torchrun's ``PET_*`` defaults, ``PYTHON_EXEC``,
            whether this is an ``srun`` step).
        python: The interpreter of torchrun's form when ``PYTHON_EXEC`` is not set.
        count_devices: Counts ``cpu``/``gpu``/``xpu``/``auto`` for ``--nproc-per-node``.

    Returns:
        The settings.

    Raises:
        UsageError: A flag that cannot mean here what it means to torchrun, or a bad
            combination (one line, saying why).
    """
    given = _Given(args, environ)
    _refuse(given)
    command, torchrun_form = _command(list(args.argv), given, environ.get("PYTHON_EXEC") or python)
    nnodes, min_nnodes = _nnodes(given.text("nnodes"), args.min_nnodes)
    nproc_per_node = _nproc_per_node(given.text("nproc_per_node"), count_devices)
    sized = (args.nproc, nnodes, nproc_per_node) != (None, None, None)
    if torchrun_form and not sized and not in_srun_step(environ):  # rule 5
        nproc_per_node = 1
    place = _rendezvous(given, nnodes, environ)
    if place.one_node and args.nproc is None:  # rule 7: not SLURM's node count either
        nnodes = 1
    return LaunchSettings(
        command=tuple(command),
        torchrun_form=torchrun_form,
        nproc=args.nproc,
        nnodes=nnodes,
        min_nnodes=min_nnodes,
        node_rank=place.node_rank,
        nproc_per_node=nproc_per_node,
        master_addr=place.master_addr,
        master_port=place.master_port,
        max_restarts=given.number("max_restarts"),  # rule 11
        run_id=_run_id(args.run_id, place.rdzv_id),
        role=given.text("role") or ROLE_NAME,
        grace_s=_grace_s(args.grace_s, given),
        no_effect=tuple(
            f"{' '.join(flag.names)}: {flag.why}"
            for flag in NO_EFFECT
            if getattr(args, flag.dest, None) is not None
        ),
    )


def _refuse(given: _Given) -> None:
    """Rule 12: the flags that cannot mean here what they mean to torchrun."""
    for flag in REFUSED:
        if getattr(given.args, flag.dest, None) is not None:
            raise UsageError(f"{flag.names[0]}: {flag.why}")
    if given.switch("virtual_local_rank"):  # PET_VIRTUAL_LOCAL_RANK=1
        raise UsageError(f"PET_VIRTUAL_LOCAL_RANK: {REFUSED[1].why}")
    signals = given.text("signals_to_handle")
    if signals is not None:
        extra = sorted({s.strip() for s in signals.split(",") if s.strip()} - DEFAULT_SIGNALS)
        if extra:
            raise UsageError(
                f"--signals-to-handle {','.join(extra)}: runwatch's agent forwards no signals "
                f"to the ranks (SIGTERM and SIGINT stop the gang: SIGTERM, --grace-s, SIGKILL)"
            )


def _command(argv: list[str], given: _Given, python: str) -> tuple[list[str], bool]:
    """Rules 1 and 2: the command each rank runs, and whether it came in torchrun's form."""
    names = {"module": "-m/--module", "no_python": "--no-python", "run_path": "--run-path"}
    shapes = [name for dest, name in names.items() if given.switch(dest)]
    if argv and argv[0] == "--":  # rule 1
        if shapes:
            raise UsageError(
                f"{shapes[0]} shapes a script given in torchrun's form: put the script right "
                f"after the flags, without --"
            )
        command = argv[1:]
        if not command:
            raise UsageError("no command after --")
        return command, False
    if not argv:
        raise UsageError(
            "no command: runwatch launch [torchrun's flags] SCRIPT ARGS..., or "
            "runwatch launch --nproc N -- COMMAND ARGS..."
        )
    script, rest = argv[0], argv[1:]  # rule 2
    if given.switch("no_python"):
        if given.switch("module"):
            raise UsageError("--no-python and -m/--module do not go together (as in torchrun)")
        return [script, *rest], True
    if given.switch("module"):
        return [python, "-u", "-m", script, *rest], True
    return [python, "-u", script, *rest], True


def _nnodes(raw: str | None, min_flag: int | None) -> tuple[int | None, int | None]:
    """Rule 3: ``(nnodes, min_nnodes)`` from ``--nnodes N|MIN:MAX`` and ``--min-nnodes``."""
    if raw is None:
        return None, min_flag
    match = re.fullmatch(r"\s*(\d+)\s*(?::\s*(\d+)\s*)?", raw)
    if match is None:
        raise UsageError(f"--nnodes must be N or MIN:MAX, got {raw!r}")
    low, high = int(match.group(1)), int(match.group(2) or match.group(1))
    if not 0 < low <= high:
        raise UsageError(f"--nnodes MIN:MAX needs 0 < MIN <= MAX, got {raw!r}")
    if low == high:
        return high, min_flag
    if min_flag is not None and min_flag != low:
        raise UsageError(
            f"--nnodes {raw} already says --min-nnodes {low}; got --min-nnodes {min_flag}"
        )
    return high, low


def _nproc_per_node(raw: str | None, count_devices: CountDevices) -> int | None:
    """Rule 4: a number, or a kind of device counted on this host."""
    if raw is None:
        return None
    text = raw.strip()
    if text in DEVICE_KINDS:
        return count_devices(text)
    if not text.isdigit():
        raise UsageError(
            f"--nproc-per-node must be a number or one of {', '.join(DEVICE_KINDS)}, got {raw!r}"
        )
    return int(text)


@dataclass(frozen=True)
class _Place:
    """Where the ranks meet, from rules 6 to 9 (``one_node``: ``--standalone``)."""

    master_addr: str | None
    master_port: int | None
    node_rank: int | None
    rdzv_id: str | None
    one_node: bool = False


def _rendezvous(given: _Given, nnodes: int | None, environ: Mapping[str, str]) -> _Place:
    """Rules 6 to 9: the rendezvous flags as ``--master-addr``/``--master-port``."""
    addr, port = given.text("master_addr"), given.number("master_port")
    node_rank = given.number("node_rank")
    if given.switch("standalone"):  # rule 7
        if nnodes is not None and nnodes > 1:
            raise UsageError(f"--standalone is one node on this host; got --nnodes {nnodes}")
        return _Place(None, 0, None, None, one_node=True)
    backend = (given.text("rdzv_backend") or "static").strip()
    if backend not in BACKENDS:  # rule 6
        raise UsageError(
            f"--rdzv-backend {backend}: runwatch's ranks meet in a TCP store that rank 0 "
            f"serves on node 0 (static or c10d); a {backend} rendezvous cannot be that"
        )
    endpoint = given.text("rdzv_endpoint")
    if endpoint is not None and endpoint.strip():  # rule 8
        host, host_port = parse_endpoint(endpoint, backend)
        flags = given.args  # a PET_MASTER_* variable yields to the endpoint, as in torchrun
        if flags.master_addr not in (None, host) or flags.master_port not in (None, host_port):
            raise UsageError(
                f"--rdzv-endpoint {endpoint} and --master-addr/--master-port name two "
                f"places for the rendezvous: give one"
            )
        addr, port = host, host_port
    several = nnodes is not None and nnodes > 1
    if backend == "c10d" and several and node_rank is None and not in_srun_step(environ):
        raise UsageError(  # rule 9
            f"--nnodes {nnodes} needs --node-rank on each node: c10d numbers nodes in the "
            f"order they join, runwatch's node ranks are fixed (node 0 serves the store)"
        )
    return _Place(addr, port, node_rank, given.text("rdzv_id"))


def parse_endpoint(endpoint: str, backend: str) -> tuple[str, int]:
    """``HOST[:PORT]`` (``[v6]:PORT`` too) as torch parses a rendezvous endpoint.

    Args:
        endpoint: The ``--rdzv-endpoint`` value.
        backend: ``static`` (a port is required) or ``c10d`` (default `C10D_DEFAULT_PORT`).

    Returns:
        ``(host, port)``.

    Raises:
        UsageError: A malformed endpoint.
    """
    text = endpoint.strip()
    match = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::(\d{1,5}))?|([\w.-]+)(?::(\d{1,5}))?", text)
    if match is None:
        raise UsageError(f"--rdzv-endpoint must be HOST[:PORT], got {endpoint!r}")
    host = match.group(1) or match.group(3)
    raw_port = match.group(2) or match.group(4)
    if raw_port is None:
        if backend == "static":
            raise UsageError(
                f"--rdzv-endpoint {endpoint} names no port (the static backend needs one, "
                f"as in torchrun)"
            )
        return host, C10D_DEFAULT_PORT
    port = int(raw_port)
    if port > 65535:
        raise UsageError(f"--rdzv-endpoint port must be in 0..65535, got {port}")
    return host, port


def _run_id(run_id: str | None, rdzv_id: str | None) -> str | None:
    """Rule 10: ``--rdzv-id`` is the run id."""
    if rdzv_id is None or rdzv_id == run_id:
        return run_id
    if run_id is not None:
        raise UsageError(f"--rdzv-id {rdzv_id} and --run-id {run_id} name two runs: give one")
    return rdzv_id


def _grace_s(grace_s: float | None, given: _Given) -> float:
    """Rule 11: ``--shutdown-timeout`` is ``--grace-s``."""
    shutdown = given.text("shutdown_timeout")
    timeout_s = None if shutdown is None else _seconds(shutdown)
    if grace_s is not None and timeout_s is not None and grace_s != timeout_s:
        raise UsageError(
            f"--shutdown-timeout {shutdown} and --grace-s {grace_s:g} say two graces: give one"
        )
    for value in (grace_s, timeout_s):
        if value is not None:
            return value
    return DEFAULT_GRACE_S


def _seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise UsageError(f"--shutdown-timeout must be seconds, got {text!r}") from None


__all__ = [
    "BACKENDS",
    "C10D_DEFAULT_PORT",
    "DEFAULT_GRACE_S",
    "DEVICE_KINDS",
    "NO_EFFECT",
    "REFUSED",
    "CountDevices",
    "LaunchSettings",
    "TorchrunFlag",
    "add_torchrun_args",
    "parse_endpoint",
    "translate",
]
