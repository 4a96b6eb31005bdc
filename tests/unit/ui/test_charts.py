"""The run page's SVG charts: segments per incarnation, markers and restart lines."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import pytest

from runwatch.ui.charts import Marker, Point, VLine, line_chart, nice_ticks

NS = "{http://www.w3.org/2000/svg}"


def test_a_rollback_starts_a_new_curve_and_marks_are_where_they_fired():
    points = [Point(s, 4.0 - 0.01 * s, 0) for s in range(1, 60)]
    points += [Point(s, 3.5, 1) for s in range(50, 70)]
    points.append(Point(70, math.nan, 1))  # a NaN is a gap, not a point
    svg = line_chart(
        "loss",
        points,
        markers=[
            Marker(30, 9.0, "loss_spike", "spike <here>"),
            Marker(70, None, "nonfinite_loss", "nan"),
        ],
        vlines=[VLine(50, "rollback", "resumed from 49", broken=True)],
        chart_id="c",
    )
    root = ET.fromstring(svg)  # well-formed, labels escaped
    curves = root.findall(f"{NS}polyline")
    assert [c.get("data-incarnation") for c in curves] == ["0", "1"]
    marks = {g.get("data-kind"): g for g in root.iter(f"{NS}g") if g.get("class") == "marker"}
    assert set(marks) == {"loss_spike", "nonfinite_loss"}
    assert marks["loss_spike"].find(f"{NS}circle") is not None  # on the curve at its value
    assert marks["nonfinite_loss"].find(f"{NS}path") is not None  # on the top edge
    assert marks["loss_spike"].find(f"{NS}title").text == "spike <here>"
    lines = [g for g in root.iter(f"{NS}g") if "vline" in (g.get("class") or "")]
    assert [(g.get("data-step"), g.get("class")) for g in lines] == [("50", "vline broken")]


def test_empty_and_flat_series_still_draw():
    assert "no data yet" in line_chart("mfu", [])
    ET.fromstring(line_chart("flat", [Point(1, 2.0, 0), Point(2, 2.0, 0)]))


def test_ticks_are_round_and_cover_the_range():
    assert nice_ticks(0.0, 1.0, 5) == [0.0, 0.25, 0.5, 0.75, 1.0]
    ticks = nice_ticks(2.87, 9.13, 4)
    assert ticks[0] >= 2.87 and ticks[-1] <= 9.13 and len(ticks) >= 3


@pytest.mark.parametrize(
    "losses",
    [(0.0, 5e-324), (5e-324, 5e-324), (-1e308, 1e308), (1e10, 1e10 + 1e-5), (0.0, 1e-310)],
    ids=["subnormal-span", "flat-subnormal", "overflowing-span", "lost-precision", "tiny"],
)
def test_charts_survive_absurd_losses(losses):
    """Finding 11: two losses 0.0 and 5e-324 raised a math domain error and broke the page."""
    from runwatch.ui.charts import Point, line_chart

    svg = line_chart("loss", [Point(i + 1, v, 0) for i, v in enumerate(losses)])
    assert svg.startswith("<svg") and "polyline" in svg
    assert "nan" not in svg and "inf" not in svg
