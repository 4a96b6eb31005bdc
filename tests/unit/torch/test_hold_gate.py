"""The example's test gate: ``--hold-after-step K --hold-file F`` (tests hold a gang at K)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from examples.train_ddp import Trainer, parse_args

pytestmark = pytest.mark.torch


def test_the_two_flags_go_together():
    with pytest.raises(SystemExit):
        parse_args(["--hold-after-step", "6"])
    args = parse_args(["--hold-after-step", "6", "--hold-file", "/tmp/f"])
    assert args.hold_after_step == 6 and str(args.hold_file) == "/tmp/f"


@pytest.mark.parametrize(
    ("step", "incarnation", "stop"),
    [
        pytest.param(5, 0, False, id="another-step"),
        pytest.param(6, 1, False, id="a-resumed-incarnation-never-holds"),
        pytest.param(6, 0, True, id="a-stop-releases-it"),
    ],
)
def test_what_passes_the_gate_while_the_file_exists(tmp_path, step, incarnation, stop):
    hold = tmp_path / "hold"
    hold.touch()
    args = parse_args(["--hold-after-step", "6", "--hold-file", str(hold)])
    trainer = SimpleNamespace(
        args=args, incarnation=incarnation, stop=SimpleNamespace(requested=stop)
    )
    Trainer._hold(trainer, step)  # type: ignore[arg-type]
    assert hold.exists()  # it returned with the file still there: it did not wait


def test_no_file_no_hold(tmp_path):
    args = parse_args(["--hold-after-step", "6", "--hold-file", str(tmp_path / "gone")])
    trainer = SimpleNamespace(args=args, incarnation=0, stop=SimpleNamespace(requested=False))
    Trainer._hold(trainer, 6)  # type: ignore[arg-type]
