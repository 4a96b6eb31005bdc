"""The demo: the whole pipeline on the embedded broker, a real torch run, injected faults.

It starts (and always stops again) the broker, a processor worker, the sinks and one
`runwatch launch` controller per run; the first run trains with faults scheduled into it
(a loss spike, a killed rank, a NaN, a resume that drops the optimizer state); the live
view shows what the processors know; at the end it prints each run's health receipt and
audits every run from the log.
"""

from __future__ import annotations

import os
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, TextIO

import msgspec

from runwatch.admin import create_catalogue
from runwatch.common.errors import RunwatchError
from runwatch.liveview import describe, render
from runwatch.processors.audit import audit, load_run_log
from runwatch.processors.core.config import DetectorConfig, with_overrides
from runwatch.processors.core.replay import replay
from runwatch.processors.core.report import health_report
from runwatch.processors.fleet import latest_states, summarize, wait_until_processed
from runwatch.processors.logread import TopicTail
from runwatch.procs import ManagedProcess
from runwatch.schemas.events import Event
from runwatch.schemas.records import split
from runwatch.schemas.topics import TopicRole, names
from runwatch.ui.model import AuditNote, WebviewData
from runwatch.ui.server import UiServer

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_ddp.py"

DETECTOR_SETTINGS: dict[str, str] = {
    "dead_rank_timeout_s": "3",
    "hang_timeout_s": "10",
    "startup_timeout_s": "120",
    "restart_check_steps": "10",
}
"""Short timeouts so the demo's faults are acted on within seconds."""

FAULTS: tuple[str, ...] = (
    "kill@55:rank=1",
    "spike@75:incarnation=1",
    "nan@95:incarnation=1",
    "dropopt@0:incarnation=2",
)
"""The first run's schedule: a killed rank (respawn), then in the respawned gang a loss
spike (alert) and a NaN (rollback), and a rollback resume that drops the optimizer state
(continuity broken). The spike comes after the steep early descent, where a window's
spread would hide it."""


class DemoConfig(msgspec.Struct, frozen=True, kw_only=True):
    """What the demo runs.

    Attributes:
        runs: Concurrent training runs (the first one gets the faults).
        steps: Steps per run.
        nproc: Ranks of the faulty run (the others run with one rank).
        bootstrap: An existing broker; None starts the embedded one.
        workdir: Where logs, checkpoints and the archive go.
        refresh_s: Live view refresh interval.
        timeout_s: Give up (and fail) after this long.
        ui_port: Port of the web view (0: any free port; None: no web view). When the
            port is taken, any free port is used instead.
        ui_host: Address the web view listens on.
        keep_ui: Keep the web view (and the broker and processors it reads) up after
            the demo until Ctrl-C.
    """

    runs: int = 1
    steps: int = 150
    nproc: int = 2
    bootstrap: str | None = None
    workdir: Path
    refresh_s: float = 1.0
    timeout_s: float = 600.0
    ui_port: int | None = 0
    ui_host: str = "127.0.0.1"
    keep_ui: bool = False


@contextmanager
def _broker(cfg: DemoConfig) -> Iterator[str]:
    if cfg.bootstrap:
        yield cfg.bootstrap
        return
    from runwatch.broker import ensure_jars, ephemeral_broker

    ensure_jars()
    with ephemeral_broker(cfg.workdir / "kafka") as info:
        yield info.bootstrap


def _launch_args(
    cfg: DemoConfig, index: int, run_id: str, bootstrap: str, prefix: str
) -> list[str]:
    faulty = index == 0
    nproc = cfg.nproc if faulty else 1
    argv = [
        "launch",
        "--nproc",
        str(nproc),
        "--run-id",
        run_id,
        "--bootstrap",
        bootstrap,
        "--prefix",
        prefix,
        "--checkpoint-dir",
        str(cfg.workdir / "ckpt" / run_id),
        "--state-dir",
        str(cfg.workdir / "controller" / run_id),
        "--grace-s",
        "5",
        "--",
        sys.executable,
        str(EXAMPLE),
        "--steps",
        str(cfg.steps),
        "--checkpoint-every",
        "10",
        "--seed",
        str(index),
    ]
    for fault in FAULTS if faulty else ():
        argv += ["--inject", fault]
    return argv


def _events(tail: TopicTail, roles: dict[str, str]) -> list[Event]:
    out: list[Event] = []
    for record in tail.poll():
        good, _ = split([record], roles[record.topic])
        out.extend(event for _, event in good)
    return out


def run_demo(cfg: DemoConfig, out: TextIO = sys.stdout) -> int:
    """Run the demo; returns 0 when every run finished and every audit agrees."""
    cfg.workdir.mkdir(parents=True, exist_ok=True)
    prefix = f"demo{secrets.token_hex(3)}"
    topics = names(prefix)
    run_ids = [f"demo-{i + 1}" for i in range(cfg.runs)]
    totals = dict.fromkeys(run_ids, cfg.steps)
    detector = with_overrides(DetectorConfig(), DETECTOR_SETTINGS)
    env = {**os.environ, "RUNWATCH_COMMAND_KEY": secrets.token_hex(16), "PYTHONUNBUFFERED": "1"}
    logs = cfg.workdir / "logs"
    is_tty = out.isatty()
    started = time.monotonic()

    def say(line: str) -> None:
        print(line, file=out, flush=True)

    with ExitStack() as stack:
        bootstrap = stack.enter_context(_broker(cfg))
        say(f"broker: {bootstrap}   topics: {prefix}.*   work dir: {cfg.workdir}")
        create_catalogue(bootstrap, prefix=prefix, partitions=2)
        app_id = f"{prefix}-processors"
        sets = [a for k, v in DETECTOR_SETTINGS.items() for a in ("--set", f"{k}={v}")]
        common = ["--bootstrap", bootstrap, "--prefix", prefix]
        services: list[ManagedProcess] = []
        stack.callback(lambda: [s.stop() for s in reversed(services)])
        services.append(
            ManagedProcess.runwatch(
                "processors",
                [
                    "processors",
                    *common,
                    "--app-id",
                    app_id,
                    "--partitions",
                    "2",
                    "--tick-interval",
                    "0.5",
                    "--session-timeout",
                    "6",
                    *sets,
                ],
                logs / "processors.log",
                env=env,
            )
        )
        services.append(
            ManagedProcess.runwatch(
                "sinks",
                [
                    "sinks",
                    *common,
                    "--alerts",
                    "--metrics",
                    "--metrics-port",
                    "0",
                    "--archive",
                    str(cfg.workdir / "archive"),
                    "--state-dir",
                    str(cfg.workdir / "sinks"),
                ],
                logs / "sinks.log",
                env=env,
            )
        )
        launches = {
            run_id: ManagedProcess.runwatch(
                f"launch {run_id}",
                _launch_args(cfg, i, run_id, bootstrap, prefix),
                logs / f"launch-{run_id}.log",
                env=env,
            )
            for i, run_id in enumerate(run_ids)
        }
        services.extend(launches.values())
        say(f"processors, sinks and {len(launches)} run(s) started; logs in {logs}")
        webview = _web_view(cfg, stack, bootstrap, prefix, app_id, detector, say)
        title = "runwatch demo" if webview is None else f"runwatch demo   web view: {webview.url}"
        roles = topics.roles(TopicRole.ANOMALIES, TopicRole.COMMANDS, TopicRole.CONTROLLER)
        tail = TopicTail(bootstrap, list(roles))
        stack.callback(tail.close)
        recent: list[Event] = []
        _watch(
            cfg,
            launches,
            lambda: _frame(bootstrap, app_id, totals, recent, tail, roles, started, title),
            say,
            is_tty,
        )
        failed = {r: p.returncode for r, p in launches.items() if p.returncode != 0}
        # every event is in the log; let the processors finish with it (inputs, then the
        # anomalies the policy reads) before the audit compares
        wait_until_processed(bootstrap, app_id, [topics.steps, topics.heartbeats])
        wait_until_processed(bootstrap, app_id, [topics.anomalies])
        recent.extend(_events(tail, roles))
        say("")
        ok = _receipts(
            bootstrap, prefix, run_ids, detector, say, None if webview is None else webview.data
        )
        if failed:
            say(f"runs that did not finish: {failed}; see {logs}")
        say(f"demo finished in {time.monotonic() - started:.0f} s")
        status = 0 if ok and not failed else 1
        if webview is not None and cfg.keep_ui:
            say(f"web view stays up at {webview.url} (Ctrl-C to stop)")
            _wait_for_stop()
            say("stopping")
        return status


def _wait_for_stop() -> None:
    """Block until Ctrl-C or SIGTERM (either way the caller's stack stops every child)."""
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):  # wakes for the signal handlers on the main thread
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)


def _web_view(
    cfg: DemoConfig,
    stack: ExitStack,
    bootstrap: str,
    prefix: str,
    app_id: str,
    detector: DetectorConfig,
    say: Callable[[str], None],
) -> UiServer | None:
    """Start `runwatch ui`'s server on this pipeline (stopped with the stack)."""
    if cfg.ui_port is None:
        return None
    data = WebviewData(bootstrap, prefix=prefix, app_id=app_id, cfg=detector)
    try:
        server = UiServer(data, host=cfg.ui_host, port=cfg.ui_port)
    except RunwatchError as exc:
        if cfg.ui_port == 0:
            raise
        say(f"web view: {exc}; using any free port")
        server = UiServer(data, host=cfg.ui_host, port=0)
    data.start()
    server.start()
    stack.callback(data.close)
    stack.callback(server.close)
    say(f"web view: {server.url}")
    return server


def _frame(
    bootstrap: str,
    app_id: str,
    totals: dict[str, int],
    recent: list[Event],
    tail: TopicTail,
    roles: dict[str, str],
    started: float,
    title: str,
) -> str:
    recent.extend(_events(tail, roles))
    views = latest_states(bootstrap, app_id, timeout_s=10.0)
    runs = [summarize(v) for k, v in views.items() if k in totals]
    return render(runs, totals, recent, elapsed_s=time.monotonic() - started, title=title)


def _watch(
    cfg: DemoConfig,
    launches: dict[str, ManagedProcess],
    frame: Callable[[], str],
    say: Callable[[str], None],
    is_tty: bool,
) -> None:
    deadline = time.monotonic() + cfg.timeout_s
    last = ""
    while any(p.returncode is None for p in launches.values()):
        if time.monotonic() > deadline:
            raise RunwatchError(f"demo timed out after {cfg.timeout_s:.0f} s")
        text = frame()
        if is_tty:
            say("\x1b[H\x1b[2J" + text)
        elif text.split("\n", 1)[1] != last.split("\n", 1)[-1]:
            say(text + "\n")
        last = text
        time.sleep(cfg.refresh_s)  # the refresh interval of a view
    say(frame())


def _receipts(
    bootstrap: str,
    prefix: str,
    run_ids: list[str],
    cfg: DetectorConfig,
    say: Callable[[str], None],
    webview: WebviewData | None = None,
) -> bool:
    ok = True
    for run_id in run_ids:
        log = load_run_log(bootstrap, prefix, run_id)
        result = replay([*log.inputs, *log.recorded_anomalies], cfg)
        report = health_report(
            result.steps.get(run_id),
            result.liveness.get(run_id),
            policy=result.policy.get(run_id),
            checkpoints=result.checkpoints.get(run_id),
            anomalies=result.anomalies,
            commands=result.commands,
            cfg=cfg,
        )
        for line in receipt_lines(report):
            say(line)
        receipt = audit(log, cfg)
        verdict = "every verdict reproduced" if receipt.agrees else "DISAGREES"
        say(
            f"  audit: {len(receipt.anomalies.matched)} anomalies and "
            f"{len(receipt.commands.matched)} commands re-derived from "
            f"{receipt.input_records} input records: {verdict}"
        )
        ok &= receipt.agrees
        if webview is not None:
            webview.record_audit(
                run_id,
                AuditNote(
                    agrees=receipt.agrees,
                    anomalies=len(receipt.anomalies.matched),
                    commands=len(receipt.commands.matched),
                    input_records=receipt.input_records,
                    at_unix_s=time.time(),
                ),
            )
    return ok


def receipt_lines(report: dict[str, Any]) -> list[str]:
    """The health receipt of one run as text."""
    steps = report.get("steps", {})
    mfu = report.get("mfu", {})
    timing = report.get("time", {})
    lines = [f"health receipt of {report.get('run_id')} (status {report.get('status')}):"]
    lines.append(
        f"  steps: {steps.get('kept')} kept, {steps.get('observed')} observed "
        f"({steps.get('redone_or_dropped')} redone after rollbacks)"
    )
    if mfu:
        avg, tps = mfu.get("run"), mfu.get("tokens_per_s")
        lines.append(
            f"  MFU ({mfu.get('convention')}, {mfu.get('dtype')}): "
            + ("n/a" if not isinstance(avg, float) else f"{100 * avg:.3f}% over kept steps")
            + ("" if not isinstance(tps, float) else f", {tps:,.0f} tokens/s")
        )
    ratio = timing.get("effective_training_time_ratio")
    if isinstance(ratio, float):
        lines.append(
            f"  effective training time: {100 * ratio:.1f}% of wall time "
            f"({100 * (1 - ratio):.1f}% lost to faults, restarts and redone steps)"
        )
    by_kind = report.get("anomalies", {}).get("by_kind", {})
    lines.append("  anomalies: " + (", ".join(f"{k} x{v}" for k, v in by_kind.items()) or "none"))
    for r in report.get("restarts", []):
        lines.append(
            f"  restart at step {r['at_step']} from step {r['from_step']} "
            f"(incarnation {r['incarnation']}): continuity {r['continuity']}"
        )
    for c in report.get("commands", []):
        bound = c["max_checkpoint_step"]
        lines.append(
            f"  command: {c['action']} of incarnation {c['incarnation']} for "
            f"{c['cause_kind']} (checkpoint {'latest' if bound is None else f'<= {bound}'})"
        )
    lines.append(f"  continuity: {'ok' if report.get('continuity_ok', True) else 'BROKEN'}")
    return lines


__all__ = ["DemoConfig", "describe", "receipt_lines", "run_demo"]
