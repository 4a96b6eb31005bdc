"""A regular (non-editable) install used from a training project with its own packages.

The bug this holds off: runwatch used to install ``common``, ``schemas``, ``producers``, ...
as top-level packages, so a project with its own ``schemas/`` next to ``train.py`` (common
in ML repositories) shadowed runwatch's, and ``from producers import RunEmitter`` failed
with ``No module named 'schemas.codec'``. An editable install hides it; a wheel shows it.

The wheel is built from this checkout and installed without its dependencies into a fresh
venv; the dependencies come from the test's own environment through a path entry (not a
site dir, so its editable finder for the checkout never loads).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

USER_PACKAGES = ("common", "schemas", "producers", "processors", "sinks", "controller")
"""Packages a training project may well have of its own, each with a ``codec`` module."""

TRAIN_PY = textwrap.dedent(
    """
    import json, sys
    import schemas.codec, common.codec            # the project's own packages
    from runwatch import RunEmitter, TrainingHealthMonitor, get_training_backend
    import runwatch

    monitor = TrainingHealthMonitor()
    for step in range(40):
        monitor.observe_step(step, loss=3.0 - 0.01 * step, grad_norm=1.0, step_time_s=0.1)
    monitor.observe_step(40, loss=float("nan"), grad_norm=1.0, step_time_s=0.1)
    kinds = [a.kind for a in monitor.anomalies]
    loaded = sorted(m for m in ("torch", "faust", "kafka", "aiokafka") if m in sys.modules)
    print(json.dumps({
        "user": [schemas.codec.OWNER, common.codec.OWNER],
        "runwatch": runwatch.__file__,
        "emitter": RunEmitter.__module__,
        "backend": type(get_training_backend("torch-ddp").capabilities).__name__,
        "kinds": kinds,
        "heavy_loaded": loaded,
    }))
    """
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(out), str(REPO)],
        check=True, cwd=out, capture_output=True, timeout=300,
    )  # fmt: skip
    (built,) = out.glob("runwatch-*.whl")
    return built


def test_the_wheel_ships_one_top_level_package(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
        (top_level,) = [n for n in names if n.endswith("top_level.txt")]
        declared = zf.read(top_level).decode().split()
    assert top == {"runwatch"}
    assert declared == ["runwatch"]
    for package in USER_PACKAGES:
        assert f"runwatch/{package}/__init__.py" in names
    assert "runwatch/schemas/jsonschema/event.json" in names


def test_a_project_with_its_own_packages_uses_the_installed_wheel(
    wheel: Path, tmp_path: Path
) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = Path(
        subprocess.check_output(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            text=True,
        ).strip()
    )
    # The dependencies (msgspec, kafka-python, numpy, ...) from this environment, as a plain
    # path entry after the venv's own site-packages.
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
         str(wheel)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    project = tmp_path / "project"
    for package in USER_PACKAGES:
        (project / package).mkdir(parents=True)
        (project / package / "__init__.py").write_text("")
        (project / package / "codec.py").write_text(f"OWNER = 'project {package}'\n")
    (project / "train.py").write_text(TRAIN_PY)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}

    done = subprocess.run(
        [str(python), "train.py"], cwd=project, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["user"] == ["project schemas", "project common"]
    assert out["runwatch"].startswith(str(site))
    assert out["emitter"] == "runwatch.producers.emitter"
    assert out["backend"] == "BackendCapabilities"
    assert "nonfinite_loss" in out["kinds"]
    assert out["heavy_loaded"] == []
    cli = subprocess.run(
        [str(python), "-m", "runwatch.cli", "--version"],
        cwd=project, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert cli.returncode == 0 and cli.stdout.startswith("runwatch "), cli.stderr
