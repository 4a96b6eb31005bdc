"""Issue 19 as an attacker: the attack tests on a real broker, and 100k run ids' memory.

Two parts, both against one embedded broker (`runwatch.broker.ephemeral_broker`):

1. The attack scenarios: the attacker tests (`ATTACK_TESTS`: ACLs per role, forged steps
   and verdicts, clock attacks, a replayed command, records that tried to stop a process)
   run by pytest with ``RUNWATCH_BOOTSTRAP`` set to this broker (the tests that need a
   broker with ACLs start their own secure one); the JUnit report becomes one table,
   finding -> result.
2. Memory after ``--runs`` distinct run ids (one step and one heartbeat each, so twice as
   many records): `runwatch sinks --metrics` and `runwatch ui`, each a subprocess reading
   the whole log, for the code ``--before`` (default: the commit this branch left main
   at, exported with ``git archive`` into a temporary directory and run from there) and
   for this tree. Figures: resident memory (``VmRSS``) and its peak (``VmHWM``) once the
   process has read everything (the exporter: ``runwatch_metrics_caught_up 1``; the web
   view: its CPU time stops moving for ``--settle-s``), the runs tracked, ``/metrics``
   size and one scrape's seconds.

3. The processors' states after the same number of run ids (one step, heartbeat and
   checkpoint each), before and after: ``bench/flood.py`` (the agents' fold entry point
   with tables of encoded states, no broker) for each tree; its figures land under
   ``memory.processors_before`` and ``memory.processors_after``.

Prints a table and one JSON line. ``--runs`` (default 100000; lower it where 4 replays
of ``2 x runs`` records take more than a few minutes, and say so), ``--skip-tests``,
``--skip-memory``, ``--skip-processors``.

    PYTHONPATH=$PWD .venv/bin/python bench/redteam.py --runs 100000
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from runwatch import admin  # noqa: E402
from runwatch.broker import ephemeral_broker  # noqa: E402

FINDINGS: dict[str, str] = {
    # test_attacker.py: what each role's credential may do on a broker with ACLs
    "test_a_trainer_cannot_write_a_verdict_a_command_or_a_dead_letter": "1 forged verdict (ACLs)",
    "test_a_trainer_cannot_write_the_processors_state": "1 forged state (ACLs)",
    "test_a_trainer_reads_nothing_not_even_its_own_inputs": "least privilege: trainer",
    "test_the_sinks_credential_cannot_write_anything": "least privilege: sinks write",
    "test_the_sinks_credential_reads_what_it_shows": "least privilege: sinks read",
    "test_the_controller_cannot_write_a_verdict_or_a_command": "least privilege: controller",
    "test_no_other_role_joins_the_processors_group": "least privilege: processors' group",
    "test_no_login_no_kafka": "least privilege: no login",
    # test_forged_steps.py and test_clock_attacks.py: records that steer decisions
    "test_a_trainers_forged_nan_steps_buy_what_the_detection_gives_and_no_forged_verdict": (
        "1 forged NaN steps"
    ),
    "test_a_forged_huge_hang_timeout_does_not_disable_hang_detection": "1 forged thresholds",
    "test_a_tick_a_day_ahead_raises_nothing_for_live_runs": "2 future Tick",
    "test_a_future_dated_incarnation_never_carries_into_the_next": "2 future incarnation",
    "test_a_live_worker_ignores_a_tick_a_day_ahead": "2 future Tick, live worker",
    "test_every_input_topic_is_stamped_by_the_broker": "2 broker time on inputs",
    "test_topics_create_gives_an_existing_input_topic_the_broker_s_clock": (
        "2 broker time, upgraded topics"
    ),
    # test_launch_binding.py (controller): commands bound to a launch
    "test_a_command_replayed_into_a_new_launch_is_refused_and_a_fresh_one_obeyed": (
        "6 command replayed into a new launch"
    ),
    # test_attacks.py: no record stops a process; bounded edges
    "test_a_non_ascii_signature_neither_kills_the_launcher_nor_its_adoption": (
        "3 non-ASCII signature; 12 state/log modes"
    ),
    "test_no_record_stops_runwatch_sinks": "4 100-'/' run id; 5 7e18 heartbeat; garbage batch",
    "test_a_record_that_raises_in_a_sink_costs_that_record_only": "no record stops a sink",
    "test_the_relay_speaks_only_for_its_run_and_one_topic_never_blocks_the_others": "9 relay",
    "test_a_long_state_dir_puts_the_socket_in_a_private_directory": "9 relay socket dir",
    "test_a_huge_or_negative_body_is_refused_at_once": "11 body limit",
    "test_dns_rebinding_is_refused_by_the_host_check": "11 Host check",
    "test_a_cross_site_form_cannot_start_an_audit": "11 Origin + CSRF",
}
"""Attack test -> the issue's finding(s) it shows (7 and 8 are unit tests and a bench:
tests/unit/core/test_bounds.py, `bench/core.py`'s 131,072-rank line; 10 is this bench's
memory part)."""

ATTACK_TESTS: tuple[str, ...] = (
    "tests/integration/security/test_attacker.py",
    "tests/integration/security/test_forged_steps.py",
    "tests/integration/security/test_clock_attacks.py",
    "tests/integration/controller/test_launch_binding.py",
    "tests/integration/security/test_attacks.py",
)
"""Where the attack tests are: raw records and plain Kafka clients, as an attacker writes them."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def attack_table(bootstrap: str) -> list[dict[str, Any]]:
    """Run the attack tests against ``bootstrap``; one row per test."""
    with tempfile.TemporaryDirectory(prefix="rw-redteam-") as tmp:
        report = Path(tmp) / "junit.xml"
        env = {**os.environ, "RUNWATCH_BOOTSTRAP": bootstrap, "PYTHONPATH": str(REPO)}
        subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             f"--junitxml={report}", *ATTACK_TESTS],
            cwd=REPO, env=env, check=False, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        by_test: dict[str, dict[str, Any]] = {}  # one row per scenario, its cases counted
        for case in ET.parse(report).getroot().iter("testcase"):
            name = case.get("name", "").split("[")[0]
            failed = case.find("failure") is not None or case.find("error") is not None
            skipped = case.find("skipped") is not None
            result = "FAIL" if failed else "skipped" if skipped else "held"
            seconds = float(case.get("time", 0))
            row = by_test.setdefault(
                name, {"finding": FINDINGS.get(name, name), "test": name, "cases": 0,
                       "held": 0, "result": "held", "seconds": 0.0}
            )  # fmt: skip
            row["cases"] += 1
            row["held"] += result == "held"
            row["seconds"] = round(row["seconds"] + seconds, 1)
            if result != "held" and row["result"] != "FAIL":
                row["result"] = result  # one failing case fails the scenario
    return list(by_test.values())


def publish_runs(bootstrap: str, prefix: str, runs: int) -> float:
    """One step and one heartbeat for each of ``runs`` distinct run ids; seconds taken."""
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap, acks=1, linger_ms=20, batch_size=512 * 1024
    )
    started = time.perf_counter()
    now_ns = time.time_ns()
    for i in range(runs):
        run_id = f"redteam-{i:06d}"
        step = {"type": "step.v1", "run_id": run_id, "ts_ns": now_ns, "step": 1}
        step |= {"loss": 2.5, "step_time_s": 0.5, "tokens": 4096}
        beat = {"type": "heartbeat.v1", "run_id": run_id, "ts_ns": now_ns, "rank": 0, "step": 1}
        producer.send(f"{prefix}.steps", key=run_id.encode(), value=json.dumps(step).encode())
        producer.send(f"{prefix}.heartbeats", key=run_id.encode(), value=json.dumps(beat).encode())
    producer.flush(300)
    producer.close()
    return time.perf_counter() - started


def proc_status(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM in MiB, and user+system CPU seconds, of ``pid``."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = round(int(value.split()[0]) / 1024, 1)
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    out["cpu_s"] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def _get(url: str) -> tuple[bytes, float]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as reply:
        body = reply.read()
    return body, time.perf_counter() - started


def _start(tree: Path, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNWATCH_")}
    env["PYTHONPATH"] = str(tree)
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "runwatch.cli", *args], cwd=tree, env=env,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)


def measure_sinks(tree: Path, bootstrap: str, prefix: str, log: Path) -> dict[str, Any]:
    """`runwatch sinks --metrics` of ``tree`` after it replayed the log."""
    port = free_port()
    proc = _start(
        tree,
        ["sinks", "--metrics", "--metrics-port", str(port), "--bootstrap", bootstrap,
         "--prefix", prefix, "--group", f"{prefix}-{uuid.uuid4().hex[:6]}",
         "--processors-group", ""],
        log,
    )  # fmt: skip
    started = time.perf_counter()
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 900
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the exporter never caught up"
            try:
                body, _ = _get(url)
            except OSError:
                body = b""
            if b"runwatch_metrics_caught_up 1.0" in body:
                break
            time.sleep(1.0)  # a scrape is the exporter's only signal; polled
        caught_up_s = time.perf_counter() - started
        body, scrape_s = _get(url)
        tracked = [
            line for line in body.decode().splitlines()
            if line.startswith("runwatch_runs_tracked ")
        ]  # fmt: skip
        return {
            **proc_status(proc.pid),
            "caught_up_s": round(caught_up_s, 1),
            "runs_tracked": int(float(tracked[0].split()[1])) if tracked else None,
            "metrics_bytes": len(body),
            "scrape_s": round(scrape_s, 2),
        }
    finally:
        _stop(proc)


def measure_ui(tree: Path, bootstrap: str, prefix: str, log: Path, settle_s: float) -> dict:
    """`runwatch ui` of ``tree`` once its reader went idle (the log read)."""
    port = free_port()
    proc = _start(
        tree, ["ui", "--port", str(port), "--bootstrap", bootstrap, "--prefix", prefix], log
    )
    started = time.perf_counter()
    try:
        deadline = time.monotonic() + 900
        last = proc_status(proc.pid)["cpu_s"]
        idle_since: float | None = None
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the web view never went idle"
            time.sleep(1.0)  # sampling CPU time: idleness has no event
            cpu = proc_status(proc.pid)["cpu_s"]
            busy = cpu - last > 0.05
            last = cpu
            if busy or idle_since is None:
                idle_since = time.monotonic() if not busy else None
                continue
            if time.monotonic() - idle_since >= settle_s and cpu > 1.0:
                break
        status = proc_status(proc.pid)
        _, fleet_s = _get(f"http://127.0.0.1:{port}/api/fleet?size=50")
        return {**status, "read_s": round(time.perf_counter() - started, 1),
                "fleet_request_s": round(fleet_s, 2)}  # fmt: skip
    finally:
        _stop(proc)


def export_before(ref: str, into: Path) -> Path:
    """``git archive`` of ``ref`` unpacked into ``into`` (read only for the repository)."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", ref], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def processors_memory(tree: Path, runs: int) -> dict[str, Any]:
    """`bench/flood.py` (of this tree) folding with the code of ``tree``; its JSON line."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "flood.py"), "--runs", str(runs),
         "--tree", str(tree)],
        cwd=REPO, check=True, capture_output=True, text=True,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def memory(
    bootstrap: str, runs: int, before_ref: str, settle_s: float, processors: bool = True
) -> dict[str, Any]:
    """Before/after memory of the exporter and the web view over ``runs`` run ids."""
    prefix = f"rt{uuid.uuid4().hex[:8]}"
    admin.create_topics(bootstrap, admin.catalogue(prefix, 2))
    publish_s = publish_runs(bootstrap, prefix, runs)
    out: dict[str, Any] = {"runs": runs, "records": 2 * runs, "publish_s": round(publish_s, 1)}
    with tempfile.TemporaryDirectory(prefix="rw-redteam-before-") as tmp:
        trees = {"before": export_before(before_ref, Path(tmp)), "after": REPO}
        for label, tree in trees.items():
            log = Path(tmp) / f"{label}.log"
            out[f"sinks_{label}"] = measure_sinks(tree, bootstrap, prefix, log)
            out[f"ui_{label}"] = measure_ui(tree, bootstrap, prefix, log, settle_s)
            if processors:
                out[f"processors_{label}"] = processors_memory(tree, runs)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=100_000, help="distinct run ids")
    parser.add_argument("--before", default="", help="git ref of 'before' (default: merge-base)")
    parser.add_argument("--settle-s", type=float, default=5.0, help="web view idle this long")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-processors", action="store_true")
    args = parser.parse_args()
    before = args.before or subprocess.run(
        ["git", "-C", str(REPO), "merge-base", "HEAD", "main"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    result: dict[str, Any] = {"bench": "redteam", "before": before[:12]}
    with (
        tempfile.TemporaryDirectory(prefix="rw-redteam-broker-") as tmp,
        ephemeral_broker(Path(tmp)) as info,
    ):
        if True:
            if not args.skip_tests:
                rows = attack_table(info.bootstrap)
                result["attacks"] = rows
                print(f"{'finding':50} {'result':8} {'cases':>7} seconds")
                for row in rows:
                    cases = f"{row['held']}/{row['cases']}"
                    print(f"{row['finding'][:50]:50} {row['result']:8} {cases:>7} {row['seconds']}")
            if not args.skip_memory:
                mem = memory(
                    info.bootstrap, args.runs, before, args.settle_s, not args.skip_processors
                )
                result["memory"] = mem
                print(f"\n{mem['runs']} run ids, {mem['records']} records")
                print(f"{'':16} {'VmRSS MiB':>10} {'VmHWM MiB':>10} {'tracked':>8} "
                      f"{'/metrics B':>11} {'scrape s':>9}")  # fmt: skip
                for label in ("before", "after"):
                    s = mem[f"sinks_{label}"]
                    print(f"sinks {label:10} {s['VmRSS']:>10} {s['VmHWM']:>10} "
                          f"{s['runs_tracked']!s:>8} {s['metrics_bytes']:>11} "
                          f"{s['scrape_s']:>9}")  # fmt: skip
                for label in ("before", "after"):
                    u = mem[f"ui_{label}"]
                    print(f"ui {label:13} {u['VmRSS']:>10} {u['VmHWM']:>10}")
                for label in ("before", "after"):
                    f = mem.get(f"processors_{label}")
                    if f is not None:
                        print(f"processors {label:6} flood {f['flood']['rss_mib']:>7} MiB "
                              f"{f['flood']['states']}; two days on {f['ended']['rss_mib']:>7} "
                              f"MiB {f['ended']['states']}")  # fmt: skip
    print(json.dumps(result, separators=(",", ":")))


if __name__ == "__main__":
    main()
