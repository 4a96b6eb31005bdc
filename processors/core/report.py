"""The health report: a JSON-serializable receipt of a run, built from reducer states.

Non-finite floats (a NaN last loss) are written as the strings ``"NaN"``, ``"Infinity"``
and ``"-Infinity"``, as on the wire, so ``json.dumps(report, allow_nan=False)`` works.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Final

from runwatch.processors.core.checkpoints import CheckpointCatalogue
from runwatch.processors.core.config import DetectorConfig, config_hash
from runwatch.processors.core.liveness import LivenessState
from runwatch.processors.core.policy import PolicyState
from runwatch.processors.core.steps import StepHealthState
from runwatch.schemas.events import AnomalyDetected, RestartRequested

MAX_LISTED: Final = 100
"""Anomalies listed one by one in a report (the newest); all are counted by kind."""


def _num(value: float | None) -> float | str | None:
    if value is None or math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def _steps_section(state: StepHealthState, cfg: DetectorConfig) -> dict[str, Any]:
    totals = state.totals
    return {
        "kept": totals.steps,
        "observed": state.steps_observed,
        "redone_or_dropped": state.steps_observed - totals.steps,
        "skipped_updates": state.skipped_steps,
        "last_step": state.last_step if state.last_step >= 0 else None,
        "last_loss": _num(state.last_loss),
        "last_grad_norm": _num(state.last_grad_norm),
        "loss_median": _num(state.loss.median()),
        "best_loss": _num(state.best_loss) if math.isfinite(state.best_loss) else None,
    }


def _mfu_section(state: StepHealthState, cfg: DetectorConfig) -> dict[str, Any]:
    info = state.info
    return {
        "convention": cfg.mfu_convention,
        "run": _num(state.mfu_avg),
        "mean_of_steps": _num(state.mfu_mean),
        "last": _num(state.last_mfu),
        "flops_per_token": _num(info.flops_per_token(cfg)),
        "peak_flops_per_s": _num(info.peak_flops_per_s),
        "dtype": info.dtype or None,
        "tokens_per_s": _num(state.tokens_per_s_avg),
        "last_tokens_per_s": _num(state.last_tokens_per_s),
        "tokens": totals_tokens(state),
    }


def totals_tokens(state: StepHealthState) -> int:
    """Tokens of the kept steps."""
    return round(state.totals.tokens)


def _time_section(state: StepHealthState) -> dict[str, Any]:
    return {
        "wall_s": _num(state.wall_time_s),
        "kept_step_time_s": _num(state.totals.time_s),
        "effective_training_time_ratio": _num(state.effective_training_time_ratio),
        "exact": state.ledger.exact,
    }


def _replica_section(state: StepHealthState) -> dict[str, Any]:
    """Replica groups and degraded steps (`processors.core.replicas`)."""
    tally = state.replicas
    return {
        "groups": len(tally.groups),
        "lost_now": list(tally.lost),
        "steps": tally.steps,
        "degraded_steps": tally.degraded_steps,
        "degraded_time_s": _num(tally.degraded_time_s),
        "lost": tally.lost_verdicts,
        "rejoined": tally.rejoined_verdicts,
    }


def _restarts(state: StepHealthState) -> list[dict[str, Any]]:
    return [
        {
            "at_step": r.at_step,
            "from_step": r.from_step,
            "incarnation": r.incarnation,
            "marked": r.marked,
            "continuity": r.verdict,
            "checked_steps": r.checked_steps,
            "paired_steps": r.paired_steps,
            "max_z": _num(r.max_z),
            "cumulative_z": _num(r.cumulative_z),
        }
        for r in state.restarts
    ]


def _liveness_section(state: LivenessState) -> dict[str, Any]:
    return {
        "status": state.status,
        "incarnation": state.incarnation,
        "live_ranks": list(state.live_ranks),
        "dead_ranks": list(state.dead_ranks),
        "stragglers": list(state.straggler_ranks),
        "hung": state.hung,
        "heartbeats": state.heartbeats,
        "run_step": state.run_step if state.run_step >= 0 else None,
    }


def _checkpoint_section(cat: CheckpointCatalogue) -> dict[str, Any]:
    latest = cat.latest()
    failure = cat.last_failure
    return {
        "committed": len(cat.committed),
        "latest_step": latest.step if latest else None,
        "latest_path": latest.path if latest else None,
        "blocked_s": _num(cat.total_blocked_s),
        "failures": cat.failures,
        "last_failure": None
        if failure is None
        else {"step": failure.step, "path": failure.path, "reason": failure.reason},
    }


def _anomaly_summary(a: AnomalyDetected) -> dict[str, Any]:
    return {
        "verdict_id": a.verdict_id,
        "kind": a.kind,
        "step": a.step,
        "rank": a.rank,
        "value": _num(a.value),
        "baseline": _num(a.baseline),
        "z": _num(a.z),
        "threshold": _num(a.threshold),
        "incarnation": a.incarnation,
        "detail": a.detail,
    }


def _command_summary(c: RestartRequested) -> dict[str, Any]:
    return {
        "command_id": c.command_id,
        "action": c.action,
        "cause_kind": c.cause_kind,
        "cause_verdict_id": c.cause_verdict_id,
        "incarnation": c.incarnation,
        "max_checkpoint_step": c.max_checkpoint_step,
        **({"replica_group": c.replica_group} if c.replica_group is not None else {}),
    }


def _counts(*states: StepHealthState | LivenessState | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for state in states:
        if state is not None:
            for kind, n in state.anomaly_counts.items():
                out[kind] = out.get(kind, 0) + n
    return dict(sorted(out.items()))


def health_report(
    steps: StepHealthState | None,
    liveness: LivenessState | None = None,
    *,
    policy: PolicyState | None = None,
    checkpoints: CheckpointCatalogue | None = None,
    anomalies: Iterable[AnomalyDetected] = (),
    commands: Iterable[RestartRequested] = (),
    cfg: DetectorConfig | None = None,
) -> dict[str, Any]:
    """A JSON-serializable receipt of one run.

    Args:
        steps: The run's step-health state.
        liveness: Its liveness state.
        policy: Its policy state.
        checkpoints: Its checkpoint catalogue.
        anomalies: Its verdicts, to list the newest ones (counts come from the states).
        commands: Its restart commands.
        cfg: The processor's configuration (the run's own thresholds apply on top).

    Returns:
        Steps, MFU (with its convention), time and the effective training time ratio,
        anomalies by kind, restarts with their continuity verdicts, liveness, checkpoints
        and commands; for a run of replica groups (torchft), its groups and degraded
        steps and time (``replicas``).
    """
    base = cfg or DetectorConfig()
    run_cfg = steps.info.config(base) if steps is not None else base
    listed = list(anomalies)[-MAX_LISTED:]
    run_id = next((s.run_id for s in (steps, liveness, policy, checkpoints) if s is not None), None)
    report: dict[str, Any] = {
        "run_id": run_id,
        "config_hash": config_hash(run_cfg),
        "anomalies": {
            "by_kind": _counts(steps, liveness),
            "total": sum(_counts(steps, liveness).values()),
            "recent": [_anomaly_summary(a) for a in listed],
        },
        "commands": [_command_summary(c) for c in commands],
    }
    if steps is not None:
        report |= {
            "status": steps.info.status,
            "incarnation": steps.incarnation,
            "steps": _steps_section(steps, run_cfg),
            "mfu": _mfu_section(steps, run_cfg),
            "time": _time_section(steps),
            "continuity_ok": steps.continuity_ok,
            "restarts": _restarts(steps),
        }
        if steps.replicas.steps:  # a per-step fault-tolerant run (torchft)
            report["replicas"] = _replica_section(steps)
    if liveness is not None:
        report["liveness"] = _liveness_section(liveness)
    if checkpoints is not None:
        report["checkpoints"] = _checkpoint_section(checkpoints)
    if policy is not None:
        report["policy"] = {
            "commands": policy.commands,
            "over_budget": policy.over_budget,
            "stale": policy.stale,
            "continuity_broken": policy.continuity_broken,
        }
    return report


__all__ = ["MAX_LISTED", "health_report"]
