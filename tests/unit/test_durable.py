from runwatch.common.durable import append_durably, atomic_write


def test_atomic_write_replaces_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "state.json"
    atomic_write(path, b"old")
    atomic_write(path, b"new")
    assert path.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_append_durably_creates_then_appends(tmp_path):
    path = tmp_path / "log.jsonl"
    append_durably(path, b"a\n")
    append_durably(path, b"b\n")
    assert path.read_bytes() == b"a\nb\n"
