"""Real event structs for the sink tests."""

from __future__ import annotations

from runwatch.schemas.events import (
    AnomalyDetected,
    CommandRejected,
    Heartbeat,
    RestartCompleted,
    RestartFailed,
    RestartRequested,
    RunEnded,
    RunStarted,
    StepCompleted,
    Tick,
)
from runwatch.schemas.kinds import KINDS

S = 1_000_000_000


def anomaly(
    run: str = "r1",
    kind: str = "loss_spike",
    step: int = 30,
    rank: int | None = 0,
    vid: str | None = None,
    ts_s: float = 100.0,
    incarnation: int = 0,
    severity: str | None = None,
) -> AnomalyDetected:
    return AnomalyDetected(
        run_id=run,
        ts_ns=int(ts_s * S),
        verdict_id=vid or f"v-{run}-{kind}-{step}",
        kind=kind,
        step=step,
        rank=rank,
        value=9.0,
        baseline=3.7,
        z=12.5,
        threshold=6.0,
        detail="loss 9 vs median 3.7",
        config_hash="cfg1",
        incarnation=incarnation,
        severity=severity or KINDS[kind].severity,  # as the detectors set it
    )


def restart(
    run: str = "r1",
    cid: str = "c1",
    ts_s: float = 101.0,
    cause: str = "v1",
    incarnation: int = 0,
    action: str = "respawn",
    cause_kind: str = "dead_rank",
) -> RestartRequested:
    return RestartRequested(
        run_id=run,
        ts_ns=int(ts_s * S),
        command_id=cid,
        action=action,
        cause_verdict_id=cause,
        cause_kind=cause_kind,
        incarnation=incarnation,
    )


def completed(run: str = "r1", cid: str = "c1", ts_s: float = 102.0) -> RestartCompleted:
    return RestartCompleted(
        run_id=run,
        ts_ns=int(ts_s * S),
        command_id=cid,
        checkpoint_step=40,
        world_size=2,
        duration_s=3.5,
    )


def failed(run: str = "r1", cid: str = "c1", ts_s: float = 102.0) -> RestartFailed:
    return RestartFailed(run_id=run, ts_ns=int(ts_s * S), command_id=cid, reason="no checkpoint")


def rejected(run: str = "r1", cid: str = "c1", ts_s: float = 102.0) -> CommandRejected:
    return CommandRejected(run_id=run, ts_ns=int(ts_s * S), command_id=cid, reason="bad signature")


def started(
    run: str = "r1", incarnation: int = 0, ts_s: float = 1.0, tags: dict[str, str] | None = None
) -> RunStarted:
    from runwatch.schemas.events import ModelFlopConfig

    return RunStarted(
        run_id=run,
        ts_ns=int(ts_s * S),
        world_size=2,
        incarnation=incarnation,
        tags=tags or {},
        flop_config=ModelFlopConfig(
            n_params=1_000_000, n_layer=2, n_head=2, d_model=64, seq_len=64
        ),
        peak_flops_per_s=1e12,
    )


def step(run: str = "r1", n: int = 1, loss: float = 3.0, ts_s: float = 2.0) -> StepCompleted:
    return StepCompleted(
        run_id=run,
        ts_ns=int(ts_s * S),
        step=n,
        loss=loss,
        step_time_s=0.5,
        grad_norm=1.25,
        tokens=4096,
    )


def heartbeat(run: str = "r1", rank: int = 0, n: int = 1, ts_s: float = 2.0) -> Heartbeat:
    return Heartbeat(run_id=run, ts_ns=int(ts_s * S), rank=rank, step=n)


def tick(partition: int = 0, ts_s: float = 3.0) -> Tick:
    return Tick(run_id="*", ts_ns=int(ts_s * S), partition=partition)


def ended(run: str = "r1", ts_s: float = 5.0, status: str = "completed") -> RunEnded:
    return RunEnded(run_id=run, ts_ns=int(ts_s * S), status=status, final_step=1)
