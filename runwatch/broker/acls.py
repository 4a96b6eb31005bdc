"""Who may do what on Kafka: runwatch's roles and their ACLs, in one place.

A deployment gives every component its own principal and the broker an authorizer, so a
credential can do only what its role needs. The roles (docs/security.md has the threat
model behind them):

* `Role.TRAINER` (every rank, any user code): writes the inputs (runs, steps, heartbeats,
  checkpoints); reads nothing.
* `Role.PROCESSORS`: the only writer of verdicts (anomalies), commands and dead letters,
  and of its own changelogs and assignor topic; reads the inputs and anomalies; its
  consumer group is its app id. It writes heartbeats too (the clock's Ticks) and may
  create the catalogue's topics (``runwatch processors`` creates those missing).
* `Role.CONTROLLER` (the node agent, ``runwatch launch`` / ``runwatch controller``): writes
  the controller topic and the trainer's inputs, because it speaks for the ranks it
  supervises: rank-exit evidence (RankExited) is a heartbeats record, RunEnded of an
  incarnation it ends goes where a rank's would, and its node relay and log watch send
  the ranks' events. Reads commands, runs, the controller topic and anomalies (the one
  verdict a restart command names). No consumer group.
* `Role.SINKS` (``runwatch sinks``, ``runwatch ui``, ``runwatch audit``/``status``):
  reads every catalogue topic and the processors' changelogs, writes nothing; its
  consumer groups are the sinks' (``<prefix>-sinks-*``), and it may read the processors'
  group offsets (the audit waits for the processors to catch up).

Nobody but the broker's own super user (the admin) alters ACLs or users. What each role
may do is `TOPIC_ACCESS` (by catalogue topic) plus `acls_of` (the app id's topics and the
consumer groups); the names come from the topic catalogue and `Scope`. The module is pure
data: `runwatch.admin` turns it into kafka-python ACLs, `kafka_acls_commands` into
``kafka-acls.sh`` lines.
"""

from __future__ import annotations

import enum
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from runwatch.schemas.topics import ROLES, Principal, TopicRole, names

Role = Principal
"""A component's role: one principal each in a deployment (`schemas.topics.Principal`)."""


class Resource(enum.StrEnum):
    """Kafka resource types runwatch grants on (kafka-python's ``ResourceType`` names)."""

    TOPIC = "TOPIC"
    GROUP = "GROUP"


class Pattern(enum.StrEnum):
    """How a grant's name matches (kafka-python's ``ACLResourcePatternType`` names)."""

    LITERAL = "LITERAL"
    PREFIXED = "PREFIXED"


class Operation(enum.StrEnum):
    """Operations runwatch grants (kafka-python's ``ACLOperation`` names).

    Read and Write each imply Describe on the same resource (Kafka's rule; Create does
    not), so Describe is granted only where neither is.
    """

    READ = "READ"
    WRITE = "WRITE"
    CREATE = "CREATE"
    DESCRIBE = "DESCRIBE"


R, W, C, D = Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DESCRIBE


def _topic_access(role: Role) -> dict[TopicRole, tuple[Operation, ...]]:
    """What ``role`` may do on each catalogue topic.

    Read and Write are the catalogue's (`schemas.topics.RoleSpec.readers` and
    ``writers``: who may write what is spelled there, once). On top of them the processors
    create every catalogue topic, and Describe where they neither read nor write (they
    wait for the topics they create to show up).
    """
    out: dict[TopicRole, tuple[Operation, ...]] = {}
    for topic, spec in ROLES.items():
        ops = [op for op, who in ((R, spec.readers), (W, spec.writers)) if role in who]
        if role is Role.PROCESSORS:
            ops += [C] if ops else [C, D]
        if ops:
            out[topic] = tuple(ops)
    return out


TOPIC_ACCESS: Final[Mapping[Role, Mapping[TopicRole, tuple[Operation, ...]]]] = {
    role: _topic_access(role) for role in Role
}
"""Role -> catalogue topic -> the operations it is allowed there."""

VERDICT_TOPICS: Final = tuple(
    topic for topic, spec in ROLES.items() if spec.writers == {Principal.PROCESSORS}
)
"""The topics whose records steer restarts or judge runs: written by the processors only."""


def default_sinks_group(prefix: str) -> str:
    """The prefix of the sinks' consumer groups for topic prefix ``prefix``: ``<prefix>-sinks``.

    ``runwatch sinks`` names its groups ``<this>-alerts``, ``-metrics``, ``-archive``.
    """
    return f"{prefix}-sinks"


@dataclass(frozen=True)
class Scope:
    """The names one deployment's grants cover.

    Attributes:
        prefix: The topic prefix (``runwatch``: ``runwatch.steps``, ...).
        app_id: The processors' app id: their consumer group, and the prefix (with ``-``)
            of their changelog and assignor topics.
        sinks_group: The prefix of the sinks' consumer groups (``<prefix>-sinks``).
    """

    prefix: str
    app_id: str
    sinks_group: str

    @classmethod
    def of(cls, prefix: str, app_id: str | None = None, sinks_group: str | None = None) -> Scope:
        """The scope of ``prefix``, with the processors' and sinks' defaults for it.

        Args:
            prefix: The topic prefix.
            app_id: The processors' app id; None: `processors.fleet.default_app_id`.
            sinks_group: The sinks' group prefix; None: `default_sinks_group`.
        """
        from runwatch.processors.fleet import default_app_id

        return cls(
            prefix=prefix,
            app_id=app_id or default_app_id(prefix),
            sinks_group=sinks_group or default_sinks_group(prefix),
        )


@dataclass(frozen=True)
class Acl:
    """One grant: operations allowed on a resource (one name, or every name of a prefix).

    Attributes:
        resource: Topic or consumer group.
        pattern: `Pattern.LITERAL` (exactly ``name``) or `Pattern.PREFIXED`.
        name: The resource name, or the prefix.
        operations: What is allowed there.
    """

    resource: Resource
    pattern: Pattern
    name: str
    operations: tuple[Operation, ...]


def acls_of(role: Role, scope: Scope) -> tuple[Acl, ...]:
    """Every grant of ``role`` in ``scope``: its catalogue topics, then its own resources.

    Args:
        role: The role.
        scope: Prefix, app id and sinks' group prefix.
    """
    topics = names(scope.prefix)
    out = [
        Acl(Resource.TOPIC, Pattern.LITERAL, topics.of(topic), ops)
        for topic, ops in TOPIC_ACCESS[role].items()
    ]
    internal = f"{scope.app_id}-"  # <app id>-<table>-changelog, <app id>-__assignor-__leader
    if role is Role.PROCESSORS:
        out += [
            Acl(Resource.TOPIC, Pattern.PREFIXED, internal, (R, W, C)),
            Acl(Resource.GROUP, Pattern.LITERAL, scope.app_id, (R,)),
        ]
    elif role is Role.SINKS:
        out += [
            Acl(Resource.TOPIC, Pattern.PREFIXED, internal, (R,)),  # the processors' states
            Acl(Resource.GROUP, Pattern.PREFIXED, scope.sinks_group, (R,)),
            Acl(Resource.GROUP, Pattern.LITERAL, scope.app_id, (D,)),  # its offsets: the lag
        ]
    return tuple(out)


def default_principal(role: Role) -> str:
    """The principal of ``role`` unless told otherwise: ``User:<role>``."""
    return f"User:{role.value}"


def principals(overrides: Mapping[Role, str] | None = None) -> dict[Role, str]:
    """Every role's principal: `default_principal`, or the one given for it."""
    given = dict(overrides or {})
    return {role: given.get(role, default_principal(role)) for role in Role}


def parse_principals(items: Sequence[str]) -> dict[Role, str]:
    """``ROLE=PRINCIPAL`` items (``trainer=User:alice``; a bare name gets ``User:``).

    Raises:
        ValueError: an unknown role, a role named twice, or an empty principal.
    """
    out: dict[Role, str] = {}
    for item in items:
        role_name, sep, principal = item.partition("=")
        try:
            role = Role(role_name.strip())
        except ValueError:
            raise ValueError(
                f"{item!r}: no role {role_name.strip()!r}; roles: {', '.join(Role)}"
            ) from None
        principal = principal.strip()
        if not sep or not principal:
            raise ValueError(f"{item!r}: expected ROLE=PRINCIPAL, e.g. trainer=User:alice")
        if role in out:
            raise ValueError(f"role {role} named twice")
        out[role] = principal if ":" in principal else f"User:{principal}"
    return out


def bindings(scope: Scope, who: Mapping[Role, str]) -> list[tuple[str, Acl]]:
    """(principal, grant) for every role of ``who``, in role order."""
    return [(who[role], acl) for role in Role if role in who for acl in acls_of(role, scope)]


_CLI_RESOURCE: Final = {Resource.TOPIC: "--topic", Resource.GROUP: "--group"}
_CLI_OPERATION: Final = {
    R: "Read",
    W: "Write",
    C: "Create",
    D: "Describe",
}


def kafka_acls_commands(scope: Scope, who: Mapping[Role, str], bootstrap: str) -> list[str]:
    """``kafka-acls.sh`` command lines that add every grant (for a cluster run elsewhere).

    Args:
        scope: Prefix, app id and sinks' group prefix.
        who: Principal of each role to grant.
        bootstrap: The cluster's address, for ``--bootstrap-server``.
    """
    lines = []
    for principal, acl in bindings(scope, who):
        ops = " ".join(f"--operation {_CLI_OPERATION[op]}" for op in acl.operations)
        lines.append(
            "kafka-acls.sh --bootstrap-server "
            f"{shlex.quote(bootstrap)} --command-config admin.properties --add "
            f"--allow-principal {shlex.quote(principal)} {ops} "
            f"{_CLI_RESOURCE[acl.resource]} {shlex.quote(acl.name)} "
            f"--resource-pattern-type {acl.pattern.value.lower()}"
        )
    return lines
