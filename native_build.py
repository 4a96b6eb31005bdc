"""Compile the pure core's hot kernels with mypyc, in place: ``make compiled`` runs it.

    .venv/bin/python native_build.py

Builds `runwatch.processors.core.native.COMPILED_MODULES` next to their sources (the
extensions are ignored by git) and writes ``native_sources.json`` there, the SHA-256 of each
source compiled, which `processors.core.native` compares with the source at import: an edit
without a rebuild runs the pure source, with a warning. Needs a C compiler and mypy (its
mypyc), both in the dev extra; without them the core runs pure, as it does when nothing was
built. Not a setup.py on purpose: ``pip install`` never compiles, so an install cannot fail
for want of a compiler.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
CORE = ROOT / "runwatch" / "processors" / "core"
GROUP = "runwatch.processors.core.kernels"
"""mypyc's group: the modules share one library, ``kernels__mypyc`` beside them (without a
name, a group of several modules gets a hashed one at the top of the tree)."""


def main() -> None:
    """Compile, then record what was compiled (only after the build succeeded)."""
    sys.path.insert(0, str(ROOT))
    from mypyc.build import mypycify
    from setuptools import Distribution

    from runwatch.processors.core.native import COMPILED_MODULES, MANIFEST, source_digest

    sources = [f"runwatch/processors/core/{stem}.py" for stem in COMPILED_MODULES]
    digests = {stem: source_digest(CORE / f"{stem}.py") for stem in COMPILED_MODULES}
    (CORE / MANIFEST).unlink(missing_ok=True)  # a failed build leaves no claim behind
    # A Distribution, not setup(): setup() would also read pyproject.toml's [project],
    # which is the package's, not this build's (and which an older setuptools rejects).
    build = Distribution(
        {
            "name": "runwatch-native",
            "ext_modules": mypycify(sources, opt_level="3", group_name=GROUP),
            "script_args": ["build_ext", "--inplace", "--build-temp", "build/native"],
        }
    )
    build.parse_command_line()
    build.run_commands()
    (CORE / MANIFEST).write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
    print(f"compiled: {', '.join(sorted(digests))}")


if __name__ == "__main__":
    main()
    # As mypy does: skip tearing down the type checker's object graph at exit, which took
    # minutes of garbage collection on a loaded box after the build had finished.
    sys.stdout.flush()
    os._exit(0)
