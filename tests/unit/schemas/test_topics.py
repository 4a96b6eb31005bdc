import pytest

from runwatch.schemas import topics


def test_catalogue_names_and_policies():
    specs = {s.name: s for s in topics.catalogue("rw")}
    assert set(specs) == {
        "rw.runs",
        "rw.steps",
        "rw.heartbeats",
        "rw.checkpoints",
        "rw.anomalies",
        "rw.commands",
        "rw.controller",
        "rw.deadletter",
    }
    # the input topics carry the broker's clock (their times steer verdicts), no other
    assert specs["rw.runs"].configs() == {
        "cleanup.policy": "compact",
        "message.timestamp.type": "LogAppendTime",
    }
    assert specs["rw.steps"].configs()["cleanup.policy"] == "delete"
    stamped = {s.name for s in specs.values() if "message.timestamp.type" in s.configs()}
    assert stamped == {"rw.runs", "rw.steps", "rw.heartbeats", "rw.checkpoints"}
    assert {s.name: s.partitions for s in specs.values()} == {
        f"rw.{short}": count for short, count in topics.DEFAULT_PARTITIONS.items()
    }


def test_every_catalogue_topic_has_a_default_count():
    assert set(topics.DEFAULT_PARTITIONS) == set(topics.TopicNames.__struct_fields__)
    # sized for a fleet: the per-rank topic carries the most, the low-volume ones the least
    hot = topics.DEFAULT_PARTITIONS["heartbeats"]
    assert hot == max(topics.DEFAULT_PARTITIONS.values())
    assert all(topics.DEFAULT_PARTITIONS[t] < hot for t in ("commands", "controller"))


def test_one_count_for_every_topic():
    assert {s.partitions for s in topics.catalogue(partitions=3)} == {3}


def test_counts_by_topic_override_only_the_named():
    specs = {s.name: s.partitions for s in topics.catalogue("p", {"steps": 3})}
    assert specs["p.steps"] == 3
    assert specs["p.heartbeats"] == topics.DEFAULT_PARTITIONS["heartbeats"]


def test_counts_by_topic_reject_unknown_names():
    with pytest.raises(ValueError, match="no topic 'step'"):
        topics.catalogue("p", {"step": 3})


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("steps=32,heartbeats=64", {"steps": 32, "heartbeats": 64, "runs": 8}),
        ("2", {"steps": 2, "heartbeats": 2, "deadletter": 2}),
        ("8, heartbeats=64", {"steps": 8, "heartbeats": 64, "commands": 8}),
        ("heartbeats=5", {"steps": topics.DEFAULT_PARTITIONS["steps"], "heartbeats": 5}),
    ],
)
def test_parse_partitions(text, want):
    got = topics.parse_partitions(text)
    assert set(got) == set(topics.DEFAULT_PARTITIONS)
    assert {k: got[k] for k in want} == want


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "got nothing"),
        ("steps=0", "positive"),
        ("steps=x", "positive"),
        ("-3", "positive"),
        ("stepz=4", "no topic 'stepz'"),
        ("steps=4,steps=5", "named twice"),
        ("4,5", "two counts"),
    ],
)
def test_parse_partitions_rejects(text, match):
    with pytest.raises(ValueError, match=match):
        topics.parse_partitions(text)


def test_names_match_catalogue():
    n = topics.names("x")
    assert n.steps == "x.steps" and n.deadletter == "x.deadletter"
    assert {getattr(n, f) for f in n.__struct_fields__} == {s.name for s in topics.catalogue("x")}


def test_bad_partition_count():
    with pytest.raises(ValueError, match="partitions"):
        topics.catalogue(partitions=0)
