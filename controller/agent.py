"""Assembling a controller: command keys, publisher, supervisors and loop, in that order.

`runwatch launch` (a new gang) and `runwatch controller` (adopting gangs after a launcher
died) both build their controller here, so neither command imports the other. Every
object is complete when it is constructed: the `EventPublisher` (and, for multi-node
gangs, the `PeerWatch`) is made first, the supervisors are given its ``publish``, the
peers and their launchers, and the `Controller` is given them all.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from runwatch.common.errors import UsageError
from runwatch.controller.launcher import Launcher, LocalLauncher
from runwatch.controller.logwatch import LogWatch
from runwatch.controller.loop import Controller, EventPublisher, PeerWatch, announce_end
from runwatch.controller.peer_auth import check_ready, sign_ready
from runwatch.controller.relay import RelayServer
from runwatch.controller.state import ControllerState, GangRecord, LaunchSpec
from runwatch.controller.supervisor import AnnounceEnd, Publish, RunSupervisor
from runwatch.schemas.events import AgentReady, Event
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

    Each run gets the launcher its spec asks for (`controller.launcher.LocalLauncher`,
    with warm spares or without), watching the ranks its record holds; a record without
    ranks (a gang about to be launched) has nothing to watch yet: the caller starts it
    with `RunSupervisor.launch`.

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
        controller.state.StateFormatError: A gang record this version cannot read.
    """
    files = []
    for state in states:
        gang = state.load_gang()
        if gang is None:
            raise ValueError(f"{state.root} holds no gang record")
        files.append(gang)
    watches = {
        gang.spec.run_id: watch
        for gang in files
        if (watch := LogWatch.for_run(gang.spec, gang.record)) is not None
    }
    relays = {
        gang.spec.run_id: RelayServer(
            Path(gang.spec.run.relay_socket), bootstrap, prefix, run_ids=[gang.spec.run_id]
        )
        for gang in files
        if gang.spec.run.relay_socket
    }
    publisher = EventPublisher(bootstrap, prefix, watches)
    several = [g.spec.run_id for g in files if g.record.topology.nnodes > 1]
    try:
        peers = (
            PeerWatch(
                bootstrap, prefix, several, check_ready=lambda ready: check_ready(ready, keys)
            )
            if several
            else None
        )
    except BaseException:
        publisher.close()
        raise
    runs = [
        RunSupervisor(
            state=state,
            spec=gang.spec,
            record=gang.record,
            launcher=launcher_for(state, gang.spec, gang.record),
            publish=signing_ready(
                keys, after_relay(relays.get(gang.spec.run_id), publisher.publish)
            ),
            announce_end=end_announcer(gang.spec, relays.get(gang.spec.run_id)),
            peers=peers,
        )
        for state, gang in zip(states, files, strict=True)
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


def launcher_for(state: ControllerState, spec: LaunchSpec, record: GangRecord) -> Launcher:
    """The launcher ``spec`` asks for: torchft replica groups, else one local gang."""
    if spec.fault_tolerance is not None:
        from runwatch.controller.torchft_launcher import TorchFTLauncher

        return TorchFTLauncher.for_run(state, spec, record)
    return LocalLauncher.for_run(state, spec, record)


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


def signing_ready(keys: Mapping[str, CommandKey], publish: Publish) -> Publish:
    """``publish``, with this agent's AgentReady signed (`controller.peer_auth`).

    Signed with the first of ``keys``; with none it goes out unsigned, and the other
    agents refuse it (an agent without a key executes no command anyway).
    """
    key = next(iter(keys.values()), None)
    if key is None:
        return publish

    def publish_signed(event: Event) -> None:
        publish(sign_ready(event, key) if isinstance(event, AgentReady) else event)

    return publish_signed


def end_announcer(spec: LaunchSpec, relay: RelayServer | None) -> AnnounceEnd:
    """RunEnded for an incarnation of ``spec``'s run, after a flush of its relayed records."""

    def announce(record: GangRecord, status: str, reason: str) -> None:
        if relay is not None and not relay.flush_run(spec.run_id):
            log.warning("run %s: the relay did not flush in time", spec.run_id)
        announce_end(spec, record, status, reason)

    return announce


__all__ = [
    "after_relay",
    "build_controller",
    "end_announcer",
    "launcher_for",
    "load_keys",
    "signing_ready",
]
