"""Reading a rank's root cause from the error file its ``@record`` entry point wrote."""

from __future__ import annotations

import json

import pytest

from runwatch.controller.error_file import (
    MAX_ERROR_FILE_BYTES,
    one_line,
    parse_root_cause,
    read_root_cause,
)
from runwatch.schemas.events import MAX_ROOT_CAUSE_CHARS


def torch_file(message: object) -> bytes:
    """What torch's ``ErrorHandler.record_exception`` writes, with ``message``."""
    info = {"py_callstack": "Traceback (most recent call last): ...", "timestamp": "17"}
    return json.dumps({"message": {"message": message, "extraInfo": info}}).encode()


@pytest.mark.parametrize(
    ("raw", "cause"),
    [
        pytest.param(torch_file("ValueError: bad batch"), "ValueError: bad batch", id="torch"),
        pytest.param(
            torch_file("RuntimeError: line one\n  line two\t end"),
            "RuntimeError: line one line two end",
            id="multi-line-message-made-one-line",
        ),
        pytest.param(
            json.dumps({"message": "OSError: disk full"}).encode(),
            "OSError: disk full",
            id="string-message-format",
        ),
        pytest.param(b"not json", "", id="not-json"),
        pytest.param(b"\xff\xfe{", "", id="not-utf8"),
        pytest.param(b"[1, 2]", "", id="not-an-object"),
        pytest.param(b'{"other": 1}', "", id="no-message"),
        pytest.param(torch_file(42), "", id="message-not-text"),
        pytest.param(b"[" * 100_000 + b"]" * 100_000, "", id="nested-too-deep"),
    ],
)
def test_parse_root_cause(raw, cause):
    assert parse_root_cause(raw) == cause


def test_a_long_message_is_cut_to_the_schemas_bound():
    cause = parse_root_cause(torch_file("E: " + "x" * 10_000))
    assert len(cause) == MAX_ROOT_CAUSE_CHARS and cause.endswith("...")
    assert one_line("short") == "short"


def test_read_root_cause(tmp_path):
    path = tmp_path / "error.json"
    assert read_root_cause(path) == ""  # no file: the rank wrote none
    path.write_bytes(torch_file("KeyError: 'step'"))
    assert read_root_cause(path) == "KeyError: 'step'"
    path.write_bytes(torch_file("E: " + "x" * MAX_ERROR_FILE_BYTES))
    assert read_root_cause(path) == ""  # too large to be a traceback: not read
    assert read_root_cause(tmp_path) == ""  # a directory: unreadable
