"""Server-side SVG line charts for the run page: curves over steps, markers, restart lines.

Pure functions from numbers to an SVG string: no JavaScript library, no CDN, the same
picture in every browser, and testable without one. Every element a reader (or a test)
looks for carries a class and data attributes: ``.marker[data-kind][data-step]``,
``.vline[data-kind][data-step]``, ``.curve[data-incarnation]``, ``.degraded[data-from]
[data-to]`` (steps where not every replica group took part).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from typing import Final, NamedTuple

WIDTH: Final = 760
HEIGHT: Final = 230
PAD_LEFT: Final = 58
PAD_RIGHT: Final = 14
PAD_TOP: Final = 26
PAD_BOTTOM: Final = 30
PALETTE: Final = ("#2563eb", "#059669", "#d97706", "#7c3aed", "#0891b2", "#be185d")
"""Curve colour per incarnation (cycled)."""


class Point(NamedTuple):
    """One value at a step; ``value`` None or non-finite draws a gap."""

    step: int
    value: float | None
    incarnation: int


class Marker(NamedTuple):
    """An anomaly drawn where it fired: at its value, or on the top edge without one."""

    step: int
    value: float | None
    kind: str
    label: str


class VLine(NamedTuple):
    """A vertical line at a step (a restart or a rollback)."""

    step: int
    kind: str
    label: str
    broken: bool = False


class Band(NamedTuple):
    """A shaded stretch of steps, both ends included (degraded steps)."""

    first: int
    last: int
    label: str


class DegradedSpan(NamedTuple):
    """Consecutive degraded steps with the same quorum: ``groups`` of ``of`` took part."""

    first: int
    last: int
    groups: int
    of: int


def degraded_spans(steps: Sequence[tuple[int, int, int]]) -> list[DegradedSpan]:
    """Merge degraded steps into spans, by numbered rules.

    1. A step right after the open span's last, with the same quorum size and group
       count, extends it.
    2. Any other step (a gap, another quorum size, or a step redone after a resume)
       opens a new span.

    Args:
        steps: ``(step, groups in its quorum, groups known)`` of each degraded step, in
            arrival order.

    Returns:
        The spans, in arrival order.
    """
    spans: list[DegradedSpan] = []
    for step, groups, of in steps:
        last = spans[-1] if spans else None
        if last is not None and step == last.last + 1 and (groups, of) == last[2:]:  # rule 1
            spans[-1] = last._replace(last=step)
        else:  # rule 2
            spans.append(DegradedSpan(step, step, groups, of))
    return spans


TINY_SPAN = 1e-300
"""Below this a span has no round ticks (its logarithm is near the float limits)."""
Y_LIMIT = 1e300
"""The value axis covers at most [-Y_LIMIT, Y_LIMIT]; values beyond are drawn off it."""


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (about ``count`` of them)."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else []
    raw = (hi - lo) / max(1, count - 1)
    if not (math.isfinite(raw) and raw >= TINY_SPAN):
        return [lo, hi]  # a span too small (5e-324) or too large for round ticks
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10)), key=lambda c: abs(math.log(c / raw)))
    first = math.ceil(lo / step) * step
    out: list[float] = []
    v = first
    while v <= hi + step * 1e-9 and len(out) < 50:
        out.append(round(v, 12))
        v += step
    return out


def _fmt(value: float, percent: bool) -> str:
    if percent:
        return f"{100 * value:.3g}%"
    if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
        return f"{value:.2e}"
    return f"{value:.4g}"


def line_chart(
    title: str,
    points: Sequence[Point],
    *,
    markers: Sequence[Marker] = (),
    vlines: Sequence[VLine] = (),
    bands: Sequence[Band] = (),
    percent: bool = False,
    chart_id: str = "",
) -> str:
    """An SVG chart of ``points`` over steps.

    A new curve segment starts where the incarnation changes or the step goes back (a
    resume redoes steps), so a rollback shows as the new gang's curve over the old one.

    Args:
        title: Shown top left.
        points: Values in arrival order.
        markers: Anomalies to mark.
        vlines: Restart and rollback lines.
        bands: Shaded stretches of steps (degraded steps), drawn under the curves.
        percent: Label values as percentages (MFU fractions).
        chart_id: ``id`` of the ``svg`` element.

    Returns:
        The ``<svg>`` element as a string.
    """
    finite_vals = [p.value for p in points if p.value is not None and math.isfinite(p.value)]
    finite_vals += [m.value for m in markers if m.value is not None and math.isfinite(m.value)]
    steps = [p.step for p in points] + [m.step for m in markers] + [v.step for v in vlines]
    steps += [s for b in bands for s in (b.first, b.last)]
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" id="{escape(chart_id)}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}">'
        f'<text class="title" x="{PAD_LEFT}" y="16">{escape(title)}</text>'
    )
    if not steps:
        return (
            head + f'<text class="empty" x="{WIDTH / 2}" y="{HEIGHT / 2}">no data yet</text></svg>'
        )
    x_lo, x_hi = min(steps), max(steps)
    if x_hi == x_lo:
        x_hi = x_lo + 1
    y_lo, y_hi = (min(finite_vals), max(finite_vals)) if finite_vals else (0.0, 1.0)
    y_lo, y_hi = max(y_lo, -Y_LIMIT), min(y_hi, Y_LIMIT)  # so that y_hi - y_lo is finite
    if y_hi - y_lo < TINY_SPAN * max(1.0, abs(y_lo)):  # flat, or a span floats cannot divide
        half = 0.5 * (abs(y_lo) if abs(y_lo) >= TINY_SPAN else 1.0)
        y_lo, y_hi = y_lo - half, y_lo + half
    margin = 0.06 * (y_hi - y_lo)
    y_lo, y_hi = y_lo - margin, y_hi + margin
    plot_w, plot_h = WIDTH - PAD_LEFT - PAD_RIGHT, HEIGHT - PAD_TOP - PAD_BOTTOM

    def sx(step: float) -> float:
        return PAD_LEFT + (step - x_lo) / (x_hi - x_lo) * plot_w

    def sy(value: float) -> float:
        return PAD_TOP + (y_hi - value) / (y_hi - y_lo) * plot_h

    parts = [
        head,
        f'<rect class="plot" x="{PAD_LEFT}" y="{PAD_TOP}" width="{plot_w}" height="{plot_h}"/>',
    ]
    for t in nice_ticks(y_lo, y_hi, 4):
        y = sy(t)
        parts.append(
            f'<line class="grid" x1="{PAD_LEFT}" x2="{WIDTH - PAD_RIGHT}" '
            f'y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="ytick" x="{PAD_LEFT - 6}" y="{y + 4:.1f}">{_fmt(t, percent)}</text>'
        )
    for t in nice_ticks(x_lo, x_hi, 6):
        if t != int(t):
            continue
        x = sx(t)
        parts.append(
            f'<text class="xtick" x="{x:.1f}" y="{HEIGHT - PAD_BOTTOM + 16}">{int(t)}</text>'
        )
    parts.append(f'<text class="xlabel" x="{WIDTH - PAD_RIGHT}" y="{HEIGHT - 4}">step</text>')
    for b in bands:
        x0, x1 = sx(b.first - 0.5), sx(b.last + 0.5)
        x0, x1 = max(PAD_LEFT, x0), min(WIDTH - PAD_RIGHT, x1)
        parts.append(
            f'<g class="degraded" data-from="{b.first}" data-to="{b.last}">'
            f"<title>{escape(b.label)}</title>"
            f'<rect x="{x0:.1f}" y="{PAD_TOP}" width="{max(1.0, x1 - x0):.1f}" '
            f'height="{plot_h}"/></g>'
        )
    for v in vlines:
        x = sx(v.step)
        cls = "vline broken" if v.broken else "vline"
        parts.append(
            f'<g class="{cls}" data-kind="{escape(v.kind)}" data-step="{v.step}">'
            f"<title>{escape(v.label)}</title>"
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{PAD_TOP}" y2="{PAD_TOP + plot_h}"/>'
            f'<text x="{x + 3:.1f}" y="{PAD_TOP + plot_h - 5}">{escape(v.kind)}</text></g>'
        )
    for segment in _segments(points):
        inc = segment[0].incarnation
        colour = PALETTE[inc % len(PALETTE)]
        for run in _finite_runs(segment):
            coords = " ".join(
                f"{sx(p.step):.1f},{sy(p.value):.1f}" for p in run if p.value is not None
            )
            if len(run) == 1:
                p = run[0]
                assert p.value is not None
                parts.append(
                    f'<circle class="curve" data-incarnation="{inc}" cx="{sx(p.step):.1f}" '
                    f'cy="{sy(p.value):.1f}" r="1.8" fill="{colour}"/>'
                )
            else:
                parts.append(
                    f'<polyline class="curve" data-incarnation="{inc}" points="{coords}" '
                    f'stroke="{colour}"/>'
                )
    for m in markers:
        x = sx(m.step)
        on_curve = m.value is not None and math.isfinite(m.value)
        y = sy(m.value) if on_curve and m.value is not None else PAD_TOP + 4
        shape = (
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="5"/>'
            if on_curve
            else f'<path d="M{x - 5:.1f},{y - 4:.1f} L{x + 5:.1f},{y - 4:.1f} '
            f'L{x:.1f},{y + 5:.1f} Z"/>'
        )
        parts.append(
            f'<g class="marker" data-kind="{escape(m.kind)}" data-step="{m.step}">'
            f"<title>{escape(m.label)}</title>{shape}</g>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _segments(points: Sequence[Point]) -> list[list[Point]]:
    out: list[list[Point]] = []
    for p in points:
        if out and p.incarnation == out[-1][-1].incarnation and p.step > out[-1][-1].step:
            out[-1].append(p)
        else:
            out.append([p])
    return out


def _finite_runs(segment: Sequence[Point]) -> list[list[Point]]:
    out: list[list[Point]] = [[]]
    for p in segment:
        if p.value is None or not math.isfinite(p.value):
            if out[-1]:
                out.append([])
        else:
            out[-1].append(p)
    return [r for r in out if r]


__all__ = ["Marker", "Point", "VLine", "line_chart", "nice_ticks"]
