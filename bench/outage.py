"""What a broker outage costs a processor worker: log lines and CPU while the broker is down.

Starts its own broker (an `EmbeddedBroker` in a temporary directory, so nothing else sees
the outage), creates the catalogue with 2 partitions, starts one `runwatch processors`
worker with the Kafka clients' errors visible (``--loglevel error``, the view of an
operator debugging a worker), feeds one run, waits until its states are written, then
stops the broker for ``--outage-s`` seconds and measures over that window:

* ``lines``: lines the worker wrote to its log (stdout and stderr), and ``lines_per_s``;
* ``connect_attempts``: refused connection attempts its client logged (summaries counted);
* ``cpu_s``: the worker's user + system CPU seconds (``/proc/PID/stat``);
* ``watch_down_s``, ``watch_errors``: the worker's own account once the broker is back
  (``answers again after N s (M client connection errors in between)``, every client
  error counted whether shown or not; -1 for a worker without that line);

then starts the broker again on the same port, feeds more steps and reports how long the
worker took to apply them all (``resume_s``, exact counts checked). One JSON line.

    .venv/bin/python bench/outage.py [--outage-s 15] [--loglevel error|none]

The worker runs ``python -m runwatch.cli`` from the current directory: run the bench from
another checkout (``cd ../main && python /path/to/bench/outage.py``) to measure its code.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from runwatch import admin  # noqa: E402
from runwatch.broker.lifecycle import EmbeddedBroker  # noqa: E402
from runwatch.processors.fleet import latest_states  # noqa: E402
from runwatch.procs import ManagedProcess, exit_on_sigterm  # noqa: E402
from runwatch.producers import RunEmitter  # noqa: E402


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def lines(path: Path) -> int:
    """Lines in ``path`` so far."""
    return path.read_bytes().count(b"\n") if path.exists() else 0


def connect_attempts(path: Path, first_line: int, last_line: int) -> int:
    """Refused connection attempts the worker's client logged in a window of its log.

    Each ``Unable connect to node`` line counts 1, plus the repeats a summary line stands
    for (``[+N like this ...]``).
    """
    text = path.read_text(errors="replace").splitlines()[first_line:last_line]
    total = 0
    for line in text:
        if "Unable connect to node" in line:
            held = re.search(r"\[\+(\d+) like this", line)
            total += 1 + (int(held.group(1)) if held else 0)
    return total


def wait_back(path: Path, timeout_s: float) -> tuple[int, int]:
    """The worker's own "answers again after N s (M client connection errors ...)" figures.

    M counts every connection error its client logged during the outage, shown or not.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = re.search(
            r"answers again after (\d+) s \((\d+) client connection errors",
            path.read_text(errors="replace"),
        )
        if found:
            return int(found.group(1)), int(found.group(2))
        time.sleep(0.2)  # polling a log file
    return -1, -1


def steps_applied(bootstrap: str, app_id: str, run_id: str) -> int:
    view = latest_states(bootstrap, app_id).get(run_id)
    return 0 if view is None or view.steps is None else view.steps.steps_observed


def feed(bootstrap: str, prefix: str, run_id: str, first: int, last: int) -> None:
    emitter = RunEmitter(run_id, bootstrap=bootstrap, topic_prefix=prefix, rank=0, world_size=1)
    if first == 1:
        emitter.run_started(vocab_size=256, peak_flops_per_s=1e12)
    for s in range(first, last + 1):
        emitter.step(s, loss=4.0 - 0.01 * s, step_time_s=0.05, grad_norm=1.0, tokens=4096)
        emitter.heartbeat(s, step_time_s=0.05)
    assert emitter.flush(60.0)
    emitter.close(30.0)


def wait_applied(bootstrap: str, app_id: str, run_id: str, want: int, timeout_s: float) -> float:
    start = time.monotonic()
    while (have := steps_applied(bootstrap, app_id, run_id)) != want:
        if time.monotonic() - start > timeout_s:
            raise SystemExit(f"only {have} of {want} steps applied after {timeout_s:.0f} s")
        time.sleep(0.2)  # polling the changelog
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outage-s", type=float, default=15.0)
    parser.add_argument("--loglevel", default="error", choices=["error", "none"])
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    exit_on_sigterm()  # stop the children it started when it is stopped itself
    root = Path(tempfile.mkdtemp(prefix="runwatch-outage-"))
    broker = EmbeddedBroker(root / "broker")
    info = broker.start()
    bootstrap, prefix, app_id, run_id = info.bootstrap, "outage", "outage-app", "run-o"
    admin.create_catalogue(bootstrap, prefix=prefix, partitions=2)
    log_path = root / "worker.log"
    argv = ["processors", "--bootstrap", bootstrap, "--prefix", prefix, "--app-id", app_id]
    argv += ["--partitions", "2", "--tick-interval", "0.5", "--session-timeout", "6"]
    if args.loglevel != "none":
        argv += ["--loglevel", args.loglevel]
    worker = ManagedProcess.runwatch("worker", argv, log_path)
    try:
        feed(bootstrap, prefix, run_id, 1, 50)
        wait_applied(bootstrap, app_id, run_id, 50, 180.0)
        lines0, cpu0, t0 = lines(log_path), cpu_s(worker.proc.pid), time.monotonic()
        broker.stop()
        time.sleep(args.outage_s)  # the outage itself: a measured window, not a sync
        window_s = time.monotonic() - t0
        lines1, cpu1 = lines(log_path), cpu_s(worker.proc.pid)
        broker.start()
        feed(bootstrap, prefix, run_id, 51, 100)
        resume_s = wait_applied(bootstrap, app_id, run_id, 100, 300.0)
        back = wait_back(log_path, 60.0)
        result = {
            "outage_s": round(window_s, 1),
            "loglevel": args.loglevel,
            "lines": lines1 - lines0,
            "lines_per_s": round((lines1 - lines0) / window_s, 1),
            "connect_attempts": connect_attempts(log_path, lines0, lines1),
            "cpu_s": round(cpu1 - cpu0, 2),
            "cpu_share": round((cpu1 - cpu0) / window_s, 3),
            "resume_s": round(resume_s, 1),
            "watch_down_s": back[0],
            "watch_errors": back[1],
            "worker_alive": worker.returncode is None,
            "log": str(log_path),
        }
        print(json.dumps(result))
    finally:
        worker.stop()
        broker.stop()
        if not args.keep:
            import shutil

            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
