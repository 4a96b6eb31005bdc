"""The web view's adapter: states folded by the real core, then paged, sorted and filtered."""

from __future__ import annotations

import math

import pytest

from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.state_codec import encode_state
from runwatch.processors.core.steps import fold_step
from runwatch.processors.settings import changelog_topic
from runwatch.schemas.codec import decode, encode, encode_key
from runwatch.schemas.events import ModelFlopConfig, Provenance, RunStarted, StepCompleted
from runwatch.schemas.records import RawRecord
from runwatch.schemas.topics import names
from runwatch.ui.model import MAX_PAGE_SIZE, AuditNote, FleetQuery, WebviewData

PREFIX, APP = "p", "p-app"
TOPICS = names(PREFIX)
CFG = DetectorConfig()
FLOPS = ModelFlopConfig(n_params=1_000_000, n_layer=2, n_head=2, d_model=64, seq_len=64)


def _records(run_id: str, steps: int, *, spike_at: int | None = None) -> list[RawRecord]:
    """The steps-topic records of a run and the step-health changelog records the core wrote."""
    events = [
        RunStarted(run_id=run_id, ts_ns=1, world_size=1, flop_config=FLOPS, peak_flops_per_s=1e12)
    ]
    events += [
        StepCompleted(
            run_id=run_id,
            ts_ns=1_000_000_000 * s,
            step=s,
            loss=9.0 if s == spike_at else 4.0 - 0.01 * s + 0.001 * (s % 3),
            grad_norm=1.0,
            step_time_s=0.5,
            tokens=4096,
        )
        for s in range(1, steps + 1)
    ]
    out, state = [], None
    for offset, event in enumerate(events):
        state, _ = fold_step(
            state, event, Provenance(topic=TOPICS.steps, partition=0, offset=offset), CFG
        )
        out.append(RawRecord(TOPICS.steps, 0, offset, encode_key(run_id), encode(event)))
        out.append(
            RawRecord(
                changelog_topic(APP, "step-health"),
                0,
                offset,
                encode_key(run_id),
                encode_state(state),
            )
        )
    return out


@pytest.fixture
def store() -> WebviewData:
    data = WebviewData("unused:9092", prefix=PREFIX, app_id=APP, cfg=CFG)
    for i in range(120):
        data.apply(_records(f"run-{i:03d}", steps=5 + i % 7, spike_at=None))
    data.apply(_records("spiky", steps=40, spike_at=30))
    return data


def test_pages_cover_every_run_once_in_order(store):
    seen = []
    for page in range(3):
        got = store.fleet(FleetQuery(sort="run", page=page, page_size=50))
        assert got["total"] == got["runs"] == 121 and got["pages"] == 3
        seen += [r["run_id"] for r in got["rows"]]
    assert seen == sorted(seen) and len(set(seen)) == 121


def test_sort_filter_and_bounds(store):
    top = store.fleet(FleetQuery(sort="step", descending=True, page_size=3))["rows"]
    assert [r["last_step"] for r in top] == [40, 11, 11]
    only = store.fleet(FleetQuery(text="RUN-00", page_size=100))
    assert only["total"] == 10 and all(r["run_id"].startswith("run-00") for r in only["rows"])
    anomalous = store.fleet(FleetQuery(status="anomalous"))
    assert [r["run_id"] for r in anomalous["rows"]] == ["spiky"]
    assert anomalous["rows"][0]["anomalies"] == {"loss_spike": 1}
    assert store.fleet(FleetQuery(page=99))["page"] == 2  # clamped to the last page
    assert store.fleet(FleetQuery(page_size=10**6))["page_size"] == MAX_PAGE_SIZE
    with pytest.raises(ValueError, match="unknown sort column"):
        store.fleet(FleetQuery(sort="nope"))


def test_run_page_has_curves_with_the_cores_mfu_and_a_receipt(store):
    page = store.run("spiky")
    assert page is not None and store.run("never-seen") is None
    steps = [p[0] for p in page["points"]]
    assert steps == list(range(1, 41))
    mfu = page["points"][0][4]
    # 6N+attn FLOPs per token x tokens / step time / peak: the core's step_accounting
    assert isinstance(mfu, float) and 0 < mfu < 1 and math.isclose(mfu, page["summary"]["mfu"])
    assert page["receipt"]["run_id"] == "spiky"
    assert page["receipt"]["anomalies"]["by_kind"] == {"loss_spike": 1}
    store.record_audit("spiky", AuditNote(agrees=True, anomalies=1, input_records=41))
    assert store.run("spiky")["audit"]["agrees"] is True
    assert store.fleet(FleetQuery(text="spiky"))["rows"][0]["audit"]["input_records"] == 41


def test_every_change_bumps_the_version(store):
    before = store.version
    store.apply(_records("late", steps=3))
    assert store.wait_for_change(before, timeout_s=0) != before


def test_packed_steps_are_points_of_the_curves():
    from runwatch.schemas.events import EventPack

    data = WebviewData("unused:9092", prefix=PREFIX, app_id=APP, cfg=CFG)
    plain = [r for r in _records("packed", steps=12) if r.topic == TOPICS.steps]
    started, *steps = [decode(r.value) for r in plain]
    pack = EventPack(run_id="packed", ts_ns=steps[-1].ts_ns, events=tuple(steps))
    data.apply(
        [
            RawRecord(TOPICS.steps, 0, 0, encode_key("packed"), encode(started)),
            RawRecord(TOPICS.steps, 0, 1, encode_key("packed"), encode(pack)),
            *[r for r in _records("packed", steps=12) if r.topic != TOPICS.steps],
        ]
    )
    assert [p[0] for p in data.run("packed")["points"]] == list(range(1, 13))


def _rec(topic: str, offset: int, event: object, ts_ms: int) -> RawRecord:
    from runwatch.schemas.codec import encode

    return RawRecord(topic, 0, offset, event.run_id.encode(), encode(event), ts_ms)  # type: ignore[attr-defined]


def test_runs_are_capped_and_ended_runs_evicted_after_the_retention():
    """Finding 10: per-run state is bounded; an ended run goes after its retention."""
    from runwatch.schemas.events import RunEnded, StepCompleted
    from runwatch.ui.model import WebviewData

    now_ms = 1_000_000_000
    data = WebviewData(
        "unused:1", prefix="p", app_id="a", max_runs=3, ended_retention_s=60,
        wall_ms=lambda: now_ms,
    )  # fmt: skip

    def step(run: str, ts_ms: int) -> RawRecord:
        e = StepCompleted(run_id=run, ts_ns=ts_ms * 10**6, step=1, loss=1.0, step_time_s=0.1)
        return _rec("p.steps", ts_ms, e, ts_ms)

    data.apply([step(r, now_ms - 10_000 + i) for i, r in enumerate("abcd")])
    assert data.run_ids() == ["b", "c", "d"] and data.evicted == 1  # a: least recent
    ended = RunEnded(run_id="b", ts_ns=1, status="completed", final_step=1)
    data.apply([_rec("p.steps", 9, ended, now_ms - 5_000)])
    assert data.run_ids() == ["b", "c", "d"]  # within its retention
    data.apply([step("c", now_ms + 60_000)])
    assert data.run_ids() == ["c", "d"]  # b ended over 60 s of log time ago
    # a record dated far ahead moves log time at most 5 minutes past the wall clock
    data.apply([step("e", now_ms + 10**12)])
    assert "d" in data.run_ids()
