"""What ``runwatch sinks`` reads from its environment: where alerts go (flags override it)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

ENV_WEBHOOK: Final = "RUNWATCH_ALERT_WEBHOOK"
ENV_ALERTMANAGER: Final = "RUNWATCH_ALERTMANAGER"


def _urls(raw: str) -> tuple[str, ...]:
    return tuple(u.strip() for u in raw.split(",") if u.strip())


@dataclass(frozen=True, kw_only=True)
class SinkEnv:
    """Where the alert sinks deliver when no flag says.

    Attributes:
        alert_webhooks: URLs alerts are POSTed to when ``--alerts`` is given without
            ``--webhook`` (``RUNWATCH_ALERT_WEBHOOK``, comma-separated).
        alertmanagers: Alertmanager base URLs alerts are posted to without
            ``--alertmanager`` (``RUNWATCH_ALERTMANAGER``, comma-separated).
    """

    alert_webhooks: tuple[str, ...] = ()
    alertmanagers: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SinkEnv:
        """Read the variables (`os.environ` when None); blank entries are dropped."""
        env = os.environ if environ is None else environ
        return cls(
            alert_webhooks=_urls(env.get(ENV_WEBHOOK, "")),
            alertmanagers=_urls(env.get(ENV_ALERTMANAGER, "")),
        )
