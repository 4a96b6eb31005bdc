"""Only the settings modules read ``RUNWATCH_*`` variables (issue 18, section 5).

Every ``RUNWATCH_*`` variable belongs to one settings object (`SETTINGS_MODULES`), whose
``from_env`` reads it; everything else asks that object. The source is parsed with `ast`
(nothing is imported) and a read is any of:

* ``X.get(NAME)``, ``X.pop(NAME)``, ``X.setdefault(NAME)``, ``os.getenv(NAME)``,
  ``X[NAME]`` (loaded) and ``NAME in X``, where ``NAME`` is a string literal starting
  with ``RUNWATCH_`` or a name (or attribute) bound anywhere in the package to such a
  literal, directly or through another such name;
* a call passing such a ``NAME`` together with an environment (``os.environ``, or a name
  or attribute called ``env`` or ``environ``), as in ``env_value(env, NAME, ...)``: a
  helper reading it;
* ``os.environ.get(x)``, ``os.getenv(x)`` or ``os.environ[x]`` with an ``x`` that is not
  a literal: a variable read by a computed name might be one of ours.

Writing a child's environment (a dict display, ``env[NAME] = ...``) is no read.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PACKAGES = ("runwatch", "common", "schemas", "processors", "producers", "controller", "sinks")
"""The shipped source; ``runwatch/<pkg>`` links to ``<pkg>`` and is walked once."""

SETTINGS_MODULES = frozenset(
    {
        "common/settings.py",
        "common/launch_env.py",
        "processors/settings.py",
        "producers/settings.py",
        "sinks/settings.py",
        "controller/settings.py",
    }
)
"""The modules allowed to read ``RUNWATCH_*``: each holds the settings objects of one
component (``launch_env``: the rank contract the launcher writes and the ranks read)."""

PREFIX = "RUNWATCH_"
_READ_METHODS = frozenset({"get", "pop", "setdefault", "getenv"})
_ENVIRONMENTS = frozenset({"env", "environ"})


def source_files(repo: Path = REPO) -> list[Path]:
    """Every ``.py`` of the shipped packages, each once (symlinked folders skipped)."""
    out: list[Path] = []
    for package in PACKAGES:
        for path in sorted((repo / package).rglob("*.py")):
            rel = path.relative_to(repo)
            if any((repo / Path(*rel.parts[:i])).is_symlink() for i in range(1, len(rel.parts))):
                continue
            out.append(path)
    return out


def _bound_names(trees: list[ast.Module]) -> dict[str, str]:
    """Names (and attribute names) bound to a ``RUNWATCH_*`` literal, directly or by alias."""
    pairs: list[tuple[str, ast.expr]] = []
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            else:
                continue
            for target in targets:
                if isinstance(target, ast.Name):
                    pairs.append((target.id, value))
                elif isinstance(target, ast.Attribute):
                    pairs.append((target.attr, value))
    found: dict[str, str] = {}
    changed = True
    while changed:  # aliases of aliases
        changed = False
        for name, value in pairs:
            text = _literal(value, found)
            if text is not None and text.startswith(PREFIX) and name not in found:
                found[name] = text
                changed = True
    return found


def _literal(node: ast.expr, names: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.Attribute):
        return names.get(node.attr)
    return None


def _is_os_environ(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "environ"
        and isinstance(node.value, ast.Name)
        and node.value.id == "os"
    )


def _is_environment(node: ast.expr) -> bool:
    """``os.environ``, or a name or attribute called ``env`` or ``environ``."""
    if isinstance(node, ast.Name):
        return node.id in _ENVIRONMENTS
    return isinstance(node, ast.Attribute) and node.attr in _ENVIRONMENTS


def _helper_read(node: ast.AST, names: dict[str, str]) -> str | None:
    """The ``RUNWATCH_*`` name a call passes along with an environment, if any."""
    if not isinstance(node, ast.Call):
        return None
    args = [*node.args, *(k.value for k in node.keywords)]
    if not any(_is_environment(arg) for arg in args):
        return None
    texts = [_literal(arg, names) for arg in args]
    return next((t for t in texts if t is not None and t.startswith(PREFIX)), None)


def _dynamic_os_read(node: ast.AST) -> bool:
    """``os.environ.get(x)`` / ``os.getenv(x)`` / ``os.environ[x]`` with a computed ``x``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
        func = node.func
        on_environ = func.attr == "get" and _is_os_environ(func.value)
        getenv = func.attr == "getenv" and isinstance(func.value, ast.Name)
        if (on_environ or getenv) and not isinstance(node.args[0], ast.Constant):
            return True
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
        return _is_os_environ(node.value) and not isinstance(node.slice, ast.Constant)
    return False


def env_reads(tree: ast.Module, names: dict[str, str]) -> list[tuple[int, str]]:
    """``(line, what)`` for every read of a ``RUNWATCH_*`` variable in ``tree``."""
    reads: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        key: ast.expr | None = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            key = node.args[0] if node.func.attr in _READ_METHODS else None
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = node.slice
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In | ast.NotIn):
            key = node.left
        text = None if key is None else _literal(key, names)
        if text is not None and text.startswith(PREFIX):
            reads.append((getattr(node, "lineno", 0), text))
        elif (helper := _helper_read(node, names)) is not None:
            reads.append((getattr(node, "lineno", 0), helper))
        elif _dynamic_os_read(node):
            reads.append((getattr(node, "lineno", 0), "a computed name in os.environ"))
    return reads


def offenders(repo: Path = REPO) -> dict[str, list[tuple[int, str]]]:
    """Modules outside `SETTINGS_MODULES` that read ``RUNWATCH_*``, with their reads."""
    files = source_files(repo)
    trees = {path: ast.parse(path.read_text(), str(path)) for path in files}
    names = _bound_names(list(trees.values()))
    out: dict[str, list[tuple[int, str]]] = {}
    for path, tree in trees.items():
        rel = path.relative_to(repo).as_posix()
        if rel in SETTINGS_MODULES:
            continue
        reads = env_reads(tree, names)
        if reads:
            out[rel] = reads
    return out


def test_only_the_settings_modules_read_runwatch_variables() -> None:
    found = offenders()
    assert found == {}, (
        "these modules read RUNWATCH_* variables; add the variable to its component's "
        f"settings object and ask that instead: {found}"
    )


def test_the_settings_modules_exist() -> None:
    assert all((REPO / rel).is_file() for rel in SETTINGS_MODULES)


def test_the_scan_sees_each_kind_of_read() -> None:
    names = {"ENV_X": "RUNWATCH_X", "ENV": "RUNWATCH_Y"}
    code = """
import os
a = os.environ.get("RUNWATCH_A")
b = env[ENV_X]
c = "RUNWATCH_C" in environ
d = os.getenv(self.ENV)
e = os.environ.get(name)
f = os.environ[name]
g = os.environ.get("HOME")
os.environ["RUNWATCH_Z"] = "1"
h = {"RUNWATCH_W": "1"}
i = env_value(os.environ, ENV_X, int, "a count")
j = parse(self.environ, name="RUNWATCH_J")
k = describe("RUNWATCH_K", other)
"""
    reads = env_reads(ast.parse(code), names)
    assert [line for line, _ in reads] == [3, 4, 5, 6, 7, 8, 12, 13]


def test_aliases_of_names_are_followed() -> None:
    trees = [ast.parse('ENV_A = "RUNWATCH_A"\nENV_B: Final = ENV_A\nclass C:\n    ENV = ENV_B\n')]
    assert _bound_names(trees) == {
        "ENV_A": "RUNWATCH_A",
        "ENV_B": "RUNWATCH_A",
        "ENV": "RUNWATCH_A",
    }
