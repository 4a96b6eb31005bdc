"""The seam between a training loop and the engine that distributes it.

A backend says what it really executes (`BackendCapabilities`) rather than accepting flags it
ignores, and implements a small lifecycle (`DistributedTrainingBackend`): join the gang, place
and wrap the model, describe the parallel plan, leave. The controller reads the capabilities
(may it restart the gang on another world size?) without importing torch: only
`TorchDDPBackend`'s methods import it.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from runwatch.common.launch_env import LaunchEnv
from runwatch.schemas.events import BackendDeclaration, ParallelPlan

if TYPE_CHECKING:
    import torch
    from torch import nn

THREADS_OUTLIVE_GROUP = "gloo threads outlive destroy_process_group"
"""What `TorchDDPBackend.shutdown` writes to stderr when a process group outlives it."""

PLAN_AXES = ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep", "etp")
"""The mesh axes of `ParallelPlan`, by field name."""


@dataclass(frozen=True)
class BackendCapabilities:
    """What a backend actually executes.

    Attributes:
        name: Backend name, e.g. ``"torch-ddp"``.
        axes: Plan axes (`PLAN_AXES` names) it can make larger than 1.
        precisions: Training precisions it runs, e.g. ``{"fp32"}``.
        distributed_optimizer: True if optimizer state is sharded across ranks (ZeRO-1+).
        reshardable_checkpoint: True if a checkpoint saved by N ranks loads on M ranks.
        elastic_restart: True if the gang may be restarted from a checkpoint, possibly on
            another world size, without restarting the job from scratch.
        per_step_fault_tolerance: True if replica groups may drop out of a step and rejoin,
            healed from a live peer's state (torchft): the controller may then restart one
            replica group alone instead of the gang. A backend that does not declare it is
            never asked to heal.
        requirements: Human-readable runtime requirements.
        incompatible_axis_sets: Axis combinations it cannot run together.
    """

    name: str
    axes: frozenset[str]
    precisions: frozenset[str] = frozenset({"fp32"})
    distributed_optimizer: bool = False
    reshardable_checkpoint: bool = False
    elastic_restart: bool = False
    per_step_fault_tolerance: bool = False
    requirements: tuple[str, ...] = ()
    incompatible_axis_sets: tuple[frozenset[str], ...] = field(default=())

    def plan_problems(self, plan: ParallelPlan, precision: str = "fp32") -> list[str]:
        """Why this backend cannot run ``plan`` at ``precision``; empty when it can.

        Args:
            plan: The requested plan.
            precision: The requested training precision.

        Returns:
            One line per problem.
        """
        used = {axis for axis in PLAN_AXES if getattr(plan, axis) > 1}
        problems = [
            f"{self.name} does not implement axis {axis}" for axis in sorted(used - self.axes)
        ]
        problems += [
            f"{self.name} cannot combine {sorted(bad)}"
            for bad in self.incompatible_axis_sets
            if bad <= used
        ]
        if precision not in self.precisions:
            problems.append(f"{self.name} does not train in {precision}")
        return problems

    def declaration(self) -> BackendDeclaration:
        """What RunStarted carries of these capabilities (the controller reads it)."""
        return BackendDeclaration(
            name=self.name,
            reshardable_checkpoint=self.reshardable_checkpoint,
            elastic_restart=self.elastic_restart,
            per_step_fault_tolerance=self.per_step_fault_tolerance,
        )


@runtime_checkable
class DistributedTrainingBackend(Protocol):
    """The lifecycle a training loop needs from a distribution engine."""

    @property
    def capabilities(self) -> BackendCapabilities:
        """What the backend really executes."""
        ...

    def init(self, env: LaunchEnv, *, timeout_s: float) -> None:
        """Join the gang (blocks until every rank has joined or ``timeout_s`` passes)."""
        ...

    @property
    def device(self) -> torch.device:
        """The device this rank computes on."""
        ...

    def plan(self) -> ParallelPlan:
        """The parallel plan the gang runs."""
        ...

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """Move ``model`` to `device` and wrap it for distributed training."""
        ...

    def shutdown(self) -> None:
        """Leave the gang and free its resources."""
        ...


class TorchDDPBackend:
    """Data-parallel replication with ``torch.nn.parallel.DistributedDataParallel``.

    gloo on CPU, nccl (plus gloo for CPU collectives such as checkpoint coordination) when
    CUDA is available. Capabilities, as exercised by ``tests/integration/torch``: only the
    ``dp_replicate`` axis, fp32, no optimizer sharding; checkpoints are reshardable (DCP with
    parameter-name keys and a global loader position: a 2-rank checkpoint resumes on 1 rank),
    so the gang may be restarted on another world size.
    """

    CAPABILITIES = BackendCapabilities(
        name="torch-ddp",
        axes=frozenset({"dp_replicate"}),
        precisions=frozenset({"fp32"}),
        distributed_optimizer=False,
        reshardable_checkpoint=True,
        elastic_restart=True,
        requirements=(
            "torch>=2.4",
            "torch.distributed with gloo (CPU) or nccl (CUDA)",
            "a file system shared by all ranks for checkpoints",
        ),
    )

    def __init__(self) -> None:
        self._env: LaunchEnv | None = None
        self._device: torch.device | None = None

    @property
    def capabilities(self) -> BackendCapabilities:
        """What DDP here really executes."""
        return self.CAPABILITIES

    def init(self, env: LaunchEnv, *, timeout_s: float = 120.0) -> None:
        """Initialise the default process group from the launch environment.

        Args:
            env: Where this rank stands in the gang.
            timeout_s: Rendezvous and collective timeout.
        """
        import torch
        import torch.distributed as dist

        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(env.local_rank)
        self._device = torch.device("cuda", env.local_rank) if cuda else torch.device("cpu")
        dist.init_process_group(
            backend="cpu:gloo,cuda:nccl" if cuda else "gloo",
            init_method=f"tcp://{env.master_addr}:{env.master_port}",
            rank=env.rank,
            world_size=env.world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        self._env = env

    @property
    def device(self) -> torch.device:
        """The device this rank computes on (after `init`)."""
        if self._device is None:
            raise RuntimeError("TorchDDPBackend.init() has not run")
        return self._device

    def plan(self) -> ParallelPlan:
        """Pure replication over the whole gang."""
        if self._env is None:
            raise RuntimeError("TorchDDPBackend.init() has not run")
        return ParallelPlan(dp_replicate=self._env.world_size)

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """Move to the device and wrap in DDP (parameters broadcast from rank 0)."""
        from torch.nn.parallel import DistributedDataParallel

        model = model.to(self.device)
        if self.device.type == "cuda":
            return DistributedDataParallel(model, device_ids=[self.device.index])
        return DistributedDataParallel(model)

    def shutdown(self) -> None:
        """Destroy the process groups and say if their threads outlive them.

        ``destroy_process_group`` shuts a group down and forgets it, but a gloo group's
        worker and socket threads end only when the group object is freed. Whatever still
        holds it (a DDP wrapper, an optimizer hook) keeps them running until the interpreter
        tears that object down at exit, in whatever order finalization frees things. So
        the caller drops its model before calling this, and a warning on stderr names the
        threads left when it did not (`gloo_threads`).
        """
        import torch.distributed as dist

        if not dist.is_initialized():
            return
        dist.destroy_process_group()
        left = gloo_threads()
        if left:
            print(
                f"runwatch: {len(left)} {THREADS_OUTLIVE_GROUP} "
                f"({', '.join(sorted(set(left)))}): something still holds a process group; "
                "drop the DDP model before shutdown()",
                file=sys.stderr,
                flush=True,
            )


def gloo_threads() -> list[str]:
    """Names of this process's threads that gloo started (Linux; elsewhere empty).

    ``pt_gloo_runloop`` (a group's workers) and ``gloo_tcp_loop`` (its socket loop), read
    from ``/proc/self/task/*/comm``; a thread that ends while this reads is skipped.
    """
    names: list[str] = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return names
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm", encoding="utf-8") as f:
                name = f.read().strip()
        except OSError:
            continue
        if name.startswith(("pt_gloo", "gloo_")):
            names.append(name)
    return names


# --------------------------------------------------------------------------- the registry

BackendFactory = Callable[[], DistributedTrainingBackend]
"""A zero-argument factory; it may import its engine (torch) when it runs, not before."""


class UnknownBackendError(LookupError):
    """No backend is registered under the name asked for."""


@dataclass(frozen=True)
class _Entry:
    factory: BackendFactory
    capabilities: BackendCapabilities


_REGISTRY: dict[str, _Entry] = {}
_INSTANCES: dict[str, DistributedTrainingBackend] = {}
_LOCK = threading.Lock()


def register_training_backend(
    name: str,
    factory: BackendFactory,
    capabilities: BackendCapabilities,
    *,
    replace: bool = False,
) -> None:
    """Register a backend under ``name`` with a lazy factory.

    The capabilities are given at registration so that they can be read
    (`training_backend_capabilities`) without running the factory, so without importing
    the engine.

    Args:
        name: The name `get_training_backend` resolves, e.g. ``"torch-ddp"``.
        factory: Called once, on the first `get_training_backend` of ``name``.
        capabilities: What the backend executes; its ``name`` must be ``name``.
        replace: Allow replacing an existing registration.

    Raises:
        ValueError: ``name`` is empty, differs from ``capabilities.name``, or is taken.
    """
    if not name:
        raise ValueError("a backend name must not be empty")
    if capabilities.name != name:
        raise ValueError(f"backend {name!r} registered with capabilities of {capabilities.name!r}")
    with _LOCK:
        if name in _REGISTRY and not replace:
            raise ValueError(f"training backend {name!r} is already registered")
        _REGISTRY[name] = _Entry(factory, capabilities)
        _INSTANCES.pop(name, None)


def _entry(name: str) -> _Entry:
    entry = _REGISTRY.get(name)
    if entry is None:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise UnknownBackendError(f"unknown training backend {name!r} (known: {known})")
    return entry


def training_backend_names() -> tuple[str, ...]:
    """The registered names, sorted."""
    return tuple(sorted(_REGISTRY))


def training_backend_capabilities(name: str) -> BackendCapabilities:
    """A registered backend's capabilities, without running its factory (no torch import).

    Raises:
        UnknownBackendError: ``name`` is not registered (the message lists the known names).
    """
    return _entry(name).capabilities


def get_training_backend(name: str) -> DistributedTrainingBackend:
    """Resolve a registered backend, calling its zero-argument lazy factory once.

    Args:
        name: A registered name (`training_backend_names`).

    Returns:
        The backend (the same object on every call for ``name``).

    Raises:
        UnknownBackendError: ``name`` is not registered (the message lists the known names).
    """
    with _LOCK:
        found = _INSTANCES.get(name)
        if found is None:
            found = _entry(name).factory()
            _INSTANCES[name] = found
        return found


register_training_backend("torch-ddp", TorchDDPBackend, TorchDDPBackend.CAPABILITIES)

TORCHFT_DDP_CAPABILITIES = BackendCapabilities(
    name="torchft-ddp",
    axes=frozenset({"dp_replicate"}),
    precisions=frozenset({"fp32"}),
    distributed_optimizer=False,
    reshardable_checkpoint=True,
    elastic_restart=True,
    per_step_fault_tolerance=True,
    requirements=(
        "torchft==0.2.0 (the `ft` extra)",
        "a torchft Lighthouse (TORCHFT_LIGHTHOUSE; `runwatch launch --fault-tolerance torchft`)",
        "gloo (CPU) or nccl (CUDA) inside each replica group",
    ),
)
"""torchft's DDP across replica groups (`producers.torchft_backend.TorchFTDDPBackend`):
per-step fault tolerance (a group drops out of a step's quorum and heals from a live peer),
DCP checkpoints as torch-ddp's for rollbacks."""


def _torchft_ddp() -> DistributedTrainingBackend:
    from runwatch.producers.torchft_backend import TorchFTDDPBackend

    return TorchFTDDPBackend()


register_training_backend("torchft-ddp", _torchft_ddp, TORCHFT_DDP_CAPABILITIES)
