"""The Prometheus rules shipped in compose/prometheus/rules, checked by promtool and by us.

`promtool check rules` and `promtool test rules` (the unit tests in
compose/prometheus/tests) run here; `promtool check metrics` runs on the exporter's real
/metrics output (its sinks folded from real events, served over HTTP). promtool comes with
Debian's `prometheus` package, which `make tools` installs (root + apt-get); without it
these tests are skipped, saying so. The cross-checks below need no promtool: every metric
a rule reads is one the exporter serves, every rule has a severity and a runbook section.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from .support import (
    COMPOSE_DIR,
    REPO,
    exporter_metric_names,
    exporter_names_from_source,
    promql_metric_names,
)

yaml = pytest.importorskip("yaml", reason="pyyaml (dev extra) reads the rule files")

RULES_DIR = COMPOSE_DIR / "prometheus" / "rules"
RULE_TESTS_DIR = COMPOSE_DIR / "prometheus" / "tests"
RUNBOOKS = REPO / "docs" / "runbooks.md"
SEVERITIES = {"critical", "warning", "info"}
PROMETHEUS_OWN = {"up"}
"""Series Prometheus writes itself."""


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip(
            "promtool is not installed: `make tools` installs Debian's prometheus package "
            "(as root, with apt-get)"
        )
    return path


def run_promtool(*args: str, stdin: str | None = None, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [promtool(), *args], input=stdin, capture_output=True, text=True, timeout=120, cwd=cwd
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"promtool {' '.join(args)} failed:\n{output}"
    return output


def rule_files() -> list[Path]:
    files = sorted(RULES_DIR.glob("*.yml"))
    assert files, f"no rule files in {RULES_DIR}"
    return files


def rules() -> list[dict[str, Any]]:
    return [
        rule
        for path in rule_files()
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    ]


# --------------------------------------------------------------------------- promtool


def test_promtool_check_rules():
    output = run_promtool("check", "rules", *map(str, rule_files()))
    assert f"SUCCESS: {len(rules())} rules found" in output


def test_promtool_test_rules():
    tests = sorted(RULE_TESTS_DIR.glob("*_test.yml"))
    assert tests, f"no rule tests in {RULE_TESTS_DIR}"
    output = run_promtool("test", "rules", *(t.name for t in tests), cwd=RULE_TESTS_DIR)
    assert "SUCCESS" in output and "FAILED" not in output


def test_every_alert_rule_has_a_unit_test():
    tested = {
        case["alertname"]
        for path in RULE_TESTS_DIR.glob("*_test.yml")
        for test in yaml.safe_load(path.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    alerts = {r["alert"] for r in rules() if "alert" in r}
    assert alerts <= tested, f"alerts no test sees firing: {sorted(alerts - tested)}"


def _exporter_output() -> str:
    """/metrics of a metrics sink that folded real events, with every receiver figure."""
    from runwatch.schemas.codec import encode, encode_key
    from runwatch.schemas.events import DeadLetter, Provenance
    from runwatch.schemas.records import RawRecord
    from runwatch.schemas.topics import names
    from runwatch.sinks.delivery_figures import DeliveryFigures
    from runwatch.sinks.metrics import MetricsSink
    from tests.unit.sinks.events import (
        anomaly,
        completed,
        ended,
        failed,
        heartbeat,
        rejected,
        restart,
        started,
        step,
    )

    t = names("p")
    figures = DeliveryFigures()
    figures.add_receiver("http://127.0.0.1:9093")
    figures.record("http://127.0.0.1:9093", attempts=3, ok=True)
    figures.add_pending_source(lambda: {"http://127.0.0.1:9093": 2})
    sink = MetricsSink(t, collectors=[figures])
    dead = DeadLetter(
        run_id="?", ts_ns=1, source=Provenance(topic=t.steps, partition=0, offset=4), reason="x"
    )
    items = [
        (t.steps, started()),
        (t.steps, step(n=3)),
        (t.heartbeats, heartbeat()),
        (t.anomalies, anomaly()),
        (t.commands, restart()),
        (t.controller, completed()),
        (t.controller, failed(cid="c2")),
        (t.controller, rejected(cid="c3")),
        (t.steps, started(run="r2")),
        (t.steps, ended(run="r2")),
        (t.deadletter, dead),
    ]
    records = [
        RawRecord(topic, 0, i, encode_key(e.run_id), encode(e), 0)
        for i, (topic, e) in enumerate(items)
    ]
    sink.handle(records, 0.0)
    sink.on_assigned([(t.steps, 0)])
    sink.on_lag({(t.steps, 0): 0})
    port = sink.serve(0, "127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            return str(r.read().decode())
    finally:
        sink.close()


def test_promtool_check_metrics_on_the_exporters_output():
    tool = promtool()
    text = _exporter_output()
    for name in (
        "runwatch_dead_letters_total",
        "runwatch_run_ended",
        "runwatch_alert_deliveries_pending",
    ):
        assert f"\n{name}{{" in text, f"{name} is not in the output checked"
    done = subprocess.run(
        [tool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), (
        done.stdout + done.stderr
    )


# --------------------------------------------------------------------------- cross-checks


def _served_names() -> set[str]:
    sinks = REPO / "sinks"
    extra = exporter_names_from_source(sinks / "group_probe.py")
    extra |= exporter_names_from_source(sinks / "delivery_figures.py")
    return exporter_metric_names() | extra | PROMETHEUS_OWN


@pytest.mark.parametrize("rule", rules(), ids=lambda r: r.get("alert") or r.get("record"))
def test_a_rule_reads_metrics_the_exporter_serves(rule):
    used = promql_metric_names(rule["expr"])
    assert used, f"no metric in {rule['expr']!r}"
    missing = used - _served_names()
    assert not missing, f"{rule.get('alert')} reads {sorted(missing)}, which nothing serves"


def runbook_anchors() -> set[str]:
    return set(re.findall(r'<a id="([a-z0-9-]+)"></a>', RUNBOOKS.read_text()))


@pytest.mark.parametrize("rule", rules(), ids=lambda r: r.get("alert") or r.get("record"))
def test_a_rule_has_a_severity_and_a_runbook_section(rule):
    assert rule["labels"]["severity"] in SEVERITIES
    annotations = rule["annotations"]
    assert annotations["summary"] and annotations["description"]
    page, _, anchor = annotations["runbook_url"].partition("#")
    assert page == "docs/runbooks.md" and anchor in runbook_anchors(), annotations["runbook_url"]


def test_every_alert_kind_of_the_sinks_has_a_runbook_section():
    from runwatch.sinks.alert_rules import ALERT_RULES

    missing = {rule.runbook for rule in ALERT_RULES.values()} - runbook_anchors()
    assert not missing, f"docs/runbooks.md has no section {sorted(missing)}"


# --------------------------------------------------------------------------- the routing example


def amtool() -> str:
    path = shutil.which("amtool")
    if path is None:
        pytest.skip(
            "amtool is not installed: `make tools` installs Debian's prometheus-alertmanager "
            "(as root, with apt-get)"
        )
    return path


@pytest.fixture(scope="module")
def routing_example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Alertmanager routing example of docs/deploy.md, as a file."""
    text = (REPO / "docs" / "deploy.md").read_text()
    section = text[text.index("## Alerting: Alertmanager") :]
    section = section[: section.index("\n## ", 1)]
    (block,) = re.findall(r"```yaml\n(.*?)```", section, re.S)
    path = tmp_path_factory.mktemp("routing") / "alertmanager.yml"
    path.write_text(block)
    return path


def test_the_routing_example_is_a_valid_alertmanager_config(routing_example: Path) -> None:
    done = subprocess.run(
        [amtool(), "check-config", str(routing_example)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (["alertname=dead_rank", "team=llm", "severity=critical", "run=r1"], "llm-pager"),
        (["alertname=loss_spike", "team=llm", "severity=warning", "run=r1"], "llm-chat"),
        (["alertname=hang", "team=vision", "severity=critical", "run=r2"], "vision-chat"),
        (["alertname=RunwatchProcessorsDown", "severity=critical", "group=g"], "platform-pager"),
        (["alertname=hang", "team=speech", "severity=critical", "run=r3"], "fallback"),
    ],
    ids=["llm-critical", "llm-warning", "vision", "pipeline", "other-team"],
)
def test_the_routing_example_routes_by_team_and_severity(
    routing_example: Path, labels: list[str], receiver: str
) -> None:
    done = subprocess.run(
        [amtool(), "config", "routes", "test", f"--config.file={routing_example}", *labels],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip() == receiver, done.stdout + done.stderr
