"""The event vocabulary of runwatch: one tagged union of frozen, keyword-only structs.

Every event is a `msgspec.Struct` with an explicit, versioned tag in the field ``type``
(``"step.v1"``), never a class name, so a class can be renamed without breaking the log.
Every event carries ``run_id``, ``ts_ns`` (nanoseconds since the epoch on the producer's
clock) and ``seq`` (monotonic per producer). Fields with a default are omitted on the wire
when they hold it, which keeps events small and lets old decoders read new events.

Evolution rules (tested in ``tests/unit/test_schema_evolution.py``):

* Adding a field with a default is compatible: old decoders ignore unknown fields, new
  decoders fill in the default for old events.
* Removing a field, changing its type or meaning, or adding a field without a default is
  a new version: a new struct with tag ``"<name>.v2"`` beside the old one.
* An unknown tag is reported as `schemas.codec.UnknownEventType`, never a crash.

Bounds: every field accepts only what is meaningful (steps and counts are non-negative,
every integer fits an int64, ranks and world sizes stay below `MAX_RANKS`, strings,
maps and sequences have a maximum length), so a hostile or broken record fails to decode
with a reason and becomes a dead letter instead of reaching a reducer (or a state that
cannot be stored). `schemas.codec` also bounds a record's size and nesting before
decoding it. Tightening a bound is a compatible change for every producer that stayed
within it.

Packed records: an `EventPack` (``pack.v1``) carries up to `MAX_PACK_EVENTS` heartbeats
or steps of one run in one record; the processors apply its events one by one, each
with the record's `Provenance` plus its ``index`` in the pack. Unpacked events stay the
default wire format, and a decoder that predates packs reports ``pack.v1`` as an unknown
type (a dead letter), never a crash.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec
from msgspec import Meta

# --------------------------------------------------------------------------- bounds

INT64_MAX: Final = 2**63 - 1
"""The largest integer any field (and any reducer state) holds."""
MAX_RANKS: Final = 2**17
"""More ranks than any gang has (a 16,384-rank run is the target); bounds ranks and sizes."""
MAX_COUNT: Final = 2**53
"""Tokens, examples, parameters: counts that must stay exact as floats."""
MAX_ID_CHARS: Final = 256
"""Run ids, host names, verdict and command ids, hashes, tag keys."""
MAX_TEXT_CHARS: Final = 4096
"""Paths, reasons, details, tag values."""
MAX_ROOT_CAUSE_CHARS: Final = 512
"""A rank's root cause (its exception's type and message, one line) in exit evidence."""
MAX_MAP_ENTRIES: Final = 256
"""Tags and thresholds per run."""
MAX_RECORD_BYTES: Final = 8 * 1024 * 1024
"""The largest record the codec decodes (Kafka's default limit is 1 MiB)."""
MAX_NESTING: Final = 32
"""The deepest JSON nesting the codec decodes (an event needs 4)."""
MAX_REPLICA_GROUPS: Final = 4096
"""Most replica groups a step's quorum lists (16,384 GPUs in groups of 8 is 2,048)."""
MAX_PACK_EVENTS: Final = 4096
"""Most events one `EventPack` carries (a node's 8 ranks for 512 steps, or 4,096 ranks'
heartbeats of one step); at ~120 bytes a heartbeat, such a pack stays under Kafka's 1 MiB."""
MAX_LISTED_RANKS: Final = 1024
"""Most ranks one verdict lists (`AnomalyDetected.ranks`; ``rank_count`` says how many in all):
a 131,072-rank gang gone silent is one verdict of a few kilobytes, not one of a megabyte."""
MAX_DEADLETTER_PAYLOAD_BYTES: Final = 512 * 1024
"""A dead letter keeps at most this much of the record (the record itself stays in its
topic, at the offset the dead letter names); its base64 stays under Kafka's 1 MiB."""

Int64 = Annotated[int, Meta(ge=-INT64_MAX - 1, le=INT64_MAX)]
"""Any integer an int64 holds."""
Count = Annotated[int, Meta(ge=0, le=INT64_MAX)]
"""A non-negative int64: a step, a timestamp, an offset, a sequence number, a size."""
Step = Count
"""An optimizer step: 0 <= step < 2**63."""
Quantity = Annotated[int, Meta(ge=0, le=MAX_COUNT)]
"""Tokens, examples: non-negative and exact as a float."""
Rank = Annotated[int, Meta(ge=0, lt=MAX_RANKS)]
"""A global rank."""
Size = Annotated[int, Meta(ge=1, le=MAX_RANKS)]
"""A world size or a parallel dimension (at least 1)."""
Small = Annotated[int, Meta(ge=0, lt=2**31)]
"""An incarnation, a process id, a partition: a non-negative int32."""
Positive = Annotated[int, Meta(ge=1, lt=2**31)]
"""A model dimension, a vocabulary size, microbatches: a positive int32."""
Id = Annotated[str, Meta(max_length=MAX_ID_CHARS)]
Text = Annotated[str, Meta(max_length=MAX_TEXT_CHARS)]
Tags = Annotated[dict[Id, Text], Meta(max_length=MAX_MAP_ENTRIES)]
Thresholds = Annotated[dict[Id, float], Meta(max_length=MAX_MAP_ENTRIES)]

# --------------------------------------------------------------------------- value types


class ModelFlopConfig(msgspec.Struct, frozen=True, omit_defaults=True):
    """The shape a decoder-only transformer's FLOPs per token depend on.

    Attributes:
        n_params: Parameters that take part in matmuls; position embeddings excluded
            (they are a lookup, not a matmul).
        n_layer: Transformer blocks.
        n_head: Attention heads per block.
        d_model: Hidden width (``n_head * head_dim``).
        seq_len: Tokens per sequence (the context length T).
    """

    # Not kw_only: seed 000 builds it positionally, ModelFlopConfig(n_params, n_layer,
    # n_head, d_model, seq_len), so this field order is API (the wire format is by name).

    n_params: Annotated[int, Meta(ge=1, le=MAX_COUNT)]
    n_layer: Positive
    n_head: Positive
    d_model: Positive
    seq_len: Positive


class ParallelPlan(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """An explicit N-D process mesh and batch schedule (every rank has one coordinate).

    ``dp_replicate`` and ``dp_shard`` are kept apart so that HSDP is not confused with
    tensor or context parallelism. ``ep`` and ``etp`` are cut from the data and model
    domains and do not multiply the world size.
    """

    dp_replicate: Size = 1
    dp_shard: Size = 1
    tp: Size = 1
    pp: Size = 1
    cp: Size = 1
    ep: Size = 1
    etp: Size = 1
    microbatches: Positive = 1
    gradient_accumulation_steps: Positive = 1

    @property
    def world_size(self) -> int:
        """Number of physical ranks the plan needs."""
        return self.dp_replicate * self.dp_shard * self.tp * self.pp * self.cp

    @property
    def data_parallel_size(self) -> int:
        """Ranks that see different data (replicate x shard)."""
        return self.dp_replicate * self.dp_shard


class LoaderState(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Where one rank's data loader stands: enough to reproduce its next batch.

    ``global_sample`` counts samples consumed by the whole gang; a resume on another world
    size restarts every rank from it, so no sample is skipped or repeated.
    """

    seed: Int64
    epoch: Count
    rank: Rank
    world_size: Size
    batch_idx: Count = 0
    global_sample: Count = 0


class Provenance(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The log position of the event that caused a verdict.

    Attributes:
        topic: The topic of the record.
        partition: Its partition.
        offset: Its offset.
        index: The event's place in the record when the record is an `EventPack`
            (0-based); -1 (the default, omitted on the wire) when the record is the event.
            Reducers apply positions in ``(offset, index)`` order and skip those at or
            below the last they applied, so a pack redelivered after a crash applies
            nothing twice.
    """

    topic: Id
    partition: Annotated[int, Meta(ge=-1, lt=2**31)]
    offset: Annotated[int, Meta(ge=-1, le=INT64_MAX)]
    index: Annotated[int, Meta(ge=-1, lt=MAX_PACK_EVENTS)] = -1


# --------------------------------------------------------------------------- base


class Event(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="type"):
    """Fields every event carries.

    Attributes:
        run_id: The training run; also the Kafka key, so one run shares one partition.
        ts_ns: Nanoseconds since the epoch on the producer's clock.
        seq: Monotonic per producer; gaps reveal lost events.
        dropped: Events the producer dropped (buffer full) since its previous event.
    """

    run_id: Id
    ts_ns: Count
    seq: Count = 0
    dropped: Count = 0


# --------------------------------------------------------------------------- input events


class BackendDeclaration(msgspec.Struct, frozen=True, kw_only=True):
    """What a run's training backend declares it can do (``producers.backend``).

    Attributes:
        name: The backend's registered name, e.g. ``"torch-ddp"``.
        reshardable_checkpoint: A checkpoint saved by N ranks loads on M ranks.
        elastic_restart: The gang may restart from a checkpoint on another world size.
        per_step_fault_tolerance: Replica groups may drop out of a step and rejoin, healed
            from a live peer (torchft): the controller may restart one replica group alone
            (``respawn_group``) instead of the gang.
    """

    name: Id
    reshardable_checkpoint: bool = False
    elastic_restart: bool = False
    per_step_fault_tolerance: bool = False


class RunStarted(Event, frozen=True, kw_only=True, tag="run_started.v1"):
    """A run (or one incarnation of it after a restart) began.

    Attributes:
        world_size: Ranks in the gang.
        flop_config: Model shape for MFU; None when unknown (no MFU then).
        plan: The parallel plan.
        peak_flops_per_s: Hardware peak for ``dtype`` summed over the gang; None: no MFU.
        dtype: Training precision, e.g. ``"bf16"``; MFU is only meaningful against its peak.
        vocab_size: For the collapse check (loss near ln(vocab)); None disables it.
        tags: Free-form labels (model, cluster, owner).
        thresholds: Detector overrides for this run, e.g. ``{"loss_z_thresh": 8.0}``.
        incarnation: 0 for the first launch, +1 per restart of the gang.
        backend: What the training backend declares; None: it did not say (a controller
            then never shrinks the run).
        launch_id: The launch this incarnation belongs to (``RUNWATCH_LAUNCH_ID``, minted
            by ``runwatch launch``); verdicts carry it and commands are bound to it. Empty:
            not launched by a runwatch controller, or announced before launch ids existed.
    """

    world_size: Size
    flop_config: ModelFlopConfig | None = None
    plan: ParallelPlan = ParallelPlan()
    peak_flops_per_s: float | None = None
    dtype: Annotated[str, Meta(max_length=32)] = "fp32"
    vocab_size: Positive | None = None
    tags: Tags = {}
    thresholds: Thresholds = {}
    incarnation: Small = 0
    backend: BackendDeclaration | None = None
    launch_id: Id = ""


class StepCompleted(Event, frozen=True, kw_only=True, tag="step.v1"):
    """One committed optimizer update, with unambiguous accounting.

    Attributes:
        step: The optimizer step just completed (0-based or 1-based, but consistent).
        loss: Loss of the step, all-reduced over the data-parallel group. May be NaN/Inf.
        grad_norm: Global gradient norm before clipping; None when not measured.
        step_time_s: Wall time of the step on the emitting rank.
        tokens: Tokens processed by the whole gang in this step.
        examples: Examples (sequences) processed by the whole gang in this step.
        local_tokens: Tokens processed by the emitting rank.
        local_examples: Examples processed by the emitting rank.
        microbatches: Microbatches per step (pipeline schedule).
        accumulation_steps: Gradient-accumulation steps per optimizer step.
        data_parallel_size: Ranks whose gradients were averaged.
        lr: Learning rate used for the step.
        skipped: True when the optimizer skipped the update (e.g. AMP overflow).
        restart_from_step: Set on the first step after a resume: the checkpoint step resumed.
        rank: The emitting rank (usually 0).
        replica_group: The emitting rank's replica group (a per-step fault-tolerant run,
            torchft); None: the run has no replica groups.
        participants: The replica groups whose gradients this step averaged (from the
            step's quorum), ascending; empty: not said (no replica groups).
    """

    step: Step
    loss: float
    step_time_s: float
    grad_norm: float | None = None
    tokens: Quantity = 0
    examples: Quantity = 0
    local_tokens: Quantity = 0
    local_examples: Quantity = 0
    microbatches: Positive = 1
    accumulation_steps: Positive = 1
    data_parallel_size: Size = 1
    lr: float | None = None
    skipped: bool = False
    restart_from_step: Step | None = None
    rank: Rank = 0
    replica_group: Small | None = None
    participants: Annotated[tuple[Small, ...], Meta(max_length=MAX_REPLICA_GROUPS)] = ()


class Heartbeat(Event, frozen=True, kw_only=True, tag="heartbeat.v1"):
    """One rank finished its part of a step and is alive.

    Attributes:
        rank: Global rank.
        step: The step the rank just finished.
        step_time_s: The rank's own wall time for the step.
        host: Host name.
        pid: Process id of the rank.
    """

    rank: Rank
    step: Step
    step_time_s: float = 0.0
    host: Id = ""
    pid: Small = 0


class Tick(Event, frozen=True, kw_only=True, tag="tick.v1"):
    """Log time advancing, published by the clock into every heartbeat partition.

    A tick's ``run_id`` is ``"*"``: it applies to every run of the partition it is in.
    Hang detection reads time only from ticks and event timestamps, so replay sees the
    same time the live processor saw.

    Attributes:
        partition: The partition the tick was written to.
    """

    partition: Small


class CheckpointCommitted(Event, frozen=True, kw_only=True, tag="checkpoint_committed.v1"):
    """A checkpoint is complete on disk (its DCP metadata is written).

    Attributes:
        step: The step whose state it holds.
        path: Directory of the checkpoint.
        loader_states: Every rank's loader position at that step.
        size_bytes: Bytes written.
        write_s: Seconds the background write took.
        blocked_s: Seconds the training loop was blocked (the snapshot copy).
        rank: The rank that reports the commit (the coordinator).
    """

    step: Step
    path: Text
    loader_states: Annotated[tuple[LoaderState, ...], Meta(max_length=MAX_RANKS)] = ()
    size_bytes: Count = 0
    write_s: float = 0.0
    blocked_s: float = 0.0
    rank: Rank = 0


class CheckpointFailed(Event, frozen=True, kw_only=True, tag="checkpoint_failed.v1"):
    """A checkpoint write failed; the previous committed one stays the latest.

    Attributes:
        step: The step it was meant to hold.
        path: Where it was being written.
        reason: The error, one line.
        rank: The rank that saw the failure.
    """

    step: Step
    path: Text
    reason: Text
    rank: Rank = 0


class RunEnded(Event, frozen=True, kw_only=True, tag="run_ended.v1"):
    """A run (one incarnation) ended.

    Attributes:
        status: ``completed``, ``failed`` or ``stopped`` (by the controller).
        final_step: Last completed step; None if none completed.
        reason: Free text for failures.
    """

    status: Literal["completed", "failed", "stopped"]
    final_step: Step | None = None
    reason: Text = ""


class RankExited(Event, frozen=True, kw_only=True, tag="rank_exited.v1"):
    """A node agent (`runwatch launch`, `runwatch controller`) saw a local rank process end.

    Liveness evidence, on the heartbeats topic keyed by run id (one partition order with
    the run's heartbeats). ``ts_ns`` is the agent's clock when it reaped the rank.
    ``exit_code`` and ``signal`` are both None when the status is unknown (an adopted rank
    whose exit was not recorded); a signal-killed rank has ``signal`` set (the shell's
    ``128 + N`` is decoded to ``N``). Only ``exit_code == 0`` is a clean exit.

    Attributes:
        rank: Global rank.
        incarnation: The gang incarnation the rank belonged to.
        host: Host name of the agent (and the rank).
        pid: Process id of the rank (its wrapper's, which is its process group).
        exit_code: The exit code, None if killed by a signal or unknown.
        signal: The signal number that killed it, None if it exited or unknown.
        root_cause: The exception that ended the rank, ``Type: message`` on one line, at
            most `MAX_ROOT_CAUSE_CHARS` (what torch's ``@record`` wrote to the rank's
            ``TORCHELASTIC_ERROR_FILE``); empty when the rank wrote none (killed by a
            signal, no ``@record``, a clean exit, or evidence of an older agent).
        launch_id: The launch the agent runs (empty: none, or an older agent). The
            exit-evidence ``dead_rank`` carries it when the processors have not read the
            run's RunStarted yet (a rank killed in its first steps), so its command is
            bound to the launch and not refused as unbound.
        finished: The rank was killed by a signal after it had told its agent that its
            training finished (`producers.rank_done.mark_training_done`): its
            interpreter's teardown (a process group's threads freed at exit, "terminate
            called without an active exception"), not a fault of the run, and the
            processors take it as a clean exit. False from an older agent.
    """

    rank: Rank
    incarnation: Small = 0
    host: Id = ""
    pid: Small = 0
    exit_code: Annotated[int, Meta(ge=-(2**31), lt=2**31)] | None = None
    signal: Annotated[int, Meta(ge=1, le=128)] | None = None
    root_cause: Annotated[str, Meta(max_length=MAX_ROOT_CAUSE_CHARS)] = ""
    launch_id: Id = ""
    finished: bool = False


PackableEvent = Heartbeat | StepCompleted
"""The events an `EventPack` may carry: the two that come once per rank (or per run) per
step and make up nearly all of the volume. Everything else (run markers, checkpoints,
exits, ticks, verdicts) is rare, or must be seen on its own, and travels alone."""

PACKABLE_TYPES: tuple[type[Event], ...] = (Heartbeat, StepCompleted)
"""`PackableEvent` as a tuple of classes (for ``isinstance``)."""


class EventPack(Event, frozen=True, kw_only=True, tag="pack.v1"):
    """Many events of one run in one record: one Kafka record, one decode, many events.

    A node's ranks' heartbeats for an interval, or an emitter's events within its linger.

    A pack is an envelope, not an event of its own: the processors apply its events one
    by one, in order, each with the record's provenance plus its index in ``events``
    (`Provenance.index`), so verdicts, dead letters and idempotence name the exact event.
    Every event must belong to the pack's run (a pack with a stranger's event is rejected
    whole: it would sit in another run's partition); packs do not nest (a pack inside a
    pack is not a `PackableEvent`); a topic takes the packs of its own events only
    (`schemas.records`: heartbeats on the heartbeats topic, steps on the steps topic).

    Attributes:
        events: One to `MAX_PACK_EVENTS` events of ``run_id``, in the order they happened.
            ``ts_ns`` of the pack is the newest of theirs (the packer's choice; the
            reducers read each event's own).
    """

    events: Annotated[tuple[PackableEvent, ...], Meta(min_length=1, max_length=MAX_PACK_EVENTS)]

    def __post_init__(self) -> None:
        """Reject a pack holding an event of another run (a decode error on the wire).

        Raises:
            ValueError: An event's ``run_id`` is not the pack's.
        """
        run_id = self.run_id
        for index, event in enumerate(self.events):
            if event.run_id != run_id:
                raise ValueError(
                    f"event {index} of a pack of run {run_id!r} belongs to run {event.run_id!r}"
                )


# --------------------------------------------------------------------------- verdicts and commands

AnomalyKind = Literal[
    "loss_spike",
    "grad_norm_spike",
    "nonfinite_loss",
    "nonfinite_grad_norm",
    "loss_divergence",
    "loss_collapse",
    "restart_discontinuity",
    "dead_rank",
    "hang",
    "straggler",
    "replica_lost",
    "replica_rejoined",
    "replicas_below_min",
]
"""Every kind of anomaly a detector can raise."""

Severity = Literal["info", "warning", "critical"]
"""How much a verdict matters, least first: ``info`` is recorded and shown but pages nobody
(a lone grad-norm spike), ``warning`` pages (a loss spike), ``critical`` pages and usually
stops or restarts the run (a non-finite loss). The order of this Literal is the order the
alert sinks compare severities by."""

RestartAction = Literal["respawn", "rollback", "respawn_group"]
"""``respawn``: restart the gang from the latest committed checkpoint.
``rollback``: restart from the last committed checkpoint before the anomaly.
``respawn_group``: restart one replica group alone (the command's ``replica_group``); it
heals from a live peer, the other groups keep stepping (a backend that declares
``per_step_fault_tolerance``)."""


class AnomalyDetected(Event, frozen=True, kw_only=True, tag="anomaly.v1"):
    """A verdict: something is wrong with a run.

    ``ts_ns`` is the log time of the triggering event and ``seq`` its offset, so the same
    log yields byte-identical verdicts.

    Attributes:
        verdict_id: Deterministic id: hash of run, kind, step, rank and config hash.
        kind: What was detected.
        step: The step it concerns.
        rank: The rank it concerns, or None for run-wide verdicts.
        value: The observed value (loss, grad norm, steps silent, seconds silent, ratio).
        baseline: The median it was judged against, if any.
        scale: The robust spread (1.4826 * MAD) it was judged against, if any.
        z: Robust z-score, if any.
        threshold: The threshold that was crossed.
        detail: One human-readable line.
        source: Log position of the triggering event.
        config_hash: Hash of the detector configuration that produced it.
        incarnation: The gang incarnation (from the run's latest RunStarted) it concerns.
        severity: How much it matters (see `Severity`); verdicts recorded before severities
            existed read as ``warning`` (every verdict paged then).
        ranks: Every rank a run-wide scan found at fault, ascending, at most
            `MAX_LISTED_RANKS` of them (``rank`` is the first; one ``dead_rank`` verdict per
            scan names them all, not one verdict per rank); empty for a verdict about one
            rank or none (older verdicts too).
        rank_count: How many ranks the verdict concerns (``ranks`` may list fewer); 0
            when ``ranks`` is empty.
        launch_id: The launch of the run's latest RunStarted when it was raised (empty:
            none announced); the policy binds its command to it.
        replica_group: The replica group it concerns (``replica_lost``,
            ``replica_rejoined``); None: not a replica group's verdict.
        peak_step: For a spike episode's verdict (``step`` is its first step): the step of
            its peak (``value``); None for other verdicts.
        duration_steps: For a spike episode: steps from its first step to the one that
            decided it, both included; None for other verdicts.
        recovered: For a spike episode: True when the value came back by itself, False
            when it did not (or was not decided); None for other verdicts.
        decided_step: For a spike episode: the step that decided it; None for others.
        shadow: Recorded in shadow mode (the processors' ``--shadow`` kinds, or a run
            announced with ``thresholds={"shadow": 1}``): shown, counted, and the command
            it would cause is recorded, but no controller executes it.
    """

    verdict_id: Id
    kind: AnomalyKind
    step: Int64
    rank: Rank | None = None
    value: float | None = None
    baseline: float | None = None
    scale: float | None = None
    z: float | None = None
    threshold: float | None = None
    detail: Text = ""
    source: Provenance | None = None
    config_hash: Id = ""
    incarnation: Small = 0
    severity: Severity = "warning"
    ranks: Annotated[tuple[Rank, ...], Meta(max_length=MAX_LISTED_RANKS)] = ()
    rank_count: Annotated[int, Meta(ge=0, le=MAX_RANKS)] = 0
    launch_id: Id = ""
    replica_group: Small | None = None
    peak_step: Int64 | None = None
    duration_steps: Int64 | None = None
    recovered: bool | None = None
    decided_step: Int64 | None = None
    shadow: bool = False


class RestartRequested(Event, frozen=True, kw_only=True, tag="restart_requested.v1"):
    """A command from the policy to the controller: restart a run from a checkpoint.

    Attributes:
        command_id: Deterministic id (hash of run, incarnation, action and cause).
        action: ``respawn`` or ``rollback``.
        cause_verdict_id: The anomaly that caused it.
        cause_kind: Its kind.
        incarnation: The gang incarnation the command ends; a controller executes at most
            one restart per incarnation.
        max_checkpoint_step: Resume from the latest committed checkpoint at or before this
            step; None: the latest committed one. The controller resolves the checkpoint
            (it is the component that sees the disk), so the command stays a pure function
            of the anomaly log.
        world_size: Gang size to use; None keeps the current one.
        source: Log position of the triggering anomaly.
        signature: HMAC-SHA256 (hex) of the command's canonical bytes, set by the signer.
        key_id: Which key signed it.
        launch_id: The launch the command is for (the cause verdict's, from the run's
            RunStarted); signed. A controller executes it only in that launch
            (`controller.command_gate`); empty: not bound (commands before launch ids).
        replica_group: For ``respawn_group``: the replica group to restart (signed with the
            rest); None for the gang's actions.
        shadow: What a shadow verdict would have caused: recorded, never executed (the
            controller's command gate ignores it).
    """

    command_id: Id
    action: RestartAction
    cause_verdict_id: Id
    cause_kind: AnomalyKind
    incarnation: Small = 0
    max_checkpoint_step: Int64 | None = None
    world_size: Size | None = None
    source: Provenance | None = None
    signature: Id = ""
    key_id: Id = ""
    launch_id: Id = ""
    replica_group: Small | None = None
    shadow: bool = False


class RankStack(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Where one rank's Python stood when the controller stopped a hung or dead gang.

    Attributes:
        rank: The rank.
        host: Its host.
        where: The innermost frame of its main thread, ``function (file:line)``; empty when
            no stack came back (see ``note``).
        note: Why there is no stack (the rank had exited, it installed no stack handler,
            it did not answer in time), or empty.
    """

    rank: Rank
    host: Id = ""
    where: Text = ""
    note: Text = ""


class RestartCompleted(Event, frozen=True, kw_only=True, tag="restart_completed.v1"):
    """The controller respawned a gang.

    Attributes:
        command_id: The command it executed.
        checkpoint_step: Step of the checkpoint the gang resumed from (None: from scratch).
        checkpoint_path: Its directory.
        world_size: Gang size after the restart.
        duration_s: Seconds from receiving the command to the new gang running.
        stacks: For a restart caused by a hang or a dead rank: where each rank of the
            stopped gang was (its full stacks are in the controller's state directory,
            ``stacks_dir``); empty otherwise.
        stacks_dir: The directory holding those stacks on the controller's host.
    """

    command_id: Id
    checkpoint_step: Int64 | None = None
    checkpoint_path: Text = ""
    world_size: Annotated[int, Meta(ge=0, le=MAX_RANKS)] = 0
    duration_s: float = 0.0
    stacks: Annotated[tuple[RankStack, ...], Meta(max_length=MAX_RANKS)] = ()
    stacks_dir: Text = ""


class RestartFailed(Event, frozen=True, kw_only=True, tag="restart_failed.v1"):
    """The controller did not execute a command.

    Attributes:
        command_id: The command.
        reason: One line.
        covered: The command was redundant, not failed: a group restart in progress already
            answers what it asked (a dead rank's respawn that arrives while the group
            restarted for that rank heals, `controller.group_plan` rule 5). Nothing for a
            human to do; the sinks show it as info, not as a failed restart.
    """

    command_id: Id
    reason: Text
    covered: bool = False


class AgentReady(Event, frozen=True, kw_only=True, tag="agent_ready.v1"):
    """A multi-node gang's agent stopped its ranks for a restart and is ready for the next.

    Every agent of the gang publishes one per command it executes, then waits for the other
    nodes' (``controller.membership``): a node whose agent is gone never announces, and
    the survivors decide from who did whether to restart at full size, on fewer nodes, or
    to fail. A controller-side fact, not a verdict (``ts_ns`` is the agent's clock).

    Attributes:
        command_id: The command being executed.
        incarnation: The incarnation about to start.
        node_rank: The agent's node in the ending incarnation.
        nnodes: Nodes of the ending incarnation.
        host: The agent's host (the next node 0's host serves the rendezvous store).
        stacks: For a restart caused by a hang or a dead rank: where each of this node's
            ranks was before the stop (the next node 0's agent lists every node's in its
            RestartCompleted); empty otherwise, and in announcements written before it
            existed.
        signature: HMAC-SHA256 (hex) over the announcement, with a key derived from the
            command key every agent holds and no rank does (`controller.peer_auth`):
            the other agents accept the announcement, and the ``host`` that may become the
            next ``MASTER_ADDR``, only when it verifies. Empty: unsigned (refused).
        key_id: The command key's id.
    """

    command_id: Id
    incarnation: Small
    node_rank: Small
    nnodes: Size
    host: Id = ""
    stacks: Annotated[tuple[RankStack, ...], Meta(max_length=MAX_RANKS)] = ()
    signature: Id = ""
    key_id: Id = ""


class CommandRejected(Event, frozen=True, kw_only=True, tag="command_rejected.v1"):
    """The controller refused a command (unsigned, forged, replayed or not its run).

    Attributes:
        command_id: The command's id as it claimed.
        reason: One line.
        source: Where the command was read.
    """

    command_id: Id
    reason: Text
    source: Provenance | None = None


DeadLetterStage = Literal["decode", "fold", "encode"]
"""Where a record failed: decoding it, folding it, or encoding the state it produced."""


class DeadLetter(Event, frozen=True, kw_only=True, tag="deadletter.v1"):
    """A record a processor could not apply, kept with the reason so nothing is lost.

    Attributes:
        source: Where the record was read.
        reason: Why it was rejected (one line, starting with the stage for fold and encode).
        key: The record key, raw (cut to `MAX_TEXT_CHARS` bytes).
        payload: The record value, raw (base64 on the JSON wire); cut to
            `MAX_DEADLETTER_PAYLOAD_BYTES`, the record itself stays at ``source``.
        stage: ``decode`` (the bytes are not a valid event for their topic), ``fold`` (the
            reducer raised on it) or ``encode`` (the state it produced cannot be stored).
    """

    source: Provenance
    reason: Text
    key: Annotated[bytes, Meta(max_length=MAX_TEXT_CHARS)] | None = None
    payload: Annotated[bytes, Meta(max_length=MAX_DEADLETTER_PAYLOAD_BYTES)] = b""
    stage: DeadLetterStage = "decode"


InputEvent = (
    RunStarted
    | StepCompleted
    | Heartbeat
    | Tick
    | CheckpointCommitted
    | CheckpointFailed
    | RunEnded
    | RankExited
    | EventPack
)
"""Events the trainer side and the clock produce (a pack carries several of them)."""

OutputEvent = (
    AnomalyDetected
    | RestartRequested
    | RestartCompleted
    | RestartFailed
    | CommandRejected
    | AgentReady
    | DeadLetter
)
"""Events runwatch's own components produce."""

AnyEvent = InputEvent | OutputEvent
"""The whole union, as decoded from any runwatch topic."""

INPUT_TYPES: tuple[type[Event], ...] = (
    RunStarted,
    StepCompleted,
    Heartbeat,
    Tick,
    CheckpointCommitted,
    CheckpointFailed,
    RunEnded,
    RankExited,
    EventPack,
)
OUTPUT_TYPES: tuple[type[Event], ...] = (
    AnomalyDetected,
    RestartRequested,
    RestartCompleted,
    RestartFailed,
    CommandRejected,
    AgentReady,
    DeadLetter,
)
ALL_TYPES: tuple[type[Event], ...] = INPUT_TYPES + OUTPUT_TYPES

_NAMES: Final[dict[type[Event], str]] = {
    t: str(t.__struct_config__.tag).rpartition(".")[0] for t in ALL_TYPES
}


def event_name(event: Event | type[Event]) -> str:
    """An event's one name: its wire tag without the version (``step``, ``restart_completed``).

    Logs, alerts, the web view's feed and the archive all name events so; a class name is
    code, and a class can be renamed without breaking the log.
    """
    return _NAMES[event if isinstance(event, type) else type(event)]


TICK_RUN_ID = "*"
"""The ``run_id`` of a Tick: it applies to every run of its partition."""
