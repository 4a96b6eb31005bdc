from __future__ import annotations

import pytest

from examples.faults import Fault, FaultPlan, parse_fault, parse_faults


def test_parse_specs():
    assert parse_fault("nan@12") == Fault("nan", 12)
    assert parse_fault("kill@15:rank=1") == Fault("kill", 15, rank=1)
    assert parse_fault("hang@3:rank=0:secs=2.5:incarnation=1") == Fault(
        "hang", 3, rank=0, incarnation=1, secs=2.5
    )
    assert parse_faults(["nan@1,spike@2", " kill@3:rank=1  ", ""]) == (
        Fault("nan", 1),
        Fault("spike", 2),
        Fault("kill", 3, rank=1),
    )


@pytest.mark.parametrize("bad", ["nan", "boom@3", "nan@x", "kill@3:who=1", "kill@3:rank"])
def test_bad_specs_are_rejected(bad):
    with pytest.raises(ValueError, match="bad fault spec"):
        parse_fault(bad)


def test_faults_fire_only_on_their_rank_step_and_incarnation():
    faults = parse_faults(["kill@5:rank=1", "spike@7"])
    assert FaultPlan(faults, rank=1, incarnation=0).has("kill", 5)
    assert not FaultPlan(faults, rank=0, incarnation=0).has("kill", 5)
    assert not FaultPlan(faults, rank=1, incarnation=1).has("kill", 5)  # no re-injection
    assert FaultPlan(faults, rank=3, incarnation=0).has("spike", 7)
    assert not FaultPlan(faults, rank=3, incarnation=0).has("spike", 8)


def test_hang_sleeps(monkeypatch):
    slept = []
    monkeypatch.setattr("examples.faults.time.sleep", slept.append)
    FaultPlan(parse_faults(["hang@2:rank=0:secs=9"]), rank=0, incarnation=0).before_step(2)
    assert slept == [9.0]


def test_abort_is_a_teardown_fault_of_its_rank_only():
    faults = parse_faults(["abort@0:rank=1"])
    assert FaultPlan(faults, rank=1, incarnation=0).active("abort")
    assert not FaultPlan(faults, rank=0, incarnation=0).active("abort")
    assert not FaultPlan(faults, rank=1, incarnation=1).active("abort")
    FaultPlan(faults, rank=0, incarnation=0).at_exit()  # not this rank's: returns


def test_stuck_sleeps_in_the_teardown_of_its_rank_only(monkeypatch):
    slept = []
    monkeypatch.setattr("examples.faults.time.sleep", slept.append)
    faults = parse_faults(["stuck@0:rank=1:secs=600"])
    FaultPlan(faults, rank=0, incarnation=0).at_exit()
    FaultPlan(faults, rank=1, incarnation=1).at_exit()  # not re-injected in a restart
    assert slept == []
    FaultPlan(faults, rank=1, incarnation=0).at_exit()
    assert slept == [600.0]
