"""Which package may import which: the layers of the house, read from the code.

Installed, runwatch is one namespace: the packages at the repository's root (``common/``,
``schemas/``, ...) are ``runwatch.common``, ``runwatch.schemas``, ... (``runwatch/<name>``
links to ``../<name>``). Every ``.py`` of them is parsed with `ast` (nothing is imported),
and each import of one of our modules (at module level, in a function, or under
``TYPE_CHECKING``: an import anywhere is a dependency) is checked against `ALLOWED`. The
layers are named without the ``runwatch.`` prefix. From the bottom up:

* ``common``: what the lower packages share (settings, durable writes, errors, the
  checkpoint layout, the launch environment, the version). It imports nothing of ours, so
  anyone may import it; and since the pure core may, importing it never loads kafka,
  faust or torch (only a function body may import them: ``faust_broker_settings``).
* ``schemas``: the event structs, codec, topics, signing and record intake (raw Kafka
  records to events or dead letters); only ``common`` below it.
* ``processors.core``: the pure verdict engine, the same code live and in replay:
  ``schemas`` and ``common`` only, and no kafka, faust, aiokafka, mode or torch.
* ``processors``: the faust shell, audit, fleet view, over the core.
* ``producers``: the trainer side (emitter, log-tail parsers, checkpoints, backends). It
  never needs the processors: a training process must not pull in faust.
* ``controller``: the per-node agent. It imports ``producers`` because it speaks for the
  trainer side: it announces RunEnded through the same `RunEmitter` a rank uses, parses a
  printing script's lines with the ``runwatch tail-log`` parsers, and reads the
  checkpoint layout and launch environment the trainer writes (those two in ``common``).
  It decides nothing the processors decide, so it does not import them.
* ``sinks``: consumers of verdicts (alerts, metrics, archive). They import ``processors``
  where they read what the processors read (the audit's run log, the core's MFU and run
  announcements for metrics), and never the controller or the trainer side.
* ``runwatch``: the command line on top, the web view (server and its data model), the
  broker's lifecycle; it may import any package.

``importlib.import_module("a.b")`` with a literal name counts as an import too. One
crossing is allowed on purpose, in `EXCEPTIONS`, with its reason (and a test that it is
still needed and still lazy).

The modules of ``runwatch/cmd`` import no cycle among themselves either: what two commands
share lives below both (``runwatch/cmd/_supervision.py``, ``controller/agent.py``).
"""

from __future__ import annotations

import ast
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

ALLOWED: dict[str, frozenset[str]] = {
    "common": frozenset({"common"}),
    "schemas": frozenset({"schemas", "common"}),
    "processors.core": frozenset({"processors.core", "schemas", "common"}),
    "processors": frozenset({"processors", "processors.core", "schemas", "common"}),
    "producers": frozenset({"producers", "schemas", "common"}),
    "controller": frozenset({"controller", "producers", "schemas", "common"}),
    "sinks": frozenset({"sinks", "processors", "processors.core", "schemas", "common"}),
    "runwatch": frozenset(
        {
            "runwatch",
            "controller",
            "sinks",
            "processors",
            "processors.core",
            "producers",
            "schemas",
            "common",
        }
    ),
}
"""Layer -> the layers its modules may import."""

OURS = frozenset({"runwatch", "examples", "tests", "bench"})
"""First components of module names that are this repository's (the rest is third-party)."""

BARE = frozenset({"common", "schemas", "producers", "processors", "controller", "sinks"})
"""Our packages' names without the namespace: never imported so (a user's own ``schemas``
package would shadow them)."""

PURE = frozenset({"kafka", "faust", "aiokafka", "mode", "torch"})
"""Third-party packages the pure core never imports, and common never loads at import."""


@dataclass(frozen=True)
class Import:
    """One import statement's target, as a module path.

    Attributes:
        line: The statement's line.
        module: The imported module, absolute (``from a import b`` names ``a.b`` when
            that is a module of ours, else ``a``).
        at_import: The statement runs when its module is imported (not in a function).
    """

    line: int
    module: str
    at_import: bool


LINKED: tuple[str, ...] = ("common", "schemas", "producers", "processors", "controller", "sinks")
"""The packages at the repository's root, each installed as ``runwatch.<name>``."""


def shipped_packages() -> list[str]:
    """The packages of the namespace, by layer root: ``runwatch`` and the linked ones."""
    return sorted({"runwatch", *LINKED})


def module_name(path: Path) -> str:
    """The installed name of a file: ``schemas/codec.py`` -> ``schemas.codec``."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    if parts[0] in LINKED:
        parts.insert(0, "runwatch")
    return ".".join(parts)


def is_our_module(name: str) -> bool:
    """True when ``name`` is a module or package of the namespace (or of the repo's tools)."""
    base = REPO.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def layer_of(module: str) -> str:
    """The layer of one of our modules: ``processors.core``, a linked package, or ``runwatch``."""
    rest = module.removeprefix("runwatch.")
    if rest == "processors.core" or rest.startswith("processors.core."):
        return "processors.core"
    first = rest.split(".")[0]
    return first if first in LINKED else module.split(".")[0]


def imports_in(text: str, package: str) -> list[Import]:
    """Every import in a module's source, relative ones made absolute.

    Args:
        text: The source.
        package: The package the module is in (``a.b`` for ``a/b/c.py``), for relative
            imports.
    """
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend(Import(node.lineno, a.name, not in_function) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                candidate = f"{source}.{alias.name}"
                target = candidate if is_our_module(candidate) else source
                found.append(Import(node.lineno, target, not in_function))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):  # importlib.import_module("a.b"): an import the statements above do not show
            found.append(Import(node.lineno, node.args[0].value, not in_function))
        function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            visit(child, in_function or function)

    visit(ast.parse(text), False)
    return found


def imports_of(path: Path) -> list[Import]:
    """Every import in the file ``path`` of this repository."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    return imports_in(path.read_text(), package)


def package_files(package: str) -> list[Path]:
    """Every ``.py`` file under a package directory (``a`` or ``a/b``), links not followed."""
    root = REPO / package
    return sorted(
        path
        for path in root.rglob("*.py")
        if not any((REPO / p).is_symlink() for p in path.relative_to(REPO).parents)
    )


EXCEPTIONS: dict[tuple[str, str], str] = {
    ("processors/core/monitor.py", "runwatch.producers.torch_helpers"): (
        "seed 000's API offers flop_config_from_causal_lm from the core's facade; it needs "
        "torch, so it is imported (importlib) only when that function is called"
    ),
}
"""(file, module) -> why this one import may cross the layers. Keep it short."""


def violations(layer: str, where: str, imports: list[Import]) -> list[str]:
    """``where:line: layer imports module`` for each import of ours `ALLOWED` forbids."""
    return [
        f"{where}:{imp.line}: {layer} imports {imp.module}"
        for imp in imports
        if imp.module.split(".")[0] in OURS
        and layer_of(imp.module) not in ALLOWED[layer]
        and (where, imp.module) not in EXCEPTIONS
    ]


def test_every_shipped_package_has_a_layer():
    packages = shipped_packages()
    assert "common" in packages and "controller" in packages
    assert set(packages) == {layer.split(".")[0] for layer in ALLOWED}


def test_pyproject_ships_one_namespace():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert config["tool"]["setuptools"]["packages"]["find"]["include"] == ["runwatch*"]


@pytest.mark.parametrize("package", LINKED)
def test_each_root_package_is_linked_into_the_namespace(package):
    link = REPO / "runwatch" / package
    assert link.is_symlink() and link.readlink() == Path("..") / package
    assert (REPO / package / "__init__.py").is_file()


def test_no_other_root_package_escapes_the_namespace():
    """A new package at the root must be linked (or be one of the repo's tools)."""
    tools = {"runwatch", "tests", "bench", "examples", "compose", "docs"}
    roots = {p.parent.name for p in REPO.glob("*/__init__.py")}
    assert roots - tools == set(LINKED)


def every_source_file() -> list[Path]:
    """The namespace's files and the repo's tools (tests, bench, examples)."""
    roots = [*shipped_packages(), "tests", "bench", "examples"]
    return [path for root in roots for path in package_files(root)]


def test_nothing_imports_our_packages_without_the_namespace():
    found = [
        f"{path.relative_to(REPO)}:{imp.line}: {imp.module}"
        for path in every_source_file()
        for imp in imports_of(path)
        if imp.module.split(".")[0] in BARE
    ]
    assert found == []


def bare_imports_in_strings(text: str) -> list[int]:
    """Lines of string literals holding code that imports a bare package (``python -c``)."""
    lines = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for chunk in node.value.replace(";", "\n").splitlines():
                words = chunk.split()
                if (
                    len(words) >= 2
                    and words[0] in ("from", "import")
                    and words[1].rstrip(",").split(".")[0] in BARE
                ):
                    lines.append(node.lineno)
    return lines


BARE_ON_PURPOSE: dict[str, str] = {
    "tests/integration/packaging/test_wheel_install.py": "the user's own schemas and common",
    "tests/unit/test_layering.py": "the planted examples of this check",
}
"""Files whose strings import bare names on purpose, with why."""


def test_code_in_strings_imports_through_the_namespace_too():
    """A subprocess started in the repository's root would still find a bare package."""
    found = [
        f"{path.relative_to(REPO)}:{line}"
        for path in every_source_file()
        if str(path.relative_to(REPO)) not in BARE_ON_PURPOSE
        for line in bare_imports_in_strings(path.read_text())
    ]
    assert found == []
    planted = 'CODE = "import sys; from processors.fleet import x"\n'
    assert bare_imports_in_strings(planted) == [1]


@pytest.mark.parametrize("package", shipped_packages())
def test_a_package_imports_only_the_layers_it_may(package):
    files = package_files(package)
    assert files, f"{package}/ has no .py files"
    found = [
        v
        for path in files
        for v in violations(
            layer_of(module_name(path)), str(path.relative_to(REPO)), imports_of(path)
        )
    ]
    assert found == []


@pytest.mark.parametrize(
    ("planted", "module"),
    [
        ("from runwatch.resolve import resolve_bootstrap", "runwatch.resolve"),
        ("def later():\n    from runwatch import cli", "runwatch.cli"),  # lazy: still counts
        ("import runwatch.admin", "runwatch.admin"),
        ("from runwatch.controller.loop import Controller", "runwatch.controller.loop"),
        ("importlib.import_module('runwatch.admin')", "runwatch.admin"),
    ],
)
def test_a_sink_importing_upwards_is_caught(planted, module):
    """The check itself: the real sinks/webhook.py passes it, plus one planted import not."""
    text = (REPO / "sinks" / "webhook.py").read_text()
    assert violations("sinks", "webhook", imports_in(text, "runwatch.sinks")) == []
    found = violations("sinks", "webhook", imports_in(f"{text}\n\n{planted}\n", "runwatch.sinks"))
    assert len(found) == 1 and found[0].endswith(f"sinks imports {module}"), found


def test_the_pure_core_imports_no_kafka_faust_or_torch():
    found = [
        f"{path.relative_to(REPO)}:{imp.line}: {imp.module}"
        for path in package_files("processors/core")
        for imp in imports_of(path)
        if imp.module.split(".")[0] in PURE
    ]
    assert found == []


def test_importing_common_loads_no_kafka_faust_or_torch():
    found = [
        f"{path.relative_to(REPO)}:{imp.line}: {imp.module}"
        for path in package_files("common")
        for imp in imports_of(path)
        if imp.at_import and imp.module.split(".")[0] in PURE
    ]
    assert found == []


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph`` (module -> modules it imports), one path each."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_cycles_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_commands_import_no_cycle():
    files = package_files("runwatch/cmd")
    modules = {module_name(p) for p in files}
    graph = {
        module_name(p): {imp.module for imp in imports_of(p) if imp.module in modules}
        for p in files
    }
    assert graph["runwatch.cmd.launch"] and not cycles(graph), cycles(graph)


def test_what_moved_to_common_left_no_shim_behind():
    """A shim (the old module re-exporting the new one) would keep the old paths alive."""
    old = ["runwatch/settings.py", "runwatch/durable.py", "runwatch/errors.py"]
    old += ["producers/checkpoint_layout.py", *(f"sinks/{m}.py" for m in MOVED_TO_CONTROLLER)]
    assert [p for p in old if (REPO / p).exists()] == []


MOVED_TO_CONTROLLER = ("controller", "controller_state", "gang", "elastic", "supervisor")
MOVED_TO_CONTROLLER += ("command_gate", "logwatch")


def test_each_exception_is_still_needed_and_lazy():
    for (where, module), why in EXCEPTIONS.items():
        found = [imp for imp in imports_of(REPO / where) if imp.module == module]
        assert found, f"{where} no longer imports {module}: drop the exception ({why})"
        assert not any(imp.at_import for imp in found), f"{where} imports {module} at import"
