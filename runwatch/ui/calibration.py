"""``GET /api/calibration``: the fleet calibration report, computed on demand from the log.

The same report as `runwatch replay --all --json` (`processors.calibration`), for the web
view's fleet page. It reads the whole log, so it is bounded: one computation at a time,
at most `MAX_RUNS` runs (more: a clear error that says how to choose fewer, or to use the
command), and `TIMEOUT_S` seconds (over: a clear error; the command has no such limit).

Query: ``set=NAME=VALUE`` (repeatable: proposed settings, applied to the view's own
configuration), ``runs=N`` (the N runs begun last), ``top=N`` (runs listed).
"""

from __future__ import annotations

import threading
from http import HTTPStatus
from typing import Any, Final, Protocol

import msgspec

from runwatch.processors.core.config import DetectorConfig

MAX_RUNS: Final = 200
"""Most runs one request replays."""
TIMEOUT_S: Final = 60.0
"""Longest one request computes."""
MAX_TOP: Final = 100

_busy = threading.Lock()


class LogSource(Protocol):
    """Where the view reads the log (`runwatch.ui.model.WebviewData` is one)."""

    bootstrap: str
    prefix: str
    cfg: DetectorConfig


def _params(params: dict[str, list[str]], max_runs: int) -> tuple[dict[str, str], int | None, int]:
    """``(overrides, runs, top)`` from the query; ValueError with a message when bad."""
    overrides: dict[str, str] = {}
    for pair in params.get("set", []):
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"set expects NAME=VALUE, got {pair!r}")
        overrides[name.strip()] = value.strip()
    runs_text = params.get("runs", [""])[0]
    runs = int(runs_text) if runs_text else None
    if runs is not None and not 1 <= runs <= max_runs:
        raise ValueError(f"runs must be 1..{max_runs}, got {runs}")
    top = int(params.get("top", ["10"])[0])
    if not 0 <= top <= MAX_TOP:
        raise ValueError(f"top must be 0..{MAX_TOP}, got {top}")
    return overrides, runs, top


def _compute(
    source: LogSource,
    overrides: dict[str, str],
    runs: int | None,
    top: int,
    limits: tuple[int, float],
) -> tuple[Any, int]:
    max_runs, timeout_s = limits
    from runwatch.processors.audit import load_all_run_logs
    from runwatch.processors.calibration import calibrate, select_runs
    from runwatch.processors.core.config import config_hash, with_overrides

    cfg = with_overrides(source.cfg, overrides)  # ValueError: a bad setting
    logs = [
        log
        for log in load_all_run_logs(source.bootstrap, source.prefix, timeout_s=timeout_s)
        if log.inputs
    ]
    if runs is None and len(logs) > max_runs:
        return {
            "error": f"{len(logs)} runs in the log; the view calibrates at most {max_runs}: "
            f"add runs=N (the N begun last, N <= {max_runs}) or run `runwatch replay --all`"
        }, HTTPStatus.UNPROCESSABLE_ENTITY
    chosen = select_runs(logs, last=runs)
    report = calibrate(chosen, cfg, config_hash(cfg), overrides=overrides, top_n=top)
    return msgspec.to_builtins(report), HTTPStatus.OK


def calibration_json(
    source: LogSource,
    params: dict[str, list[str]],
    *,
    max_runs: int = MAX_RUNS,
    timeout_s: float = TIMEOUT_S,
) -> tuple[Any, int]:
    """The report (or ``{"error": ...}``) and the HTTP status to answer with.

    Args:
        source: The log's address and the view's configuration.
        params: The parsed query string.
        max_runs: Most runs replayed.
        timeout_s: Longest to compute.

    Returns:
        ``(body, status)``: 200 with the report; 400 a bad query or setting; 422 too many
        runs; 429 another calibration is running; 503 over the time limit or the log could
        not be read.
    """
    try:
        overrides, runs, top = _params(params, max_runs)
    except ValueError as exc:
        return {"error": str(exc)}, HTTPStatus.BAD_REQUEST
    if not _busy.acquire(blocking=False):
        return {
            "error": "a calibration is already being computed; try again shortly"
        }, HTTPStatus.TOO_MANY_REQUESTS
    out: list[tuple[Any, int]] = []

    def work() -> None:
        try:
            out.append(_compute(source, overrides, runs, top, (max_runs, timeout_s)))
        except ValueError as exc:
            out.append(({"error": str(exc)}, HTTPStatus.BAD_REQUEST))
        except Exception as exc:  # the view keeps serving; the page shows why
            out.append(({"error": f"cannot read the log: {exc}"}, HTTPStatus.SERVICE_UNAVAILABLE))
        finally:
            _busy.release()

    worker = threading.Thread(target=work, name="calibration", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if not out:
        return {
            "error": f"the calibration took longer than {timeout_s:.0f} s; choose fewer runs "
            "(runs=N) or run `runwatch replay --all`"
        }, HTTPStatus.SERVICE_UNAVAILABLE
    return out[0]


__all__ = ["MAX_RUNS", "TIMEOUT_S", "LogSource", "calibration_json"]
