"""A rank's word to its agent that its training finished (`producers.rank_done`)."""

from __future__ import annotations

import json
import os

import pytest

from runwatch.common.launch_env import ENV_DONE_FILE
from runwatch.producers import mark_training_done


def test_the_file_the_agent_names_is_written_whole(tmp_path, monkeypatch):
    target = tmp_path / "inc0.rank1.json"
    monkeypatch.setenv(ENV_DONE_FILE, str(target))
    assert mark_training_done(42) == target
    body = json.loads(target.read_text())
    assert body["final_step"] == 42 and body["pid"] == os.getpid()
    assert [p.name for p in tmp_path.iterdir()] == [target.name], "no scratch file left"


def test_a_rank_without_an_agent_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_DONE_FILE, raising=False)
    monkeypatch.chdir(tmp_path)
    assert mark_training_done(3) is None
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_cannot_be_written_is_a_line_not_an_error(tmp_path, capsys):
    missing = tmp_path / "no-such-dir" / "inc0.rank0.json"
    assert mark_training_done(path=missing) is None
    assert "could not mark training done" in capsys.readouterr().err
    assert not missing.parent.exists()


@pytest.mark.parametrize("again", [1, 2], ids=["once", "twice"])
def test_saying_it_again_replaces_the_file(tmp_path, again):
    target = tmp_path / "done.json"
    for step in range(again):
        mark_training_done(step, path=target)
    assert json.loads(target.read_text())["final_step"] == again - 1


def test_odd_arguments_and_environments_never_raise_at_the_end_of_training(
    tmp_path, monkeypatch, capsys
):
    target = tmp_path / "done.json"
    assert mark_training_done("not a step", path=target) is None  # type: ignore[arg-type]
    assert not target.exists()
    monkeypatch.setenv(ENV_DONE_FILE, str(target))
    monkeypatch.setenv("RANK", "zero")
    assert mark_training_done(1) is None
    assert capsys.readouterr().err.count("could not mark training done") == 2


def test_an_integer_like_step_is_written_as_an_integer(tmp_path):
    class Step:  # what numpy's integers offer: __index__ / __int__
        def __int__(self) -> int:
            return 7

    target = tmp_path / "done.json"
    assert mark_training_done(Step(), path=target) == target  # type: ignore[arg-type]
    assert json.loads(target.read_text())["final_step"] == 7
