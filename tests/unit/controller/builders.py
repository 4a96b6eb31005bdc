"""Small builders of launch specs, gang records, commands and supervisors for the controller tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from runwatch.controller.launcher import LocalLauncher
from runwatch.controller.spares import NoSpares
from runwatch.controller.state import ControllerState, GangFile, GangRecord, LaunchSpec
from runwatch.controller.supervisor import Peers, RunSupervisor
from runwatch.controller.topology import NodeTopology, RunBinding
from runwatch.schemas.events import AnomalyDetected, Event, RestartRequested


def spec(
    *,
    run_id: str = "r",
    argv: tuple[str, ...] = ("x",),
    bootstrap: str = "b:1",
    prefix: str = "p",
    checkpoint_dir: str | None = None,
    topology: NodeTopology | None = None,
    nproc: int = 2,
    **kw: Any,
) -> LaunchSpec:
    """A launch spec: one host of ``nproc`` ranks unless a ``topology`` is given."""
    run = RunBinding(
        run_id=run_id, bootstrap=bootstrap, prefix=prefix, checkpoint_dir=checkpoint_dir
    )
    return LaunchSpec(
        run=run,
        argv=argv,
        topology=topology or NodeTopology(nproc_per_node=nproc),
        **kw,
    )


def record(launched: LaunchSpec, **changes: Any) -> GangRecord:
    """The record of ``launched``'s first incarnation, with ``changes``."""
    return msgspec.structs.replace(launched.first_record(), **changes)


def multinode(
    node_rank: int, *, nnodes: int = 2, nproc_per_node: int = 2, **kw: Any
) -> NodeTopology:
    """Node ``node_rank`` of a gang on ``10.0.0.1:30000``."""
    return NodeTopology(
        nnodes=nnodes,
        node_rank=node_rank,
        nproc_per_node=nproc_per_node,
        master_addr="10.0.0.1",
        master_port=30000,
        **kw,
    )


def command(**kw: Any) -> RestartRequested:
    """A respawn of incarnation 0 for a dead rank."""
    fields: dict[str, Any] = {
        "run_id": "r",
        "ts_ns": 1,
        "command_id": "c1",
        "action": "respawn",
        "cause_verdict_id": "v1",
        "cause_kind": "dead_rank",
    }
    return RestartRequested(**(fields | kw))


def verdict(rank: int | None, kind: str = "dead_rank", verdict_id: str = "v1") -> AnomalyDetected:
    """The verdict a command names."""
    return AnomalyDetected(
        run_id="r",
        ts_ns=1,
        verdict_id=verdict_id,
        kind=kind,  # type: ignore[arg-type]
        step=3,
        rank=rank,
    )


def supervisor(
    state: ControllerState,
    launched: LaunchSpec,
    rec: GangRecord | None = None,
    *,
    publish: Callable[[Event], None],
    announce_end: Callable[[GangRecord, str, str], None] = lambda *_: None,
    peers: Peers | None = None,
) -> RunSupervisor:
    """A supervisor of real local processes, its record saved in ``state`` (no Kafka)."""
    rec = rec or launched.first_record()
    state.save_gang(GangFile(spec=launched, record=rec))
    return RunSupervisor(
        state=state,
        spec=launched,
        record=rec,
        launcher=LocalLauncher(state, launched, NoSpares()),
        publish=publish,
        announce_end=announce_end,
        peers=peers,
    )
