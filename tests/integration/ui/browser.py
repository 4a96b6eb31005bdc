"""A real headless Chromium driven by selenium, and the `runwatch ui` process it looks at."""

from __future__ import annotations

import os
import re
import shutil
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from runwatch.procs import ManagedProcess

CHROMIUM = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
)
CHROMEDRIVER = shutil.which("chromedriver")
MISSING = (
    None
    if CHROMIUM and CHROMEDRIVER
    else "chromium and chromedriver are not installed (`make tools` installs them when root)"
)
URL_LINE = re.compile(r"serving (http://\S+/)")


def chrome(width: int = 1440, height: int = 1000) -> Any:
    """A headless Chromium session (the system's browser and driver; nothing is downloaded)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    assert CHROMIUM and CHROMEDRIVER
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root in a container has no user namespace for the sandbox
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
    ):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def _fleet_now(match: re.Match[str] | None) -> str:
    """What the server's fleet endpoint answers now (a failed page wait's evidence)."""
    if match is None:
        return "(the server never said its address)"
    try:
        with urllib.request.urlopen(f"{match.group(1)}api/fleet", timeout=5) as reply:
            return reply.read(20_000).decode(errors="replace")
    except OSError as exc:
        return f"(no answer: {exc})"


@contextmanager
def ui_process(args: Sequence[str], log_path: Path, timeout_s: float = 60.0) -> Iterator[str]:
    """Start `runwatch ui ARGS --port 0`; yield the address it prints; stop it at the end."""
    proc = ManagedProcess.runwatch(
        "ui", ["ui", *args, "--port", "0"], log_path, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    match = None
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            text = log_path.read_text(errors="replace") if log_path.exists() else ""
            match = URL_LINE.search(text)
            if match:
                break
            if proc.returncode is not None or time.monotonic() > deadline:
                raise AssertionError(f"runwatch ui did not start:\n{text[-3000:]}")
            time.sleep(0.1)  # polls the log for the address line; the process is the one writing it
        yield match.group(1)
    except BaseException:  # a failed wait says what the reader saw (as the workers' logs do)
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        print(f"--- {log_path.name}\n{text[-6000:]}\n--- /api/fleet\n{_fleet_now(match)}")
        raise
    finally:
        proc.stop()
