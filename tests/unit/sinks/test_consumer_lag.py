from __future__ import annotations

from runwatch.sinks.consumer import settled_lag

HB = ("p.heartbeats", 0)


def test_ticks_that_landed_since_the_previous_sample_are_not_lag():
    # the previous sample saw the end at 100; the consumer has read 100; two ticks have
    # landed since (end 102): a consumer that keeps up reads 0
    assert settled_lag({HB: 100}, {HB: 100}) == {HB: 0}


def test_a_consumer_that_falls_behind_shows_how_far():
    assert settled_lag({HB: 500}, {HB: 120}) == {HB: 380}


def test_partitions_without_a_previous_sample_or_no_longer_held_are_left_out():
    other = ("p.steps", 1)
    assert settled_lag({other: 10}, {HB: 3}) == {}
