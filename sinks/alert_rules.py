"""What an alert of each kind is as an Alertmanager alert: one table, keyed by kind.

Every anomaly kind and every restart event that raises an alert has one `AlertRule`: the
anchor of its section in ``docs/runbooks.md``, whether its alert is labelled with a rank,
and how the condition it stands for ends (`Ends`). `sinks.alert_conditions` reads nothing
else about a kind, so a kind's clearing rule is one entry here: when a loss-spike verdict
carries its episode's end (issue 20), its entry changes and nothing else does.

How a condition ends (several flags: the first that applies ends it):

* ``RESTART``: the run left the condition's incarnation: a restart of the gang completed
  (`RestartCompleted` of a command for that incarnation or a later one), or another
  incarnation started (`RunStarted`), or the run was launched again after it ended, after
  the condition began;
* ``RUN_END``: the incarnation ended (`RunEnded`, any status: a restart's ``stopped`` too);
* ``QUIET``: ``hold_s`` of log time after its latest verdict (an episode: each verdict of
  the same key extends it);
* ``MOMENT``: ``hold_s`` after it happened (an event, not a state: it shows that long).

Whatever its rule, a condition also ends `STALE_S` after its latest verdict: nothing fires
forever (a run whose controller died before it restarted or ended it).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final, Literal, NamedTuple, get_args

from runwatch.schemas.events import AnomalyKind

EventAlertKind = Literal[
    "restart_requested", "restart_completed", "restart_failed", "command_rejected"
]
"""The alerts raised by restart commands and their outcomes (not anomaly verdicts)."""

STALE_S: Final = 86_400.0
"""Longest a condition fires after its latest verdict, whatever its rule (24 h)."""


class Ends(enum.Flag):
    """How a condition ends (see the module docstring)."""

    RESTART = enum.auto()
    RUN_END = enum.auto()
    QUIET = enum.auto()
    MOMENT = enum.auto()


class AlertRule(NamedTuple):
    """One kind's alert: its runbook section, identity and end.

    Attributes:
        runbook: Anchor of the kind's section in ``docs/runbooks.md``.
        ends: How the condition ends (`Ends` flags).
        hold_s: For ``QUIET`` and ``MOMENT``: seconds (of log time) it lasts.
        rank_label: The alert is labelled ``rank`` with the rank of its first verdict (the
            one that died or straggled first: the culprit); otherwise the rank is only in
            the description. The rank is never part of a condition's identity: a gang of
            16,384 ranks killed at once is one alert, not 16,384.
    """

    runbook: str
    ends: Ends
    hold_s: float = 0.0
    rank_label: bool = False


_UNTIL_RESTART = Ends.RESTART | Ends.RUN_END
_EPISODE = Ends.QUIET | Ends.RESTART | Ends.RUN_END

ALERT_RULES: Final[Mapping[str, AlertRule]] = {
    # A rank is gone: firing until the gang is back (or the incarnation ends).
    "dead_rank": AlertRule("dead-rank", _UNTIL_RESTART, rank_label=True),
    # No rank is stepping: until the gang is restarted.
    "hang": AlertRule("hang", _UNTIL_RESTART),
    # The state is poisoned: until the rollback restarted the gang.
    "nonfinite_loss": AlertRule("nonfinite-loss", _UNTIL_RESTART),
    "nonfinite_grad_norm": AlertRule("nonfinite-grad-norm", _UNTIL_RESTART),
    "loss_divergence": AlertRule("loss-divergence", _UNTIL_RESTART),
    # The resume lost state: until the next restart (a bad one raises its own verdict).
    "restart_discontinuity": AlertRule("restart-discontinuity", _UNTIL_RESTART),
    # Episodes: until no verdict of the kind came for hold_s (issue 20: the verdict's end).
    "loss_spike": AlertRule("loss-spike", _EPISODE, hold_s=600.0),
    "grad_norm_spike": AlertRule("grad-norm-spike", _EPISODE, hold_s=600.0),
    "loss_collapse": AlertRule("loss-collapse", _EPISODE, hold_s=1800.0),
    "straggler": AlertRule("straggler", _EPISODE, hold_s=600.0, rank_label=True),
    # A replica group out of the quorum: an episode (its replica_rejoined or a restart
    # ends it in practice; hold_s bounds a group that never comes back).
    "replica_lost": AlertRule("replica-lost", _EPISODE, hold_s=600.0),
    "replica_rejoined": AlertRule("replica-rejoined", Ends.MOMENT, hold_s=900.0),
    # Too few groups for too long: until the gang restart it causes.
    "replicas_below_min": AlertRule("replicas-below-min", _UNTIL_RESTART),
    # Restart events: shown a while.
    "restart_requested": AlertRule("restart-requested", Ends.MOMENT, hold_s=900.0),
    "restart_completed": AlertRule("restart-completed", Ends.MOMENT, hold_s=900.0),
    "command_rejected": AlertRule("command-rejected", Ends.MOMENT, hold_s=3600.0),
    # Until a later restart succeeds (or the run is launched again); the RunEnded the
    # agents announce after a failed restart does not end it: that is what a human must act on.
    "restart_failed": AlertRule("restart-failed", Ends.RESTART),
}
"""Every alert kind's rule (the anomaly kinds of `schemas.events.AnomalyKind` and the
`EventAlertKind` events); a unit test checks that none is missing."""

ALERT_KINDS: Final[tuple[str, ...]] = (*get_args(AnomalyKind), *get_args(EventAlertKind))
"""Every kind an alert can have, anomalies first."""


def rule_of(kind: str) -> AlertRule:
    """The rule of ``kind``.

    Raises:
        KeyError: A kind without a rule (a new anomaly kind needs its entry).
    """
    try:
        return ALERT_RULES[kind]
    except KeyError:
        raise KeyError(
            f"alert kind {kind!r} has no entry in sinks.alert_rules.ALERT_RULES"
        ) from None
