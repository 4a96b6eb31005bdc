"""The Alertmanager sink: how fast it rebuilds its alerts from the log, and posts them.

    .venv/bin/python bench/alertmanager.py [--runs 1000] [--incarnations 5] [--world 64]
        [--storm 16384] [--post 10000] [--repeat 3]

1. **Replay** (what every start of `runwatch sinks --alertmanager` does before posting): a
   fleet history of ``--runs`` runs, each with ``--incarnations`` incarnations; each
   incarnation has a RunStarted with tags, three loss spikes, a NaN, a rollback command,
   ``--world`` dead-rank verdicts (a DDP gang killed: one per rank), RunEnded(stopped) and
   RestartCompleted. The records are encoded first; the timed loop is
   `AlertmanagerSink.handle` before catching up (decode, intake check, fold without
   rendering) with no Alertmanager. Then the catch-up (every run's alerts rendered once,
   and those that fire or ended within the hour as PostableAlerts).
2. **A storm**, live (the sink caught up, every change rendered and staged): one run whose
   ``--storm`` ranks all die at once (one verdict each): the cost per verdict must not grow
   with the gang (one condition, however many ranks).
3. **Posting** to the real Alertmanager (Debian's `prometheus-alertmanager`, on a free
   loopback port; skipped when it is not installed): ``--post`` firing alerts through one
   `AlertmanagerClient` (batches of 1000), until Alertmanager holds them all.

Each timed figure is the best of ``--repeat``: a shared machine only ever slows a run down.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runwatch.procs import ManagedProcess
from runwatch.schemas.codec import encode, encode_key
from runwatch.schemas.events import (
    AnomalyDetected,
    RestartCompleted,
    RestartRequested,
    RunEnded,
    RunStarted,
)
from runwatch.schemas.records import RawRecord
from runwatch.schemas.topics import names
from runwatch.sinks.alert_conditions import AlertState
from runwatch.sinks.alertmanager import (
    AlertmanagerClient,
    AlertmanagerSettings,
    AlertmanagerSink,
    postable,
)
from runwatch.sinks.delivery_figures import DeliveryFigures
from runwatch.sinks.webhook import RetryPolicy

S = 1_000_000_000
T = names("bench")


def verdict(
    run: str, kind: str, step: int, ts_ns: int, inc: int, rank: int | None = 0
) -> AnomalyDetected:
    severity = "warning" if kind == "loss_spike" else "critical"
    return AnomalyDetected(
        run_id=run,
        ts_ns=ts_ns,
        verdict_id=f"{run}-{inc}-{kind}-{step}-{rank}",
        kind=kind,  # type: ignore[arg-type]
        step=step,
        rank=rank,
        value=9.0,
        baseline=3.0,
        detail=f"{kind} at step {step}",
        incarnation=inc,
        severity=severity,  # type: ignore[arg-type]
    )


def history(runs: int, incarnations: int, world: int, now_ns: int) -> list[RawRecord]:
    """A fleet's retained runs, anomalies, commands and controller records."""
    out: list[tuple[str, object]] = []
    for r in range(runs):
        run = f"run-{r:05d}"
        t = now_ns - incarnations * 600 * S
        for inc in range(incarnations):
            tags = {"team": f"team-{r % 7}", "cluster": "west", "model": "gpt-1b"}
            out.append(
                (
                    T.runs,
                    RunStarted(run_id=run, ts_ns=t, world_size=world, tags=tags, incarnation=inc),
                )
            )
            for k in range(3):
                out.append(
                    (T.anomalies, verdict(run, "loss_spike", 100 + k, t + (10 + k) * S, inc))
                )
            out.append((T.anomalies, verdict(run, "nonfinite_loss", 200, t + 60 * S, inc)))
            cid = f"{run}-c{inc}"
            out.append(
                (
                    T.commands,
                    RestartRequested(
                        run_id=run,
                        ts_ns=t + 61 * S,
                        command_id=cid,
                        action="rollback",
                        cause_verdict_id="x",
                        cause_kind="nonfinite_loss",
                        incarnation=inc,
                    ),
                )
            )
            for rank in range(world):
                out.append(
                    (T.anomalies, verdict(run, "dead_rank", 201, t + 62 * S + rank, inc, rank))
                )
            out.append((T.runs, RunEnded(run_id=run, ts_ns=t + 63 * S, status="stopped")))
            out.append(
                (
                    T.controller,
                    RestartCompleted(
                        run_id=run, ts_ns=t + 65 * S, command_id=cid, checkpoint_step=150
                    ),
                )
            )
            t += 600 * S
    return [
        RawRecord(topic, 0, i, encode_key(e.run_id), encode(e), 0)
        for i, (topic, e) in enumerate(out)
    ]  # type: ignore[attr-defined]


def replay(records: list[RawRecord], now_ns: int) -> tuple[float, float, int, AlertmanagerSink]:
    """Seconds to fold ``records``, seconds of the catch-up snapshot, alerts posted by it."""
    sink = AlertmanagerSink(AlertmanagerSettings(urls=()), T, wall_ns=lambda: now_ns)
    start = time.perf_counter()
    for i in range(0, len(records), 2000):
        sink.handle(records[i : i + 2000], 0.0)
    fold_s = time.perf_counter() - start
    start = time.perf_counter()
    sink.on_assigned([(t, 0) for t in sink.topics])
    sink.on_lag({(t, 0): 0 for t in sink.topics})
    items = {
        a.fingerprint: postable(a, sink.settings, now_ns)
        for a in sink.latest.values()
        if a.fingerprint in sink.sent
    }
    snapshot_s = time.perf_counter() - start
    return fold_s, snapshot_s, len(items), sink


def storm_cost_us(ranks: int, repeat: int) -> float:
    now_ns = 10_000 * S
    records = [
        RawRecord(
            T.runs,
            0,
            0,
            encode_key("storm"),
            encode(RunStarted(run_id="storm", ts_ns=now_ns, world_size=ranks)),
            0,
        )
    ]
    records += [
        RawRecord(
            T.anomalies,
            0,
            i + 1,
            encode_key("storm"),
            encode(verdict("storm", "dead_rank", 5, now_ns + i, 0, i)),
            0,
        )
        for i in range(ranks)
    ]
    best = float("inf")
    for _ in range(repeat):
        sink = AlertmanagerSink(AlertmanagerSettings(urls=()), T, wall_ns=lambda: now_ns)
        sink.on_assigned([(t, 0) for t in sink.topics])
        sink.on_lag({(t, 0): 0 for t in sink.topics})  # caught up: live, every change rendered
        start = time.perf_counter()
        for i in range(0, len(records), 2000):
            sink.handle(records[i : i + 2000], 0.0)
        best = min(best, time.perf_counter() - start)
        assert len(sink.latest) == 1, "a storm must be one alert"
    return best / ranks * 1e6


def post_to_alertmanager(count: int, repeat: int) -> dict[str, float] | None:
    binary = shutil.which("prometheus-alertmanager")
    if binary is None:
        print("posting: skipped (prometheus-alertmanager is not installed: make tools)")
        return None
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    work = Path(tempfile.mkdtemp(prefix="am-bench-"))
    (work / "am.yml").write_text('route:\n  receiver: "null"\nreceivers:\n  - name: "null"\n')
    proc = ManagedProcess(
        "alertmanager",
        [
            binary,
            f"--config.file={work / 'am.yml'}",
            f"--storage.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        work / "am.log",
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        now_ns = time.time_ns()
        settings = AlertmanagerSettings(urls=(url,))
        best = float("inf")
        for rep in range(repeat):
            alerts = [
                AlertState(
                    run_id=f"r{i}",
                    kind="hang",
                    severity="critical",
                    labels={
                        "alertname": "hang",
                        "run": f"r{i}",
                        "severity": "critical",
                        "rep": str(rep),
                    },
                    annotations={"summary": "s", "description": "d"},
                    starts_ns=now_ns,
                    ends_ns=now_ns + 3600 * S,
                )
                for i in range(count)
            ]
            client = AlertmanagerClient(
                url,
                retry=RetryPolicy(timeout_s=30),
                max_delay_s=1,
                figures=DeliveryFigures(),
                say=print,
            )
            client.start()
            start = time.perf_counter()
            client.offer({a.fingerprint: postable(a, settings, now_ns) for a in alerts})
            assert client.wait_delivered(300), "Alertmanager did not take them"
            best = min(best, time.perf_counter() - start)
            client.stop()
        with urllib.request.urlopen(f"{url}/api/v2/alerts", timeout=60) as reply:
            held = len(json.loads(reply.read()))
        assert held == count * repeat, held
        return {"alerts": count, "post_s": best, "alerts_per_s": count / best}
    finally:
        proc.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--incarnations", type=int, default=5)
    parser.add_argument("--world", type=int, default=64)
    parser.add_argument("--storm", type=int, default=16384)
    parser.add_argument("--post", type=int, default=10000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    now_ns = time.time_ns()
    records = history(args.runs, args.incarnations, args.world, now_ns)
    best = (float("inf"), float("inf"), 0)
    for _ in range(args.repeat):
        fold_s, snapshot_s, posted, sink = replay(records, now_ns)
        best = (min(best[0], fold_s), min(best[1], snapshot_s), posted)
    fold_s, snapshot_s, posted = best
    print(
        f"replay: {len(records):,} records of {args.runs} runs x {args.incarnations} incarnations "
        f"(world {args.world}) in {fold_s:.2f} s: {len(records) / fold_s:,.0f} records/s; "
        f"{len(sink.latest):,} alerts held, {len(sink.runs)} runs"
    )
    print(
        f"catch-up snapshot: {posted:,} alerts (firing or ended within the hour) "
        f"rendered in {snapshot_s * 1e3:.1f} ms"
    )
    small = storm_cost_us(args.world, args.repeat)
    large = storm_cost_us(args.storm, args.repeat)
    print(
        f"storm: {small:.1f} us per dead-rank verdict at {args.world} ranks, {large:.1f} us at "
        f"{args.storm:,} ranks (ratio {large / small:.2f}); one alert each"
    )
    posting = post_to_alertmanager(args.post, args.repeat)
    if posting:
        print(
            f"posting: {posting['alerts']:,} alerts taken by Alertmanager in "
            f"{posting['post_s']:.2f} s "
            f"({posting['alerts_per_s']:,.0f} alerts/s, batches of 1000)"
        )
    print(
        json.dumps(
            {
                "bench": "alertmanager",
                "records": len(records),
                "replay_records_per_s": round(len(records) / fold_s),
                "snapshot_alerts": posted,
                "snapshot_ms": round(snapshot_s * 1e3, 1),
                "storm_us_per_verdict": {
                    str(args.world): round(small, 2),
                    str(args.storm): round(large, 2),
                },
                "post": posting,
            }
        )
    )


if __name__ == "__main__":
    main()
