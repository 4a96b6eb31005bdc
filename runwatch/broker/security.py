"""A secure embedded broker: SASL/SCRAM-SHA-512 for clients, an authorizer, a user per role.

``runwatch broker start --secure`` makes a data directory secure for good (a data
directory's security is fixed when its storage is formatted):

* the client listener is ``SASL_PLAINTEXT`` with SCRAM-SHA-512 only; the broker's own
  connections (inter-broker, as the admin) use it too;
* the KRaft controller listener authenticates with SASL PLAIN (KRaft cannot use SCRAM
  there: the controller needs the credential before it has read the metadata that holds
  SCRAM credentials); it is on loopback and only the broker itself uses it;
* `AUTHORIZER` (Kafka's StandardAuthorizer) with ``allow.everyone.if.no.acl.found=false``
  and one super user, `ADMIN_USER`, the broker's own identity and the one that manages
  users and ACLs;
* one SCRAM user per `runwatch.broker.acls.Role`, named after it, and the ACLs of
  `runwatch.broker.acls` applied for a prefix and app id.

The admin's SCRAM credential is written into the metadata when the storage is formatted
(``--add-scram``); the roles' users are created afterwards through the Admin API, as the
admin. Passwords are random (`secrets.token_urlsafe`), generated once and kept in
``credentials/credentials.json`` under the data directory (0600, the directory 0700),
with one ``credentials/<user>.env`` shell snippet per user (``runwatch broker env``
prints one).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from runwatch.broker.acls import Role
from runwatch.broker.files import write_private
from runwatch.common.errors import RunwatchError
from runwatch.common.settings import (
    ENV_BOOTSTRAP,
    ENV_SASL_MECHANISM,
    ENV_SASL_PASSWORD,
    ENV_SASL_USERNAME,
    ENV_SECURITY_PROTOCOL,
    ENV_TRAINER_SASL_PASSWORD,
    ENV_TRAINER_SASL_USERNAME,
)

ADMIN_USER: Final = "admin"
"""The broker's super user: its own identity, and the one that manages users and ACLs."""

MECHANISM: Final = "SCRAM-SHA-512"
"""The clients' SASL mechanism."""

PROTOCOL: Final = "SASL_PLAINTEXT"
"""The clients' security protocol (loopback only: no TLS)."""

AUTHORIZER: Final = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
"""KRaft's authorizer: ACLs kept in the cluster metadata."""

CREDENTIALS_DIR: Final = "credentials"
"""The directory of a secure broker's passwords, under its data directory."""

_CREDENTIALS_FILE: Final = "credentials.json"


def users() -> tuple[str, ...]:
    """Every user of a secure embedded broker: the admin, then one per role."""
    return (ADMIN_USER, *(role.value for role in Role))


def credentials_dir(data_dir: Path) -> Path:
    """Where a secure broker's passwords live: ``<data dir>/credentials``."""
    return data_dir / CREDENTIALS_DIR


def is_secure(data_dir: Path) -> bool:
    """True if ``data_dir`` holds a secure broker (its credentials exist)."""
    return (credentials_dir(data_dir) / _CREDENTIALS_FILE).is_file()


@dataclass(frozen=True)
class Credentials:
    """The passwords of a secure broker's users.

    Attributes:
        passwords: User name -> password, for the admin and every role.
    """

    passwords: Mapping[str, str]

    def password(self, user: str) -> str:
        """The password of ``user``.

        Raises:
            RunwatchError: no such user.
        """
        try:
            return self.passwords[user]
        except KeyError:
            raise RunwatchError(
                f"the broker has no user {user!r}; users: {', '.join(self.passwords)}"
            ) from None

    def client_config(self, user: str) -> dict[str, Any]:
        """kafka-python's security settings to connect as ``user``."""
        return {
            "security_protocol": PROTOCOL,
            "sasl_mechanism": MECHANISM,
            "sasl_plain_username": user,
            "sasl_plain_password": self.password(user),
        }

    def environ(self, user: str, bootstrap: str) -> dict[str, str]:
        """The ``RUNWATCH_*`` variables a process needs to connect as ``user``.

        The controller's also carry the trainer's login for the ranks ``runwatch launch``
        starts (`common.settings.ranks_environ`).
        """
        env = {
            ENV_BOOTSTRAP: bootstrap,
            ENV_SECURITY_PROTOCOL: PROTOCOL,
            ENV_SASL_MECHANISM: MECHANISM,
            ENV_SASL_USERNAME: user,
            ENV_SASL_PASSWORD: self.password(user),
        }
        if user == Role.CONTROLLER.value:
            env[ENV_TRAINER_SASL_USERNAME] = Role.TRAINER.value
            env[ENV_TRAINER_SASL_PASSWORD] = self.password(Role.TRAINER.value)
        return env

    def env_snippet(self, user: str, bootstrap: str) -> str:
        """Shell lines exporting `environ` (``eval "$(runwatch broker env trainer)"``)."""
        lines = [f"# runwatch: user {user} of the embedded broker at {bootstrap}"]
        lines += [f"export {k}={v}" for k, v in self.environ(user, bootstrap).items()]
        return "\n".join(lines) + "\n"

    def broker_properties(self) -> dict[str, str]:
        """``server.properties`` entries of a secure node (besides its listeners)."""
        admin = self.password(ADMIN_USER)
        scram = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{ADMIN_USER}" password="{admin}";'
        )
        plain = (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="{ADMIN_USER}" password="{admin}" user_{ADMIN_USER}="{admin}";'
        )
        return {
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            "sasl.mechanism.controller.protocol": "PLAIN",
            "listener.name.sasl_plaintext.sasl.enabled.mechanisms": MECHANISM,
            f"listener.name.sasl_plaintext.{MECHANISM.lower()}.sasl.jaas.config": scram,
            "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.controller.plain.sasl.jaas.config": plain,
            "authorizer.class.name": AUTHORIZER,
            "super.users": f"User:{ADMIN_USER}",
            "allow.everyone.if.no.acl.found": "false",
        }

    def format_arguments(self) -> list[str]:
        """The storage tool's arguments that write the admin's SCRAM credential."""
        admin = self.password(ADMIN_USER)
        return ["--add-scram", f"{MECHANISM}=[name={ADMIN_USER},password={admin}]"]


def load_credentials(data_dir: Path) -> Credentials:
    """The credentials of the secure broker in ``data_dir``.

    Raises:
        RunwatchError: ``data_dir`` holds no secure broker, or its file is unreadable.
    """
    path = credentials_dir(data_dir) / _CREDENTIALS_FILE
    try:
        raw = json.loads(path.read_text())
        passwords = {str(k): str(v) for k, v in raw["passwords"].items()}
    except FileNotFoundError:
        raise RunwatchError(
            f"{data_dir} holds no secure broker (no {path}): start one with "
            "`runwatch broker start --secure`"
        ) from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RunwatchError(f"cannot read {path}: {exc}") from None
    return Credentials(passwords)


def ensure_credentials(data_dir: Path) -> Credentials:
    """The credentials of ``data_dir``'s secure broker, creating what is missing.

    A user without a password (every user the first time; a role added by a later
    runwatch) gets a new random one; existing passwords are kept.
    """
    known = load_credentials(data_dir).passwords if is_secure(data_dir) else {}
    passwords = {user: known.get(user) or secrets.token_urlsafe(24) for user in users()}
    if passwords != known:
        payload = {"passwords": passwords}
        write_private(credentials_dir(data_dir) / _CREDENTIALS_FILE, json.dumps(payload, indent=2))
    return Credentials(passwords)


def write_env_files(data_dir: Path, credentials: Credentials, bootstrap: str) -> list[Path]:
    """Write ``credentials/<user>.env`` (0600) for every user; returns the paths."""
    out = []
    for user in users():
        path = credentials_dir(data_dir) / f"{user}.env"
        write_private(path, credentials.env_snippet(user, bootstrap))
        out.append(path)
    return out
