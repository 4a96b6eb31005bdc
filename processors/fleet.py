"""What the processors know about every run, read back from their table changelogs.

The changelog topics hold every state the workers wrote; the latest record per run is
the current state. Reading them needs no connection to a worker and disturbs none.
"""

from __future__ import annotations

import msgspec

from runwatch.processors.core.liveness import LivenessState
from runwatch.processors.core.policy import PolicyState
from runwatch.processors.core.state_codec import decode_state
from runwatch.processors.core.steps import StepHealthState
from runwatch.processors.logread import read_history
from runwatch.processors.settings import changelog_topic
from runwatch.schemas.codec import DecodeError, decode
from runwatch.schemas.events import RankStack, RestartCompleted
from runwatch.schemas.topics import StateKind, table_of


def default_app_id(prefix: str) -> str:
    """The processors' app id for a topic prefix when none is given: ``<prefix>-processors``.

    For the default prefix this is `processors.settings.DEFAULT_APP_ID`
    (``runwatch-processors``); fleets on other prefixes get their own consumer group and
    changelog topics, and `runwatch status --prefix P` finds the fleet of prefix P.
    """
    return f"{prefix}-processors"


class RunView(msgspec.Struct, kw_only=True):
    """One run as the processors see it (absent parts are None)."""

    run_id: str
    steps: StepHealthState | None = None
    liveness: LivenessState | None = None
    policy: PolicyState | None = None


def latest_states(bootstrap: str, app_id: str, *, timeout_s: float = 30.0) -> dict[str, RunView]:
    """Every run's latest step-health, liveness and policy state.

    Args:
        bootstrap: Kafka bootstrap address.
        app_id: The processors' app id.
        timeout_s: Give up when reading stalls this long.

    Returns:
        Run id -> its view, sorted by run id.
    """
    kinds = (StateKind.STEPS, StateKind.LIVENESS, StateKind.POLICY)  # `RunView`'s
    topics = {changelog_topic(app_id, table_of(kind)): kind for kind in kinds}
    history = read_history(bootstrap, list(topics), timeout_s=timeout_s)
    views: dict[str, RunView] = {}
    for topic, records in history.items():
        kind = topics[topic]
        for record in records:
            if record.key is None:
                continue
            run_id = record.key.decode()
            if record.value is None:  # a tombstone: the state was evicted (retention)
                if run_id in views:
                    setattr(views[run_id], kind.value, None)
                continue
            view = views.setdefault(run_id, RunView(run_id=run_id))
            setattr(view, kind.value, decode_state(kind, record.value))
    kept = (
        v
        for v in views.values()
        if v.steps is not None or v.liveness is not None or v.policy is not None
    )
    return {view.run_id: view for view in sorted(kept, key=lambda v: v.run_id)}


class RunSummary(msgspec.Struct, frozen=True, kw_only=True):
    """The figures of one run an operator looks at first."""

    run_id: str
    incarnation: int
    last_step: int | None
    loss: float | None
    mfu: float | None
    mfu_avg: float | None
    tokens_per_s: float | None
    live_ranks: tuple[int, ...]
    dead_ranks: tuple[int, ...]
    stragglers: tuple[int, ...]
    status: str
    anomalies: dict[str, int]
    restarts: int
    continuity_ok: bool
    steps_observed: int
    heartbeats: int
    last_stacks: tuple[RankStack, ...] = ()
    """Where each rank was before the run's latest restart for a hang or dead rank."""
    replica_groups: int = 0
    """Replica groups seen in the steps' quorums (a torchft run; 0: none)."""
    replicas_lost: tuple[int, ...] = ()
    """Replica groups out of the quorum now."""
    degraded_steps: int = 0
    """Steps committed with fewer groups than the run has had."""
    shadow_commands: int = 0
    """Commands recorded in shadow mode (what shadow verdicts would have caused)."""


def summarize(view: RunView) -> RunSummary:
    """Condense a run's states into a `RunSummary`."""
    s, lv, pol = view.steps, view.liveness, view.policy
    counts: dict[str, int] = {}
    for part in (s, lv):
        for kind, n in (part.anomaly_counts if part else {}).items():
            counts[kind] = counts.get(kind, 0) + n
    return RunSummary(
        run_id=view.run_id,
        incarnation=max(s.incarnation if s else 0, lv.incarnation if lv else 0),
        last_step=s.last_step if s and s.last_step >= 0 else None,
        loss=s.last_loss if s else None,
        mfu=s.last_mfu if s else None,
        mfu_avg=s.mfu_avg if s else None,
        tokens_per_s=s.last_tokens_per_s if s else None,
        live_ranks=lv.live_ranks if lv else (),
        dead_ranks=lv.dead_ranks if lv else (),
        stragglers=lv.straggler_ranks if lv else (),
        status=lv.status if lv else "unknown",
        anomalies=dict(sorted(counts.items())),
        restarts=pol.commands if pol else 0,
        continuity_ok=(s.continuity_ok if s else True) and not (pol and pol.continuity_broken),
        steps_observed=s.steps_observed if s else 0,
        heartbeats=lv.heartbeats if lv else 0,
        replica_groups=len(s.replicas.groups) if s else 0,
        replicas_lost=s.replicas.lost if s else (),
        degraded_steps=s.replicas.degraded_steps if s else 0,
        shadow_commands=pol.shadow_commands if pol else 0,
    )


def last_stacks(
    bootstrap: str, controller_topic: str, *, timeout_s: float = 30.0
) -> dict[str, RestartCompleted]:
    """Each run's latest restart that came with the ranks' stacks (a hang, a dead rank).

    Args:
        bootstrap: Kafka bootstrap address.
        controller_topic: The controller topic (`schemas.topics.TopicNames.controller`).
        timeout_s: Give up when reading stalls this long.

    Returns:
        Run id -> its latest `RestartCompleted` with ``stacks``.
    """
    out: dict[str, RestartCompleted] = {}
    for record in read_history(bootstrap, [controller_topic], timeout_s=timeout_s).get(
        controller_topic, []
    ):
        if record.value is None:  # a tombstone carries no event
            continue
        try:
            event = decode(record.value)
        except DecodeError:  # the topic is the controllers'; a bad record is not ours to judge
            continue
        if isinstance(event, RestartCompleted) and event.stacks:
            out[event.run_id] = event
    return out


def committed_offsets(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    """The group's committed offsets by (topic, partition); empty before its first commit."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    from runwatch.common.settings import kafka_client_config

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, **kafka_client_config())
    try:
        offsets = admin.list_group_offsets(group).get(group, {})
    except KafkaError:  # no coordinator yet: the group never joined
        return {}
    finally:
        admin.close()
    return {(tp.topic, tp.partition): meta.offset for tp, meta in offsets.items()}


def wait_until_processed(
    bootstrap: str, app_id: str, topics: list[str], *, timeout_s: float = 60.0
) -> None:
    """Block until the processors have committed every record now in ``topics``.

    Commits trail processing by up to a second, so this is how a caller that read the
    log itself (the demo's audit) knows the verdicts of everything it read are published.

    Raises:
        TimeoutError: The processors did not catch up in time.
    """
    import time

    from kafka import KafkaConsumer, TopicPartition

    from runwatch.common.settings import kafka_client_config

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,  # no group: nothing to commit (and no warning saying so)
        **kafka_client_config(),
    )
    try:
        parts = [
            TopicPartition(t, p) for t in topics for p in consumer.partitions_for_topic(t) or ()
        ]
        target = {(tp.topic, tp.partition): n for tp, n in consumer.end_offsets(parts).items() if n}
    finally:
        consumer.close()
    deadline = time.monotonic() + timeout_s
    while True:
        done = committed_offsets(bootstrap, app_id)
        if all(done.get(tp, 0) >= n for tp, n in target.items()):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"processors of {app_id} did not catch up with {topics}")
        time.sleep(0.2)  # commits land on the broker's schedule; poll them
