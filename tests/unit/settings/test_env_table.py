"""The table of ``RUNWATCH_*`` variables in docs/deploy.md, drawn from the settings objects.

Each variable's row is found, not written: the variables are the ``RUNWATCH_*`` names the
settings modules bind (`test_env_reads.SETTINGS_MODULES`); which field of which settings
object reads one is found by setting it alone and seeing what ``from_env`` changes; the
default is that field's default and the meaning its entry in the object's docstring.
A variable no object reads fails the test, as does a page that differs from the code's
table. ``python -m tests.unit.settings.test_env_table --write`` puts the table in the page.
"""

from __future__ import annotations

import ast
import dataclasses
import sys
from typing import Any

import msgspec

from runwatch.common.launch_env import LaunchEnv
from runwatch.common.settings import CommandKeySettings, CommonSettings, CoreSettings, KafkaAuth
from runwatch.controller.settings import AgentEnv
from runwatch.processors.settings import ProcessorEnv
from runwatch.producers.settings import EmitterEnv, ReplicaEnv, ReplicaFloorEnv
from runwatch.sinks.settings import SinkEnv
from tests.unit.settings.test_env_reads import REPO, SETTINGS_MODULES, _bound_names

DOC = REPO / "docs" / "deploy.md"
BEGIN = "<!-- env-table (tests/unit/settings/test_env_table.py writes and checks it) -->"
END = "<!-- /env-table -->"

OBJECTS: tuple[tuple[type, str], ...] = (
    (CommonSettings, "every command"),
    (CoreSettings, "the pure core (compiled or pure copy)"),
    (KafkaAuth, "Kafka clients (auth)"),
    (CommandKeySettings, "processors, agent (command key)"),
    (ProcessorEnv, "processors"),
    (SinkEnv, "sinks"),
    (AgentEnv, "controller/agent"),
    (EmitterEnv, "producers/emitter"),
    (ReplicaEnv, "producers (torchft)"),
    (ReplicaFloorEnv, "producers (torchft)"),
    (LaunchEnv, "rank contract"),
)
"""Every settings object, owners first: a variable's default and meaning are its first
reader's."""

BASE = {"REPLICA_GROUP_ID": "0", "NUM_REPLICA_GROUPS": "1", "TORCHFT_LIGHTHOUSE": "h:1"}
"""What `ReplicaEnv` needs to read anything; the others ignore it."""
SAMPLES = ("3", "rocksdb", "asyncio", "1")
"""Values tried for a variable until its object takes one (a count, a store's name, an event
loop's, a switch)."""


def variables() -> list[str]:
    """Every ``RUNWATCH_*`` name the settings modules bind."""
    trees = [ast.parse((REPO / rel).read_text()) for rel in sorted(SETTINGS_MODULES)]
    return sorted(set(_bound_names(trees).values()))


def _read(cls: type, env: dict[str, str]) -> Any:
    reader = getattr(cls, "from_env", None) or cls.from_environ  # type: ignore[attr-defined]
    return reader(env)


def _fields(obj: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(obj):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return msgspec.structs.asdict(obj)


def _default(cls: type, name: str) -> Any:
    if dataclasses.is_dataclass(cls):
        field = next(f for f in dataclasses.fields(cls) if f.name == name)
        return field.default
    info = next(f for f in msgspec.structs.fields(cls) if f.name == name)
    return info.default


def field_of(cls: type, var: str) -> str | None:
    """The field of ``cls`` that ``var`` sets, or None when ``cls`` does not read it."""
    before = _fields(_read(cls, BASE))
    for sample in SAMPLES:
        try:
            after = _fields(_read(cls, {**BASE, var: sample}))
        except Exception:  # the object refused the sample: try the next
            continue
        changed = [k for k in before if before[k] != after[k]]
        if changed:
            return changed[0]
    return None


def meaning(cls: type, name: str) -> str:
    """The entry of ``name`` in the Attributes of ``cls``'s docstring, on one line."""
    lines = (cls.__doc__ or "").splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip().startswith(f"{name}: ")), None)
    if start is None:
        return ""
    indent = len(lines[start]) - len(lines[start].lstrip())
    entry = [lines[start].strip().removeprefix(f"{name}: ")]
    for line in lines[start + 1 :]:
        if not line.strip() or len(line) - len(line.lstrip()) <= indent:
            break
        entry.append(line.strip())
    return " ".join(entry).replace("``", "`").replace("|", "\\|")


def _show(value: Any) -> str:
    return "unset" if value is None or value in ((), "", {}) else f"`{value}`"


def rows() -> list[str]:
    """One table row per variable."""
    out = []
    for var in variables():
        readers = [(cls, label, field_of(cls, var)) for cls, label in OBJECTS]
        found = [(cls, label, f) for cls, label, f in readers if f is not None]
        assert found, f"{var} is bound in a settings module but no settings object reads it"
        owner, _, field = found[0]
        read_by = ", ".join(f"{label} (`{cls.__name__}.{f}`)" for cls, label, f in found)
        default = _show(_default(owner, field))
        out.append(f"| `{var}` | {read_by} | {default} | {meaning(owner, field)} |")
    return out


def render() -> str:
    """The table, between its markers."""
    head = ["| variable | read by | default | meaning |", "| --- | --- | --- | --- |"]
    return "\n".join([BEGIN, *head, *rows(), END])


def documented() -> str:
    """The table as the page has it."""
    text = DOC.read_text()
    return text[text.index(BEGIN) : text.index(END) + len(END)]


def test_the_documented_table_is_the_code_s() -> None:
    assert documented() == render(), (
        "docs/deploy.md's RUNWATCH_* table is stale: "
        "python -m tests.unit.settings.test_env_table --write"
    )


def test_every_variable_has_a_meaning() -> None:
    assert all(not row.endswith("|  |") for row in rows())


def test_a_field_is_found_by_what_the_variable_changes() -> None:
    assert field_of(ProcessorEnv, "RUNWATCH_STORE") == "store"
    assert field_of(ProcessorEnv, "RUNWATCH_BOOTSTRAP") is None
    assert field_of(ReplicaEnv, "RUNWATCH_MIN_REPLICAS") == "min_replicas"


def write() -> None:
    """Put the code's table in the page."""
    text = DOC.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    DOC.write_text(text[:start] + render() + text[end:])


if __name__ == "__main__":
    if "--write" in sys.argv[1:]:
        write()
    else:
        print(render())
