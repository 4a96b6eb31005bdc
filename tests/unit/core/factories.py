"""Small builders of events and logs for the core tests."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Iterator

from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.liveness import LivenessState, fold_liveness
from runwatch.processors.core.steps import StepHealthState, fold_step
from runwatch.schemas.events import (
    AnomalyDetected,
    Heartbeat,
    ModelFlopConfig,
    Provenance,
    RankExited,
    RestartRequested,
    RunEnded,
    RunStarted,
    StepCompleted,
    Tick,
)

S = 1_000_000_000
"""One second in nanoseconds."""

GPT2_SMALL = ModelFlopConfig(n_params=124_356_864, n_layer=12, n_head=12, d_model=768, seq_len=1024)


def src(offset: int, topic: str = "t", partition: int = 0) -> Provenance:
    return Provenance(topic=topic, partition=partition, offset=offset)


def started(run: str = "r", ts_ns: int = 0, **kw: object) -> RunStarted:
    return RunStarted(run_id=run, ts_ns=ts_ns, world_size=kw.pop("world_size", 4), **kw)  # type: ignore[arg-type]


def step(
    n: int,
    loss: float,
    *,
    run: str = "r",
    grad: float | None = None,
    dt: float = 0.25,
    tokens: int = 0,
    restart_from: int | None = None,
    ts_ns: int | None = None,
    skipped: bool = False,
) -> StepCompleted:
    return StepCompleted(
        run_id=run,
        ts_ns=n * int(dt * S) if ts_ns is None else ts_ns,
        step=n,
        loss=loss,
        grad_norm=grad,
        step_time_s=dt,
        tokens=tokens,
        restart_from_step=restart_from,
        skipped=skipped,
    )


def hb(rank: int, n: int, ts_ns: int, *, run: str = "r", dt: float = 0.0) -> Heartbeat:
    return Heartbeat(run_id=run, ts_ns=ts_ns, rank=rank, step=n, step_time_s=dt)


def tick(ts_ns: int, partition: int = 0) -> Tick:
    return Tick(run_id="*", ts_ns=ts_ns, partition=partition)


def ended(run: str = "r", ts_ns: int = 0, status: str = "stopped") -> RunEnded:
    return RunEnded(run_id=run, ts_ns=ts_ns, status=status)  # type: ignore[arg-type]


def random_exit(rng: random.Random, run: str, ts_ns: int, world: int) -> RankExited:
    """A RankExited of a rank up to one past ``world``: clean, failed, unknown or killed,
    and now and then after the rank said its training finished (``finished``)."""
    return RankExited(
        run_id=run,
        ts_ns=ts_ns,
        rank=rng.randrange(world + 1),
        exit_code=rng.choice((0, 1, None)),
        signal=rng.choice((None, 9)),
        finished=rng.random() < 0.25,
    )


def healthy_losses(n: int, seed: int = 0, noise: float = 0.02) -> list[float]:
    rng = random.Random(seed)
    return [2.0 + math.exp(-i / 200) + rng.gauss(0.0, noise) for i in range(1, n + 1)]


def fold_steps(
    events: Iterable[RunStarted | StepCompleted | RunEnded],
    cfg: DetectorConfig,
    state: StepHealthState | None = None,
    first_offset: int = 0,
) -> tuple[StepHealthState | None, list[AnomalyDetected]]:
    out: list[AnomalyDetected] = []
    for i, event in enumerate(events):
        state, verdicts = fold_step(state, event, src(first_offset + i), cfg)
        out.extend(verdicts)
    return state, out


def fold_heartbeats(
    events: Iterable[RunStarted | Heartbeat | Tick | RunEnded],
    cfg: DetectorConfig,
    state: LivenessState | None = None,
    first_offset: int = 0,
) -> tuple[LivenessState | None, list[AnomalyDetected]]:
    out: list[AnomalyDetected] = []
    for i, event in enumerate(events):
        state, verdicts = fold_liveness(state, event, src(first_offset + i), cfg)
        out.extend(verdicts)
    return state, out


def lockstep(
    world: int, steps: range, *, dt_s: float = 0.25, run: str = "r", skip: Iterable[int] = ()
) -> Iterator[Heartbeat]:
    """Heartbeats of a gang in lockstep: every rank but ``skip`` reports every step."""
    silent = set(skip)
    for n in steps:
        for rank in range(world):
            if rank not in silent:
                yield hb(rank, n, n * int(dt_s * S) + rank, run=run, dt=dt_s)


def kinds(verdicts: Iterable[AnomalyDetected]) -> list[str]:
    return [v.kind for v in verdicts]


def verdict(
    kind: str,
    n: int,
    *,
    run: str = "r",
    severity: str = "warning",
    rank: int | None = None,
    detail: str = "",
) -> AnomalyDetected:
    """A verdict of ``kind`` at step ``n`` (ids are not derived: tests of folds over verdicts)."""
    return AnomalyDetected(
        run_id=run,
        ts_ns=n * S,
        verdict_id=f"{run}-{kind}-{n}",
        kind=kind,  # type: ignore[arg-type]
        step=n,
        rank=rank,
        severity=severity,  # type: ignore[arg-type]
        detail=detail,
    )


def restart(
    action: str, cause_kind: str, *, run: str = "r", incarnation: int = 0
) -> RestartRequested:
    """A command of ``action`` for a verdict of ``cause_kind``."""
    return RestartRequested(
        run_id=run,
        ts_ns=0,
        command_id=f"{run}-{action}-{incarnation}",
        action=action,  # type: ignore[arg-type]
        cause_verdict_id=f"{run}-{cause_kind}",
        cause_kind=cause_kind,  # type: ignore[arg-type]
        incarnation=incarnation,
    )


def same(a: object, b: object) -> bool:
    """``a == b``, a NaN equal to a NaN: what "the same verdicts, bit for bit" means here.

    ``==`` holds a NaN equal to itself only when both sides hold one float object, which
    the pure fold happens to reuse and a compiled one (`processors.core.native`) boxes
    anew. ``repr`` round-trips every float (``-0.0`` and ``0.0`` differ), so this is as
    strict as ``==`` otherwise, and stricter about order.
    """
    return repr(a) == repr(b)
