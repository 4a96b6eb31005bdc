"""Parsing training log lines into steps: a table of real-looking lines."""

from __future__ import annotations

import math

import pytest

from runwatch.producers.logtail import ParsedStep, make_parser

NAN = float("nan")

SEED_LINES = [
    ("step: 12, loss: 3.1, dt: 0.25", ParsedStep(12, 3.1, 0.25)),
    ("step: 1, loss: 3.950, dt: 0.25\n", ParsedStep(1, 3.95, 0.25)),
    ("step: 21, loss: nan, dt: 0.25", ParsedStep(21, NAN, 0.25)),
    ("step: 22, loss: inf, dt: 0.25", ParsedStep(22, math.inf, 0.25)),
    ("step: 23, loss: -Infinity, dt: 2.5e-1", ParsedStep(23, -math.inf, 0.25)),
    ("step: 24, loss: NaN, dt: 1", ParsedStep(24, NAN, 1.0)),
    ("2024-05-01 12:00:00 INFO step: 7, loss: 1e-3, dt: .5", ParsedStep(7, 0.001, 0.5)),
    ("val_step: 7, loss: 1.0, dt: 0.5", None),
    ("step: 7, loss: 1.0", None),  # no dt: not the seed format
    ("loading checkpoint...", None),
    ("", None),
    ("step: x, loss: 1.0, dt: 0.5", None),
]

NANOGPT_LINES = [
    ("iter 12: loss 3.1000, time 250.00ms, mfu 30.10%", ParsedStep(12, 3.1, 0.25)),
    ("iter 0: loss 10.9856, time 12034.57ms, mfu -100.00%", ParsedStep(0, 10.9856, 12.03457)),
    ("iter 40: loss nan, time 251.00ms, mfu 31.00%", ParsedStep(40, NAN, 0.251)),
    ("step 250: train loss 3.1234, val loss 3.2345", None),  # evaluation line
    ("saving checkpoint to out", None),
    (
        "step    12 | loss: 3.100000 | lr 6.0000e-04 | norm: 0.9300 | dt: 250.00ms | "
        "tok/sec: 2097152.00",
        ParsedStep(12, 3.1, 0.25, grad_norm=0.93),
    ),
    (
        "step   13 | loss: inf | lr 6.0000e-04 | norm: nan | dt: 250.00ms | tok/sec: 1.0",
        ParsedStep(13, math.inf, 0.25, grad_norm=NAN),
    ),
    ("step 14 | loss: 2.5", ParsedStep(14, 2.5)),
]


def same(a: ParsedStep | None, b: ParsedStep | None) -> bool:
    if a is None or b is None:
        return a is b

    def eq(x: float | int | None, y: float | int | None) -> bool:
        if isinstance(x, float) and isinstance(y, float):
            return (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=1e-12)
        return x == y

    return all(
        eq(getattr(a, f), getattr(b, f))
        for f in ("step", "loss", "step_time_s", "grad_norm", "tokens")
    )


@pytest.mark.parametrize(("line", "expected"), SEED_LINES)
def test_seed_format(line: str, expected: ParsedStep | None) -> None:
    got = make_parser("seed").parse(line)
    assert same(got, expected), got


@pytest.mark.parametrize(("line", "expected"), NANOGPT_LINES)
def test_nanogpt_format(line: str, expected: ParsedStep | None) -> None:
    got = make_parser("nanogpt").parse(line)
    assert same(got, expected), got


@pytest.mark.parametrize(
    ("pattern", "line", "expected"),
    [
        (
            r"it=(?P<step>\d+) l=(?P<loss>\S+) ms=(?P<time_ms>\S+)",
            "it=5 l=nan ms=120",
            ParsedStep(5, NAN, 0.12),
        ),
        (
            r"(?P<step>\d+) (?P<loss>\S+) (?P<dt>\S+) gn=(?P<grad_norm>\S+) tok=(?P<tokens>\d+)",
            "9 2.0 0.5 gn=1.25 tok=4096",
            ParsedStep(9, 2.0, 0.5, grad_norm=1.25, tokens=4096),
        ),
        (
            r"step (?P<step>\d+) loss (?P<loss>\S+)(?: t (?P<step_time_s>\S+))?",
            "step 3 loss 1.5",
            ParsedStep(3, 1.5),
        ),
        (
            r"step (?P<step>\d+) loss (?P<loss>\S+) t (?P<step_time_s>\S+)",
            "step 3 loss 1.5 t 0.75",
            ParsedStep(3, 1.5, 0.75),
        ),
        (r"step (?P<step>\d+) loss (?P<loss>\S+)", "step 3 loss oops", None),
        (r"step (?P<step>\d+) loss (?P<loss>\S+)", "nothing here", None),
    ],
)
def test_regex_format(pattern: str, line: str, expected: ParsedStep | None) -> None:
    got = make_parser("regex", pattern).parse(line)
    assert same(got, expected), got


@pytest.mark.parametrize(
    ("fmt", "regex", "message"),
    [
        ("csv", None, "unknown format 'csv'"),
        ("regex", None, "needs --regex"),
        ("regex", r"(\d+) (\S+)", "named group"),
        ("regex", r"(?P<step>\d+) (\S+)", "loss"),
        ("regex", r"(?P<step>\d+", "invalid --regex"),
        ("seed", r"(?P<step>\d+) (?P<loss>\S+)", "only goes with --format regex"),
    ],
)
def test_bad_format_arguments(fmt: str, regex: str | None, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        make_parser(fmt, regex)
    assert "\n" not in str(info.value)
