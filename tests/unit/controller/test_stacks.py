"""Hang diagnostics on real processes: a rank's stacks on SIGUSR1, read by the agent."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from runwatch.controller.gang import WRAPPER
from runwatch.controller.stacks import capture, python_process, where

REPO = Path(__file__).resolve().parents[3]

STUCK = textwrap.dedent(
    """
    import sys, threading, time
    sys.path.insert(0, {repo!r})
    if {install}:
        from runwatch.producers.stackdump import install_stack_dump
        install_stack_dump()
    def background():
        time.sleep(600)
    threading.Thread(target=background, daemon=True).start()
    def stuck_here():
        print("ready", flush=True); time.sleep(600)  # one line: signalled on either call
    def outer():
        stuck_here()
    outer()
    """
)


@contextmanager
def rank(tmp_path: Path, *, install: bool) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A rank slot as `controller.gang` starts one: the shell wrapper around a Python."""
    script = tmp_path / "train.py"
    script.write_text(STUCK.format(repo=str(REPO), install=install))
    stack_file = tmp_path / "stacks" / "inc0.rank0.txt"
    proc = subprocess.Popen(
        ["/bin/sh", "-c", WRAPPER, str(tmp_path / "exit"), sys.executable, str(script)],
        env={"RUNWATCH_STACK_FILE": str(stack_file), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        yield proc, stack_file
    finally:
        proc.kill()
        subprocess.run(["pkill", "-KILL", "-s", str(proc.pid)], check=False)
        proc.wait(timeout=30)


def test_a_stuck_rank_says_where_it_is(tmp_path: Path) -> None:
    with rank(tmp_path, install=True) as (proc, stack_file):
        taken = capture({0: (proc.pid, stack_file)})
        assert proc.poll() is None  # asked, not killed
    t = taken[0]
    assert t.note == "" and t.pid is not None and t.pid != proc.pid  # the Python, not sh
    lines = STUCK.splitlines()
    stuck_line = next(i + 1 for i, line in enumerate(lines) if "ready" in line)
    assert t.where.startswith("stuck_here (") and t.where.endswith(f"/train.py:{stuck_line})")
    assert "in background" in t.text  # every thread, the main one last
    assert "# runwatch" not in t.text
    assert stack_file.read_text().endswith(t.text)  # the full text stays in the state dir
    assert stack_file.read_text().startswith(f"# runwatch: stacks of pid {t.pid} on SIGUSR1")


def test_a_process_without_the_handler_is_never_signalled(tmp_path: Path) -> None:
    with rank(tmp_path, install=False) as (proc, stack_file):
        taken = capture({0: (proc.pid, stack_file)}, timeout_s=0.5)
        assert python_process(proc.pid, 10) is None
        assert proc.poll() is None  # SIGUSR1 would have terminated it
    assert taken[0].note == "no process catching SIGUSR1" and taken[0].where == ""
    assert not stack_file.exists()


def test_a_rank_that_is_gone_is_noted(tmp_path: Path) -> None:
    beyond_pid_max = 2**22 + 12345
    taken = capture({3: (beyond_pid_max, tmp_path / "none.txt")}, timeout_s=0.2)
    assert taken[3].pid is None and taken[3].note


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", ""),
        ("Thread 0x00007f (most recent call first):\n  <no Python frame>\n", ""),
        (
            'Stack (most recent call first):\n  File "/a/b/c.py", line 3 in f\n'
            '  File "/a/b/d.py", line 9 in <module>\n',
            "f (b/c.py:3)",
        ),
        (
            'Thread 0x1 (most recent call first):\n  File "/x/t.py", line 5 in worker\n\n'
            'Current thread 0x2 (most recent call first):\n  File "/x/m.py", line 7 in '
            'all_reduce\n  File "/x/m.py", line 1 in <module>\n',
            "all_reduce (x/m.py:7)",
        ),
        (
            'Current thread 0x2 (most recent call first):\n  File "/x/t.py", line 5 in hb\n\n'
            'Thread 0x1 (most recent call first):\n  File "/x/m.py", line 8 in step\n',
            "step (x/m.py:8)",
        ),
    ],
)
def test_where_names_the_main_threads_innermost_frame(text: str, expected: str) -> None:
    assert where(text) == expected


def test_a_program_with_its_own_sigusr1_handler_keeps_it(tmp_path: Path) -> None:
    code = textwrap.dedent(
        f"""
        import signal, sys
        sys.path.insert(0, {str(REPO)!r})
        mine = lambda signum, frame: None
        signal.signal(signal.SIGUSR1, mine)
        from runwatch.producers.stackdump import install_stack_dump
        assert install_stack_dump({str(tmp_path / "s.txt")!r}) is None
        assert signal.getsignal(signal.SIGUSR1) is mine
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_process_catching_sigusr1_for_itself_is_never_signalled(tmp_path: Path) -> None:
    """It catches SIGUSR1 (its own handler) but never registered for stacks: not asked."""
    script = tmp_path / "own.py"
    script.write_text(
        "import signal, sys, time\n"
        "signal.signal(signal.SIGUSR1, lambda s, f: sys.exit(42))\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        taken = capture({0: (proc.pid, tmp_path / "none.txt")}, timeout_s=0.5)
        assert proc.poll() is None  # its handler would have exited 42
        assert taken[0].note == "no stack handler installed" and taken[0].pid == proc.pid
    finally:
        proc.kill()
        proc.wait(timeout=30)
