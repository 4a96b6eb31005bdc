"""`runwatch.procs.exit_on_sigterm`: a SIGTERMed script still stops the children it started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from runwatch.procs import ManagedProcess, exit_on_sigterm

    if sys.argv[2] == "on":
        exit_on_sigterm()
    child = ManagedProcess("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"],
                           Path(sys.argv[1]) / "child.log")
    try:
        # written whole, then renamed: the test signals as soon as child.pid exists, and a
        # file seen between its creation and its write held no pid
        Path(sys.argv[1], "child.pid.tmp").write_text(str(child.proc.pid))
        Path(sys.argv[1], "child.pid.tmp").rename(Path(sys.argv[1], "child.pid"))
        time.sleep(600)
    finally:
        child.stop(grace_s=10)
    """
)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _run_and_terminate(tmp_path: Path, mode: str) -> tuple[int, int]:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    parent = subprocess.Popen([sys.executable, str(script), str(tmp_path), mode])
    pid_file = tmp_path / "child.pid"
    deadline = time.monotonic() + 60
    while not pid_file.is_file():
        assert parent.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)  # polling a file the script writes, with a deadline
    parent.send_signal(signal.SIGTERM)
    return parent.wait(timeout=60), int(pid_file.read_text())


def test_a_sigtermed_script_stops_its_children(tmp_path):
    code, child = _run_and_terminate(tmp_path, "on")
    assert code == 128 + signal.SIGTERM
    assert not _alive(child)


def test_without_it_the_child_is_left_behind(tmp_path):
    code, child = _run_and_terminate(tmp_path, "off")
    try:
        assert code == -signal.SIGTERM and _alive(child)  # what the benches used to do
    finally:
        os.killpg(child, signal.SIGKILL)
