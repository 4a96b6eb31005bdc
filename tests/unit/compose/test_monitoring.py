"""Prometheus and Grafana: scrape targets, provisioning paths, and the dashboard's metrics."""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from .support import (
    COMPOSE_DIR,
    METRICS_FILE,
    METRICS_MODULE,
    exporter_metric_names,
    exporter_names_from_collect,
    exporter_names_from_source,
    promql_metric_names,
    template_query_metric_names,
)

yaml = pytest.importorskip("yaml", reason="pyyaml (dev extra) reads the compose files")

PROMETHEUS_YML = COMPOSE_DIR / "prometheus" / "prometheus.yml"
PROVISIONING = COMPOSE_DIR / "grafana" / "provisioning"
DASHBOARD = COMPOSE_DIR / "grafana" / "dashboards" / "runwatch.json"


def _listening_ports(service: dict[str, Any]) -> set[int]:
    """Container ports a service listens on: published, exposed, or set by a --*-port flag."""
    ports = {int(str(p).split(":")[-1].split("/")[0]) for p in service.get("ports", [])}
    ports |= {int(str(p).split("/")[0]) for p in service.get("expose", [])}
    command = service.get("command") or []
    if isinstance(command, list):
        for flag, value in itertools.pairwise(command):
            if re.fullmatch(r"--[\w-]*port", flag):
                ports.add(int(value))
        for arg in command:  # --web.listen-address=HOST:PORT (Prometheus)
            if re.fullmatch(r"--[\w.-]*listen-address=.*:\d+", str(arg)):
                ports.add(int(str(arg).rsplit(":", 1)[1]))
    if "GF_SERVER_HTTP_PORT" in (service.get("environment") or {}):
        ports.add(int(service["environment"]["GF_SERVER_HTTP_PORT"]))
    return ports


def _service_on(services: dict[str, dict[str, Any]], port: int) -> str:
    """The one service that listens on ``port`` (host networking: ports are the address)."""
    found = [name for name, svc in services.items() if port in _listening_ports(svc)]
    assert len(found) == 1, f"port {port}: {found or 'no service'} listens there"
    return found[0]


def _host_path(service: dict[str, Any], container_path: str) -> Path | None:
    """The file on this machine that a bind mount of ``service`` shows at ``container_path``."""
    wanted = PurePosixPath(container_path)
    best: tuple[int, Path] | None = None
    for entry in service.get("volumes", []):
        source, target, *_ = entry.split(":")
        target_path = PurePosixPath(target)
        if source.startswith(".") and (wanted == target_path or target_path in wanted.parents):
            depth = len(target_path.parts)
            if best is None or depth > best[0]:
                rel = wanted.relative_to(target_path)
                best = (depth, (COMPOSE_DIR / source / rel).resolve())
    return None if best is None else best[1]


def _flag(command: list[str], name: str) -> str:
    for part in command:
        if part.startswith(f"{name}="):
            return part.split("=", 1)[1]
    raise AssertionError(f"{name} not in {command}")


# --- Prometheus ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prometheus_config() -> dict[str, Any]:
    return yaml.safe_load(PROMETHEUS_YML.read_text())


def test_prometheus_mounts_this_config(services: dict[str, dict[str, Any]]) -> None:
    prom = services["prometheus"]
    config_path = _flag(prom["command"], "--config.file")
    assert _host_path(prom, config_path) == PROMETHEUS_YML.resolve()
    data = _flag(prom["command"], "--storage.tsdb.path")
    assert data in {t for s, t, *_ in (v.split(":") for v in prom["volumes"]) if s[0] not in "./"}
    assert re.fullmatch(r"\d+[dwy]", _flag(prom["command"], "--storage.tsdb.retention.time"))


def test_prometheus_targets_are_compose_services(
    prometheus_config: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    # Host networking: a target is a loopback port one compose service listens on.
    jobs = prometheus_config["scrape_configs"]
    assert len({j["job_name"] for j in jobs}) == len(jobs), "duplicate job names"
    for job in jobs:
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                host, port = target.rsplit(":", 1)
                assert host == "127.0.0.1", f"{job['job_name']}: {target} is not on loopback"
                _service_on(services, int(port))


def test_prometheus_scrapes_the_sinks_exporter(
    prometheus_config: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    command = services["sinks"]["command"]
    port = command[command.index("--metrics-port") + 1]
    targets = {
        t for job in prometheus_config["scrape_configs"] for s in job.get("static_configs", [])
        for t in s["targets"]
    }  # fmt: skip
    assert f"127.0.0.1:{port}" in targets


def test_prometheus_loads_the_shipped_rules(
    prometheus_config: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    (pattern,) = prometheus_config["rule_files"]
    folder, _, glob = pattern.rpartition("/")
    host = _host_path(services["prometheus"], folder)
    assert host == (COMPOSE_DIR / "prometheus" / "rules").resolve()
    assert sorted(host.glob(glob)), f"{pattern} matches no shipped rule file"


def test_prometheus_and_the_sinks_post_to_the_compose_alertmanager(
    prometheus_config: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    (manager,) = prometheus_config["alerting"]["alertmanagers"]
    (target,) = [t for s in manager["static_configs"] for t in s["targets"]]
    host, port = target.rsplit(":", 1)
    assert host == "127.0.0.1" and _service_on(services, int(port)) == "alertmanager"
    command = services["sinks"]["command"]
    assert command[command.index("--alertmanager") + 1] == f"http://127.0.0.1:{port}"


def test_alertmanager_mounts_the_shipped_config_and_a_volume(
    services: dict[str, dict[str, Any]],
) -> None:
    am = services["alertmanager"]
    assert am["entrypoint"] == ["/usr/bin/prometheus-alertmanager"]
    assert am["image"] == services["prometheus"]["image"], "Debian's package, same image"
    config = _host_path(am, _flag(am["command"], "--config.file"))
    assert config == (COMPOSE_DIR / "prometheus" / "alertmanager.yml").resolve()
    storage = _flag(am["command"], "--storage.path")
    assert storage in {t for s, t, *_ in (v.split(":") for v in am["volumes"]) if s[0] not in "./"}
    assert _flag(am["command"], "--cluster.listen-address") == "", "one instance: no gossip"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed: `make tools` installs it (root + apt-get)")
    return path


@pytest.mark.parametrize(
    ("tool", "args", "path"),
    [
        ("promtool", ["check", "config"], PROMETHEUS_YML),
        ("amtool", ["check-config"], COMPOSE_DIR / "prometheus" / "alertmanager.yml"),
    ],
    ids=["prometheus.yml", "alertmanager.yml"],
)
def test_the_shipped_configs_are_valid(tool: str, args: list[str], path: Path) -> None:
    done = subprocess.run(
        [_tool(tool), *args, str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


# --- Grafana provisioning -----------------------------------------------------------------


@pytest.fixture(scope="module")
def datasources() -> list[dict[str, Any]]:
    docs = [yaml.safe_load(p.read_text()) for p in sorted(PROVISIONING.glob("datasources/*.y*ml"))]
    assert docs, "no datasource is provisioned"
    return [ds for doc in docs for ds in doc["datasources"]]


def test_grafana_mounts_the_provisioning_dir(services: dict[str, dict[str, Any]]) -> None:
    assert _host_path(services["grafana"], "/etc/grafana/provisioning") == PROVISIONING.resolve()


def test_datasource_points_at_prometheus(
    datasources: list[dict[str, Any]], services: dict[str, dict[str, Any]]
) -> None:
    (prom,) = [ds for ds in datasources if ds["type"] == "prometheus"]
    m = re.fullmatch(r"http://127\.0\.0\.1:(\d+)/?", prom["url"])
    assert m, prom["url"]
    assert _service_on(services, int(m.group(1))) == "prometheus"
    assert prom["uid"]


def test_dashboard_providers_point_at_existing_files(services: dict[str, dict[str, Any]]) -> None:
    docs = [yaml.safe_load(p.read_text()) for p in sorted(PROVISIONING.glob("dashboards/*.y*ml"))]
    providers = [p for doc in docs for p in doc["providers"]]
    assert providers, "no dashboard provider"
    for provider in providers:
        assert provider["type"] == "file"
        host = _host_path(services["grafana"], provider["options"]["path"])
        assert host is not None, f"{provider['options']['path']} is not mounted from the repo"
        assert host.is_dir() and list(host.glob("*.json")), f"no dashboards in {host}"
        assert DASHBOARD.resolve().parent == host


def test_home_dashboard_exists(services: dict[str, dict[str, Any]]) -> None:
    grafana = services["grafana"]
    path = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert _host_path(grafana, path) == DASHBOARD.resolve()


# --- The dashboard ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def _exprs(dashboard: dict[str, Any]) -> dict[str, str]:
    """Every PromQL expression: '<panel title>/<refId>' -> expr."""
    return {
        f"{p['title']}/{t['refId']}": t["expr"]
        for p in _panels(dashboard)
        for t in p.get("targets", [])
    }


def _dashboard_metrics(dashboard: dict[str, Any]) -> dict[str, set[str]]:
    used = {where: promql_metric_names(expr) for where, expr in _exprs(dashboard).items()}
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            used[f"${var['name']}"] = template_query_metric_names(query)
    return used


def test_dashboard_structure(dashboard: dict[str, Any], datasources: list[dict[str, Any]]) -> None:
    assert dashboard["uid"] and dashboard["title"]
    panels = _panels(dashboard)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    uids = {ds["uid"] for ds in datasources}
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel.get("targets"), f"panel {panel['title']!r} has no query"
        assert panel["datasource"]["uid"] in uids, f"{panel['title']}: unknown datasource"
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs))
        for target in panel["targets"]:
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]
            assert target["expr"].count("{") == target["expr"].count("}"), target["expr"]


def test_every_query_selects_a_metric(dashboard: dict[str, Any]) -> None:
    for where, names in _dashboard_metrics(dashboard).items():
        assert names, f"{where}: no metric found in the query"


def test_dashboard_shows_what_the_issue_asks_for(dashboard: dict[str, Any]) -> None:
    used = set().union(*_dashboard_metrics(dashboard).values())
    for topic in ("loss", "mfu", "anomal", "restart"):
        assert any(topic in name for name in used), f"no panel about {topic}"
    restarts = [e for e in _exprs(dashboard).values() if "restart" in e]
    assert any("by (run)" in e for e in restarts), "restarts are not shown per run"


def test_dashboard_metrics_exist_in_the_exporter(dashboard: dict[str, Any]) -> None:
    if not METRICS_FILE.is_file():
        used = sorted(set().union(*_dashboard_metrics(dashboard).values()))
        pytest.skip(f"{METRICS_MODULE} does not exist yet; the dashboard assumes {used}")
    exported = exporter_metric_names()
    assert exported, f"found no metric definitions in {METRICS_FILE}"
    for where, names in _dashboard_metrics(dashboard).items():
        missing = names - exported
        assert not missing, (
            f"{where} uses {sorted(missing)}, which {METRICS_MODULE} does not export "
            f"(it exports {sorted(n for n in exported if n.startswith('runwatch'))})"
        )


# --- The helpers themselves ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('runwatch_loss{run=~"$run"}', {"runwatch_loss"}),
        (
            'sum by (run, kind) (increase(runwatch_anomalies_total{run=~"$run"}[$__rate_interval]))',
            {"runwatch_anomalies_total"},
        ),
        ("sum(rate(a_total[5m])) by (job) / on (job) group_left(x) b", {"a_total", "b"}),
        ('max_over_time(x{l="by (y)"}[1h:5m] offset 1d) > bool 0.5e3', {"x"}),
        ("histogram_quantile(0.9, sum by (le) (rate(h_bucket[$__interval])))", {"h_bucket"}),
        ("topk(5, c) and d unless e or f", {"c", "d", "e", "f"}),
        ("vector(1)", set()),
    ],
)
def test_promql_metric_names(expr: str, names: set[str]) -> None:
    assert promql_metric_names(expr) == names


def test_template_query_metric_names() -> None:
    assert template_query_metric_names("label_values(runwatch_last_step, run)") == {
        "runwatch_last_step"
    }
    assert template_query_metric_names('label_values(m{job="x"}, run)') == {"m"}


def test_exporter_names_from_source(tmp_path: Path) -> None:
    src = tmp_path / "metrics.py"
    src.write_text(
        "from prometheus_client import Counter, Gauge, Histogram\n"
        "from prometheus_client.core import GaugeMetricFamily\n"
        "import prometheus_client as pc\n"
        "PREFIX = 'runwatch'\n"
        "LOSS = Gauge('runwatch_loss', 'loss', ['run'])\n"
        "A = Counter(name='runwatch_anomalies_total', documentation='x')\n"
        "R = pc.Counter('restarts', 'x', namespace=PREFIX)\n"
        "H = Histogram(f'{PREFIX}_step_seconds', 'x')\n"
        "def collect():\n"
        "    yield GaugeMetricFamily(PREFIX + '_consumer_lag', 'lag', labels=['topic'])\n"
    )
    names = exporter_names_from_source(src)
    assert {
        "runwatch_loss",
        "runwatch_anomalies_total",
        "runwatch_restarts_total",
        "runwatch_step_seconds_bucket",
        "runwatch_step_seconds_count",
        "runwatch_consumer_lag",
    } <= names
    assert "runwatch_anomalies" not in names


def test_exporter_names_come_from_the_served_families() -> None:
    if not METRICS_FILE.is_file():
        pytest.skip(f"{METRICS_MODULE} does not exist yet")
    names = exporter_names_from_collect()
    # A counter family is served with the _total suffix; its bare name is not a series.
    assert "runwatch_anomalies_total" in names and "runwatch_anomalies" not in names
