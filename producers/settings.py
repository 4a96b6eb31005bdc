"""What the trainer side reads from its environment: the emitter's and torchft's variables.

``runwatch launch`` (or torchrun) sets these for every rank (`common.launch_env` writes
the contract); `EmitterEnv` is what `RunEmitter` falls back on for each argument it is not
given, and `ReplicaEnv` is where a ``torchft-ddp`` rank stands among the replica groups.
Nothing else on the trainer side reads a ``RUNWATCH_*`` variable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from runwatch.common.launch_env import (
    ENV_DONE_FILE,
    ENV_INCARNATION,
    ENV_LAUNCH_ID,
    ENV_RANK,
    ENV_RELAY_SOCKET,
    ENV_RUN_ID,
    ENV_STACK_FILE,
    ENV_WORLD_SIZE,
)
from runwatch.common.settings import ENV_BOOTSTRAP, ENV_TOPIC_PREFIX

ENV_REPLICA_GROUP_ID: Final = "REPLICA_GROUP_ID"
ENV_NUM_REPLICA_GROUPS: Final = "NUM_REPLICA_GROUPS"
ENV_LIGHTHOUSE: Final = "TORCHFT_LIGHTHOUSE"
ENV_MIN_REPLICAS: Final = "RUNWATCH_MIN_REPLICAS"
ENV_START_BARRIER: Final = "RUNWATCH_FT_START_BARRIER"
"""A second Lighthouse whose quorum needs every group: the first start's barrier."""
ENV_GROUP_RESTARTS: Final = "RUNWATCH_FT_GROUP_RESTARTS"
"""How many times the launcher restarted this rank's group (0: its first start)."""


ENV_REPLICA_FLOOR: Final = "RUNWATCH_REPLICA_FLOOR"
"""``--min-replicas`` when ``--min-replicas-bound-s`` is given (torchft's floor is then 1)."""
ENV_REPLICA_FLOOR_BOUND_S: Final = "RUNWATCH_REPLICA_FLOOR_BOUND_S"
"""``--min-replicas-bound-s``: how long the steps may stay below the floor, in log time."""


def _int(env: Mapping[str, str], name: str) -> int | None:
    """The integer in variable ``name``; None when unset or blank.

    Raises:
        ValueError: It is set to something that is not an integer (the message names it).
    """
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {raw!r}") from None


@dataclass(frozen=True, kw_only=True)
class EmitterEnv:
    """What a rank's `RunEmitter` reads from its environment; None: the variable is unset.

    Attributes:
        run_id: The run (``RUNWATCH_RUN_ID``, set by ``runwatch launch`` for every rank).
        bootstrap: Kafka ``host:port[,host:port]`` (``RUNWATCH_BOOTSTRAP``).
        topic_prefix: Topic name prefix (``RUNWATCH_TOPIC_PREFIX``).
        rank: torchrun's global rank (``RANK``).
        world_size: torchrun's world size (``WORLD_SIZE``).
        incarnation: The gang's incarnation, 0 then +1 per restart
            (``RUNWATCH_INCARNATION``).
        relay_socket: The node agent's relay (``RUNWATCH_RELAY_SOCKET``, ``runwatch launch
            --relay``): events go there instead of to Kafka.
        launch_id: The launch the gang belongs to (``RUNWATCH_LAUNCH_ID``); RunStarted
            carries it.
        stack_file: Where ``SIGUSR1`` dumps every thread's stack (``RUNWATCH_STACK_FILE``;
            `producers.stackdump`).
        done_file: Where the rank says its training finished (``RUNWATCH_DONE_FILE``;
            `producers.rank_done`).
    """

    run_id: str | None = None
    bootstrap: str | None = None
    topic_prefix: str | None = None
    rank: int | None = None
    world_size: int | None = None
    incarnation: int | None = None
    relay_socket: str | None = None
    launch_id: str | None = None
    stack_file: str | None = None
    done_file: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> EmitterEnv:
        """Read the variables (`os.environ` when None); empty strings count as unset.

        Raises:
            ValueError: ``RANK``, ``WORLD_SIZE`` or ``RUNWATCH_INCARNATION`` is set but
                not an integer (the message names it).
        """
        env = os.environ if environ is None else environ
        return cls(
            run_id=env.get(ENV_RUN_ID) or None,
            bootstrap=env.get(ENV_BOOTSTRAP) or None,
            topic_prefix=env.get(ENV_TOPIC_PREFIX) or None,
            rank=_int(env, ENV_RANK),
            world_size=_int(env, ENV_WORLD_SIZE),
            incarnation=_int(env, ENV_INCARNATION),
            relay_socket=env.get(ENV_RELAY_SOCKET) or None,
            launch_id=env.get(ENV_LAUNCH_ID) or None,
            stack_file=env.get(ENV_STACK_FILE) or None,
            done_file=env.get(ENV_DONE_FILE) or None,
        )


@dataclass(frozen=True)
class ReplicaEnv:
    """Where a rank stands among the replica groups (torchft's variables).

    Attributes:
        group: Its replica group (``REPLICA_GROUP_ID``).
        groups: Replica groups in the run (``NUM_REPLICA_GROUPS``).
        lighthouse: The Lighthouse's address (``TORCHFT_LIGHTHOUSE``).
        min_replicas: Fewest groups a step may commit with (``RUNWATCH_MIN_REPLICAS``).
        start_barrier: The start barrier's Lighthouse (``RUNWATCH_FT_START_BARRIER``), "":
            none.
        restarts: Times the launcher restarted this group (``RUNWATCH_FT_GROUP_RESTARTS``).
    """

    group: int
    groups: int
    lighthouse: str
    min_replicas: int = 1
    start_barrier: str = ""
    restarts: int = 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ReplicaEnv:
        """Read the variables (`os.environ` when None); a missing one is an error naming it.

        Raises:
            RuntimeError: ``REPLICA_GROUP_ID``, ``NUM_REPLICA_GROUPS`` or
                ``TORCHFT_LIGHTHOUSE`` is missing (the run was not launched for torchft).
            ValueError: A numeric variable is not an integer (the message names it).
        """
        env = os.environ if environ is None else environ
        missing = [
            n
            for n in (ENV_REPLICA_GROUP_ID, ENV_NUM_REPLICA_GROUPS, ENV_LIGHTHOUSE)
            if not env.get(n)
        ]
        if missing:
            raise RuntimeError(
                f"torchft-ddp needs {', '.join(missing)} (start the run with "
                "`runwatch launch --fault-tolerance torchft`)"
            )
        min_replicas = _int(env, ENV_MIN_REPLICAS)
        restarts = _int(env, ENV_GROUP_RESTARTS)
        return cls(
            group=_int(env, ENV_REPLICA_GROUP_ID) or 0,
            groups=_int(env, ENV_NUM_REPLICA_GROUPS) or 0,
            lighthouse=env[ENV_LIGHTHOUSE],
            min_replicas=1 if min_replicas is None else min_replicas,
            start_barrier=env.get(ENV_START_BARRIER, ""),
            restarts=0 if restarts is None else restarts,
        )


@dataclass(frozen=True)
class ReplicaFloorEnv:
    """The floor of replica groups a run announces (``--min-replicas-bound-s``).

    Attributes:
        min_replicas: ``--min-replicas`` (``RUNWATCH_REPLICA_FLOOR``); None: no bound given.
        bound_s: How long the steps may stay below it, in log time
            (``RUNWATCH_REPLICA_FLOOR_BOUND_S``).
    """

    min_replicas: float | None = None
    bound_s: float = 300.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ReplicaFloorEnv:
        """Read the variables (`os.environ` when None).

        Raises:
            ValueError: A variable that is not a number (the message names it).
        """
        env = os.environ if environ is None else environ
        values: dict[str, float] = {}
        for name, field in (
            (ENV_REPLICA_FLOOR, "min_replicas"),
            (ENV_REPLICA_FLOOR_BOUND_S, "bound_s"),
        ):
            raw = env.get(name)
            if raw is None:
                continue
            try:
                values[field] = float(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not a number") from None
        return cls(**values)

    def thresholds(self) -> dict[str, float]:
        """The floor as RunStarted thresholds (empty: no bound given).

        ``runwatch launch --min-replicas M --min-replicas-bound-s S`` gives the ranks M and
        S; the run announces them (``min_replicas``, ``min_replicas_bound_s``) so that the
        step reducer raises ``replicas_below_min`` when its steps stay below M for longer
        than S.
        """
        if self.min_replicas is None:
            return {}
        return {"min_replicas": self.min_replicas, "min_replicas_bound_s": self.bound_s}


def floor_thresholds(environ: Mapping[str, str] | None = None) -> dict[str, float]:
    """`ReplicaFloorEnv.thresholds` of the environment (empty: no bound given)."""
    return ReplicaFloorEnv.from_env(environ).thresholds()


__all__ = ["EmitterEnv", "ReplicaEnv", "ReplicaFloorEnv", "floor_thresholds"]
