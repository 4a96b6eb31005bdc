"""Which copy of each compiled core module runs: mypyc's build or the pure-Python source.

`COMPILED_MODULES` are compiled in place by ``make compiled`` (``native_build.py``, which
``make venv`` runs): the extension lands next to its source, where Python's import would
prefer it. The package's ``__init__`` imports this module before anything else, so that
for each of them `select` decides, by numbered rules:

1. ``RUNWATCH_PURE_PYTHON=1`` (`common.settings.CoreSettings`): the pure source.
2. No compiled copy next to the source (a plain install, a machine without a compiler):
   the pure source.
3. A compiled copy built from other source than the file now beside it (its SHA-256 in
   ``native_sources.json``, which the build writes, differs or is missing): the pure
   source, with a `RuntimeWarning` naming the module and ``make compiled``; an edit
   without a rebuild never runs stale compiled code, and never goes unnoticed.
4. Otherwise the compiled copy.

Both copies give the same verdicts bit for bit (``tests/unit/core/test_native.py`` runs
the verdict tests under each and compares their outputs), so the choice changes speed
only. `COMPILED` says which is active: ``python -c 'import runwatch.processors.core as c;
print(c.COMPILED)'``; `ACTIVE` says it per module, with the reason.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import sys
import warnings
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from types import ModuleType
from typing import Final

from runwatch.common.settings import CoreSettings

COMPILED_MODULES: Final = ("window",)
"""Modules of this package that ``make compiled`` compiles (file stems)."""
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
    if built_digests(folder).get(stem) != source_digest(folder / f"{stem}.py"):  # rule 3
        return f"stale: {stem}.py changed since it was compiled (run `make compiled`)"
    return None


def _load_source(name: str, path: Path) -> ModuleType:
    """Import ``path`` as module ``name`` from its source, bypassing a compiled copy."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {name} from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    setattr(sys.modules[PACKAGE], name.rpartition(".")[2], module)
    return module


def select(settings: CoreSettings | None = None, folder: Path = HERE) -> dict[str, str]:
    """Import each of `COMPILED_MODULES` from the copy the rules choose.

    Args:
        settings: The switch; read from the environment when None.
        folder: This package's folder.

    Returns:
        ``{stem: "compiled" or "pure (<reason>)"}``, from the module actually imported (a
        module imported before this ran keeps the copy it was imported from).
    """
    pure_python = (settings or CoreSettings.from_env()).pure_python
    active: dict[str, str] = {}
    for stem in COMPILED_MODULES:
        name = f"{PACKAGE}.{stem}"
        reason = pure_reason(stem, pure_python, folder)
        if name in sys.modules:
            module = sys.modules[name]
        elif reason is None:
            module = importlib.import_module(name)
        else:
            if reason.startswith("stale"):
                warnings.warn(f"{name}: {reason}; running its pure source", RuntimeWarning, 2)
            module = _load_source(name, folder / f"{stem}.py")
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
    "built_digests",
    "compiled_copy",
    "pure_reason",
    "select",
    "source_digest",
]
