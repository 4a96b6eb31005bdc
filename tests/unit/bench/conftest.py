"""Import the bench modules under test (bench/ is a directory of scripts, not a package)."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "bench"

sys.path.insert(0, str(BENCH))
try:
    import curve_events  # noqa: F401
    import llm_corpus  # noqa: F401
    import llm_quality  # noqa: F401
    import spike_census  # noqa: F401
finally:
    sys.path.remove(str(BENCH))
