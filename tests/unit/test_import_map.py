"""The import map of docs/architecture.md, drawn from the code and kept true by a test.

The map counts, for each pair of packages, how many files of the first import at least one
module of the second (imports inside functions included: an import anywhere is a
dependency). The packages are the layers of `tests/unit/test_layering.py`, with the
``runwatch`` layer cut into what it holds (the commands, the web view, the broker, the
rest). ``python -m tests.unit.test_import_map [ROOT]`` prints the map of a checkout (ROOT,
default this one): the page's "before" map was printed so from the commit before the
namespace (1b1185a), whose packages were still top-level; the "after" map is this test's.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from tests.unit.test_layering import LINKED, REPO, imports_in, layer_of

DOC = REPO / "docs" / "architecture.md"
BEGIN = "<!-- import-map:after (tests/unit/test_import_map.py writes and checks it) -->"
END = "<!-- /import-map:after -->"

SPLIT = ("cmd", "ui", "broker")
"""Sub-packages of ``runwatch`` shown apart: what the command line holds besides commands."""

ORDER = (
    "common",
    "schemas",
    "processors.core",
    "processors",
    "producers",
    "controller",
    "sinks",
    "runwatch.broker",
    "runwatch.ui",
    "runwatch.cmd",
    "runwatch",
)
"""Rows and columns, from the bottom layer up."""


def node_of(module: str) -> str | None:
    """The map's package of a module of ours; None for a third-party one or a tool's."""
    first = module.split(".")[0]
    if first not in ("runwatch", *LINKED):
        return None
    layer = layer_of(module)
    if layer == "runwatch":
        parts = module.split(".")
        if len(parts) > 1 and parts[1] in SPLIT:
            return f"runwatch.{parts[1]}"
    return layer


def source_files(root: Path) -> list[tuple[str, Path]]:
    """``(module, path)`` of every shipped file under ``root``, links not followed."""
    found = []
    for top in ("runwatch", *LINKED):
        base = root / top
        if not base.is_dir() or base.is_symlink():
            continue
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(root)
            if any((root / p).is_symlink() for p in rel.parents):
                continue
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found.append((".".join(parts), path))
    return found


def import_map(root: Path) -> Counter[tuple[str, str]]:
    """(importer, imported) -> how many files of the importer import the imported package."""
    edges: Counter[tuple[str, str]] = Counter()
    for module, path in source_files(root):
        here = node_of(module)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = {node_of(imp.module) for imp in imports_in(path.read_text(), package)}
        for target in targets - {None, here}:
            if here is not None and target is not None:
                edges[here, target] += 1
    return edges


def render(edges: Counter[tuple[str, str]]) -> str:
    """The map as a Markdown table: a row per importer, a column per imported package."""
    nodes = [n for n in ORDER if any(n in pair for pair in edges)]
    head = "| imports → | " + " | ".join(f"`{n}`" for n in nodes) + " |"
    rule = "|---|" + "---:|" * len(nodes)
    rows = [
        f"| `{a}` | " + " | ".join(str(edges.get((a, b), "")) for b in nodes) + " |"
        for a in nodes
        if any(pair[0] == a for pair in edges)
    ]
    return "\n".join([head, rule, *rows])


def documented() -> str:
    """The "after" map as docs/architecture.md holds it."""
    text = DOC.read_text()
    return text[text.index(BEGIN) + len(BEGIN) : text.index(END)].strip()


def test_the_documented_map_is_the_code_s():
    """A change of the packages' imports changes the page: rerun the module and paste."""
    assert documented() == render(import_map(REPO))


def test_the_map_counts_files_not_statements(tmp_path):
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "a.py").write_text(
        "from runwatch.common import x\nfrom runwatch.common.y import z\n"
    )
    (tmp_path / "sinks").mkdir()
    (tmp_path / "sinks" / "b.py").write_text("def f():\n    import runwatch.schemas.a\n")
    assert import_map(tmp_path) == Counter({("schemas", "common"): 1, ("sinks", "schemas"): 1})


def test_the_layers_only_point_down():
    """What the layering test forbids never shows as an upward arrow on the map.

    The parts of the ``runwatch`` layer (commands, web view, broker) may import each other;
    the core's one lazy import of the trainer side is the layering test's one exception.
    """
    edges = import_map(REPO)
    rank = {n: i for i, n in enumerate(ORDER)}
    upward = [
        (a, b)
        for a, b in edges
        if rank[a] < rank[b]
        and not a.startswith("runwatch")
        and (a, b) != ("processors.core", "producers")
    ]
    assert upward == []


if __name__ == "__main__":
    print(render(import_map(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO)))
