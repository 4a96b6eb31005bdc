"""`runwatch controller`: adopt the gangs recorded in a state directory and serve their commands.

Used after a `runwatch launch` process died: the ranks run on (they are in their own
sessions, writing to files), and this command takes over their supervision. The ranks are
not its children, so it watches their pids (``/proc``) and reads their exit status from the
files their shell wrappers write.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from common.errors import RunwatchError, UsageError

if TYPE_CHECKING:
    from controller.loop import Controller
    from controller.state import ControllerState
    from controller.supervisor import RunSupervisor
    from schemas.signing import CommandKey

HELP = "adopt the gangs recorded in --state-dir (after a launcher died) and serve their commands"

log = logging.getLogger("runwatch")


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of `runwatch controller`."""
    from runwatch.cmd.launch import add_supervision_args

    add_supervision_args(parser)
    parser.add_argument(
        "--state-dir",
        type=Path,
        required=True,
        help="a run's state directory, or a directory of them (e.g. $RUNWATCH_HOME/controller)",
    )


def load_keys() -> dict[str, CommandKey]:
    """The configured command keys by id; empty (with a warning) when none is configured."""
    from schemas.signing import load_key

    try:
        key = load_key()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if key is None:
        log.warning(
            "no RUNWATCH_COMMAND_KEY or RUNWATCH_COMMAND_KEY_FILE: every command is rejected"
        )
        return {}
    return {key.key_id: key}


def make_controller(
    states: Sequence[ControllerState],
    keys: dict[str, CommandKey],
    bootstrap: str,
    prefix: str,
) -> tuple[Controller, list[RunSupervisor]]:
    """A controller over the runs recorded in ``states``, their gangs adopted.

    Args:
        states: State directories holding a running gang record.
        keys: Command keys by id.
        bootstrap: Kafka bootstrap address.
        prefix: Topic name prefix.

    Returns:
        The controller and its supervisors (in the order of ``states``).
    """
    from controller.gang import Gang
    from controller.loop import Controller, announce_end
    from controller.supervisor import RunSupervisor

    runs = []
    for state in states:
        record = state.load_gang()
        assert record is not None
        exit_files = [state.exit_path(record.incarnation, p.rank) for p in record.ranks]
        runs.append(
            RunSupervisor(
                state=state,
                record=record,
                gang=Gang.adopt(record.ranks, exit_files),
                publish=lambda event: None,
                announce_end=announce_end,
            )
        )
    controller = Controller(runs, keys, bootstrap, prefix)
    for run in runs:
        run.publish = controller.publish
    return controller, runs


def _state_dirs(root: Path) -> list[Path]:
    from controller.state import GANG_FILE

    if (root / GANG_FILE).is_file():
        return [root]
    return sorted(p.parent for p in root.glob(f"*/{GANG_FILE}"))


def run(args: argparse.Namespace) -> int:
    """Adopt every running gang under ``--state-dir`` and serve until they all ended."""
    from common.settings import topic_prefix
    from controller.state import ControllerState, StateLocked, lock_state_dir
    from runwatch.reachability import check_reachable

    root = args.state_dir.resolve()
    if not root.is_dir():
        raise UsageError(f"{root} is not a directory")
    states = []
    for path in _state_dirs(root):
        state = ControllerState(path)
        record = state.load_gang()
        if record is None or record.status != "running":
            continue
        try:
            lock_state_dir(path)
        except StateLocked as exc:
            log.warning("skipping %s: %s", path, exc)
            continue
        states.append(state)
    if not states:
        raise RunwatchError(f"no running gang to adopt under {root}")
    records = [s.load_gang() for s in states]
    bootstraps = {r.bootstrap for r in records if r is not None}
    prefixes = {r.prefix for r in records if r is not None}
    if len(bootstraps) > 1 or len(prefixes) > 1:
        raise UsageError("the gangs use several brokers or prefixes: adopt them one by one")
    bootstrap = args.bootstrap or bootstraps.pop()
    check_reachable(bootstrap)  # the records' broker is not resolved by resolve_bootstrap
    prefix = topic_prefix(args.prefix or prefixes.pop())
    keys = load_keys()
    controller, runs = make_controller(states, keys, bootstrap, prefix)
    for r in runs:
        print(
            f"runwatch controller: adopted run {r.run_id}, incarnation {r.record.incarnation}, "
            f"pids {[p.pid for p in r.record.ranks]} (running: {r.gang.running()})",
            flush=True,
        )
    return controller.serve()
