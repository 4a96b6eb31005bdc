"""What the node agent (``runwatch launch``) reads from its environment; flags override it.

The command key is `common.settings.CommandKeySettings` (the processors sign with it too),
the Kafka login `common.settings.KafkaAuth`; the ranks' contract is
`common.launch_env.LaunchEnv`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from runwatch.common.launch_env import ENV_LAUNCH_ID


@dataclass(frozen=True, kw_only=True)
class AgentEnv:
    """The agent's own variables.

    Attributes:
        launch_id: The launch this agent's gang belongs to when ``--launch-id`` is not
            given (``RUNWATCH_LAUNCH_ID``): every node of a multi-node launch needs the
            same one; None: not set.
    """

    launch_id: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AgentEnv:
        """Read the variables (`os.environ` when None); empty ones count as unset."""
        env = os.environ if environ is None else environ
        return cls(launch_id=env.get(ENV_LAUNCH_ID) or None)
