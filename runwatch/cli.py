"""The `runwatch` command line: a thin dispatcher over the modules in `runwatch.cmd`.

Besides dispatching, this module owns what every command shares:

* logging, set up once (`setup_logging`): runwatch's own loggers to stderr, the Kafka and
  faust client libraries kept off the screen unless ``-v`` / ``-vv`` asks for them;
* errors as one line (`main`): `RunwatchError` and the client libraries' exceptions become
  ``runwatch COMMAND: message`` and an exit status, never a traceback;
* (with `runwatch.resolve.resolve_bootstrap`, which every command that talks to Kafka
  calls once its arguments are checked) a bounded check that Kafka answers before the
  command starts its clients, so an unreachable broker is reported within seconds;
* help that shows every option's default (`HelpFormatter`).
"""

from __future__ import annotations

import argparse
import copy
import importlib
import logging
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from runwatch.common.errors import RunwatchError, UsageError, kafka_error
from runwatch.common.version import __version__

# Subcommand name -> module. Every one must import: a missing module is a broken install.
COMMANDS: dict[str, str] = {
    "broker": "runwatch.cmd.broker",
    "topics": "runwatch.cmd.topics",
    "tail-log": "runwatch.cmd.tail_log",
    "processors": "runwatch.cmd.processors",
    "status": "runwatch.cmd.status",
    "audit": "runwatch.cmd.audit",
    "replay": "runwatch.cmd.replay",
    "launch": "runwatch.cmd.launch",
    "controller": "runwatch.cmd.controller",
    "sinks": "runwatch.cmd.sinks",
    "demo": "runwatch.cmd.demo",
    "ui": "runwatch.cmd.ui",
    "checkpoints": "runwatch.cmd.checkpoints",
}

OWN_LOGGERS: tuple[str, ...] = ("runwatch",)
"""runwatch's own logger hierarchy: every package of ours is under the ``runwatch`` namespace
(``controller.supervisor``, ``sinks.alerts``, ...)."""

KAFKA_CLIENT_LOGGERS: tuple[str, ...] = ("kafka", "aiokafka")
"""The Kafka clients: silent by default. They log every failed connection attempt as an
error while they retry; the command reports the outcome itself, in one line."""

FRAMEWORK_LOGGERS: tuple[str, ...] = ("faust", "mode", "aiohttp", "urllib3")
"""Other libraries: errors only by default (a crashed faust agent is worth a line)."""

# verbosity -> levels of (runwatch's loggers, Kafka clients, frameworks, everything else)
_LEVELS: dict[int, tuple[int, int, int, int]] = {
    0: (logging.INFO, logging.CRITICAL, logging.ERROR, logging.WARNING),
    1: (logging.DEBUG, logging.INFO, logging.INFO, logging.INFO),
    2: (logging.DEBUG, logging.DEBUG, logging.DEBUG, logging.DEBUG),
}

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler `setup_logging` installs (so a second call replaces only its own)."""


def setup_logging(verbosity: int) -> None:
    """Send log records to stderr at the levels ``verbosity`` (the count of ``-v``) asks.

    0: runwatch's loggers at INFO; the Kafka clients (`KAFKA_CLIENT_LOGGERS`) silent (their
    warnings, such as kafka-python's ``group_id is None: disabling auto-commit``, and the
    errors they log while retrying a connection are not for the user's screen); faust and
    the other `FRAMEWORK_LOGGERS` at ERROR; anything else at WARNING. 1 (``-v``): runwatch
    at DEBUG, the libraries at INFO. 2 or more (``-vv``): everything at DEBUG, the
    clients' internals included.

    At every level, repeated warnings and errors of one kind are summarised
    (`runwatch.logsummary.RepeatSummary`): the first, then one line per 10 s with the
    count of the others.
    """
    ours, clients, frameworks, rest = _LEVELS[min(max(verbosity, 0), 2)]
    from runwatch.logsummary import RepeatSummary

    handler = _StderrHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    # a library that logs an error per retry costs one line per kind per 10 s
    handler.addFilter(RepeatSummary())
    root = logging.getLogger()
    for old in list(root.handlers):
        # only a handler of an earlier call: others (a host program's, pytest's caplog)
        # are not ours to remove
        if isinstance(old, _StderrHandler):
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(rest)
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(ours)
    for name in KAFKA_CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(clients)
    for name in FRAMEWORK_LOGGERS:
        logging.getLogger(name).setLevel(frameworks)
    logging.captureWarnings(True)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help that ends every option with ``(default: X)`` unless its text already says it.

    Options without a default worth showing are left alone: None, flags (``--json``),
    empty lists of repeatable options.
    """

    def _format_action(self, action: argparse.Action) -> str:
        if action.help is None and _shows_default(action):
            action = copy.copy(action)  # the parser's own action stays as it was
            action.help = "(default: %(default)s)"
        return super()._format_action(action)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if not _shows_default(action) or "default" in text or "%(default)" in text:
            return text
        return f"{text} (default: %(default)s)".lstrip()


def _shows_default(action: argparse.Action) -> bool:
    default = action.default
    return not (
        default is None
        or default is argparse.SUPPRESS
        or action.nargs == 0
        or default in ([], "")
        or isinstance(action, argparse._SubParsersAction)
    )


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and exit status 2, help with defaults."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"runwatch: {message}\n")


def _load(module_name: str) -> ModuleType:
    """The module of one subcommand; an ImportError propagates (a broken install)."""
    return importlib.import_module(module_name)


_VERBOSE_HELP = "-v: runwatch's debug logs and the Kafka clients' info; -vv: everything"


def build_parser() -> argparse.ArgumentParser:
    """Build the full parser with every available subcommand."""
    parser = _Parser(prog="runwatch", description="Watch training runs through Kafka.")
    parser.add_argument("--version", action="version", version=f"runwatch {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help=_VERBOSE_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, module_name in COMMANDS.items():
        module = _load(module_name)
        child = sub.add_parser(name, help=module.HELP, description=module.HELP)
        # also after the command (`runwatch status -v`); SUPPRESS keeps a -v given before it
        child.add_argument(
            "-v", "--verbose", action="count", default=argparse.SUPPRESS, help=_VERBOSE_HELP
        )
        module.configure(child)
        child.set_defaults(_run=module.run)
    return parser


def _bootstrap_hint(args: argparse.Namespace) -> str | None:
    """The address a command was pointed at, for messages (it may have resolved another)."""
    from runwatch.common.settings import CommonSettings

    if getattr(args, "bootstrap", None):
        return str(args.bootstrap)
    try:
        return CommonSettings.from_env().bootstrap
    except UsageError:  # another variable is malformed: no hint, the error says why
        return None


def _fail(command: str, error: RunwatchError) -> int:
    print(f"runwatch {command}: {error}", file=sys.stderr)
    return error.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `runwatch` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    if getattr(args, "_run", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args._run(args))
    except RunwatchError as exc:
        return _fail(args.command, exc)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`runwatch ... | head`): not an error worth a traceback.
        sys.stderr.close()
        return 0
    except Exception as exc:
        mapped = kafka_error(exc, _bootstrap_hint(args))
        if mapped is None:
            raise
        logging.getLogger("runwatch").debug("client error", exc_info=True)
        return _fail(args.command, mapped)


if __name__ == "__main__":
    sys.exit(main())
