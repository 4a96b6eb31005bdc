"""Helpers for the compose tests: .env parsing, compose interpolation, PromQL and exporter names.

No Docker engine is needed: the files are parsed and cross-checked the way `docker compose`,
Prometheus and Grafana would read them.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
COMPOSE_DIR = REPO / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"
ENV_EXAMPLE = COMPOSE_DIR / ".env.example"
METRICS_MODULE = "runwatch.sinks.metrics"
METRICS_FILE = REPO / "sinks" / "metrics.py"

# ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error}, ${VAR?error}, $VAR; $$ is a literal $.
_VAR = re.compile(
    r"\$\$|\$\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
    r"|\$(?P<bare>[A-Za-z_][A-Za-z0-9_]*)"
)


class MissingVariable(KeyError):
    """A `${VAR:?message}` variable with no value."""


def parse_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of a compose .env file (comments and blank lines skipped)."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not KEY=VALUE: {line!r}"
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        out[key.strip()] = value
    return out


def variables_in(text: str) -> dict[str, str | None]:
    """Variables referenced in ``text`` -> their operator (``:-``, ``:?``, ... or None)."""
    found: dict[str, str | None] = {}
    for m in _VAR.finditer(text):
        name = m.group("braced") or m.group("bare")
        if name:
            found[name] = m.group("op")
    return found


def interpolate(value: str, env: Mapping[str, str]) -> str:
    """Substitute variables in one string as docker compose does."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group("braced") or m.group("bare")
        op, arg = m.group("op"), m.group("arg") or ""
        current = env.get(name)
        if op == ":-":
            return current if current else arg
        if op == "-":
            return current if current is not None else arg
        if op in (":?", "?") and (current is None or (op == ":?" and not current)):
            raise MissingVariable(f"{name}: {arg}")
        return current or ""

    return _VAR.sub(sub, value)


def interpolate_tree(node: Any, env: Mapping[str, str]) -> Any:
    """`interpolate` over every string of a parsed YAML document."""
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [interpolate_tree(v, env) for v in node]
    if isinstance(node, dict):
        return {k: interpolate_tree(v, env) for k, v in node.items()}
    return node


# --- PromQL -------------------------------------------------------------------------------

_PROMQL_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool",
    "and", "or", "unless", "inf", "nan", "atan2", "start", "end",
}  # fmt: skip
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w.:$])[A-Za-z_:][A-Za-z0-9_:]*")


def promql_metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (functions, labels, keywords left out)."""
    s = _STRINGS.sub('""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)  # range and subquery durations
    s = _LABEL_LISTS.sub(" ", s)
    s = re.sub(r"\$\{?\w+\}?", " ", s)  # Grafana variables
    names: set[str] = set()
    for m in _IDENT.finditer(s):
        word = m.group()
        if s[m.end() :].lstrip().startswith("(") or word.lower() in _PROMQL_KEYWORDS:
            continue
        names.add(word)
    return names


def template_query_metric_names(query: str) -> set[str]:
    """Metric names in a Grafana Prometheus variable query (``label_values(metric, label)``)."""
    m = re.fullmatch(r"\s*label_values\((?P<sel>.*),\s*\w+\s*\)\s*", query)
    if m:
        return promql_metric_names(m.group("sel"))
    m = re.fullmatch(r"\s*(?:query_result|metrics)\((?P<q>.*)\)\s*", query)
    return promql_metric_names(m.group("q") if m else query)


# --- The exporter -------------------------------------------------------------------------

# prometheus_client constructors -> metric type.
_METRIC_CALLS = {
    "Counter": "counter",
    "Gauge": "gauge",
    "Histogram": "histogram",
    "Summary": "summary",
    "Info": "info",
    "Enum": "stateset",
    "CounterMetricFamily": "counter",
    "GaugeMetricFamily": "gauge",
    "HistogramMetricFamily": "histogram",
    "SummaryMetricFamily": "summary",
    "InfoMetricFamily": "info",
    "StateSetMetricFamily": "stateset",
    "GaugeHistogramMetricFamily": "gaugehistogram",
    "UnknownMetricFamily": "unknown",
    "Metric": "unknown",
}


def exposed_names(name: str, kind: str) -> set[str]:
    """The sample names Prometheus stores for a metric family ``name`` of type ``kind``."""
    if kind == "counter":
        base = name.removesuffix("_total")
        return {f"{base}_total", f"{base}_created"}
    if kind == "histogram":
        return {f"{name}_bucket", f"{name}_sum", f"{name}_count", f"{name}_created"}
    if kind == "gaugehistogram":
        return {f"{name}_bucket", f"{name}_gsum", f"{name}_gcount"}
    if kind == "summary":
        return {name, f"{name}_sum", f"{name}_count", f"{name}_created"}
    if kind == "info":
        return {name if name.endswith("_info") else f"{name}_info"}
    return {name}


def _module_constants(tree: ast.Module) -> dict[str, str]:
    consts: dict[str, str] = {}
    for node in tree.body:
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            for t in targets:
                if isinstance(t, ast.Name):
                    consts[t.id] = value.value
    return consts


def _literal(node: ast.expr | None, consts: Mapping[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return consts.get(node.id)
    if isinstance(node, ast.JoinedStr):
        parts = []
        for v in node.values:
            if isinstance(v, ast.FormattedValue):
                part = _literal(v.value, consts)
            else:
                part = _literal(v, consts)
            if part is None:
                return None
            parts.append(part)
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _literal(node.left, consts), _literal(node.right, consts)
        return None if left is None or right is None else left + right
    return None


def exporter_names_from_source(path: Path) -> set[str]:
    """Sample names of every prometheus_client metric defined in ``path`` (by reading its AST)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    consts = _module_constants(tree)
    names: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if fname not in _METRIC_CALLS:
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        name = _literal(node.args[0] if node.args else kw.get("name"), consts)
        if name is None:
            continue
        prefix = [
            p
            for p in (_literal(kw.get("namespace"), consts), _literal(kw.get("subsystem"), consts))
            if p
        ]
        full = "_".join([*prefix, name])
        names |= exposed_names(full, _METRIC_CALLS[fname])
    return names


def _registries(module: Any) -> list[Any]:
    """Registries the exporter module holds or builds: module-level ones, and the
    ``registry`` of its `MetricsSink` (one registry per sink, built without Kafka, told it
    has caught up with its partitions so that it serves every family)."""
    from prometheus_client.registry import CollectorRegistry

    found = [v for v in vars(module).values() if isinstance(v, CollectorRegistry)]
    sink_class = getattr(module, "MetricsSink", None)
    if sink_class is not None:
        from runwatch.schemas.topics import names

        sink = sink_class(names())
        sink.on_assigned([("t", 0)])
        sink.on_lag({("t", 0): 0})  # caught up: every family is served
        found.append(sink.registry)
    return found


def exporter_names_from_collect() -> set[str]:
    """Sample names the exporter serves, by importing it and collecting its registries.

    Custom collectors yield every family at each scrape (empty ones too), so the names and
    types come from the code that renders /metrics, not from its documentation.
    """
    module = importlib.import_module(METRICS_MODULE)
    names: set[str] = set()
    for registry in _registries(module):
        for family in registry.collect():
            names |= exposed_names(family.name, family.type)
    return names


def exporter_metric_names() -> set[str]:
    """Every sample name the exporter (`sinks/metrics.py`) can expose."""
    return exporter_names_from_source(METRICS_FILE) | exporter_names_from_collect()
