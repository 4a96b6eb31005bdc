"""`common.launch_env.LaunchEnv`: the one struct the controller writes and a rank reads."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runwatch.common.launch_env import UNLIMITED_RESTARTS, LaunchEnv


def test_a_lone_process_is_rank_0_of_1_on_localhost():
    assert LaunchEnv.from_environ({}) == LaunchEnv()
    assert LaunchEnv().to_environ() == {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }


def test_torchrun_variables_alone_leave_runwatch_fields_unset():
    env = LaunchEnv.from_environ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert (env.rank, env.world_size, env.local_rank) == (3, 4, 1)
    assert env.run_id is None and env.restart_from is None and env.incarnation == 0


def test_a_malformed_number_names_the_variable():
    with pytest.raises(ValueError, match="MASTER_PORT='http'"):
        LaunchEnv.from_environ({"MASTER_PORT": "http"})


names = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12)
counts = st.integers(min_value=0, max_value=10_000)


@given(
    rank=counts,
    world_size=st.integers(min_value=1, max_value=10_000),
    local_rank=counts,
    master_addr=names,
    master_port=st.integers(min_value=1, max_value=65535),
    local_world_size=st.none() | st.integers(min_value=1, max_value=64),
    group_rank=st.none() | counts,
    group_world_size=st.none() | st.integers(min_value=1, max_value=10_000),
    role_name=names,
    max_restarts=st.none() | counts,
    error_file=st.none() | names,
    run_id=st.none() | names,
    bootstrap=st.none() | names,
    prefix=st.none() | names,
    incarnation=counts,
    checkpoint_dir=st.none() | names,
    restart_from=st.none() | counts,
    stack_file=st.none() | names,
    done_file=st.none() | names,
)
def test_what_the_controller_writes_the_rank_reads_back(**fields):
    launch = LaunchEnv(**fields)
    assert LaunchEnv.from_environ(launch.to_environ()) == launch


def _full(**fields: object) -> LaunchEnv:
    """A rank of a torchrun-style gang (``group_rank`` set: torchrun's environment in full)."""
    return LaunchEnv(rank=1, world_size=2, local_world_size=2, group_rank=0, **fields)


def test_the_full_environment_always_says_max_restarts():
    # torchrun always gives TORCHELASTIC_MAX_RESTARTS; "no limit" has no torchrun spelling,
    # so it is a number no restart count reaches, and reads back as no limit.
    unlimited = _full().to_environ()
    assert unlimited["TORCHELASTIC_MAX_RESTARTS"] == str(UNLIMITED_RESTARTS)
    assert LaunchEnv.from_environ(unlimited).max_restarts is None
    assert _full(max_restarts=3).to_environ()["TORCHELASTIC_MAX_RESTARTS"] == "3"
    assert "TORCHELASTIC_MAX_RESTARTS" not in LaunchEnv().to_environ()


def test_the_error_file_and_role_are_torchruns_variables():
    env = _full(error_file="/s/errors/inc0.rank1.json", role_name="trainer").to_environ()
    assert env["TORCHELASTIC_ERROR_FILE"] == "/s/errors/inc0.rank1.json"
    assert env["ROLE_NAME"] == "trainer"
    assert _full().to_environ()["ROLE_NAME"] == "default"
    assert "TORCHELASTIC_ERROR_FILE" not in _full().to_environ()


@pytest.mark.parametrize(
    ("launch", "defaults"),
    [
        pytest.param(
            _full(),
            {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "OMP_NUM_THREADS": "1"},
            id="two-ranks-on-the-host",
        ),
        pytest.param(
            LaunchEnv(group_rank=0, local_world_size=1),
            {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"},
            id="one-rank-on-the-host",
        ),
        pytest.param(LaunchEnv(rank=1, world_size=2), {}, id="not-torchrun-style"),
    ],
)
def test_torchruns_defaults(launch, defaults):
    assert launch.defaults() == defaults
