from __future__ import annotations

from runwatch.sinks.alert_log import DeliveryLog


def test_delivered_ids_survive_a_reopen(tmp_path):
    path = tmp_path / "state" / "alerts.jsonl"
    log = DeliveryLog(path)
    log.delivered("console", "r1", ["a", "b"])
    log.delivered("http://x", "r1", ["a"])
    log.suppressed("r1", ["c", "d"])
    log.reported("r1", 1)
    log.close()
    again = DeliveryLog(path)
    assert again.handled("a", ["console", "http://x"])
    assert not again.handled("b", ["console", "http://x"])  # the webhook never had it
    assert again.handled("c", ["console"])  # suppressed counts as handled
    assert again.unreported == {"r1": 1}


def test_a_torn_last_line_is_ignored(tmp_path):
    path = tmp_path / "alerts.jsonl"
    log = DeliveryLog(path)
    log.delivered("console", "r1", ["a"])
    log.close()
    with path.open("a") as fh:
        fh.write('{"target": "console", "ids": ["b"')
    again = DeliveryLog(path)
    assert again.has("console", "a") and not again.has("console", "b")


def test_compaction_keeps_recent_ids_and_unreported_counts(tmp_path):
    path = tmp_path / "alerts.jsonl"
    log = DeliveryLog(path)
    for i in range(50):
        log.delivered("console", "r1", [f"id{i}"])
    log.suppressed("r2", ["s1", "s2", "s3"])
    log.reported("r2", 1)
    log.close()
    small = DeliveryLog(path, max_lines=10, keep_ids=5)
    assert small.has("console", "id49") and not small.has("console", "id10")
    assert small.has("_suppressed", "s3")
    assert small.unreported == {"r2": 2}
    small.close()
    assert len(path.read_text().splitlines()) <= 4
    assert DeliveryLog(path).unreported == {"r2": 2}
