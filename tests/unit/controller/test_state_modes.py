"""Finding 12: controller state and the alert delivery log are this user's only."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from runwatch.controller.state import (
    ControllerState,
    ProcessedCommand,
    lock_state_dir,
)
from runwatch.sinks.alert_log import DeliveryLog


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_state_dirs_are_0700_and_files_0600(tmp_path: Path) -> None:
    root = tmp_path / "state"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)  # an older version's directory: tightened
    state = ControllerState(root)
    for sub in ("", "logs", "exit", "errors"):
        assert _mode(root / sub) == 0o700, sub
    state.mark_processed(ProcessedCommand(command_id="c", run_id="r", incarnation=0, ts_ns=1))
    fd = lock_state_dir(root)
    os.close(fd)
    for name in ("processed.jsonl", "lock"):
        assert _mode(root / name) == 0o600, name


def test_the_delivery_log_holding_webhook_urls_is_0600(tmp_path: Path) -> None:
    path = tmp_path / "sinks" / "delivered.jsonl"
    path.parent.mkdir(mode=0o755)
    path.write_text("")
    os.chmod(path, 0o644)  # an older version's log: tightened
    log = DeliveryLog(path)
    log.delivered("https://hooks.example/T0KEN/secret", "r1", ["a1"])
    assert _mode(path) == 0o600
    assert _mode(path.parent) == 0o700
    assert "T0KEN" in path.read_text()  # kept (the dedupe key), but only for this user
