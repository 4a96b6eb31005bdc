"""The roles' grants: least privilege read from the table, names from the catalogue."""

from __future__ import annotations

import shlex

import pytest

from runwatch.broker.acls import (
    TOPIC_ACCESS,
    VERDICT_TOPICS,
    Acl,
    Operation,
    Pattern,
    Resource,
    Role,
    Scope,
    acls_of,
    bindings,
    default_sinks_group,
    kafka_acls_commands,
    parse_principals,
    principals,
)
from runwatch.schemas.topics import DEFAULT_PARTITIONS, names

SCOPE = Scope.of("rw")
ROLES = list(Role)


def _ops(role: Role, topic: str) -> set[Operation]:
    return {
        op
        for acl in acls_of(role, SCOPE)
        if acl.resource is Resource.TOPIC and acl.name == topic
        for op in acl.operations
    }


def test_every_topic_of_the_table_is_in_the_catalogue() -> None:
    for role, topics in TOPIC_ACCESS.items():
        assert set(topics) <= set(DEFAULT_PARTITIONS), role


@pytest.mark.parametrize("short", VERDICT_TOPICS)
def test_only_the_processors_write_verdicts_commands_and_dead_letters(short: str) -> None:
    topic = getattr(names("rw"), short)
    writers = {role for role in Role if Operation.WRITE in _ops(role, topic)}
    assert writers == {Role.PROCESSORS}


def test_a_trainer_writes_the_inputs_and_reads_nothing() -> None:
    grants = acls_of(Role.TRAINER, SCOPE)
    t = names("rw")
    assert {g.name for g in grants} == {t.runs, t.steps, t.heartbeats, t.checkpoints}
    assert all(g.operations == (Operation.WRITE,) for g in grants)
    assert all(g.resource is Resource.TOPIC and g.pattern is Pattern.LITERAL for g in grants)


def test_the_sinks_write_and_create_nothing() -> None:
    for acl in acls_of(Role.SINKS, SCOPE):
        assert set(acl.operations) <= {Operation.READ, Operation.DESCRIBE}, acl
    every = set(DEFAULT_PARTITIONS)
    assert {
        short for short in every if Operation.READ in _ops(Role.SINKS, getattr(names("rw"), short))
    } == every


@pytest.mark.parametrize("role", ROLES, ids=str)
def test_no_role_reaches_beyond_its_prefix_app_id_and_groups(role: Role) -> None:
    for acl in acls_of(role, SCOPE):
        if acl.resource is Resource.TOPIC:
            assert acl.name.startswith(("rw.", "rw-processors-")), acl
            assert acl.pattern is Pattern.LITERAL or acl.name == "rw-processors-", acl
        else:
            assert acl.name in ("rw-processors", "rw-sinks"), acl


def test_the_controller_reads_what_a_restart_needs_and_writes_for_its_ranks() -> None:
    t = names("rw")
    reads = {n for n in vars_of(t) if Operation.READ in _ops(Role.CONTROLLER, n)}
    writes = {n for n in vars_of(t) if Operation.WRITE in _ops(Role.CONTROLLER, n)}
    assert reads == {t.commands, t.runs, t.controller, t.anomalies}
    assert writes == {t.controller, t.runs, t.steps, t.heartbeats, t.checkpoints}
    assert not any(a.resource is Resource.GROUP for a in acls_of(Role.CONTROLLER, SCOPE))


def vars_of(topics: object) -> list[str]:
    return [getattr(topics, f) for f in topics.__struct_fields__]  # type: ignore[attr-defined]


def test_the_processors_own_their_group_and_internal_topics() -> None:
    own = [a for a in acls_of(Role.PROCESSORS, SCOPE) if not a.name.startswith("rw.")]
    assert own == [
        Acl(
            Resource.TOPIC,
            Pattern.PREFIXED,
            "rw-processors-",
            (Operation.READ, Operation.WRITE, Operation.CREATE),
        ),
        Acl(Resource.GROUP, Pattern.LITERAL, "rw-processors", (Operation.READ,)),
    ]


def test_a_scope_takes_the_defaults_of_its_prefix_unless_told() -> None:
    assert Scope.of("p") == Scope("p", "p-processors", default_sinks_group("p"))
    assert Scope.of("p", "app", "g") == Scope("p", "app", "g")
    assert default_sinks_group("p") == "p-sinks"


def test_principals_default_to_the_role_name_and_can_be_named() -> None:
    assert principals() == {r: f"User:{r.value}" for r in Role}
    named = principals(parse_principals(["trainer=alice", "sinks=User:ro"]))
    assert named[Role.TRAINER] == "User:alice" and named[Role.SINKS] == "User:ro"
    assert named[Role.PROCESSORS] == "User:processors"


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["admin=x"], "no role 'admin'"),
        (["trainer"], "expected ROLE=PRINCIPAL"),
        (["trainer="], "expected ROLE=PRINCIPAL"),
        (["trainer=a", "trainer=b"], "named twice"),
    ],
    ids=["unknown-role", "no-principal", "empty-principal", "twice"],
)
def test_bad_principals_are_clear_errors(items: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_principals(items)


def test_the_printed_commands_are_one_per_grant_and_parse_as_shell() -> None:
    who = principals()
    lines = kafka_acls_commands(SCOPE, who, "kafka:9092")
    grants = bindings(SCOPE, who)
    assert len(lines) == len(grants)
    for line, (principal, acl) in zip(lines, grants, strict=True):
        words = shlex.split(line)
        assert words[0] == "kafka-acls.sh" and "--add" in words
        assert words[words.index("--allow-principal") + 1] == principal
        flag = "--topic" if acl.resource is Resource.TOPIC else "--group"
        assert words[words.index(flag) + 1] == acl.name
        assert words[words.index("--resource-pattern-type") + 1] == acl.pattern.value.lower()
        ops = [words[i + 1] for i, w in enumerate(words) if w == "--operation"]
        assert [o.upper() for o in ops] == [op.value for op in acl.operations]
