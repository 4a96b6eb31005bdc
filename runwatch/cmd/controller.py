"""`runwatch controller`: adopt the gangs recorded in a state directory and serve their commands.

Used after a `runwatch launch` process died: the ranks run on (they are in their own
sessions, writing to files), and this command takes over their supervision. The ranks are
not its children, so it watches their pids (``/proc``) and reads their exit status from the
files their shell wrappers write.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from runwatch.cmd._supervision import add_supervision_args
from runwatch.common.errors import RunwatchError, UsageError

HELP = "adopt the gangs recorded in --state-dir (after a launcher died) and serve their commands"

log = logging.getLogger("runwatch")


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of `runwatch controller`."""
    add_supervision_args(parser)
    parser.add_argument(
        "--state-dir",
        type=Path,
        required=True,
        help="a run's state directory, or a directory of them (e.g. $RUNWATCH_HOME/controller)",
    )


def _state_dirs(root: Path) -> list[Path]:
    from runwatch.controller.state import GANG_FILE

    if (root / GANG_FILE).is_file():
        return [root]
    # <run>/gang.json, and a node's agent of a multi-node run: <run>/node<I>/gang.json
    found = [*root.glob(f"*/{GANG_FILE}"), *root.glob(f"*/node*/{GANG_FILE}")]
    return sorted(p.parent for p in found)


def run(args: argparse.Namespace) -> int:
    """Adopt every running gang under ``--state-dir`` and serve until they all ended."""
    from runwatch.admin import warn_if_no_authorizer
    from runwatch.common.settings import topic_prefix
    from runwatch.controller.agent import build_controller, load_keys
    from runwatch.controller.launcher import HOST
    from runwatch.controller.state import (
        ControllerState,
        StateFormatError,
        StateLocked,
        lock_state_dir,
    )
    from runwatch.reachability import check_reachable

    root = args.state_dir.resolve()
    if not root.is_dir():
        raise UsageError(f"{root} is not a directory")
    states = []
    for path in _state_dirs(root):
        state = ControllerState(path)
        try:
            gang = state.load_gang()
        except StateFormatError as exc:  # one unreadable record does not stop the others
            log.warning("skipping %s", exc)
            continue
        if gang is None or gang.record.status != "running":
            continue
        host = gang.spec.host
        if host and host != HOST:  # a shared file system shows every node's
            log.info("skipping %s: its ranks run on %s, not here", path, host)
            continue
        try:
            lock_state_dir(path)
        except StateLocked as exc:
            log.warning("skipping %s: %s", path, exc)
            continue
        states.append(state)
    if not states:
        raise RunwatchError(f"no running gang to adopt under {root}")
    specs = [g.spec for s in states if (g := s.load_gang()) is not None]
    run_ids = [spec.run_id for spec in specs]
    twice = sorted({r for r in run_ids if run_ids.count(r) > 1})
    if twice:
        raise UsageError(
            f"several agents' state of run {twice[0]} here: adopt each node's agent with its "
            f"own --state-dir (e.g. .../{twice[0]}/node1)"
        )
    bootstraps = {spec.run.bootstrap for spec in specs}
    prefixes = {spec.run.prefix for spec in specs}
    if len(bootstraps) > 1 or len(prefixes) > 1:
        raise UsageError("the gangs use several brokers or prefixes: adopt them one by one")
    bootstrap = args.bootstrap or bootstraps.pop()
    check_reachable(bootstrap)  # the records' broker is not resolved by resolve_bootstrap
    prefix = topic_prefix(args.prefix or prefixes.pop())
    warn_if_no_authorizer(bootstrap, prefix, "controller")
    keys = load_keys()
    controller, runs = build_controller(states, keys, bootstrap, prefix)
    for r in runs:
        print(
            f"runwatch controller: adopted run {r.run_id}, incarnation {r.record.incarnation}, "
            f"pids {[p.pid for p in r.record.ranks]} (running: {r.launcher.running()})",
            flush=True,
        )
    return controller.serve()
