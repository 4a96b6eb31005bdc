"""Replay: routing by role, tick fan-out, canonical order, recorded vs recomputed policy."""

from __future__ import annotations

import pytest

from runwatch.processors.core.config import DetectorConfig, with_overrides
from runwatch.processors.core.replay import REPLAY_ANOMALIES_TOPIC, Record, Replayer, replay
from runwatch.schemas.events import Provenance
from runwatch.schemas.topics import TopicRole
from tests.unit.core.factories import S, ended, hb, started, step, tick

CFG = with_overrides(DetectorConfig(), {"hang_timeout_s": 60, "dead_rank_timeout_s": 600})


def rec(role: str, offset: int, event, partition: int = 0) -> Record:  # type: ignore[no-untyped-def]
    return (role, Provenance(topic=f"runwatch.{role}", partition=partition, offset=offset), event)


def two_runs_one_partition() -> list[Record]:
    return [
        rec("heartbeats", 0, started("b", world_size=1)),
        rec("heartbeats", 1, started("a", world_size=1)),
        rec("heartbeats", 2, hb(0, 1, S, run="a")),
        rec("heartbeats", 3, hb(0, 1, S, run="b")),
        rec("heartbeats", 4, tick(100 * S)),
        rec("heartbeats", 0, started("c", world_size=1), partition=1),
        rec("heartbeats", 1, hb(0, 1, S, run="c"), partition=1),
    ]


def test_tick_fans_out_to_runs_of_its_partition_in_run_order() -> None:
    result = replay(two_runs_one_partition(), CFG)
    assert [(a.run_id, a.kind) for a in result.anomalies] == [("a", "hang"), ("b", "hang")]
    assert result.liveness["c"].hung is False
    assert {a.source for a in result.anomalies} == {
        Provenance(topic="runwatch.heartbeats", partition=0, offset=4)
    }


def test_recomputed_anomalies_drive_the_policy_with_synthetic_provenance() -> None:
    result = replay(two_runs_one_partition(), CFG)
    assert result.policy_input == "recomputed"
    assert [(c.run_id, c.action) for c in result.commands] == [("a", "respawn"), ("b", "respawn")]
    assert all(c.source and c.source.topic == REPLAY_ANOMALIES_TOPIC for c in result.commands)


def test_recorded_anomalies_drive_the_policy_in_their_order() -> None:
    first = replay(two_runs_one_partition(), CFG)
    recorded = [rec("anomalies", i, a) for i, a in enumerate(reversed(first.anomalies))]
    result = replay(two_runs_one_partition() + recorded, CFG)
    assert result.policy_input == "recorded"
    assert [c.run_id for c in result.commands] == ["b", "a"]
    assert result.commands[0].source == recorded[0][1]


def test_roles_are_independent_and_runs_role_is_ignored() -> None:
    steps = [rec("steps", i, step(i, 2.0 + 0.01 * (i % 3))) for i in range(1, 40)]
    steps.append(rec("steps", 40, step(40, 80.0)))
    runs = [rec("runs", 0, started())]
    a = replay(steps + two_runs_one_partition() + runs, CFG)
    b = replay(runs + two_runs_one_partition()[:3] + steps + two_runs_one_partition()[3:], CFG)
    assert [x.verdict_id for x in a.anomalies] == [x.verdict_id for x in b.anomalies]
    assert "loss_spike" in {x.kind for x in a.anomalies}


def test_unknown_role_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown topic role"):
        replay([rec("nonsense", 0, started())], CFG)


def test_replayer_exposes_what_the_live_pipeline_reads() -> None:
    # processors/pipeline.py preloads these attributes and reads recomputed + commands.
    r = Replayer(CFG).feed(two_runs_one_partition())
    assert set(r.liveness) == {"a", "b", "c"} and r.partition_runs == {0: {"a", "b"}, 1: {"c"}}
    assert [v.run_id for _, v in r.recomputed] == ["a", "b"]
    assert isinstance(r.steps, dict) and isinstance(r.checkpoints, dict)
    assert isinstance(r.policy, dict) and r.commands == []


def test_tick_skips_runs_listed_without_a_state() -> None:
    r = Replayer(CFG)
    r.partition_runs[0] = {"ghost"}
    r.feed([rec("heartbeats", 0, tick(10 * S))])
    assert r.liveness == {} and r.recomputed == []


def test_a_tick_writes_only_the_runs_it_changes() -> None:
    # An ended run has nothing to age: a Tick must not rewrite its table entry (a fleet's
    # state is mostly ended runs; rewriting them on every Tick grew the changelog with uptime).
    r = Replayer(CFG)
    r.feed(
        [
            rec("heartbeats", 0, started("live", world_size=1)),
            rec("heartbeats", 1, started("done", world_size=1)),
            rec("heartbeats", 2, ended("done", ts_ns=S)),
        ]
    )
    done = r.liveness["done"]
    r.encoded["liveness"].clear()
    r.feed([rec("heartbeats", 3, tick(10 * S))])
    assert r.liveness["done"] is done  # untouched, even its offset
    assert set(r.encoded["liveness"]) == {"live"}
    r.encoded["liveness"].clear()
    r.feed([rec("heartbeats", 4, tick(20 * S)), rec("heartbeats", 3, tick(10 * S))])
    assert set(r.encoded["liveness"]) == {"live"}
    assert r.liveness["live"].last_offset == 4  # the redelivered Tick changed nothing


def test_the_replayer_hands_out_the_states_of_each_folded_role() -> None:
    replayer = Replayer(DetectorConfig())
    assert replayer.states_of(TopicRole.STEPS) is replayer.steps
    assert replayer.states_of("heartbeats") is replayer.liveness
    assert replayer.states_of(TopicRole.CHECKPOINTS) is replayer.checkpoints
    assert replayer.states_of(TopicRole.ANOMALIES) is replayer.policy
    with pytest.raises(ValueError):
        replayer.states_of(TopicRole.COMMANDS)
