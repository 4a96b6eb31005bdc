"""Shadow verdicts and commands are shown as shadow where people read them."""

from __future__ import annotations

import msgspec

from runwatch.liveview import describe
from runwatch.schemas.events import RestartRequested
from tests.unit.core.test_policy import anomaly


def test_status_lines_say_shadow_and_not_executed() -> None:
    verdict = anomaly("nonfinite_loss", 30)
    command = RestartRequested(
        run_id="r",
        ts_ns=1,
        command_id="c",
        action="rollback",
        cause_verdict_id=verdict.verdict_id,
        cause_kind="nonfinite_loss",
        max_checkpoint_step=29,
    )
    assert "shadow" not in describe(verdict) and "shadow" not in describe(command)
    assert "nonfinite_loss (shadow) at step 30" in describe(
        msgspec.structs.replace(verdict, shadow=True)
    )
    assert "shadow (not executed) command rollback" in describe(
        msgspec.structs.replace(command, shadow=True)
    )


def test_the_status_row_counts_shadow_commands_apart() -> None:
    from runwatch.cmd.status import format_row
    from runwatch.processors.core.policy import PolicyState
    from runwatch.processors.fleet import RunView, summarize

    view = RunView(run_id="r", policy=PolicyState(run_id="r", commands=1, shadow_commands=2))
    summary = summarize(view)
    assert (summary.restarts, summary.shadow_commands) == (1, 2)
    assert format_row(summary).endswith("/ 1 (+2 shadow, not executed)")
    plain = summarize(RunView(run_id="r", policy=PolicyState(run_id="r", commands=1)))
    assert "shadow" not in format_row(plain)
