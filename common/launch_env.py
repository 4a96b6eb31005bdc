"""The launch environment: what a rank is started with, as one struct.

One writer, one reader: the controller builds a `LaunchEnv` per rank and hands its
`LaunchEnv.to_environ` to the process (`controller.gang.rank_environ`); the training side
reads it back with `LaunchEnv.from_environ` (`producers.backend`, the examples). The
variables are torchrun's (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``, and on a node of a torchrun-style gang ``GROUP_RANK``,
``ROLE_*``, ``TORCHELASTIC_*``) plus runwatch's (``RUNWATCH_*``), so a script launched by
``torchrun`` reads the same struct with runwatch's fields left unset. The controller's
writer is `controller.topology.NodeTopology.launch_env`. Two more variables torchrun gives
are defaults rather than contract (the agent's own environment wins): `LaunchEnv.defaults`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from runwatch.common.settings import ENV_BOOTSTRAP, ENV_TOPIC_PREFIX

ENV_RANK = "RANK"
ENV_WORLD_SIZE = "WORLD_SIZE"
ENV_LOCAL_RANK = "LOCAL_RANK"
ENV_LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
ENV_MASTER_ADDR = "MASTER_ADDR"
ENV_MASTER_PORT = "MASTER_PORT"
ENV_GROUP_RANK = "GROUP_RANK"
ENV_GROUP_WORLD_SIZE = "GROUP_WORLD_SIZE"
ENV_ROLE_NAME = "ROLE_NAME"
ENV_ROLE_RANK = "ROLE_RANK"
ENV_ROLE_WORLD_SIZE = "ROLE_WORLD_SIZE"
ENV_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
ENV_MAX_RESTARTS = "TORCHELASTIC_MAX_RESTARTS"
ENV_ELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"
ENV_USE_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"
ENV_ERROR_FILE = "TORCHELASTIC_ERROR_FILE"
ENV_NCCL_ASYNC_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
ENV_OMP_NUM_THREADS = "OMP_NUM_THREADS"
ENV_RUN_ID = "RUNWATCH_RUN_ID"
ENV_INCARNATION = "RUNWATCH_INCARNATION"
ENV_CHECKPOINT_DIR = "RUNWATCH_CHECKPOINT_DIR"
ENV_RESTART_FROM = "RUNWATCH_RESTART_FROM"
ENV_STACK_FILE = "RUNWATCH_STACK_FILE"
ENV_DONE_FILE = "RUNWATCH_DONE_FILE"
ENV_RELAY_SOCKET = "RUNWATCH_RELAY_SOCKET"
ENV_LAUNCH_ID = "RUNWATCH_LAUNCH_ID"

DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500
ROLE_NAME = "default"
"""torchrun's ``ROLE_NAME`` for a launch without roles."""
UNLIMITED_RESTARTS = 2**31 - 1
"""``TORCHELASTIC_MAX_RESTARTS`` of a gang with no restart limit: torchrun has no spelling
for "no limit" (its default is 0), and a script comparing the restart count with it must
never find the limit reached. Read back as None."""


@dataclass(frozen=True, kw_only=True)
class LaunchEnv:
    """The torchrun-style environment of one rank, with runwatch's variables.

    The defaults describe a lone process started by hand: rank 0 of 1 on localhost, no
    runwatch variables.

    Attributes:
        rank: Global rank (``RANK``).
        world_size: Ranks in the gang (``WORLD_SIZE``).
        local_rank: Rank on this host (``LOCAL_RANK``), selects the GPU.
        master_addr: Rendezvous host (``MASTER_ADDR``).
        master_port: Rendezvous port (``MASTER_PORT``).
        local_world_size: Ranks on this host (``LOCAL_WORLD_SIZE``); None: not given.
        group_rank: This node's index (``GROUP_RANK``); None: not given. When set, the
            environment is torchrun's in full: also ``GROUP_WORLD_SIZE``, ``ROLE_NAME``,
            ``ROLE_RANK``, ``ROLE_WORLD_SIZE``, ``TORCHELASTIC_RESTART_COUNT`` (the
            incarnation), ``TORCHELASTIC_MAX_RESTARTS`` (`UNLIMITED_RESTARTS` when there
            is no limit), ``TORCHELASTIC_RUN_ID`` (the run id) and
            ``TORCHELASTIC_USE_AGENT_STORE=False`` (rank 0 serves the store).
        group_world_size: Nodes in the gang (``GROUP_WORLD_SIZE``).
        role_name: torchrun's role (``ROLE_NAME``, ``--role``); written with the full
            environment, or when not the default.
        max_restarts: ``TORCHELASTIC_MAX_RESTARTS``; None: not given (no limit).
        error_file: Where the rank's ``@record`` entry point writes the exception that
            ended it (``TORCHELASTIC_ERROR_FILE``, read by the agent when the rank exits
            non-zero: `controller.error_file`); None: not given.
        run_id: The run (``RUNWATCH_RUN_ID``); None: not launched by runwatch.
        bootstrap: Kafka bootstrap address (``RUNWATCH_BOOTSTRAP``).
        prefix: Topic name prefix (``RUNWATCH_TOPIC_PREFIX``).
        incarnation: Restarts of the gang so far (``RUNWATCH_INCARNATION``).
        checkpoint_dir: The gang's checkpoint root (``RUNWATCH_CHECKPOINT_DIR``), if known.
        restart_from: The checkpoint step a respawn resumes from (``RUNWATCH_RESTART_FROM``;
            0: start over, no checkpoint); None on a first launch.
        stack_file: Where the rank writes its Python stacks when its agent asks
            (``RUNWATCH_STACK_FILE``; `producers.stackdump`); None: not asked for.
        done_file: Where the rank says that its training finished
            (``RUNWATCH_DONE_FILE``; `producers.rank_done`), read by the agent when a
            signal kills the rank: one after it is the interpreter's teardown, not a
            fault; None: not given.
        relay_socket: The node agent's relay, where the rank's emitter hands its events
            (``RUNWATCH_RELAY_SOCKET``; `producers.relay_client`); None: the emitter
            talks to Kafka itself.
        launch_id: The launch the gang belongs to (``RUNWATCH_LAUNCH_ID``, minted by
            ``runwatch launch``); the rank's RunStarted carries it and restart commands are
            bound to it. None: not given.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    master_addr: str = DEFAULT_MASTER_ADDR
    master_port: int = DEFAULT_MASTER_PORT
    local_world_size: int | None = None
    group_rank: int | None = None
    group_world_size: int | None = None
    role_name: str = ROLE_NAME
    max_restarts: int | None = None
    error_file: str | None = None
    run_id: str | None = None
    bootstrap: str | None = None
    prefix: str | None = None
    incarnation: int = 0
    checkpoint_dir: str | None = None
    restart_from: int | None = None
    stack_file: str | None = None
    done_file: str | None = None
    relay_socket: str | None = None
    launch_id: str | None = None

    def to_environ(self) -> dict[str, str]:
        """The variables, as a process environment (unset fields are left out).

        Returns:
            Variable name -> value; `from_environ` of it gives this struct back.
        """
        env = {
            ENV_RANK: str(self.rank),
            ENV_WORLD_SIZE: str(self.world_size),
            ENV_LOCAL_RANK: str(self.local_rank),
            ENV_MASTER_ADDR: self.master_addr,
            ENV_MASTER_PORT: str(self.master_port),
        }
        optional = {
            ENV_LOCAL_WORLD_SIZE: self.local_world_size,
            ENV_BOOTSTRAP: self.bootstrap,
            ENV_RUN_ID: self.run_id,
            ENV_TOPIC_PREFIX: self.prefix,
            ENV_CHECKPOINT_DIR: self.checkpoint_dir or None,
            ENV_RESTART_FROM: self.restart_from,
            ENV_STACK_FILE: self.stack_file or None,
            ENV_DONE_FILE: self.done_file or None,
            ENV_RELAY_SOCKET: self.relay_socket or None,
            ENV_LAUNCH_ID: self.launch_id or None,
            ENV_ERROR_FILE: self.error_file or None,
            ENV_GROUP_WORLD_SIZE: self.group_world_size,
            ENV_MAX_RESTARTS: self.max_restarts,
        }
        env.update({name: str(value) for name, value in optional.items() if value is not None})
        if self.run_id is not None or self.incarnation:
            env[ENV_INCARNATION] = str(self.incarnation)
        if self.group_rank is not None or self.role_name != ROLE_NAME:
            env[ENV_ROLE_NAME] = self.role_name
        if self.group_rank is not None:
            env[ENV_GROUP_RANK] = str(self.group_rank)
            env[ENV_ROLE_RANK] = str(self.rank)
            env[ENV_ROLE_WORLD_SIZE] = str(self.world_size)
            env[ENV_RESTART_COUNT] = str(self.incarnation)
            env[ENV_USE_AGENT_STORE] = "False"
            env[ENV_MAX_RESTARTS] = str(
                UNLIMITED_RESTARTS if self.max_restarts is None else self.max_restarts
            )
            if self.run_id is not None:
                env[ENV_ELASTIC_RUN_ID] = self.run_id
        return env

    def defaults(self) -> dict[str, str]:
        """What torchrun gives its workers unless its own environment already has it.

        With the full environment (``group_rank`` set): ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1``
        (NCCL errors abort the rank instead of hanging it), and ``OMP_NUM_THREADS=1`` when
        more than one rank shares the host (torchrun's guard against oversubscribing the
        CPUs). The launcher puts them under the agent's environment and ``--env``
        (`controller.gang.rank_environ`), so either wins.

        Returns:
            Variable name -> default value.
        """
        if self.group_rank is None:
            return {}
        out = {ENV_NCCL_ASYNC_ERROR_HANDLING: "1"}
        if (self.local_world_size or 1) > 1:
            out[ENV_OMP_NUM_THREADS] = "1"
        return out

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> LaunchEnv:
        """Read the variables; a lone process without them is rank 0 of 1 on localhost.

        Args:
            environ: Mapping to read; None reads ``os.environ``.

        Returns:
            The launch environment.

        Raises:
            ValueError: A numeric variable is not an integer.
        """
        env = os.environ if environ is None else environ

        def number(name: str) -> int | None:
            raw = env.get(name)
            if raw is None or raw == "":
                return None
            try:
                return int(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not an integer") from None

        rank = number(ENV_RANK) or 0
        local_rank = number(ENV_LOCAL_RANK)
        max_restarts = number(ENV_MAX_RESTARTS)
        return cls(
            rank=rank,
            world_size=number(ENV_WORLD_SIZE) or 1,
            local_rank=rank if local_rank is None else local_rank,
            master_addr=env.get(ENV_MASTER_ADDR) or DEFAULT_MASTER_ADDR,
            master_port=number(ENV_MASTER_PORT) or DEFAULT_MASTER_PORT,
            local_world_size=number(ENV_LOCAL_WORLD_SIZE),
            group_rank=number(ENV_GROUP_RANK),
            group_world_size=number(ENV_GROUP_WORLD_SIZE),
            role_name=env.get(ENV_ROLE_NAME) or ROLE_NAME,
            max_restarts=None if max_restarts == UNLIMITED_RESTARTS else max_restarts,
            error_file=env.get(ENV_ERROR_FILE) or None,
            run_id=env.get(ENV_RUN_ID) or None,
            bootstrap=env.get(ENV_BOOTSTRAP) or None,
            prefix=env.get(ENV_TOPIC_PREFIX) or None,
            # torchrun's restart count is the incarnation of a gang runwatch did not launch
            incarnation=number(ENV_INCARNATION) or number(ENV_RESTART_COUNT) or 0,
            checkpoint_dir=env.get(ENV_CHECKPOINT_DIR) or None,
            restart_from=number(ENV_RESTART_FROM),
            stack_file=env.get(ENV_STACK_FILE) or None,
            done_file=env.get(ENV_DONE_FILE) or None,
            relay_socket=env.get(ENV_RELAY_SOCKET) or None,
            launch_id=env.get(ENV_LAUNCH_ID) or None,
        )


__all__ = ["ROLE_NAME", "UNLIMITED_RESTARTS", "LaunchEnv"]
