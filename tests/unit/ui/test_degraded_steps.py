"""Degraded steps on the run page: spans from the steps' quorums, shaded on the charts."""

from __future__ import annotations

import re

from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.state_codec import encode_state
from runwatch.processors.core.steps import fold_step
from runwatch.processors.settings import changelog_topic
from runwatch.schemas.codec import encode, encode_key
from runwatch.schemas.events import Provenance, RunStarted, StepCompleted
from runwatch.schemas.records import RawRecord
from runwatch.schemas.topics import names
from runwatch.ui.charts import Band, DegradedSpan, Point, degraded_spans, line_chart
from runwatch.ui.model import WebviewData
from runwatch.ui.server import run_charts

PREFIX, APP = "p", "p-app"
TOPICS = names(PREFIX)
CFG = DetectorConfig()
QUORUMS = {**{s: (0, 1, 2) for s in range(1, 21)}, **{s: (0, 2) for s in range(5, 9)}}
QUORUMS |= {s: (0,) for s in (9, 10)} | {14: (0, 1)}


def test_rule_1_consecutive_steps_with_one_quorum_are_one_span() -> None:
    assert degraded_spans([(5, 2, 3), (6, 2, 3), (7, 2, 3)]) == [DegradedSpan(5, 7, 2, 3)]


def test_rule_2_a_gap_another_quorum_or_a_redone_step_opens_a_span() -> None:
    got = degraded_spans([(5, 2, 3), (6, 1, 3), (9, 1, 3), (8, 1, 3)])
    assert got == [
        DegradedSpan(5, 5, 2, 3),
        DegradedSpan(6, 6, 1, 3),
        DegradedSpan(9, 9, 1, 3),
        DegradedSpan(8, 8, 1, 3),
    ]


def test_a_band_is_drawn_under_the_curves_with_its_steps_and_label() -> None:
    points = [Point(s, 4.0 - 0.1 * s, 0) for s in range(1, 11)]
    svg = line_chart("loss", points, bands=[Band(3, 5, "steps 3-5: 1 of 2")], chart_id="c")
    band = re.search(r'<g class="degraded" data-from="3" data-to="5"><title>(.*?)</title>', svg)
    assert band is not None and band[1] == "steps 3-5: 1 of 2"
    assert svg.index('class="degraded"') < svg.index('class="curve"')
    assert 'class="degraded"' not in line_chart("loss", points)


def _records(run_id: str) -> list[RawRecord]:
    events: list[RunStarted | StepCompleted] = [RunStarted(run_id=run_id, ts_ns=1, world_size=3)]
    events += [
        StepCompleted(
            run_id=run_id,
            ts_ns=1_000_000_000 * s,
            step=s,
            loss=4.0 - 0.01 * s,
            step_time_s=0.5,
            replica_group=0,
            participants=QUORUMS[s],
        )
        for s in range(1, 21)
    ]
    out, state = [], None
    for offset, event in enumerate(events):
        source = Provenance(topic=TOPICS.steps, partition=0, offset=offset)
        state, _ = fold_step(state, event, source, CFG)
        key = encode_key(run_id)
        out.append(RawRecord(TOPICS.steps, 0, offset, key, encode(event)))
        out.append(
            RawRecord(changelog_topic(APP, "step-health"), 0, offset, key, encode_state(state))
        )
    return out


def test_the_run_page_lists_the_degraded_spans_and_shades_them_on_loss_and_mfu() -> None:
    data = WebviewData("unused:9092", prefix=PREFIX, app_id=APP, cfg=CFG)
    data.apply(_records("ft"))
    page = data.run("ft")
    assert page is not None
    assert page["degraded"] == [
        {"first": 5, "last": 8, "groups": 2, "of": 3},
        {"first": 9, "last": 10, "groups": 1, "of": 3},
        {"first": 14, "last": 14, "groups": 2, "of": 3},
    ]
    assert page["summary"]["degraded_steps"] == 7 and page["summary"]["replica_groups"] == 3
    assert page["receipt"]["replicas"]["degraded_steps"] == 7
    charts = run_charts(page)
    for name in ("loss", "mfu"):
        shaded = re.findall(r'class="degraded" data-from="(\d+)" data-to="(\d+)"', charts[name])
        assert shaded == [("5", "8"), ("9", "10"), ("14", "14")], name


def test_a_run_without_replica_groups_has_no_degraded_steps() -> None:
    data = WebviewData("unused:9092", prefix=PREFIX, app_id=APP, cfg=CFG)
    recs = _records("plain")
    data.apply(recs[:2])  # RunStarted only: no quorum seen
    page = data.run("plain")
    assert page is not None and page["degraded"] == []
    assert 'class="degraded"' not in run_charts(page)["loss"]
