"""The broker's jars: fetched from Maven Central with Maven into a versioned libs directory.

``compose/kafka-embedded/pom.xml`` lists Apache Kafka's runtime artifacts; `ensure_jars` runs
``mvn dependency:copy-dependencies`` on it once and records the result in a completion marker.
Failures become one-line `RunwatchError` messages carrying Maven's root cause.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
from pathlib import Path

from runwatch.broker.config import ASSEMBLY_DIR, KAFKA_VERSION
from runwatch.broker.files import file_lock, write_json
from runwatch.common.errors import RunwatchError
from runwatch.common.settings import runwatch_home

logger = logging.getLogger("runwatch.broker")  # the package's logger, as before the split

_MARKER = ".runwatch-complete"
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Fully qualified, so a failed download names the artifact rather than "no plugin for prefix".
_MAVEN_HELP_REF = re.compile(r"\s*-> \[Help \d+\]$")
_COPY_GOAL = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies"
_MAVEN_BOILERPLATE = (
    "-> [Help",
    "[Help ",
    "To see the full stack trace",
    "Re-run Maven using",
    "For more information about the errors",
    "After correcting the problems",
    "mvn <args> -rf",
)


def kafka_libs_dir(kafka_version: str = KAFKA_VERSION) -> Path:
    """Where the broker's jars are cached: ``$RUNWATCH_HOME/kafka/<version>/libs``."""
    return runwatch_home() / "kafka" / kafka_version / "libs"


def assembly_pom() -> Path:
    """The Maven pom that assembles the broker's jars (``compose/kafka-embedded/pom.xml``).

    Raises:
        RunwatchError: when runwatch does not run from its source tree (editable install or
            checkout), so the pom is not there.
    """
    pom = ASSEMBLY_DIR / "pom.xml"
    if not pom.is_file():
        raise RunwatchError(
            f"cannot find {pom}: fetching the Kafka jars needs runwatch's source tree "
            "(run from the repo or `pip install -e .`)"
        )
    return pom


def _jars_complete(libs_dir: Path, kafka_version: str) -> bool:
    marker = libs_dir / _MARKER
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    jars = recorded.get("jars") if isinstance(recorded, dict) else None
    if recorded.get("kafka_version") != kafka_version or not jars:
        return False
    return all((libs_dir / jar).is_file() for jar in jars)


def _require_tool(name: str, hint: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RunwatchError(f"no `{name}` on PATH: {hint}")
    return path


def require_java() -> str:
    """The path of ``java``.

    Raises:
        RunwatchError: no ``java`` on PATH.
    """
    return _require_tool("java", "install a Java 17+ runtime (e.g. openjdk-17-jre-headless)")


def last_meaningful_line(output: str) -> str:
    """The root cause in a tool's output: its last line that is not boilerplate (ANSI-free)."""
    lines = []
    for raw in output.splitlines():
        line = _ANSI_ESCAPE.sub("", raw).strip()
        if line.startswith("[ERROR]"):
            line = line[len("[ERROR]") :].strip()
        line = _MAVEN_HELP_REF.sub("", line)
        if not line or any(line.startswith(b) for b in _MAVEN_BOILERPLATE):
            continue
        lines.append(line)
    if not lines:
        return "no output"
    line = lines[-1]  # Maven puts the root cause at the end of its long error line
    return line if len(line) <= 400 else f"{line[:150]} ... {line[-250:]}"


def ensure_jars(
    libs_dir: Path | None = None,
    *,
    kafka_version: str = KAFKA_VERSION,
    timeout_s: float = 900.0,
) -> Path:
    """Make sure the broker's jars are in ``libs_dir``; fetch them with Maven if not.

    Runs ``mvn dependency:copy-dependencies`` on the assembly pom only when the directory
    lacks a completion marker (or a jar it lists); writes the marker after success. Safe to
    call from several processes at once (a file lock serialises the fetch).

    Args:
        libs_dir: Target directory; `kafka_libs_dir(kafka_version)` when None.
        kafka_version: Apache Kafka release to fetch.
        timeout_s: Longest the Maven run may take.

    Returns:
        The directory holding the jars.

    Raises:
        RunwatchError: no ``java`` or ``mvn`` on PATH, or Maven failed (typically Maven
            Central unreachable); the message carries Maven's last meaningful line.
    """
    libs = kafka_libs_dir(kafka_version) if libs_dir is None else libs_dir
    if _jars_complete(libs, kafka_version):
        return libs
    with file_lock(libs.parent / ".fetch.lock"):
        if _jars_complete(libs, kafka_version):
            return libs
        require_java()
        mvn = _require_tool("mvn", "install Maven 3.6+ (e.g. apt-get install maven) to fetch Kafka")
        pom = assembly_pom()
        libs.mkdir(parents=True, exist_ok=True)
        cmd = [
            mvn,
            "-q",
            "-B",
            "-Dstyle.color=never",
            "-f",
            str(pom),
            f"-Dkafka.version={kafka_version}",
            f"-Dkafka.libs.dir={libs}",
            _COPY_GOAL,
        ]
        logger.warning(
            "fetching Apache Kafka %s jars from Maven Central into %s", kafka_version, libs
        )
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise RunwatchError(
                f"mvn took over {timeout_s:.0f} s fetching Kafka {kafka_version} jars "
                "(is Maven Central reachable?)"
            ) from exc
        if done.returncode != 0:
            line = last_meaningful_line(done.stdout + "\n" + done.stderr)
            raise RunwatchError(
                f"mvn failed fetching Kafka {kafka_version} jars (is Maven Central reachable?): "
                f"{line}"
            )
        jars = sorted(p.name for p in libs.glob("*.jar"))
        if f"kafka_2.13-{kafka_version}.jar" not in jars:
            raise RunwatchError(f"mvn succeeded but {libs} has no kafka_2.13-{kafka_version}.jar")
        write_json(libs / _MARKER, {"kafka_version": kafka_version, "jars": jars})
        return libs
