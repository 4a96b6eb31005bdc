"""Library logging stays off the user's screen; -v adds ours and the clients' info, -vv all.

Against the session broker, through the real CLI and the real kafka-python.
"""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from tests.integration.cli.cli import ROOT, runwatch


def _status(bootstrap: str, *flags: str) -> subprocess.CompletedProcess[str]:
    app_id = f"t{uuid.uuid4().hex[:10]}-app"  # no changelogs: nothing to show, quickly
    result = runwatch(*flags, "status", "--bootstrap", bootstrap, "--app-id", app_id)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("no runs known to the processors"), result.stdout
    return result


def test_default_shows_no_library_logging(kafka_bootstrap: str) -> None:
    assert _status(kafka_bootstrap).stderr == ""


def test_v_shows_client_info_but_not_their_debug(kafka_bootstrap: str) -> None:
    err = _status(kafka_bootstrap, "-v").stderr
    assert " INFO kafka." in err  # asked for: the clients' info is there
    assert " DEBUG kafka." not in err and " DEBUG aiokafka." not in err


def test_v_works_after_the_command_too(kafka_bootstrap: str) -> None:
    app_id = f"t{uuid.uuid4().hex[:10]}-app"
    result = runwatch("status", "-v", "--bootstrap", kafka_bootstrap, "--app-id", app_id)
    assert result.returncode == 0 and " INFO kafka." in result.stderr


def test_vv_shows_client_internals(kafka_bootstrap: str) -> None:
    assert " DEBUG kafka." in _status(kafka_bootstrap, "-vv").stderr


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=True,
    )


@pytest.mark.parametrize(("verbosity", "shown"), [(0, False), (1, True)])
def test_kafka_python_warnings_only_with_v(
    kafka_bootstrap: str, verbosity: int, shown: bool
) -> None:
    """kafka-python's own `group_id is None` warning: hidden by default, shown under -v."""
    code = (
        "from runwatch.cli import setup_logging\n"
        f"setup_logging({verbosity})\n"
        "from kafka import KafkaConsumer\n"
        f"KafkaConsumer(bootstrap_servers={kafka_bootstrap!r}).close()\n"
    )
    assert ("group_id is None" in _python(code).stderr) is shown


def test_the_fleet_reader_asks_for_no_auto_commit(kafka_bootstrap: str, make_topics, topic_prefix):
    """The consumer behind the demo's wait for the processors warned into its live view."""
    specs = make_topics(topic_prefix, partitions=1)
    code = (
        "import logging\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "from runwatch.processors.fleet import wait_until_processed\n"
        f"wait_until_processed({kafka_bootstrap!r}, 'none-app', [{specs[0].name!r}])\n"
    )
    assert "group_id is None" not in _python(code).stderr
