"""`tail-log` without --format: the format is found from the first step line."""

from __future__ import annotations

import pytest

from runwatch.producers.logtail import DetectingParser, ParsedStep, detect_format

NANOGPT = "iter 3: loss 3.1000, time 250.00ms, mfu 30.10%"
BUILD_NANOGPT = "step    4 | loss: 3.000000 | lr 6.0000e-04 | norm: 0.9300 | dt: 250.00ms"
SEED = "step: 5, loss: 2.9, dt: 0.25"
NOISE = ["loading data...", "step 250: train loss 3.1, val loss 3.2", ""]


@pytest.mark.parametrize(
    ("lines", "fmt"),
    [
        ([*NOISE, NANOGPT, SEED], "nanogpt"),
        ([*NOISE, BUILD_NANOGPT], "nanogpt"),
        ([*NOISE, SEED, NANOGPT], "seed"),
        (NOISE, None),
        ([], None),
    ],
)
def test_detect_format_takes_the_first_step_line(lines: list[str], fmt: str | None) -> None:
    assert detect_format(lines) == fmt


def test_detecting_parser_keeps_the_first_format_it_sees() -> None:
    seen: list[tuple[str, str]] = []
    parser = DetectingParser(on_detect=lambda fmt, line: seen.append((fmt, line)))
    assert parser.name == "auto"
    assert [parser.parse(line) for line in NOISE] == [None] * len(NOISE)
    assert parser.parse(SEED) == ParsedStep(5, 2.9, 0.25)
    assert parser.name == "seed" and seen == [("seed", SEED)]
    assert parser.parse(NANOGPT) is None  # another format after detection is not a step
    assert parser.parse("step: 6, loss: 2.8, dt: 0.5") == ParsedStep(6, 2.8, 0.5)
    assert len(seen) == 1
