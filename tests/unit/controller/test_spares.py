"""Warm spares on real processes: the command split, the preload, the assignment, the pool.

The spares here preload ``wave`` and the script's ``colorsys`` (not torch: the protocol is what is under test, and a
spare is the same process whatever it imports). Waiting is on the spares' ready files and
on the processes, with deadlines.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from runwatch.controller import warm_start
from runwatch.controller.gang import Gang
from runwatch.controller.spares import SparePool, split_python
from runwatch.controller.warm_start import script_imports

PY = sys.executable

SCRIPT = textwrap.dedent(
    """
    import sys
    PRELOADED = "wave" in sys.modules and "colorsys" in sys.modules
    import colorsys, json, os
    print(json.dumps({
        "argv": sys.argv,
        "rank": os.environ.get("RANK"),
        "secret": os.environ.get("ONLY_IN_SPARE"),
        "cwd": os.getcwd(),
        "name": __name__,
        "path0": sys.path[0],
        "stdin": sys.stdin.read(),
        "preloaded": PRELOADED,
    }), flush=True)
    sys.exit(int(sys.argv[1]))
    """
)


@pytest.mark.parametrize(
    ("argv", "split"),
    [
        (["python", "train.py", "--lr", "1"], (["python"], ["train.py", "--lr", "1"])),
        (["/usr/bin/python3.11", "-u", "t.py"], (["/usr/bin/python3.11", "-u"], ["t.py"])),
        (["python3", "-X", "dev", "-O", "t.py"], (["python3", "-X", "dev", "-O"], ["t.py"])),
        (["python", "-uB", "t.py"], (["python", "-uB"], ["t.py"])),
        (["python", "-m", "pkg.train", "-x"], (["python"], ["-m", "pkg.train", "-x"])),
        (["python", "-c", "print(1)"], None),
        (["python", "-m"], None),
        (["python", "-u"], None),
        (["bash", "train.sh"], None),
        (["torchrun", "--nproc-per-node", "2", "t.py"], None),
        ([], None),
    ],
)
def test_split_python(argv, split):
    assert split_python(argv) == split


def test_script_imports_reads_the_top_level_without_running_it():
    source = textwrap.dedent(
        """
        import os, torch.distributed as dist
        from pathlib import Path
        from . import sibling
        if True:
            import json
        try:
            import yaml
        except ImportError:
            import tomllib
        def f():
            import never_at_top
        raise SystemExit("not run")
        """
    )
    assert script_imports(source) == [
        "os",
        "torch.distributed",
        "pathlib",
        "json",
        "yaml",
        "tomllib",
    ]


def test_preload_skips_what_does_not_import():
    done, failed = warm_start.preload(["json", "no_such_module_xyz"], "import colorsys\n")
    assert done == ["json", "colorsys"] and failed == ["no_such_module_xyz"]


def _pool(tmp_path: Path, size: int = 2) -> SparePool:
    script = tmp_path / "job" / "s.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text(SCRIPT)
    return SparePool(
        root=tmp_path / "spares",
        interpreter=(PY,),
        target=(str(script),),
        env={**os.environ, "ONLY_IN_SPARE": "spare-env"},
        preload=("wave",),
        size=size,
    )


def _wait_ready(pool: SparePool, count: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while pool.ready < count:
        assert time.monotonic() < deadline, [s.proc.poll() for s in pool.spares]
        time.sleep(0.02)  # polling files the spares write, with a deadline


def test_a_rank_started_in_a_spare_runs_as_a_cold_one_would(tmp_path):
    pool = _pool(tmp_path)
    pool.fill()
    _wait_ready(pool, 2)
    spare_pids = {s.proc.pid for s in pool.spares}
    script = pool.target[0]
    logs = [tmp_path / f"r{r}.log" for r in (0, 1)]
    exits = [tmp_path / "exit" / f"inc1.rank{r}" for r in (0, 1)]
    exits[0].parent.mkdir()
    envs = [{"PATH": os.environ["PATH"], "RANK": str(r)} for r in (0, 1)]
    gang = Gang.launch([PY, script, "3"], envs, logs, exits, warm=pool.start_rank)
    try:
        assert {p.pid for p in gang.ranks} == spare_pids  # the spares became the ranks
        assert pool.spares == [] and pool.taken == 2
        assert gang.wait(60)
        assert [gang.status(r) for r in (0, 1)] == [3, 3]
        for rank, log in enumerate(logs):
            seen = json.loads(log.read_text().splitlines()[-1])
            assert seen["argv"] == [script, "3"]
            assert seen["rank"] == str(rank)
            assert seen["secret"] is None  # the environment is the rank's, not the spare's
            assert (seen["cwd"], seen["name"]) == (os.getcwd(), "__main__")
            assert seen["path0"] == str(Path(script).parent)  # not controller/
            assert seen["stdin"] == "" and seen["preloaded"]
        # The rank's usual exit path leads to the status: an adopting controller reads it.
        assert all(e.is_symlink() for e in exits)
        assert [Gang.adopt(gang.ranks, exits).status(r) for r in (0, 1)] == [3, 3]
    finally:
        pool.close()


def test_a_dead_spare_is_skipped_and_the_rank_starts_cold(tmp_path):
    pool = _pool(tmp_path, size=1)
    pool.fill()
    _wait_ready(pool, 1)
    (spare,) = pool.spares
    os.killpg(spare.proc.pid, 9)
    spare.proc.wait(timeout=30)
    log, exit_file = tmp_path / "r.log", tmp_path / "r.exit"
    env = {"PATH": os.environ["PATH"], "RANK": "0"}
    gang = Gang.launch([PY, pool.target[0], "0"], [env], [log], [exit_file], warm=pool.start_rank)
    assert gang.ranks[0].pid != spare.proc.pid and pool.taken == 0
    assert gang.wait(60) and gang.status(0) == 0
    assert json.loads(log.read_text())["preloaded"] is False  # a cold interpreter
    assert not exit_file.is_symlink()


def test_another_command_starts_cold(tmp_path):
    pool = _pool(tmp_path, size=1)
    pool.fill()
    try:
        assert pool.start_rank(["bash", "x.sh"], {}, tmp_path / "l", tmp_path / "e") is None
        assert pool.start_rank([PY, "-O", "x.py"], {}, tmp_path / "l", tmp_path / "e") is None
        assert len(pool.spares) == 1
    finally:
        pool.close()


def test_released_and_closed_spares_run_nothing_and_leave_nothing(tmp_path):
    pool = _pool(tmp_path)
    pool.fill()
    _wait_ready(pool, 2)
    first, second = pool.spares
    first.release()  # end of input, as when the agent dies: it exits without running
    assert first.proc.wait(timeout=30) == 0
    assert "ready in" in (pool.root / f"{first.name}.log").read_text()
    pool.close()  # the pool kills what still waits
    assert second.proc.poll() is not None and pool.spares == []
    # SIGKILL is sent to the whole group; its members may take a moment to be gone.
    deadline = time.monotonic() + 30
    while _live_members(first.proc.pid) + _live_members(second.proc.pid):
        assert time.monotonic() < deadline, _live_members(second.proc.pid)
        time.sleep(0.02)  # polling /proc, with a deadline


def _live_members(pgid: int) -> list[int]:
    """Processes of group ``pgid`` still running (zombies waiting for a reaper are not)."""
    live = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # it ended meanwhile
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            live.append(int(entry.name))
    return live
