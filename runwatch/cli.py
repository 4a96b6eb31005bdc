"""The `runwatch` command line: a thin dispatcher over the modules in `runwatch.cmd`."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from types import ModuleType

from runwatch import __version__
from runwatch.errors import RunwatchError, UsageError

# Subcommand name -> module. A module that does not exist yet is simply not offered.
COMMANDS: dict[str, str] = {
    "broker": "runwatch.cmd.broker",
    "topics": "runwatch.cmd.topics",
    "tail-log": "runwatch.cmd.tail_log",
    "processors": "runwatch.cmd.processors",
    "clock": "runwatch.cmd.clock",
    "status": "runwatch.cmd.status",
    "audit": "runwatch.cmd.audit",
    "replay": "runwatch.cmd.replay",
    "launch": "runwatch.cmd.launch",
    "controller": "runwatch.cmd.controller",
    "sinks": "runwatch.cmd.sinks",
    "demo": "runwatch.cmd.demo",
    "ui": "runwatch.cmd.ui",
}


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"runwatch: {message}\n")


def _load(module_name: str) -> ModuleType | None:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            return None
        raise


def build_parser() -> argparse.ArgumentParser:
    """Build the full parser with every available subcommand."""
    parser = _Parser(prog="runwatch", description="Watch training runs through Kafka.")
    parser.add_argument("--version", action="version", version=f"runwatch {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, module_name in COMMANDS.items():
        module = _load(module_name)
        if module is None:
            continue
        child = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.configure(child)
        child.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `runwatch` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if getattr(args, "_run", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args._run(args))
    except UsageError as exc:
        print(f"runwatch {args.command}: {exc}", file=sys.stderr)
        return 2
    except RunwatchError as exc:
        print(f"runwatch {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`runwatch ... | head`): not an error worth a traceback.
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
