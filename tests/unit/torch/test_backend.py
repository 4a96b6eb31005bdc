from __future__ import annotations

from runwatch.common.launch_env import LaunchEnv
from runwatch.producers.backend import (
    BackendCapabilities,
    DistributedTrainingBackend,
    TorchDDPBackend,
)
from runwatch.schemas.events import ParallelPlan


def test_ddp_capabilities_are_what_it_runs():
    caps = TorchDDPBackend().capabilities
    assert caps.name == "torch-ddp" and caps.axes == {"dp_replicate"}
    assert caps.elastic_restart and caps.reshardable_checkpoint
    assert not caps.distributed_optimizer
    assert caps.plan_problems(ParallelPlan(dp_replicate=8)) == []
    assert caps.plan_problems(ParallelPlan(dp_replicate=2, tp=2), "bf16") == [
        "torch-ddp does not implement axis tp",
        "torch-ddp does not train in bf16",
    ]


def test_incompatible_axis_sets():
    caps = BackendCapabilities(
        "x", frozenset({"tp", "cp"}), incompatible_axis_sets=(frozenset({"tp", "cp"}),)
    )
    assert caps.plan_problems(ParallelPlan(tp=2, cp=2)) == ["x cannot combine ['cp', 'tp']"]


def test_ddp_backend_satisfies_the_protocol():
    backend: DistributedTrainingBackend = TorchDDPBackend()  # checked by mypy
    members = [n for n in vars(DistributedTrainingBackend) if not n.startswith("_")]
    assert {"capabilities", "init", "device", "plan", "wrap_model", "shutdown"} <= set(members)
    assert all(hasattr(TorchDDPBackend, n) for n in members)
    assert backend.capabilities is TorchDDPBackend.CAPABILITIES


def test_launch_env():
    env = LaunchEnv.from_environ({"RANK": "3", "WORLD_SIZE": "4", "MASTER_PORT": "1234"})
    assert env == LaunchEnv(
        rank=3, world_size=4, local_rank=3, master_addr="127.0.0.1", master_port=1234
    )
    assert LaunchEnv.from_environ({}).world_size == 1
