"""The arguments `runwatch launch` and `runwatch controller` share.

A module of its own below both commands, so that neither imports the other (what they
share beyond arguments, the keys and the assembly of a controller, is in
`controller.agent`).
"""

from __future__ import annotations

import argparse


def add_supervision_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--bootstrap`` and ``--prefix``: where the supervised runs' topics are."""
    parser.add_argument(
        "--bootstrap", help="Kafka bootstrap HOST:PORT (default: RUNWATCH_BOOTSTRAP)"
    )
    parser.add_argument("--prefix", help="topic name prefix (default: runwatch)")
