import msgspec
import pytest

from runwatch.schemas import signing
from runwatch.schemas.events import RestartRequested

KEY = signing.CommandKey.from_secret(b"0123456789abcdef-secret")
OTHER = signing.CommandKey.from_secret(b"another-secret-of-16+bytes")
CMD = RestartRequested(
    run_id="r", ts_ns=5, command_id="c1", action="respawn", cause_verdict_id="v", cause_kind="hang"
)


def test_signed_command_verifies():
    signing.verify(signing.sign(CMD, KEY), {KEY.key_id: KEY})


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda c: c, "unsigned"),
        (lambda c: signing.sign(c, OTHER), "unknown key"),
        (
            lambda c: msgspec.structs.replace(signing.sign(c, KEY), max_checkpoint_step=0),
            "bad signature",
        ),
        (lambda c: msgspec.structs.replace(signing.sign(c, KEY), run_id="victim"), "bad signature"),
        (
            lambda c: msgspec.structs.replace(signing.sign(c, KEY), signature="00" * 32),
            "bad signature",
        ),
    ],
    ids=["unsigned", "unknown-key", "altered-step", "altered-run", "forged"],
)
def test_bad_commands_are_refused(mutate, reason):
    with pytest.raises(signing.SignatureError, match=reason):
        signing.verify(mutate(CMD), {KEY.key_id: KEY})


def test_load_key_from_env_and_file(tmp_path):
    assert signing.load_key({}) is None
    assert signing.load_key({signing.ENV_KEY: "0123456789abcdef-secret"}) == KEY
    path = tmp_path / "key"
    path.write_bytes(b"0123456789abcdef-secret\n")
    assert signing.load_key({signing.ENV_KEY_FILE: str(path)}) == KEY
    with pytest.raises(ValueError, match="cannot read"):
        signing.load_key({signing.ENV_KEY_FILE: str(tmp_path / "missing")})
    with pytest.raises(ValueError, match="16 bytes"):
        signing.load_key({signing.ENV_KEY: "short"})


@pytest.mark.parametrize(
    "signature",
    ["é" * 64, "Ω" * 64, "AB" * 32, "00" * 31, "00" * 33, "0g" * 32, "\x00" * 64],
    ids=["latin1", "greek", "uppercase", "short", "long", "not-hex", "nul"],
)
def test_a_malformed_signature_is_refused_not_raised(signature):
    """Finding 3: compare_digest raises TypeError on non-ASCII str; verify refuses first."""
    signed = signing.sign(CMD, KEY)
    with pytest.raises(signing.SignatureError, match="malformed signature"):
        signing.verify(msgspec.structs.replace(signed, signature=signature), {KEY.key_id: KEY})
