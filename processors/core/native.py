"""Which copy of each compiled core module runs: mypyc's build or the pure-Python source.

`COMPILED_MODULES` are compiled in place by ``make compiled`` (``native_build.py``, which
``make venv`` runs): the extension lands next to its source, where Python's import would
prefer it. They are compiled as one group (one library, ``kernels__mypyc``) whose modules
call each other's compiled copies directly, so they run compiled or pure together: a
compiled module imported beside a pure one of its group would crash the interpreter. The
package's ``__init__`` imports this module before anything else, so that `select` decides
for the group, by numbered rules applied to each module (the first that sends one module
to its source sends them all; `SourceFinder` then serves every import of them):

1. ``RUNWATCH_PURE_PYTHON=1`` (`common.settings.CoreSettings`): the pure source.
2. No compiled copy next to the source (a plain install, a machine without a compiler):
   the pure source.
3. A compiled copy built from other source than the file now beside it (its SHA-256 in
   ``native_sources.json``, which the build writes, differs or is missing), or from other
   source than any other module of the group beside it: the pure source, with a
   `RuntimeWarning` naming the module and ``make compiled``; an edit without a rebuild
   never runs stale compiled code, and never goes unnoticed.
4. Otherwise the compiled copy.

Both copies give the same verdicts bit for bit (``tests/unit/core/test_native.py`` runs
the verdict tests under each and compares their outputs), so the choice changes speed
only. `COMPILED` says which is active: ``python -c 'import runwatch.processors.core as c;
print(c.COMPILED)'``; `ACTIVE` says it per module, with the reason.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.util
import json
import sys
import warnings
from collections.abc import Sequence
from importlib.machinery import EXTENSION_SUFFIXES, ModuleSpec
from pathlib import Path
from types import ModuleType
from typing import Final

from runwatch.common.settings import CoreSettings

COMPILED_MODULES: Final = ("window", "liveness_pack", "straggler_buckets")
"""Modules of this package that ``make compiled`` compiles (file stems), as one group.

None may define a class with class keywords (a msgspec Struct's ``frozen=True``, ``tag``):
mypyc drops them without a word (``tests/unit/core/test_native.py`` holds each to it)."""
MANIFEST: Final = "native_sources.json"
"""Written by the build beside the extensions: ``{stem: SHA-256 of the source compiled}``."""
HERE: Final = Path(__file__).resolve().parent
PACKAGE: Final = __name__.rpartition(".")[0]
COMPILED_LABEL: Final = "compiled"


def source_digest(path: Path) -> str:
    """SHA-256 (hex) of a source file's bytes, as the build records it."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def compiled_copy(stem: str, folder: Path = HERE) -> Path | None:
    """The compiled extension of module ``stem`` in ``folder``, None when there is none."""
    for suffix in EXTENSION_SUFFIXES:
        candidate = folder / f"{stem}{suffix}"
        if candidate.is_file():
            return candidate
    return None


def built_digests(folder: Path = HERE) -> dict[str, str]:
    """The build's manifest (`MANIFEST`) in ``folder``; empty when absent or unreadable."""
    try:
        found = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(found, dict):
        return {}
    return {str(k): str(v) for k, v in found.items()}


def pure_reason(stem: str, pure_python: bool, folder: Path = HERE) -> str | None:
    """Why module ``stem`` runs its pure source (rules 1-3 above), None: run the compiled one.

    Args:
        stem: The module's file stem in ``folder``.
        pure_python: ``RUNWATCH_PURE_PYTHON`` asked for the pure source.
        folder: Where the source, its compiled copy and the manifest live.

    Returns:
        The reason, or None when the compiled copy is current.
    """
    if pure_python:  # rule 1
        return "RUNWATCH_PURE_PYTHON=1"
    if compiled_copy(stem, folder) is None:  # rule 2
        return "not compiled"
    built = built_digests(folder)
    if built.get(stem) != source_digest(folder / f"{stem}.py"):  # rule 3
        return f"stale: {stem}.py changed since it was compiled (run `make compiled`)"
    for other in COMPILED_MODULES:
        source = folder / f"{other}.py"
        if other != stem and source.is_file() and built.get(other) != source_digest(source):
            return f"stale: {other}.py, compiled with it, changed since (run `make compiled`)"
    return None


class SourceFinder(importlib.abc.MetaPathFinder):
    """Finds the group's modules as their ``.py`` sources, ahead of their compiled copies.

    Installed first on `sys.meta_path` when the group runs pure with a compiled copy beside
    it (a plain install has none to shadow), so that whichever module imports one of them
    first, and in whatever order, gets the source: a compiled module of the group imported
    beside a pure one would reach into the pure one's internals as if it were compiled (a
    crash, not an error).
    """

    def __init__(self, sources: dict[str, Path]) -> None:
        """Serve ``sources``: ``{full module name: path of its source}``."""
        self.sources = sources

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        """The source's spec for a module of the group; None (the next finder) otherwise."""
        source = self.sources.get(fullname)
        return None if source is None else importlib.util.spec_from_file_location(fullname, source)


def group_reason(pure_python: bool, folder: Path = HERE) -> str | None:
    """Why the group runs its sources: the first module's reason, None: all compiled.

    The group is compiled into one library whose modules call each other directly, so it
    runs compiled or pure as a whole: one module not built or stale sends every one of
    them to its source.
    """
    for stem in COMPILED_MODULES:
        reason = pure_reason(stem, pure_python, folder)
        if reason is not None:
            return reason if reason.startswith(("RUNWATCH", "stale")) else f"{stem}: {reason}"
    return None


def select(settings: CoreSettings | None = None, folder: Path = HERE) -> dict[str, str]:
    """Import each of `COMPILED_MODULES` from the copy the rules choose, the group as one.

    Args:
        settings: The switch; read from the environment when None.
        folder: This package's folder.

    Returns:
        ``{stem: "compiled" or "pure (<reason>)"}``, from the module actually imported (a
        module imported before this ran keeps the copy it was imported from).
    """
    pure_python = (settings or CoreSettings.from_env()).pure_python
    reason = group_reason(pure_python, folder)
    if reason is not None:
        if reason.startswith("stale"):
            warnings.warn(f"{PACKAGE}: {reason}; running the pure source", RuntimeWarning, 2)
        if any(compiled_copy(stem, folder) for stem in COMPILED_MODULES):  # else: nothing to shadow
            sources = {f"{PACKAGE}.{stem}": folder / f"{stem}.py" for stem in COMPILED_MODULES}
            sys.meta_path.insert(0, SourceFinder(sources))
    active: dict[str, str] = {}
    for stem in COMPILED_MODULES:
        module = importlib.import_module(f"{PACKAGE}.{stem}")
        is_compiled = not str(getattr(module, "__file__", "")).endswith(".py")
        active[stem] = COMPILED_LABEL if is_compiled else f"pure ({reason or 'imported before'})"
    return active


ACTIVE: Final = select()
"""Per compiled module: ``"compiled"`` or ``"pure (<reason>)"``."""
COMPILED: Final = all(state == COMPILED_LABEL for state in ACTIVE.values())
"""True when every module of `COMPILED_MODULES` runs its compiled copy."""

__all__ = [
    "ACTIVE",
    "COMPILED",
    "COMPILED_MODULES",
    "MANIFEST",
    "SourceFinder",
    "built_digests",
    "compiled_copy",
    "group_reason",
    "pure_reason",
    "select",
    "source_digest",
]
