"""A rank's root cause: the exception its ``@record`` entry point wrote before it died.

torchrun gives every worker ``TORCHELASTIC_ERROR_FILE``; an entry point decorated with
``torch.distributed.elastic.multiprocessing.errors.record`` catches the exception that
ends it, writes it there as JSON and re-raises it. runwatch gives the same variable
(`controller.state.ControllerState.error_path`), and the supervisor reads the file when a
rank exits non-zero, so the exit evidence (`schemas.events.RankExited.root_cause`), and the
``dead_rank`` verdict made from it, say what went wrong and not only that it did.

The file is torch's (`torch.distributed.elastic.multiprocessing.errors.ErrorHandler`)::

    {"message": {"message": "ValueError: bad batch", "extraInfo": {"py_callstack": ...,
                 "timestamp": "1700000000"}}}

A ``message`` that is a string (torch's "new message format", written by custom handlers)
is read too. Nothing in the file is trusted: it is the rank's own output. Whatever it
holds comes back as one line of at most `MAX_ROOT_CAUSE_CHARS` characters, and a file
that is missing, unreadable, too large or not of this shape gives ``""``.

Standard library only, no torch: the agent never imports the trainer's stack.
"""

from __future__ import annotations

import json
from pathlib import Path

from runwatch.schemas.events import MAX_ROOT_CAUSE_CHARS

MAX_ERROR_FILE_BYTES = 1024 * 1024
"""An error file larger than this is not read (a traceback is a few KiB)."""


def one_line(text: str, limit: int = MAX_ROOT_CAUSE_CHARS) -> str:
    """``text`` with its whitespace runs made single spaces, cut to ``limit`` characters.

    Args:
        text: Any text (an exception's message may span lines).
        limit: The longest result; a cut one ends with ``...``.

    Returns:
        One line.
    """
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def parse_root_cause(raw: bytes) -> str:
    """The root cause in the bytes of an error file (see the module doc), or ``""``.

    Args:
        raw: The file's content.

    Returns:
        ``Type: message`` on one line, bounded; ``""`` when the content is not an error
        file torch writes.
    """
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, nested too deep
        return ""
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, dict):
        message = message.get("message")
    return one_line(message) if isinstance(message, str) else ""


def read_root_cause(path: Path) -> str:
    """The root cause a rank wrote to its error file, ``""`` when it wrote none.

    Args:
        path: The rank's ``TORCHELASTIC_ERROR_FILE``.

    Returns:
        ``Type: message`` on one line, bounded (`parse_root_cause`).
    """
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_ERROR_FILE_BYTES + 1)
    except OSError:
        return ""
    return "" if len(raw) > MAX_ERROR_FILE_BYTES else parse_root_cause(raw)


__all__ = ["MAX_ERROR_FILE_BYTES", "one_line", "parse_root_cause", "read_root_cause"]
