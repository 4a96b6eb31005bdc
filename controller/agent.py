"""Assembling a controller: command keys, publisher, supervisors and loop, in that order.

`runwatch launch` (a new gang) and `runwatch controller` (adopting gangs after a launcher
died) both build their controller here, so neither command imports the other. Every
object is complete when it is constructed: the `EventPublisher` (and, for multi-node
gangs, the `PeerWatch`) is made first, the supervisors are given its ``publish`` (and the
peers), and the `Controller` is given them all.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from runwatch.common.errors import UsageError
from runwatch.controller.gang import Gang
from runwatch.controller.logwatch import LogWatch
from runwatch.controller.loop import Controller, EventPublisher, PeerWatch, announce_end
from runwatch.controller.relay import RelayServer
from runwatch.controller.state import ControllerState, GangRecord
from runwatch.controller.supervisor import AnnounceEnd, Publish, RunSupervisor
from runwatch.schemas.events import Event
from runwatch.schemas.signing import CommandKey, load_key

log = logging.getLogger("runwatch")


def load_keys() -> dict[str, CommandKey]:
    """The configured command keys by id; empty (with a warning) when none is configured.

    Raises:
        UsageError: ``RUNWATCH_COMMAND_KEY`` / ``RUNWATCH_COMMAND_KEY_FILE`` is malformed.
    """
    try:
        key = load_key()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if key is None:
        log.warning(
            "no RUNWATCH_COMMAND_KEY or RUNWATCH_COMMAND_KEY_FILE: every command is rejected"
        )
        return {}
    return {key.key_id: key}


def build_controller(
    states: Sequence[ControllerState],
    keys: dict[str, CommandKey],
    bootstrap: str,
    prefix: str,
) -> tuple[Controller, list[RunSupervisor]]:
    """A controller over the runs recorded in ``states``, their gangs adopted.

    A record without ranks (a gang about to be launched) adopts an empty gang: the
    caller starts it with `RunSupervisor.launch`.

    Args:
        states: State directories holding a running gang record.
        keys: Command keys by id.
        bootstrap: Kafka bootstrap address.
        prefix: Topic name prefix.

    Returns:
        The controller and its supervisors (in the order of ``states``).

    Raises:
        ValueError: A state directory holds no gang record, or a recorded log format is
            invalid.
    """
    records = []
    for state in states:
        record = state.load_gang()
        if record is None:
            raise ValueError(f"{state.root} holds no gang record")
        records.append(record)
    watches = {
        record.run_id: watch
        for record in records
        if (watch := LogWatch.for_record(record)) is not None
    }
    relays = {
        record.run_id: RelayServer(Path(record.relay_socket), bootstrap, prefix)
        for record in records
        if record.relay_socket
    }
    publisher = EventPublisher(bootstrap, prefix, watches)
    several = [r.run_id for r in records if r.topology.nnodes > 1]
    try:
        peers = PeerWatch(bootstrap, prefix, several) if several else None
    except BaseException:
        publisher.close()
        raise
    runs = [
        RunSupervisor(
            state=state,
            record=record,
            gang=Gang.adopt(
                record.ranks, [state.exit_path(record.incarnation, p.rank) for p in record.ranks]
            ),
            publish=after_relay(relays.get(record.run_id), publisher.publish),
            announce_end=after_relay_end(relays.get(record.run_id), announce_end),
            peers=peers,
        )
        for state, record in zip(states, records, strict=True)
    ]
    try:
        controller = Controller(
            runs, keys, bootstrap, publisher, watches, peers, relays=list(relays.values())
        )
        return controller, runs
    except BaseException:
        publisher.close()
        if peers is not None:
            peers.close()
        for relay in relays.values():
            relay.close()
        raise


def after_relay(relay: RelayServer | None, publish: Publish) -> Publish:
    """``publish``, preceded by a flush of the run's relayed records when there is a relay.

    The controller's own events (exit evidence, restart reports) then never overtake what
    the run's ranks handed the relay before (their last heartbeats).
    """
    if relay is None:
        return publish

    def publish_after(event: Event) -> None:
        if not relay.flush_run(event.run_id):
            log.warning("run %s: the relay did not flush in time", event.run_id)
        publish(event)

    return publish_after


def after_relay_end(relay: RelayServer | None, announce: AnnounceEnd) -> AnnounceEnd:
    """``announce`` (RunEnded), preceded by a flush of the run's relayed records."""
    if relay is None:
        return announce

    def announce_after(record: GangRecord, status: str, reason: str) -> None:
        if not relay.flush_run(record.run_id):
            log.warning("run %s: the relay did not flush in time", record.run_id)
        announce(record, status, reason)

    return announce_after


__all__ = ["after_relay", "after_relay_end", "build_controller", "load_keys"]
