"""The audit reads the partition Kafka's default partitioner chose for the run's key."""

from __future__ import annotations

import pytest
from aiokafka.partitioner import DefaultPartitioner
from hypothesis import given
from hypothesis import strategies as st

from runwatch.processors.logread import partition_for


@given(run_id=st.text(min_size=1, max_size=40), partitions=st.integers(1, 64))
def test_same_partition_as_the_processors_producer(run_id, partitions):
    # aiokafka's partitioner places faust's verdicts; kafka-python's (RunEmitter) is the
    # same murmur2, checked against a real broker in tests/integration/processors
    key = run_id.encode()
    every = list(range(partitions))
    assert partition_for(run_id, partitions) == DefaultPartitioner()(key, every, every)


def test_same_formula_as_the_processors():
    app = pytest.importorskip("runwatch.processors.app")
    for i in range(500):
        run_id = f"run-{i}"
        for n in (1, 2, 8, 12, 64):
            assert partition_for(run_id, n) == app.partition_for(run_id, n)


def test_known_values():
    # pinned: a change of formula would strand every run's history in other partitions
    assert [partition_for(f"run-{i}", 8) for i in range(8)] == [1, 5, 1, 1, 3, 4, 2, 4]
    assert partition_for("run-a", 1) == 0


def test_no_partitions_is_an_error():
    with pytest.raises(ValueError, match="partitions"):
        partition_for("r", 0)
