"""The real Alertmanager binary (Debian's `prometheus-alertmanager`) on a loopback port.

`make tools` installs it (root + apt-get, best effort, like chromium); where it is absent
the tests that need it are skipped, saying so.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runwatch.procs import ManagedProcess
from tests.unit.sinks.recorder import Recorder

BINARY = "prometheus-alertmanager"
AMTOOL = "amtool"
MISSING = (
    "{} is not installed: `make tools` installs Debian's prometheus-alertmanager "
    "(as root, with apt-get)"
)

CONFIG = """\
route:
  receiver: {receiver}
  group_by: [run]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: "null"
  - name: hook
    webhook_configs:
      - url: {hook}
        send_resolved: true
"""


def binary(name: str) -> str:
    """The path of ``name``; skips the test when it is not installed."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(MISSING.format(name))
    return path


class RealAlertmanager:
    """One Alertmanager process; `start` and `stop` it as often as a test needs.

    Its alerts live in memory only (a restarted Alertmanager has none until senders post
    them again); silences and its notification log persist in ``storage``.

    Args:
        workdir: Where its config, storage and log go.
        hook: A webhook receiver URL every notification goes to (``send_resolved``); None:
            notifications go nowhere.
    """

    def __init__(self, workdir: Path, hook: str | None = None) -> None:
        self.binary = binary(BINARY)
        self.workdir = workdir
        self.config = workdir / "alertmanager.yml"
        self.config.write_text(
            CONFIG.format(receiver="hook" if hook else '"null"', hook=hook or "http://127.0.0.1:9")
        )
        self.storage = workdir / "data"
        self.port = Recorder.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: ManagedProcess | None = None
        self.starts = 0

    def start(self, timeout_s: float = 30.0) -> None:
        """Start it and wait until it answers ready."""
        self.starts += 1
        self.proc = ManagedProcess(
            "alertmanager",
            [
                self.binary,
                f"--config.file={self.config}",
                f"--storage.path={self.storage}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--cluster.listen-address=",  # one instance: no gossip port
            ],
            self.workdir / f"alertmanager-{self.starts}.log",
        )
        deadline = time.monotonic() + timeout_s
        while not self._ready():
            if self.proc.returncode is not None:
                raise AssertionError(f"alertmanager exited:\n{self.proc.log_tail(30)}")
            if time.monotonic() > deadline:
                raise AssertionError(f"alertmanager not ready:\n{self.proc.log_tail(30)}")
            time.sleep(0.05)  # polling its readiness endpoint: the answer decides

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        """Stop it (SIGTERM); its port stays reserved for the next `start`."""
        if self.proc is not None:
            self.proc.stop()
            self.proc = None

    def alerts(self, **filters: str) -> list[dict[str, Any]]:
        """``GET /api/v2/alerts`` (only alerts that have not ended)."""
        query = "&".join(f"{k}={v}" for k, v in filters.items())
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts?{query}", timeout=5) as response:
            return list(json.loads(response.read()))

    def wait_alerts(
        self,
        done: Callable[[list[dict[str, Any]]], bool],
        timeout_s: float = 60.0,
        **filters: str,
    ) -> list[dict[str, Any]]:
        """Poll ``GET /api/v2/alerts`` until ``done(alerts)``; returns them."""
        deadline = time.monotonic() + timeout_s
        while True:
            alerts = self.alerts(**filters)
            if done(alerts):
                return alerts
            if time.monotonic() > deadline:
                raise AssertionError(f"Alertmanager never matched; it holds {alerts}")
            time.sleep(0.1)  # polling an HTTP API: its content decides, not the sleep

    def amtool(self, *args: str) -> str:
        """Run ``amtool ARGS`` against it; returns stdout (CalledProcessError on failure)."""
        done = subprocess.run(
            [binary(AMTOOL), f"--alertmanager.url={self.url}", *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return done.stdout


def by_run(alerts: list[dict[str, Any]]) -> dict[str, set[str]]:
    """``{run: {alertname, ...}}`` of a ``GET /api/v2/alerts`` answer."""
    out: dict[str, set[str]] = {}
    for alert in alerts:
        labels = alert["labels"]
        out.setdefault(labels.get("run", ""), set()).add(labels["alertname"])
    return out
