"""Each component's settings object: defaults, values read, and a bad value named."""

from __future__ import annotations

from pathlib import Path

import pytest

from runwatch.common.errors import UsageError
from runwatch.common.settings import CommandKeySettings, CommonSettings, KafkaAuth
from runwatch.controller.settings import AgentEnv
from runwatch.processors.settings import ProcessorEnv
from runwatch.producers.settings import EmitterEnv, ReplicaEnv
from runwatch.sinks.settings import SinkEnv


def test_common_settings_defaults_and_values() -> None:
    empty = CommonSettings.from_env({})
    assert empty.bootstrap is None
    assert empty.topic_prefix == "runwatch"
    assert empty.home_dir == Path.home() / ".runwatch"
    assert empty.replication_factor is None
    assert empty.partitions is None
    assert empty.connect_timeout_s == 5.0
    full = CommonSettings.from_env(
        {
            "RUNWATCH_BOOTSTRAP": "k:9092",
            "RUNWATCH_TOPIC_PREFIX": "lab",
            "RUNWATCH_HOME": "/srv/rw",
            "RUNWATCH_REPLICATION_FACTOR": "3",
            "RUNWATCH_PARTITIONS": " heartbeats=64 ",
            "RUNWATCH_CONNECT_TIMEOUT_S": "0.5",
        }
    )
    assert full == CommonSettings(
        bootstrap="k:9092",
        topic_prefix="lab",
        home_dir=Path("/srv/rw"),
        replication_factor=3,
        partitions="heartbeats=64",
        connect_timeout_s=0.5,
    )


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("RUNWATCH_REPLICATION_FACTOR", "0"),
        ("RUNWATCH_REPLICATION_FACTOR", "three"),
        ("RUNWATCH_CONNECT_TIMEOUT_S", "-1"),
        ("RUNWATCH_CONNECT_TIMEOUT_S", "nan"),
    ],
)
def test_common_settings_name_a_bad_variable(name: str, bad: str) -> None:
    with pytest.raises(UsageError, match=rf"^{name}='{bad}' must be "):
        CommonSettings.from_env({name: bad})


def test_blank_variables_are_unset() -> None:
    blank = {"RUNWATCH_REPLICATION_FACTOR": " ", "RUNWATCH_CONNECT_TIMEOUT_S": ""}
    assert CommonSettings.from_env(blank) == CommonSettings.from_env({})


def test_kafka_auth_reads_the_password_file_only_when_asked(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope")
    auth = KafkaAuth.from_env(
        {"RUNWATCH_SASL_USERNAME": "trainer", "RUNWATCH_SASL_PASSWORD_FILE": missing}
    )
    assert auth.sasl_username == "trainer"  # who logs in is known without the file
    with pytest.raises(UsageError, match=r"RUNWATCH_SASL_PASSWORD_FILE=.*cannot read"):
        auth.variables()
    (tmp_path / "pw").write_text(" s3cret\n")
    auth = KafkaAuth.from_env({"RUNWATCH_SASL_PASSWORD_FILE": str(tmp_path / "pw")})
    assert auth.variables() == {"RUNWATCH_SASL_PASSWORD": "s3cret"}


def test_kafka_auth_plaintext_and_trainer_login() -> None:
    assert KafkaAuth.from_env({}).plaintext
    assert KafkaAuth.from_env({"RUNWATCH_SECURITY_PROTOCOL": "sasl_plaintext"}).plaintext
    assert not KafkaAuth.from_env({"RUNWATCH_SECURITY_PROTOCOL": "SASL_SSL"}).plaintext
    trainer = {"RUNWATCH_TRAINER_SASL_USERNAME": "t", "RUNWATCH_TRAINER_SASL_PASSWORD_FILE": "/f"}
    assert KafkaAuth.from_env(trainer).has_trainer_login
    assert not KafkaAuth.from_env({"RUNWATCH_TRAINER_SASL_USERNAME": "t"}).has_trainer_login


def test_command_key_settings() -> None:
    assert CommandKeySettings.from_env({}) == CommandKeySettings()
    got = CommandKeySettings.from_env(
        {"RUNWATCH_COMMAND_KEY": "", "RUNWATCH_COMMAND_KEY_FILE": "/k"}
    )
    assert got == CommandKeySettings(command_key=None, command_key_file="/k")


def test_processor_env() -> None:
    assert ProcessorEnv.from_env({}) == ProcessorEnv(
        store="memory", batch_stats_s=0.0, fault_state_writes=0, event_loop="uvloop"
    )
    got = ProcessorEnv.from_env(
        {
            "RUNWATCH_STORE": "rocksdb",
            "RUNWATCH_BATCH_STATS_S": "2.5",
            "RUNWATCH_FAULT_STATE_WRITES": "3",
            "RUNWATCH_EVENT_LOOP": "asyncio",
        }
    )
    assert got == ProcessorEnv(
        store="rocksdb", batch_stats_s=2.5, fault_state_writes=3, event_loop="asyncio"
    )


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("RUNWATCH_STORE", "redis"),
        ("RUNWATCH_BATCH_STATS_S", "often"),
        ("RUNWATCH_FAULT_STATE_WRITES", "-2"),
        ("RUNWATCH_EVENT_LOOP", "trio"),
    ],
)
def test_processor_env_names_a_bad_variable(name: str, bad: str) -> None:
    with pytest.raises(UsageError, match=rf"^{name}='{bad}' must be "):
        ProcessorEnv.from_env({name: bad})


def test_sink_env_splits_the_lists() -> None:
    assert SinkEnv.from_env({}) == SinkEnv(alert_webhooks=(), alertmanagers=())
    got = SinkEnv.from_env(
        {"RUNWATCH_ALERT_WEBHOOK": "http://a, ,http://b", "RUNWATCH_ALERTMANAGER": "http://am"}
    )
    assert got == SinkEnv(alert_webhooks=("http://a", "http://b"), alertmanagers=("http://am",))


def test_agent_env() -> None:
    assert AgentEnv.from_env({}).launch_id is None
    assert AgentEnv.from_env({"RUNWATCH_LAUNCH_ID": "l-1"}).launch_id == "l-1"


def test_emitter_env() -> None:
    assert EmitterEnv.from_env({}) == EmitterEnv()
    got = EmitterEnv.from_env(
        {
            "RUNWATCH_RUN_ID": "r",
            "RUNWATCH_BOOTSTRAP": "k:1",
            "RUNWATCH_TOPIC_PREFIX": "p",
            "RANK": "2",
            "WORLD_SIZE": "4",
            "RUNWATCH_INCARNATION": "1",
            "RUNWATCH_RELAY_SOCKET": "/s",
            "RUNWATCH_LAUNCH_ID": "l",
            "RUNWATCH_STACK_FILE": "/st",
        }
    )
    assert got == EmitterEnv(
        run_id="r",
        bootstrap="k:1",
        topic_prefix="p",
        rank=2,
        world_size=4,
        incarnation=1,
        relay_socket="/s",
        launch_id="l",
        stack_file="/st",
    )
    with pytest.raises(ValueError, match="RUNWATCH_INCARNATION must be an integer, got 'x'"):
        EmitterEnv.from_env({"RUNWATCH_INCARNATION": "x"})


def test_replica_env() -> None:
    base = {"REPLICA_GROUP_ID": "1", "NUM_REPLICA_GROUPS": "3", "TORCHFT_LIGHTHOUSE": "h:1"}
    assert ReplicaEnv.from_env(base) == ReplicaEnv(group=1, groups=3, lighthouse="h:1")
    got = ReplicaEnv.from_env(
        {
            **base,
            "RUNWATCH_MIN_REPLICAS": "2",
            "RUNWATCH_FT_START_BARRIER": "h:2",
            "RUNWATCH_FT_GROUP_RESTARTS": "4",
        }
    )
    assert (got.min_replicas, got.start_barrier, got.restarts) == (2, "h:2", 4)
    with pytest.raises(RuntimeError, match="needs TORCHFT_LIGHTHOUSE"):
        ReplicaEnv.from_env({k: v for k, v in base.items() if k != "TORCHFT_LIGHTHOUSE"})
    with pytest.raises(ValueError, match="RUNWATCH_MIN_REPLICAS must be an integer"):
        ReplicaEnv.from_env({**base, "RUNWATCH_MIN_REPLICAS": "two"})


def test_from_env_reads_os_environ_when_given_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNWATCH_STORE", "rocksdb")
    monkeypatch.setenv("RUNWATCH_TOPIC_PREFIX", "fromenv")
    assert ProcessorEnv.from_env().store == "rocksdb"
    assert CommonSettings.from_env().topic_prefix == "fromenv"
