"""Restart policy: the reducer from a run's anomalies to restart commands.

It reads the anomalies topic alone, so a command is a pure function of the anomaly log.
What each kind calls for is its `schemas.kinds.KindSpec`:

* ``dead_rank`` and ``hang``: respawn the gang from the latest committed checkpoint
  (``max_checkpoint_step=None``);
* ``nonfinite_loss``, ``nonfinite_grad_norm``, ``loss_divergence`` and ``loss_collapse`` at
  step k: roll back to the latest committed checkpoint at or before k-1 (the checkpoint of
  step k may already hold the poisoned weights);
* ``restart_discontinuity``: no command (restarting again would loop); the run's
  continuity is marked broken and the anomaly itself is the alert;
* ``replica_lost`` (a backend with per-step fault tolerance, torchft): ``respawn_group``
  for the verdict's replica group alone; the gang's incarnation goes on, so such commands
  do not count as the incarnation's one command (a later dead rank may still restart the
  gang), but they do count against the budget. A ``replica_lost`` naming no group gives
  none, nor one of an incarnation that already has a gang command, until a group has
  rejoined in it (the controller carried that command out as a group restart: a later
  loss is a new failure);
* ``replicas_below_min`` (the steps' quorums stayed below the run's ``--min-replicas``
  for longer than its bound): a gang ``respawn``, even in an incarnation that already has
  a gang command (a torchft controller carried that one out as a group restart, and the
  groups did not come back in time); once per incarnation (see `_escalation`);
* spikes, stragglers and ``replica_rejoined``: alert only.

At most one command per (run, incarnation): a restart ends the incarnation, so every
dead_rank of a killed gang, or a hang plus a dead_rank, gives one command; an anomaly of an
incarnation older than one already seen concerns a gang that no longer exists and is
ignored. A budget caps commands per run to ``restart_budget`` per
``restart_budget_window_steps`` steps; past it, anomalies stay alerts.

Incarnations count within one launch (``AnomalyDetected.launch_id``, from the run's
RunStarted): an anomaly of another launch than the last one seen starts the count over, so
a new launch of a recurring run id (incarnation 0 again) gets its commands. An anomaly with
no launch id (its processor had not read the RunStarted yet) counts in the last launch seen.
Each command carries its anomaly's launch id, signed, and a controller executes it only in
that launch.

Shadow mode: an anomaly flagged ``shadow`` (or of a kind `config.is_shadow` names) gives
the command it would cause, flagged ``shadow``, which no controller executes. A shadow
command neither ends the incarnation nor spends the budget (the gang goes on), so an
enforced kind after it still commands; at most one shadow command per incarnation.
"""

from __future__ import annotations

import msgspec

from runwatch.processors.core.bounds import check_incarnation, check_step
from runwatch.processors.core.config import DetectorConfig, is_shadow
from runwatch.processors.core.verdicts import command_id
from runwatch.schemas.events import (
    AnomalyDetected,
    AnomalyKind,
    Provenance,
    RestartAction,
    RestartRequested,
)
from runwatch.schemas.kinds import KINDS


class PolicyState(msgspec.Struct, frozen=True, gc=False):
    """The policy's memory of one run.

    Attributes:
        run_id: The run.
        last_offset: Offset of the last applied anomaly (-1: none).
        newest_incarnation: Newest incarnation any anomaly carried (-1: none).
        commanded_incarnation: Newest incarnation a command was issued for (-1: none).
        command_steps: Steps of the anomalies that caused commands (for the budget).
        commands: Commands issued.
        over_budget: Anomalies that would have caused a command but for the budget.
        stale: Anomalies ignored because their incarnation had ended.
        continuity_broken: True once a restart_discontinuity was seen.
        last_command_id: Id of the latest command ("" if none).
        launch_id: Launch of the last anomaly applied ("" if none, or before launch ids).
        rejoined_incarnation: Newest incarnation in which a replica group rejoined after
            its gang command (-1: none): the command's failure was healed by a group
            restart, so a later ``replica_lost`` of that incarnation is a new failure.
        shadow_commands: Shadow commands recorded (what shadow mode would have done).
        shadow_incarnation: Newest incarnation a shadow command was recorded for (-1: none).
        escalated_incarnation: Newest incarnation a ``replicas_below_min`` gang command
            was issued for (-1: none).
        last_ts_ns: Log time of the newest anomaly applied (retention,
            `processors.core.retention`: the policy never sees a RunEnded).
    """

    run_id: str
    last_offset: int = -1
    newest_incarnation: int = -1
    commanded_incarnation: int = -1
    command_steps: tuple[int, ...] = ()
    commands: int = 0
    over_budget: int = 0
    stale: int = 0
    continuity_broken: bool = False
    last_command_id: str = ""
    launch_id: str = ""
    rejoined_incarnation: int = -1
    shadow_commands: int = 0
    shadow_incarnation: int = -1
    escalated_incarnation: int = -1
    last_ts_ns: int = 0


def action_for(kind: AnomalyKind) -> RestartAction | None:
    """The restart action an anomaly kind calls for (`KindSpec.action`), None: alert only."""
    return KINDS[kind].action


def _within_budget(state: PolicyState, step: int, cfg: DetectorConfig) -> bool:
    window = cfg.restart_budget_window_steps
    recent = sum(1 for s in state.command_steps if s > step - window)
    return recent < cfg.restart_budget


def _command(
    anomaly: AnomalyDetected, source: Provenance, action: RestartAction, shadow: bool
) -> RestartRequested:
    """The command ``anomaly`` causes (unsigned)."""
    return RestartRequested(
        run_id=anomaly.run_id,
        ts_ns=anomaly.ts_ns,
        seq=source.offset,
        command_id=command_id(anomaly.run_id, anomaly.incarnation, action, anomaly.verdict_id),
        action=action,
        cause_verdict_id=anomaly.verdict_id,
        cause_kind=anomaly.kind,
        incarnation=anomaly.incarnation,
        max_checkpoint_step=anomaly.step - 1 if action == "rollback" else None,
        source=source,
        launch_id=anomaly.launch_id,
        shadow=shadow,
    )


def _shadow_command(
    state: PolicyState, anomaly: AnomalyDetected, source: Provenance, action: RestartAction
) -> tuple[PolicyState, list[RestartRequested]]:
    """Record what a shadow anomaly would cause: once per incarnation, never executed."""
    if anomaly.incarnation <= state.shadow_incarnation:
        return state, []
    return msgspec.structs.replace(
        state,
        shadow_commands=state.shadow_commands + 1,
        shadow_incarnation=anomaly.incarnation,
    ), [_command(anomaly, source, action, shadow=True)]


def fold_policy(
    state: PolicyState | None,
    anomaly: AnomalyDetected,
    source: Provenance,
    cfg: DetectorConfig,
) -> tuple[PolicyState, list[RestartRequested]]:
    """Apply one anomaly of a run's anomalies topic.

    Args:
        state: The run's policy state, None for a run not seen yet.
        anomaly: The verdict.
        source: Its position in the anomalies topic (skipped if at or below the last one).
        cfg: The processor's configuration (budget).

    Returns:
        The new state and at most one unsigned command (``signature=""``).

    Raises:
        BoundError: A step or incarnation past a bound of `processors.core.bounds`.
    """
    if state is None:
        state = PolicyState(run_id=anomaly.run_id)
    elif source.offset <= state.last_offset:
        return state, []
    if not anomaly.launch_id and state.launch_id:
        # A verdict made before its processor read the run's RunStarted carries no launch:
        # it belongs to the launch last seen and never starts the count over (toggling
        # between "" and the launch reset the incarnation's one command: two restarts).
        anomaly = msgspec.structs.replace(anomaly, launch_id=state.launch_id)
    if anomaly.launch_id != state.launch_id:  # a new launch counts its incarnations anew
        state = msgspec.structs.replace(
            state, launch_id=anomaly.launch_id, newest_incarnation=-1, commanded_incarnation=-1
        )
    # A verdict no detector can make is refused before it moves anything (bounds.py):
    # a step outside [0, 2**53) would make a command outside the schema, an incarnation
    # far ahead would make every later real verdict stale (issue 19, finding 7).
    check_step(anomaly.step, -1, "verdict step")
    check_incarnation(anomaly.incarnation, state.newest_incarnation, "verdict incarnation")
    incarnation = anomaly.incarnation
    newest = max(state.newest_incarnation, incarnation)
    state = msgspec.structs.replace(
        state,
        last_offset=source.offset,
        newest_incarnation=newest,
        last_ts_ns=max(state.last_ts_ns, anomaly.ts_ns),
    )
    spec = KINDS[anomaly.kind]
    if spec.breaks_continuity:
        return msgspec.structs.replace(state, continuity_broken=True), []
    action = spec.action
    if anomaly.kind == "replica_rejoined" and incarnation == state.commanded_incarnation:
        return msgspec.structs.replace(state, rejoined_incarnation=incarnation), []
    if action is None:
        return state, []
    if action == "respawn_group":
        return _group_command(state, anomaly, source, cfg)
    if anomaly.kind == "replicas_below_min":
        return _escalation(state, anomaly, source, cfg)
    if incarnation < newest:
        return msgspec.structs.replace(state, stale=state.stale + 1), []
    if incarnation <= state.commanded_incarnation:
        return state, []
    if anomaly.shadow or is_shadow(cfg, anomaly.kind):
        return _shadow_command(state, anomaly, source, action)
    if not _within_budget(state, anomaly.step, cfg):
        return msgspec.structs.replace(state, over_budget=state.over_budget + 1), []
    command = _command(anomaly, source, action, shadow=False)
    cid = command.command_id
    keep = max(cfg.restart_budget, 1)
    return msgspec.structs.replace(
        state,
        commanded_incarnation=incarnation,
        command_steps=(*state.command_steps, anomaly.step)[-keep:],
        commands=state.commands + 1,
        last_command_id=cid,
    ), [command]


def _escalation(
    state: PolicyState, anomaly: AnomalyDetected, source: Provenance, cfg: DetectorConfig
) -> tuple[PolicyState, list[RestartRequested]]:
    """A gang ``respawn`` for a run that stayed below its floor, by numbered rules.

    1. Its incarnation is older than one already seen: stale, no command.
    2. The incarnation was already escalated: no command (one gang restart covers it).
    3. Shadow: the command it would cause, flagged (`_shadow_command`).
    4. Over the restart budget: no command, counted.
    5. Otherwise the gang command, whether or not the incarnation had one before (a group
       restart carried that one out and the run did not come back above its floor).
    """
    incarnation = anomaly.incarnation
    if incarnation < state.newest_incarnation:  # rule 1
        return msgspec.structs.replace(state, stale=state.stale + 1), []
    if incarnation <= state.escalated_incarnation:  # rule 2
        return state, []
    if anomaly.shadow or is_shadow(cfg, anomaly.kind):  # rule 3
        return _shadow_command(state, anomaly, source, "respawn")
    if not _within_budget(state, anomaly.step, cfg):  # rule 4
        return msgspec.structs.replace(state, over_budget=state.over_budget + 1), []
    command = _command(anomaly, source, "respawn", shadow=False)  # rule 5
    keep = max(cfg.restart_budget, 1)
    return msgspec.structs.replace(
        state,
        commanded_incarnation=incarnation,
        escalated_incarnation=incarnation,
        command_steps=(*state.command_steps, anomaly.step)[-keep:],
        commands=state.commands + 1,
        last_command_id=command.command_id,
    ), [command]


def _group_command(
    state: PolicyState, anomaly: AnomalyDetected, source: Provenance, cfg: DetectorConfig
) -> tuple[PolicyState, list[RestartRequested]]:
    """``respawn_group`` for a lost replica group, by numbered rules.

    1. The verdict names no replica group: no command (nothing to restart alone).
    2. Its incarnation is older than one already seen: stale, no command.
    3. The incarnation already has a gang command and no group rejoined since: no command
       (that restart covers it; a torchft controller may have carried it out as this
       group's restart, and the group is healing).
    4. Over the restart budget: no command, counted.
    5. Otherwise one command naming the group; the incarnation stays open for a gang command.
    """
    group = anomaly.replica_group
    if group is None:  # rule 1
        return state, []
    if anomaly.incarnation < state.newest_incarnation:  # rule 2
        return msgspec.structs.replace(state, stale=state.stale + 1), []
    if (
        anomaly.incarnation <= state.commanded_incarnation
        and state.rejoined_incarnation < anomaly.incarnation
    ):  # rule 3
        return state, []
    if not _within_budget(state, anomaly.step, cfg):  # rule 4
        return msgspec.structs.replace(state, over_budget=state.over_budget + 1), []
    cid = command_id(anomaly.run_id, anomaly.incarnation, "respawn_group", anomaly.verdict_id)
    command = RestartRequested(  # rule 5
        run_id=anomaly.run_id,
        ts_ns=anomaly.ts_ns,
        seq=source.offset,
        command_id=cid,
        action="respawn_group",
        cause_verdict_id=anomaly.verdict_id,
        cause_kind=anomaly.kind,
        incarnation=anomaly.incarnation,
        source=source,
        launch_id=anomaly.launch_id,
        replica_group=group,
    )
    keep = max(cfg.restart_budget, 1)
    return msgspec.structs.replace(
        state,
        command_steps=(*state.command_steps, anomaly.step)[-keep:],
        commands=state.commands + 1,
        last_command_id=cid,
    ), [command]


__all__ = ["PolicyState", "action_for", "fold_policy"]
