import pytest

from schemas import topics


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
    assert specs["rw.runs"].configs() == {"cleanup.policy": "compact"}
    assert specs["rw.steps"].configs()["cleanup.policy"] == "delete"
    assert all(s.partitions == topics.DEFAULT_PARTITIONS for s in specs.values())


def test_all_topics_share_a_partition_count():
    assert {s.partitions for s in topics.catalogue(partitions=3)} == {3}


def test_names_match_catalogue():
    n = topics.names("x")
    assert n.steps == "x.steps" and n.deadletter == "x.deadletter"
    assert {getattr(n, f) for f in n.__struct_fields__} == {s.name for s in topics.catalogue("x")}


def test_bad_partition_count():
    with pytest.raises(ValueError, match="partitions"):
        topics.catalogue(partitions=0)
