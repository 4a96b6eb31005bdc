"""Restart policy: actions, one command per incarnation, stale anomalies, budget."""

from __future__ import annotations

import msgspec
import pytest

from runwatch.processors.core.config import DetectorConfig, with_overrides
from runwatch.processors.core.policy import PolicyState, fold_policy
from runwatch.processors.core.verdicts import make_anomaly
from runwatch.schemas.events import AnomalyDetected, AnomalyKind, RestartRequested
from tests.unit.core.factories import src

CFG = DetectorConfig()


def anomaly(
    kind: AnomalyKind,
    step: int = 100,
    incarnation: int = 0,
    rank: int | None = None,
    run: str = "r",
) -> AnomalyDetected:
    return make_anomaly(
        run_id=run,
        kind=kind,
        step=step,
        ts_ns=step * 1000,
        source=src(step, "steps"),
        config_hash="h",
        incarnation=incarnation,
        rank=rank,
    )


def fold(
    anomalies: list[AnomalyDetected], cfg: DetectorConfig = CFG
) -> tuple[PolicyState | None, list[RestartRequested]]:
    state: PolicyState | None = None
    out: list[RestartRequested] = []
    for i, a in enumerate(anomalies):
        state, commands = fold_policy(state, a, src(i, "anomalies"), cfg)
        out.extend(commands)
    return state, out


@pytest.mark.parametrize(
    ("kind", "action", "max_step"),
    [
        ("dead_rank", "respawn", None),
        ("hang", "respawn", None),
        ("nonfinite_loss", "rollback", 99),
        ("nonfinite_grad_norm", "rollback", 99),
        ("loss_divergence", "rollback", 99),
        ("loss_collapse", "rollback", 99),
        ("restart_discontinuity", None, None),
        ("loss_spike", None, None),
        ("grad_norm_spike", None, None),
        ("straggler", None, None),
    ],
)
def test_action_table(kind: AnomalyKind, action: str | None, max_step: int | None) -> None:
    cause = anomaly(kind)
    state, commands = fold([cause])
    if action is None:
        assert commands == []
    else:
        (command,) = commands
        assert command.action == action and command.max_checkpoint_step == max_step
        assert command.cause_verdict_id == cause.verdict_id and command.cause_kind == kind
        assert command.signature == "" and command.incarnation == 0
        assert command.ts_ns == cause.ts_ns and command.seq == 0
        assert command.source == src(0, "anomalies")
    assert state is not None
    assert state.continuity_broken == (kind == "restart_discontinuity")


@pytest.mark.parametrize(
    ("anomalies", "expected"),
    [
        pytest.param(
            [anomaly("dead_rank", rank=r) for r in range(8)],
            [("respawn", 0)],
            id="every-rank-of-a-killed-gang-one-command",
        ),
        pytest.param(
            [anomaly("hang"), anomaly("dead_rank", rank=1)],
            [("respawn", 0)],
            id="hang-plus-dead-rank",
        ),
        pytest.param(
            [anomaly("nonfinite_loss"), anomaly("nonfinite_grad_norm")],
            [("rollback", 0)],
            id="same-incarnation-two-causes",
        ),
        pytest.param(
            [anomaly("nonfinite_loss"), anomaly("nonfinite_loss", 150, incarnation=1)],
            [("rollback", 0), ("rollback", 1)],
            id="next-incarnation-new-command",
        ),
        pytest.param(
            [anomaly("hang", incarnation=1), anomaly("dead_rank", incarnation=0)],
            [("respawn", 1)],
            id="stale-incarnation-ignored",
        ),
    ],
)
def test_one_command_per_incarnation(
    anomalies: list[AnomalyDetected], expected: list[tuple]
) -> None:  # type: ignore[type-arg]
    _, commands = fold(anomalies)
    assert [(c.action, c.incarnation) for c in commands] == expected
    assert len({c.command_id for c in commands}) == len(commands)


def test_budget_per_window_of_steps() -> None:
    cfg = with_overrides(CFG, {"restart_budget": 2, "restart_budget_window_steps": 100})
    causes = [
        anomaly("nonfinite_loss", 100, incarnation=0),
        anomaly("nonfinite_loss", 110, incarnation=1),
        anomaly("nonfinite_loss", 120, incarnation=2),  # third within 100 steps: over budget
        anomaly("nonfinite_loss", 250, incarnation=3),  # window moved on
    ]
    state, commands = fold(causes, cfg)
    assert [c.incarnation for c in commands] == [0, 1, 3]
    assert state is not None and state.over_budget == 1


def test_rollback_loop_at_the_same_step_is_capped() -> None:
    causes = [anomaly("loss_divergence", 500, incarnation=i) for i in range(10)]
    state, commands = fold(causes)
    assert len(commands) == CFG.restart_budget
    assert state is not None and state.over_budget == 10 - CFG.restart_budget


def test_zero_budget_means_alerts_only() -> None:
    _, commands = fold([anomaly("hang")], with_overrides(CFG, {"restart_budget": 0}))
    assert commands == []


def test_redelivered_anomaly_is_skipped_by_offset() -> None:
    state, _ = fold([anomaly("hang")])
    assert state is not None
    again, commands = fold_policy(state, anomaly("hang", incarnation=5), src(0, "anomalies"), CFG)
    assert again is state and commands == []


def test_a_shadow_kind_records_the_command_it_would_cause_without_spending_the_gang() -> None:
    cfg = with_overrides(CFG, {"shadow_kinds": "nonfinite_loss"})
    state, out = fold(
        [anomaly("nonfinite_loss", 100), anomaly("nonfinite_loss", 101), anomaly("hang", 102)],
        cfg,
    )
    assert [(c.cause_kind, c.action, c.shadow) for c in out] == [
        ("nonfinite_loss", "rollback", True),  # once per incarnation
        ("hang", "respawn", False),  # an enforced kind still commands after it
    ]
    assert state is not None and (state.shadow_commands, state.commands) == (1, 1)
    assert out[0].max_checkpoint_step == 99


def test_a_verdict_flagged_shadow_gives_a_shadow_command_whatever_the_policy_config() -> None:
    flagged = msgspec.structs.replace(anomaly("dead_rank"), shadow=True)
    state, (command,) = fold([flagged])
    assert command.shadow and command.action == "respawn"
    assert state is not None and state.commanded_incarnation == -1 and state.commands == 0


def test_shadow_all_and_its_spelling() -> None:
    _, (command,) = fold([anomaly("hang")], with_overrides(CFG, {"shadow": "1"}))
    assert command.shadow
    with pytest.raises(ValueError, match="shadow_kinds: unknown kind"):
        with_overrides(CFG, {"shadow_kinds": "nonfinite_loss,nope"})
    with pytest.raises(ValueError, match="not a boolean"):
        with_overrides(CFG, {"shadow": "maybe"})
    assert with_overrides(CFG, {"shadow": "0"}) == CFG
