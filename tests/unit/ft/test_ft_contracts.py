"""Per-replica-group fault tolerance: the backend's declaration, the kinds, the signed
``respawn_group`` command and the step fields it is decided from."""

from __future__ import annotations

import subprocess
import sys

import msgspec
import pytest

from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.policy import PolicyState, fold_policy
from runwatch.processors.core.verdicts import make_anomaly, verdict_id
from runwatch.producers.backend import training_backend_capabilities, training_backend_names
from runwatch.schemas.codec import decode, encode
from runwatch.schemas.events import AnomalyDetected, RestartRequested, StepCompleted
from runwatch.schemas.kinds import kind_spec
from runwatch.schemas.signing import CommandKey, sign, verify
from tests.unit.core.factories import src

CFG = DetectorConfig()


def lost(group: int | None, step: int = 50, incarnation: int = 0) -> AnomalyDetected:
    return make_anomaly(
        run_id="r",
        kind="replica_lost",
        step=step,
        ts_ns=step * 1000,
        source=src(step, "steps"),
        config_hash="h",
        incarnation=incarnation,
        replica_group=group,
    )


def fold(anomalies: list[AnomalyDetected]) -> tuple[PolicyState | None, list[RestartRequested]]:
    state: PolicyState | None = None
    out: list[RestartRequested] = []
    for i, a in enumerate(anomalies):
        state, commands = fold_policy(state, a, src(i, "anomalies"), CFG)
        out.extend(commands)
    return state, out


def test_torchft_ddp_declares_per_step_fault_tolerance_and_torch_ddp_does_not() -> None:
    assert "torchft-ddp" in training_backend_names()
    ft = training_backend_capabilities("torchft-ddp").declaration()
    assert ft.per_step_fault_tolerance and ft.reshardable_checkpoint
    assert not training_backend_capabilities("torch-ddp").declaration().per_step_fault_tolerance


def test_the_torchft_capabilities_are_read_without_importing_torch() -> None:
    code = (
        "import sys\n"
        "from runwatch.producers.backend import training_backend_capabilities as c\n"
        "assert c('torchft-ddp').per_step_fault_tolerance\n"
        "assert 'torch' not in sys.modules and 'torchft' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_replica_kinds_say_what_runwatch_does() -> None:
    assert kind_spec("replica_lost").action == "respawn_group"
    assert kind_spec("replica_lost").captures_stacks
    assert kind_spec("replica_rejoined").action is None


def test_replica_lost_asks_respawn_group_for_its_group_only() -> None:
    _, commands = fold([lost(1)])
    assert [(c.action, c.replica_group, c.max_checkpoint_step) for c in commands] == [
        ("respawn_group", 1, None)
    ]


def test_each_lost_group_gets_its_command_and_the_incarnation_stays_open_for_a_gang_one() -> None:
    gang = make_anomaly(
        run_id="r",
        kind="dead_rank",
        step=60,
        ts_ns=60_000,
        source=src(60, "heartbeats"),
        config_hash="h",
        incarnation=0,
        rank=0,
    )
    state, commands = fold([lost(1), lost(2), gang])
    assert [(c.action, c.replica_group) for c in commands] == [
        ("respawn_group", 1),
        ("respawn_group", 2),
        ("respawn", None),
    ]
    assert state is not None and state.commanded_incarnation == 0


def test_rule_1_a_replica_lost_naming_no_group_gets_no_command() -> None:
    assert fold([lost(None)])[1] == []


def test_rule_2_a_replica_lost_of_an_older_incarnation_is_stale() -> None:
    state, commands = fold([lost(1, incarnation=1), lost(2, step=51, incarnation=0)])
    assert [c.replica_group for c in commands] == [1]
    assert state is not None and state.stale == 1


def test_rule_3_an_incarnation_with_a_gang_command_gets_no_group_command() -> None:
    nan = make_anomaly(
        run_id="r",
        kind="nonfinite_loss",
        step=40,
        ts_ns=40_000,
        source=src(40, "steps"),
        config_hash="h",
        incarnation=0,
    )
    _, commands = fold([nan, lost(1)])
    assert [c.action for c in commands] == ["rollback"]


def test_replica_verdict_ids_differ_by_group_and_other_ids_are_unchanged() -> None:
    assert lost(1).verdict_id != lost(2).verdict_id
    assert verdict_id("r", "hang", 3, None, "h") == verdict_id(
        "r", "hang", 3, None, "h", replica_group=None
    )


def test_the_signature_covers_the_replica_group() -> None:
    key = CommandKey.from_secret(b"k" * 32)
    _, (command,) = fold([lost(1)])
    signed = sign(command, key)
    verify(signed, {key.key_id: key})
    forged = msgspec.structs.replace(signed, replica_group=0)
    with pytest.raises(Exception, match="signature"):
        verify(forged, {key.key_id: key})


def test_steps_carry_their_replica_group_and_participants_and_old_steps_decode() -> None:
    step = StepCompleted(
        run_id="r", ts_ns=1, step=3, loss=1.0, step_time_s=0.1, replica_group=1, participants=(0, 1)
    )
    assert decode(encode(step)) == step
    old = StepCompleted(run_id="r", ts_ns=1, step=3, loss=1.0, step_time_s=0.1)
    assert b"participants" not in encode(old)
    assert decode(encode(old)).participants == ()


def test_a_rejoin_after_a_gang_command_opens_the_incarnation_to_group_commands() -> None:
    dead = make_anomaly(
        run_id="r",
        kind="dead_rank",
        step=40,
        ts_ns=40_000,
        source=src(40, "heartbeats"),
        config_hash="h",
        incarnation=0,
        rank=1,
    )
    back = make_anomaly(
        run_id="r",
        kind="replica_rejoined",
        step=60,
        ts_ns=60_000,
        source=src(60, "steps"),
        config_hash="h",
        incarnation=0,
        replica_group=1,
    )
    # the dead rank's respawn (carried out as group 1's restart), its replica_lost (covered),
    # the rejoin, then group 0 lost: a new failure of the same incarnation
    _, commands = fold([dead, lost(1, step=41), back, lost(0, step=80)])
    assert [(c.action, c.replica_group) for c in commands] == [
        ("respawn", None),
        ("respawn_group", 0),
    ]
