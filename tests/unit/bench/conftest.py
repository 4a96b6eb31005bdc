"""Import the bench modules under test (bench/ is a directory of scripts, not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[3] / "bench"

sys.path.insert(0, str(BENCH))
try:
    import curve_events  # noqa: F401
    import llm_corpus  # noqa: F401
    import llm_quality  # noqa: F401
    import spike_census  # noqa: F401
finally:
    sys.path.remove(str(BENCH))


def load_script(stem: str) -> ModuleType:
    """``bench/<stem>.py`` loaded by path as ``bench_<stem>``, as the benches load each other
    (not by its own name: ``processors`` is the package's). Registered in `sys.modules`
    while it runs: a script's dataclasses look their module up there."""
    name = f"bench_{stem}"
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{stem}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
