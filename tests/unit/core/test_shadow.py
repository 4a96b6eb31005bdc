"""Shadow mode end to end in the pure core: verdicts flagged, commands recorded as shadow."""

from __future__ import annotations

import math

from runwatch.processors.core.config import DetectorConfig, with_overrides
from runwatch.processors.core.replay import policy_over
from tests.unit.core.factories import (
    fold_heartbeats,
    fold_steps,
    healthy_losses,
    lockstep,
    started,
    step,
)

CFG = DetectorConfig()
SHADOW_RUN = {"shadow": 1.0}


def steps_with_nan(**started_kw: object) -> list:  # type: ignore[type-arg]
    losses = healthy_losses(40, seed=2)
    losses[29] = math.nan
    return [started(**started_kw)] + [step(i + 1, x) for i, x in enumerate(losses)]


def test_a_run_announced_in_shadow_mode_flags_its_verdicts_and_commands() -> None:
    _, enforced = fold_steps(steps_with_nan(), CFG)
    _, shadowed = fold_steps(steps_with_nan(thresholds=SHADOW_RUN), CFG)
    assert [(v.kind, v.shadow) for v in enforced] == [("nonfinite_loss", False)]
    assert [(v.kind, v.shadow) for v in shadowed] == [("nonfinite_loss", True)]
    (real,), _ = policy_over(enforced, CFG)
    (would,), policy = policy_over(shadowed, CFG)
    assert (real.shadow, would.shadow) == (False, True)
    assert (real.action, real.max_checkpoint_step) == (would.action, would.max_checkpoint_step)
    assert policy["r"].commands == 0 and policy["r"].shadow_commands == 1


def test_liveness_verdicts_of_a_shadow_run_are_shadow_too() -> None:
    cfg = with_overrides(CFG, {"dead_rank_timeout_s": 30})
    events = [started(world_size=4, thresholds=SHADOW_RUN)]
    events += lockstep(4, range(1, 21))
    events += lockstep(4, range(21, 101), skip={3})
    _, verdicts = fold_heartbeats(events, cfg)
    assert verdicts and all(v.kind == "dead_rank" and v.shadow for v in verdicts)
    (command,), _ = policy_over(verdicts, cfg)
    assert command.shadow and command.action == "respawn"


def test_a_shadow_kind_flags_only_that_kind() -> None:
    cfg = with_overrides(CFG, {"shadow_kinds": "loss_spike"})
    losses = healthy_losses(60, seed=2)
    losses[29] = 50.0
    losses[44] = math.nan
    _, got = fold_steps([started()] + [step(i + 1, x) for i, x in enumerate(losses)], cfg)
    assert [(v.kind, v.shadow) for v in got] == [
        ("loss_spike", True),
        ("nonfinite_loss", False),
    ]
