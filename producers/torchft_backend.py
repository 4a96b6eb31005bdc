"""The ``torchft-ddp`` backend: DDP across replica groups that may drop out and heal.

One replica group is a torchrun-style gang of ``WORLD_SIZE`` ranks (``RANK`` inside the
group) with its own rendezvous store at ``MASTER_ADDR:MASTER_PORT``; the groups meet per
step in a torchft quorum kept by a Lighthouse (``TORCHFT_LIGHTHOUSE``). The launcher says
which group a rank is in (``REPLICA_GROUP_ID``, of ``NUM_REPLICA_GROUPS``:
`controller.torchft_launcher`). A group that dies is left out of the next step's quorum;
when it comes back, torchft copies a live peer's state into it (no checkpoint read).

torchft is imported when `TorchFTDDPBackend.init` runs, never on import of this module's
registration (`producers.backend` reads the capabilities without torch).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from runwatch.common.launch_env import LaunchEnv
from runwatch.producers.backend import TORCHFT_DDP_CAPABILITIES, BackendCapabilities
from runwatch.producers.settings import (
    ENV_LIGHTHOUSE,
    ENV_MIN_REPLICAS,
    ENV_NUM_REPLICA_GROUPS,
    ENV_REPLICA_FLOOR,
    ENV_REPLICA_FLOOR_BOUND_S,
    ENV_REPLICA_GROUP_ID,
    ReplicaEnv,
    floor_thresholds,
)
from runwatch.schemas.events import ParallelPlan

if TYPE_CHECKING:
    import torch
    from torch import nn


def _guarded_ddp() -> Any:
    """Torchft 0.2.0's ``DistributedDataParallel`` with a comm hook that survives a lost peer.

    The trainer side's one private access to torchft (the controller's are in
    `controller.torchft_compat`). torchft's hook returns the ``_fut`` of the manager's
    managed future, and asserts that it exists; when a peer group dies in the middle of a
    step, the all-reduce fails and the future it gets has none: the ``AssertionError``
    then kills the *surviving* group too. The guarded hook returns a completed future of
    the bucket instead: the manager has recorded the error, so the step will not commit
    (``should_commit`` is False) and the next quorum goes on without the dead group.

    Raises:
        RuntimeError: A torchft without the hook this guards (another version).
    """
    import torch
    from torchft import DistributedDataParallel

    if not hasattr(DistributedDataParallel, "_comm_hook"):
        raise RuntimeError(
            "torchft.DistributedDataParallel has no _comm_hook: runwatch's torchft-ddp "
            "backend is written against torchft 0.2.0 (pip install 'runwatch[ft]')"
        )

    class GuardedDDP(DistributedDataParallel):  # type: ignore[misc]
        # No annotations: torch's DDP refuses a hook whose annotations are not the very
        # objects dist.GradBucket and Future[Tensor] (this module's are strings).
        @staticmethod
        def _comm_hook(state, bucket):  # type: ignore[no-untyped-def]
            work = state.allreduce(bucket.buffer())
            work.wait()
            inner = getattr(work.get_future(), "_fut", None)
            if inner is not None:
                return inner
            done: torch.futures.Future[Any] = torch.futures.Future()
            done.set_result(bucket.buffer())
            return done

    return GuardedDDP


class TorchFTDDPBackend:
    """torchft's ``Manager`` + ``DistributedDataParallel`` + ``OptimizerWrapper``.

    `init` serves the group's rendezvous store on group rank 0 (runwatch has no agent
    store), makes a reconfigurable gloo process group and the ``Manager``; `wrap_model` and
    `wrap_optimizer` wrap for torchft; `register_state` names what a healing group copies
    from a live peer.
    """

    CAPABILITIES = TORCHFT_DDP_CAPABILITIES

    def __init__(self) -> None:
        self._env: LaunchEnv | None = None
        self.replica: ReplicaEnv | None = None
        self._device: torch.device | None = None
        self._store: Any = None
        self.manager: Any = None

    @property
    def capabilities(self) -> BackendCapabilities:
        """What torchft DDP here really executes."""
        return self.CAPABILITIES

    def init(self, env: LaunchEnv, *, timeout_s: float = 60.0) -> None:
        """Join the replica group and the Lighthouse's quorum.

        Args:
            env: Where this rank stands inside its replica group (torchrun's variables).
            timeout_s: Collective, quorum and connect timeout.
        """
        import torch
        from torch.distributed import TCPStore  # type: ignore[attr-defined]
        from torchft import Manager, ProcessGroupGloo

        self.replica = ReplicaEnv.from_env()
        self._device = torch.device("cpu")
        if env.rank == 0:  # torchft's Manager joins the group's store; someone must serve it
            self._store = TCPStore(
                env.master_addr,
                env.master_port,
                is_master=True,
                wait_for_workers=False,
                timeout=timedelta(seconds=timeout_s),
            )
        timeout = timedelta(seconds=timeout_s)
        if env.rank == 0:
            self._await_every_group(env, timeout)
        self.manager = Manager(
            pg=ProcessGroupGloo(timeout=timeout),
            load_state_dict=None,
            state_dict=None,
            min_replica_size=self.replica.min_replicas,
            replica_id=f"{env.run_id or 'run'}_{self.replica.group}",
            rank=env.rank,
            world_size=env.world_size,
            store_addr=env.master_addr,
            store_port=env.master_port,
            lighthouse_addr=self.replica.lighthouse,
            timeout=timeout,
            quorum_timeout=timeout,
            connect_timeout=timeout,
        )
        self._env = env

    def _await_every_group(self, env: LaunchEnv, timeout: timedelta) -> None:
        """On the run's first start, wait until every group's rank 0 is here.

        torchft's Lighthouse forms a quorum of the groups that are up: a group whose
        interpreter starts a second later would begin as a straggler and heal at once. The
        barrier is a quorum of a second Lighthouse that needs every group (the launcher's).
        A restarted group skips it: the others are stepping and it heals from them.
        """
        replica = self.replica
        if replica is None or not replica.start_barrier or replica.restarts:
            return
        from torchft.coordination import LighthouseClient

        client = LighthouseClient(replica.start_barrier, connect_timeout=timeout)
        client.quorum(replica_id=f"{env.run_id or 'run'}_{replica.group}", timeout=timeout)

    @property
    def device(self) -> torch.device:
        """The device this rank computes on (after `init`)."""
        if self._device is None:
            raise RuntimeError("TorchFTDDPBackend.init() has not run")
        return self._device

    def plan(self) -> ParallelPlan:
        """Replication over every replica group's ranks."""
        if self._env is None or self.replica is None:
            raise RuntimeError("TorchFTDDPBackend.init() has not run")
        return ParallelPlan(dp_replicate=self._env.world_size * self.replica.groups)

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """Torchft's DDP, guarded (`_guarded_ddp`): gradients averaged over the step's quorum."""
        wrapped: nn.Module = _guarded_ddp()(self.manager, model.to(self.device))
        return wrapped

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Torchft's wrapper: ``zero_grad`` starts the quorum, ``step`` commits or not."""
        from torchft.optim import OptimizerWrapper

        wrapped: torch.optim.Optimizer = OptimizerWrapper(self.manager, optimizer)
        return wrapped

    def register_state(
        self, key: str, load: Callable[[Any], None], save: Callable[[], Any]
    ) -> None:
        """What a healing group copies from a live peer (model, optimizer, loader)."""
        self.manager.register_state_dict_fn(key, load, save)

    def shutdown(self) -> None:
        """Stop the Manager (its server and threads); the store goes with the process."""
        if self.manager is not None:
            self.manager.shutdown(wait=False)


__all__ = [
    "ENV_LIGHTHOUSE",
    "ENV_MIN_REPLICAS",
    "ENV_NUM_REPLICA_GROUPS",
    "ENV_REPLICA_FLOOR",
    "ENV_REPLICA_FLOOR_BOUND_S",
    "ENV_REPLICA_GROUP_ID",
    "ReplicaEnv",
    "TorchFTDDPBackend",
    "floor_thresholds",
]
