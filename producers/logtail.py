"""Parsing the step lines that existing training scripts print, for ``runwatch tail-log``.

Pure functions of one line: no files, no Kafka. Three formats:

``seed``
    ``step: 12, loss: 3.1, dt: 0.25`` (``dt`` in seconds), the telemetry format of the
    course's ``TelemetryMonitor``.
``nanogpt``
    nanoGPT's ``iter 12: loss 3.1000, time 250.00ms, mfu 30.10%`` and build-nanogpt's
    ``step    12 | loss: 3.100000 | lr 6.0000e-04 | norm: 0.9300 | dt: 250.00ms | ...``
    (evaluation lines such as ``step 250: train loss 3.1, val loss 3.2`` do not match).
``regex``
    A custom pattern with named groups ``step`` and ``loss`` and, optionally, one of
    ``step_time_s`` / ``dt`` (seconds) or ``time_ms``, and ``grad_norm`` and ``tokens``.

`DetectingParser` tells ``nanogpt`` from ``seed`` by itself: it tries each format's parser
on the lines until one recognises a step line, then keeps that format.

Losses and norms spelled ``nan``, ``inf``, ``-inf`` (any case) parse to those floats and
are kept: a NaN loss is the line that matters most.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

FLOAT_PATTERN: Final = r"[-+]?(?:nan|inf(?:inity)?|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
"""A decimal float, or nan / inf / infinity with an optional sign (case-insensitive)."""

FORMATS: Final = ("nanogpt", "seed", "regex")
"""The ``--format`` values."""

DETECTABLE_FORMATS: Final = ("nanogpt", "seed")
"""The formats `detect_format` and `DetectingParser` recognise, tried in this order."""

REQUIRED_GROUPS: Final = frozenset({"step", "loss"})
OPTIONAL_GROUPS: Final = frozenset({"step_time_s", "dt", "time_ms", "grad_norm", "tokens"})

_F = FLOAT_PATTERN
_SEED: Final = (rf"\bstep:\s*(?P<step>\d+),\s*loss:\s*(?P<loss>{_F}),\s*dt:\s*(?P<dt>{_F})",)
_NANOGPT: Final = (
    rf"\biter\s+(?P<step>\d+):\s*loss\s+(?P<loss>{_F}),\s*time\s+(?P<time_ms>{_F})\s*ms",
    rf"\bstep\s+(?P<step>\d+)\s*\|\s*loss:\s*(?P<loss>{_F})"
    rf"(?:\s*\|\s*lr:?\s*{_F})?"
    rf"(?:\s*\|\s*norm:\s*(?P<grad_norm>{_F}))?"
    rf"(?:\s*\|\s*dt:\s*(?P<time_ms>{_F})\s*ms)?",
)


@dataclass(frozen=True, slots=True)
class ParsedStep:
    """What one log line says about a step.

    Attributes:
        step: The step number.
        loss: The loss; may be NaN or infinite.
        step_time_s: Wall time of the step in seconds, if the line gives it.
        grad_norm: Gradient norm, if the line gives it.
        tokens: Tokens processed in the step, if the line gives it.
    """

    step: int
    loss: float
    step_time_s: float | None = None
    grad_norm: float | None = None
    tokens: int | None = None


class LineParser:
    """Turns log lines into `ParsedStep`s with a list of patterns (the first match wins).

    Attributes:
        name: The format's name.
        patterns: The compiled patterns.
    """

    def __init__(self, name: str, patterns: Sequence[re.Pattern[str]]) -> None:
        """Use ``patterns``; each must have the groups ``step`` and ``loss``.

        Raises:
            ValueError: A pattern lacks a required named group.
        """
        for pattern in patterns:
            missing = REQUIRED_GROUPS - pattern.groupindex.keys()
            if missing:
                raise ValueError(
                    f"the pattern needs the named group(s) {', '.join(sorted(missing))}: "
                    "e.g. (?P<step>\\d+) and (?P<loss>\\S+)"
                )
        self.name = name
        self.patterns = tuple(patterns)

    def parse(self, line: str) -> ParsedStep | None:
        """The step a line reports, or None for any other line (banners, evals, noise).

        A line that matches but holds an unreadable number (``step: 1x``) is None too.
        """
        for pattern in self.patterns:
            match = pattern.search(line)
            if match is not None:
                return _to_step(match.groupdict())
        return None


def _to_step(groups: dict[str, str | None]) -> ParsedStep | None:
    step, loss = groups["step"], groups["loss"]
    dt, time_ms = groups.get("step_time_s") or groups.get("dt"), groups.get("time_ms")
    grad_norm, tokens = groups.get("grad_norm"), groups.get("tokens")
    try:
        return ParsedStep(
            step=int(step),  # type: ignore[arg-type]
            loss=float(loss),  # type: ignore[arg-type]
            step_time_s=(
                float(dt)
                if dt is not None
                else None
                if time_ms is None
                else float(time_ms) / 1000.0
            ),
            grad_norm=None if grad_norm is None else float(grad_norm),
            tokens=None if tokens is None else int(tokens),
        )
    except (TypeError, ValueError):
        return None


def make_parser(fmt: str, regex: str | None = None) -> LineParser:
    """The parser for a ``--format`` (and ``--regex``).

    Args:
        fmt: ``nanogpt``, ``seed`` or ``regex``.
        regex: The pattern, for ``regex`` only.

    Returns:
        The parser.

    Raises:
        ValueError: An unknown format, a regex given for another format or missing for
            ``regex``, a pattern that does not compile or lacks the ``step`` or ``loss``
            group. The message is one line.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if fmt != "regex":
        if regex is not None:
            raise ValueError(f"--regex only goes with --format regex, not {fmt}")
        sources = _SEED if fmt == "seed" else _NANOGPT
        return LineParser(fmt, [re.compile(p, re.IGNORECASE) for p in sources])
    if not regex:
        raise ValueError("--format regex needs --regex PATTERN with named groups step and loss")
    try:
        pattern = re.compile(regex)
    except re.error as exc:
        raise ValueError(f"invalid --regex {regex!r}: {exc}") from None
    return LineParser("regex", [pattern])


def detect_format(lines: Iterable[str]) -> str | None:
    """The format of the first of ``lines`` that a `DETECTABLE_FORMATS` parser recognises.

    Args:
        lines: Log lines, e.g. the first lines of a file (banners and evals are skipped).

    Returns:
        ``nanogpt`` or ``seed``; None when no line is a step line of either.
    """
    parsers = [make_parser(fmt) for fmt in DETECTABLE_FORMATS]
    for line in lines:
        for parser in parsers:
            if parser.parse(line) is not None:
                return parser.name
    return None


class DetectingParser:
    """A parser that finds its format in the lines it is given (`detect_format`).

    Until a line is recognised, every line yields None; the first step line of either
    detectable format fixes the format, and that line and all later ones are parsed with
    it alone (a line of the other format afterwards is not a step).

    Attributes:
        detected: The parser of the detected format; None until then.
    """

    def __init__(self, on_detect: Callable[[str, str], None] | None = None) -> None:
        """Optionally call ``on_detect(format, line)`` once, when the format is found."""
        self._on_detect = on_detect
        self.detected: LineParser | None = None

    @property
    def name(self) -> str:
        """The detected format's name, or ``auto`` before detection."""
        return "auto" if self.detected is None else self.detected.name

    def parse(self, line: str) -> ParsedStep | None:
        """The step ``line`` reports, detecting the format on the first step line."""
        if self.detected is None:
            fmt = detect_format([line])
            if fmt is None:
                return None
            self.detected = make_parser(fmt)
            if self._on_detect is not None:
                self._on_detect(fmt, line)
        return self.detected.parse(line)


__all__ = [
    "DETECTABLE_FORMATS",
    "FLOAT_PATTERN",
    "FORMATS",
    "OPTIONAL_GROUPS",
    "REQUIRED_GROUPS",
    "DetectingParser",
    "LineParser",
    "ParsedStep",
    "detect_format",
    "make_parser",
]
