"""HMAC signatures on restart commands: a command can kill a job, so it must be authentic.

The policy signs each `RestartRequested` with a shared secret; the controller verifies it
and refuses unsigned or forged commands. The signature covers the command's canonical
bytes: its wire encoding with ``signature`` empty and ``key_id`` set, which msgspec
produces deterministically (fields in declaration order).

The key comes from ``RUNWATCH_COMMAND_KEY`` (the secret itself) or
``RUNWATCH_COMMAND_KEY_FILE`` (a file holding it). Its id is a short hash of the key, so
a rotated key is recognisable in logs without revealing it.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import msgspec

from runwatch.common.settings import ENV_COMMAND_KEY, ENV_COMMAND_KEY_FILE, CommandKeySettings
from runwatch.schemas.codec import encode
from runwatch.schemas.events import RestartRequested

ENV_KEY: Final = ENV_COMMAND_KEY
ENV_KEY_FILE: Final = ENV_COMMAND_KEY_FILE
SIGNATURE_HEX_CHARS: Final = 64
"""A signature is the 64 lowercase hex digits of an HMAC-SHA256."""
_HEX: Final = frozenset("0123456789abcdef")


class SignatureError(ValueError):
    """A command that must not be executed; the message says why."""


class CommandKey(msgspec.Struct, frozen=True):
    """A signing key and its public id."""

    key_id: str
    secret: bytes

    @classmethod
    def from_secret(cls, secret: bytes) -> CommandKey:
        """Wrap a secret, deriving its id."""
        if len(secret) < 16:
            raise ValueError("a command key needs at least 16 bytes")
        return cls(key_id=hashlib.sha256(secret).hexdigest()[:12], secret=secret)


def load_key(environ: Mapping[str, str] | None = None) -> CommandKey | None:
    """The command key from the environment, or None when none is configured.

    Raises:
        ValueError: The key file is unreadable or the key is too short.
    """
    settings = CommandKeySettings.from_env(environ)
    if settings.command_key:
        return CommandKey.from_secret(settings.command_key.encode())
    if settings.command_key_file:
        path = Path(settings.command_key_file)
        try:
            secret = path.read_bytes().strip()
        except OSError as exc:
            raise ValueError(f"cannot read {ENV_KEY_FILE}={path}: {exc.strerror}") from None
        return CommandKey.from_secret(secret)
    return None


def canonical_bytes(command: RestartRequested, key_id: str) -> bytes:
    """The bytes a signature covers."""
    return encode(msgspec.structs.replace(command, signature="", key_id=key_id))


def sign(command: RestartRequested, key: CommandKey) -> RestartRequested:
    """Return ``command`` signed with ``key``."""
    mac = hmac.new(key.secret, canonical_bytes(command, key.key_id), hashlib.sha256)
    return msgspec.structs.replace(command, signature=mac.hexdigest(), key_id=key.key_id)


def verify(command: RestartRequested, keys: Mapping[str, CommandKey]) -> None:
    """Check a command's signature against the known keys.

    Args:
        command: The command as read from the log.
        keys: Known keys by id (more than one during a key rotation).

    Raises:
        SignatureError: Unsigned, a signature that is not 64 lowercase hex digits (a
            non-ASCII one included), signed by an unknown key, or forged.
    """
    if not command.signature:
        raise SignatureError("unsigned command")
    if len(command.signature) != SIGNATURE_HEX_CHARS or not _HEX.issuperset(command.signature):
        # compare_digest raises TypeError on a non-ASCII str: refuse the form first.
        raise SignatureError(f"malformed signature: not {SIGNATURE_HEX_CHARS} lowercase hex digits")
    key = keys.get(command.key_id)
    if key is None:
        raise SignatureError(f"signed with unknown key id {command.key_id[:64]!r}")
    expected = hmac.new(key.secret, canonical_bytes(command, key.key_id), hashlib.sha256)
    if not hmac.compare_digest(expected.hexdigest(), command.signature):
        raise SignatureError("bad signature: the command was altered or forged")
