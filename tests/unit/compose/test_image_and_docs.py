"""The Dockerfile and the deployment/security docs agree with the code."""

from __future__ import annotations

import re

import pytest

from runwatch.common.settings import _SECURITY_ENV, SASL_MECHANISMS, SECURITY_PROTOCOLS

from .support import COMPOSE_DIR, REPO

DOCKERFILE = COMPOSE_DIR / "Dockerfile"
BUILD_SH = COMPOSE_DIR / "images" / "build.sh"
DEPLOY_MD = REPO / "docs" / "deploy.md"
SECURITY_MD = REPO / "docs" / "security.md"


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _args() -> dict[str, str]:
    out = {}
    for word, rest in _instructions():
        if word == "ARG":
            for item in rest.split():
                name, _, default = item.partition("=")
                out[name] = default
    return out


def _project_paths() -> list[str]:
    m = re.search(r"^PROJECT_PATHS=\((.*?)\)", BUILD_SH.read_text(), flags=re.M)
    assert m, "build.sh lists PROJECT_PATHS"
    return m.group(1).split()


def test_base_image() -> None:
    # The local Debian base (compose/images/build.sh), overridable with BASE_IMAGE.
    assert _args()["BASE_IMAGE"] == "runwatch/debian:bookworm"
    froms = [rest for word, rest in _instructions() if word == "FROM"]
    assert froms == ["${BASE_IMAGE}"]


def test_torch_is_optional_via_build_arg() -> None:
    assert _args()["WITH_TORCH"] == "false"
    runs = " ".join(rest for w, rest in _instructions() if w == "RUN")
    assert "WITH_TORCH" in runs and "torch" in runs


def test_copied_sources_come_from_the_context_build_sh_makes() -> None:
    copied = [rest.split()[0] for word, rest in _instructions() if word == "COPY"]
    assert copied == ["wheels", "src"]
    for path in _project_paths():
        assert (REPO / path).exists(), f"build.sh sends {path}: not in the repository"


def test_every_package_is_copied() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    include = re.search(r"include = \[(.*?)\]", pyproject, flags=re.S)
    assert include
    packages = {p.strip(' "*') for p in include.group(1).split(",") if p.strip()}
    assert packages <= set(_project_paths()), (
        f"not in the image: {packages - set(_project_paths())}"
    )


def test_runs_as_an_unprivileged_user() -> None:
    users = [rest for word, rest in _instructions() if word == "USER"]
    assert users and users[-1] not in ("root", "0")


@pytest.fixture(scope="module")
def security_md() -> str:
    return SECURITY_MD.read_text()


def test_security_doc_covers_every_variable(security_md: str) -> None:
    for var in [*_SECURITY_ENV, "RUNWATCH_COMMAND_KEY", "RUNWATCH_COMMAND_KEY_FILE"]:
        assert f"`{var}`" in security_md, f"docs/security.md does not document {var}"
    for kwarg in _SECURITY_ENV.values():
        assert f"`{kwarg}`" in security_md, f"docs/security.md does not name {kwarg}"
    for value in (*SECURITY_PROTOCOLS, *SASL_MECHANISMS):
        assert value in security_md
    for faust_name in ("broker_credentials", "SASLCredentials", "SSLCredentials"):
        assert faust_name in security_md


def test_deploy_doc_covers_operation() -> None:
    text = DEPLOY_MD.read_text()
    for needle in ("docker compose up", "--scale processors=", "replicas", "retention", "volume"):
        assert needle in text, f"docs/deploy.md does not mention {needle!r}"
