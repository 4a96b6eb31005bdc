"""``gang.json`` version 1: the one flat record runwatch wrote before the split, read and converted.

Version 1 held what was asked and what happened in one 31-field struct, without a version
field. A controller adopting a gang launched by such a version reads it through
`GangRecordV1` and `GangRecordV1.upgrade` turns it into a version 2 `GangFile` (the
next save writes that). Nothing writes version 1 any more; this module only reads it.

What goes where:

* the launch spec: ``run_id``, ``bootstrap``, ``prefix``, ``checkpoint_dir`` and
  ``relay_socket`` (``""``: none) become the spec's `controller.topology.RunBinding`;
  ``argv``, ``env``, ``host``, ``launch_offsets``, ``grace_s``, ``command_timeout_s``,
  ``rank_failure_budget``, ``min_nproc``, ``node_timeout_s``, ``node_failure_budget``
  and ``exit_evidence`` keep their names; ``log_format``/``log_regex``/
  ``log_tokens_per_step`` become a `LogWatchSpec` (None without a format), and
  ``warm_spares``/``spare_preload`` a `WarmSparesSpec` (None when off); ``topology`` is the
  spec's topology too (version 1 kept only one: the current);
* the gang record: ``incarnation``, ``ranks``, ``master_port``, ``failure_counts``,
  ``node_failure_counts``, ``consumer_offsets``, ``backend`` and ``status`` keep their
  names; ``topology`` with, on one node, ``nproc_per_node`` set to ``world_size`` (version
  1 kept a one-node gang's shrunk size in ``world_size`` only).
"""

from __future__ import annotations

import msgspec

from runwatch.controller.state import (
    DEFAULT_SPARE_PRELOAD,
    GangFile,
    GangRecord,
    GangStatus,
    LaunchSpec,
    LogWatchSpec,
    RankProcess,
    WarmSparesSpec,
)
from runwatch.controller.topology import NodeTopology, RunBinding
from runwatch.schemas.events import BackendDeclaration


class GangRecordV1(msgspec.Struct, frozen=True, kw_only=True):
    """A version 1 ``gang.json``, field for field as version 1 wrote it (see the module doc)."""

    run_id: str
    argv: tuple[str, ...]
    world_size: int
    bootstrap: str
    prefix: str
    checkpoint_dir: str | None = None
    env: dict[str, str] = {}
    incarnation: int = 0
    ranks: tuple[RankProcess, ...] = ()
    master_port: int = 0
    launch_offsets: dict[int, int] = {}
    consumer_offsets: dict[int, int] = {}
    failure_counts: tuple[int, ...] = ()
    status: GangStatus = "running"
    grace_s: float = 10.0
    command_timeout_s: float = 120.0
    rank_failure_budget: int = 2
    min_nproc: int = 1
    log_format: str | None = None
    log_regex: str | None = None
    log_tokens_per_step: int = 0
    exit_evidence: bool = True
    topology: NodeTopology = NodeTopology()
    host: str = ""
    node_timeout_s: float = 60.0
    backend: BackendDeclaration | None = None
    relay_socket: str = ""
    warm_spares: bool = False
    spare_preload: tuple[str, ...] = DEFAULT_SPARE_PRELOAD
    node_failure_budget: int = 2
    node_failure_counts: tuple[int, ...] = ()

    def upgrade(self) -> GangFile:
        """The same gang as a version 2 file: what was asked, and what happened."""
        spec = LaunchSpec(
            run=RunBinding(
                run_id=self.run_id,
                bootstrap=self.bootstrap,
                prefix=self.prefix,
                checkpoint_dir=self.checkpoint_dir,
                relay_socket=self.relay_socket or None,
            ),
            argv=self.argv,
            env=self.env,
            topology=self.topology,
            host=self.host,
            launch_offsets=self.launch_offsets,
            grace_s=self.grace_s,
            command_timeout_s=self.command_timeout_s,
            rank_failure_budget=self.rank_failure_budget,
            min_nproc=self.min_nproc,
            node_timeout_s=self.node_timeout_s,
            node_failure_budget=self.node_failure_budget,
            exit_evidence=self.exit_evidence,
            log_watch=None
            if not self.log_format
            else LogWatchSpec(
                format=self.log_format,
                regex=self.log_regex,
                tokens_per_step=self.log_tokens_per_step,
            ),
            warm_spares=WarmSparesSpec(preload=self.spare_preload) if self.warm_spares else None,
        )
        topology = self.topology
        if topology.nnodes == 1 and topology.nproc_per_node != self.world_size:
            topology = msgspec.structs.replace(topology, nproc_per_node=self.world_size)
        record = GangRecord(
            incarnation=self.incarnation,
            topology=topology,
            ranks=self.ranks,
            master_port=self.master_port,
            failure_counts=self.failure_counts,
            node_failure_counts=self.node_failure_counts,
            consumer_offsets=self.consumer_offsets,
            backend=self.backend,
            status=self.status,
        )
        return GangFile(spec=spec, record=record)


__all__ = ["GangRecordV1"]
