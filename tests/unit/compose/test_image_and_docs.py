"""The Dockerfile and the deployment/security docs agree with the code."""

from __future__ import annotations

import re

import pytest

from runwatch.settings import _SECURITY_ENV, SASL_MECHANISMS, SECURITY_PROTOCOLS

from .support import COMPOSE_DIR, REPO

DOCKERFILE = COMPOSE_DIR / "Dockerfile"
DOCKERIGNORE = COMPOSE_DIR / "Dockerfile.dockerignore"
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


def test_base_image() -> None:
    # The local Debian base (compose/images/build.sh), overridable with BASE_IMAGE.
    args = {rest.split("=")[0]: rest.partition("=")[2] for w, rest in _instructions() if w == "ARG"}
    assert args["BASE_IMAGE"] == "runwatch/debian:bookworm"
    froms = [rest for word, rest in _instructions() if word == "FROM"]
    assert froms == ["${BASE_IMAGE}"]


def test_torch_is_optional_via_build_arg() -> None:
    args = {rest.split("=")[0]: rest.partition("=")[2] for w, rest in _instructions() if w == "ARG"}
    assert args["WITH_TORCH"] == "false"
    runs = " ".join(rest for w, rest in _instructions() if w == "RUN")
    assert "WITH_TORCH" in runs and "torch" in runs


def test_copied_sources_exist_and_are_not_ignored() -> None:
    reincluded = {
        line[1:].split("/")[0]
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.startswith("!")
    }
    for word, rest in _instructions():
        if word != "COPY":
            continue
        *sources, _dest = rest.split()
        for src in sources:
            if src == "wheels":  # the dependencies' wheels: compose/images/build.sh makes them
                continue
            assert (REPO / src).exists(), f"COPY {src}: not in the repository"
            assert src in reincluded, f"COPY {src}: excluded by {DOCKERIGNORE.name}"


def test_every_package_is_copied() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    include = re.search(r"include = \[(.*?)\]", pyproject, flags=re.S)
    assert include
    packages = {p.strip(' "*') for p in include.group(1).split(",") if p.strip()}
    copied = {rest.split()[0] for w, rest in _instructions() if w == "COPY"}
    assert packages <= copied, f"packages not in the image: {packages - copied}"


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
