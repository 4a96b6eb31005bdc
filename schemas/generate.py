"""Generate the JSON Schema files in ``schemas/jsonschema/`` from the event structs.

Run ``python -m runwatch.schemas.generate`` after changing ``schemas/events.py``; a test
fails while the checked-in files are stale. ``python -m runwatch.schemas.generate --check``
exits 1 when they are.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from runwatch.schemas.events import AnyEvent

OUT_DIR = Path(__file__).parent / "jsonschema"
_NONFINITE = {"type": "string", "enum": ["NaN", "Infinity", "-Infinity"]}


def _allow_nonfinite(node: Any) -> Any:
    """Let every ``number`` also be one of the non-finite tokens the codec writes."""
    if isinstance(node, dict):
        node = {k: _allow_nonfinite(v) for k, v in node.items()}
        if node.get("type") == "number":
            return {"anyOf": [node, _NONFINITE]}
        return node
    if isinstance(node, list):
        return [_allow_nonfinite(v) for v in node]
    return node


def render() -> dict[str, str]:
    """File name -> JSON text of every schema file."""
    (union,), components = msgspec.json.schema_components([AnyEvent])
    components = _allow_nonfinite(components)
    files: dict[str, str] = {}
    top = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "runwatch event",
        "description": "Any runwatch event; the `type` field names its struct and version.",
        **union,
        "$defs": components,
    }
    files["event.json"] = json.dumps(top, indent=2, sort_keys=True) + "\n"
    return files


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check`` verify) the schema files; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if files are stale")
    args = parser.parse_args(argv)
    stale = []
    for name, text in render().items():
        path = OUT_DIR / name
        current = path.read_text() if path.exists() else None
        if current != text:
            stale.append(name)
            if not args.check:
                OUT_DIR.mkdir(exist_ok=True)
                path.write_text(text)
    if args.check and stale:
        print(
            f"stale JSON Schema files: {', '.join(stale)}; run python -m runwatch.schemas.generate"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
