"""`bench/processors.py`'s profile parts: which part a py-spy sample counts for."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import load_script

processors = load_script("processors")

_MAIN = (
    "<module> (runwatch/cli.py:1);BatchIngest._round_then_flush (runwatch/processors/engine.py:1)"
)


@pytest.mark.parametrize(
    ("leaf", "part"),
    [
        pytest.param(
            "SendProduceReqHandler.do (aiokafka/producer/sender.py:782);"
            "AIOKafkaClient.send (aiokafka/client.py:474);"
            "AIOKafkaConnection.send (aiokafka/conn.py:423)",
            "aiokafka requests (main thread: produce, fetch)",
            id="produce-request-not-an-output",
        ),
        pytest.param(
            "Fetcher._proc_fetch_request (aiokafka/consumer/fetcher.py:747);"
            "AIOKafkaClient.send (aiokafka/client.py:474)",
            "aiokafka requests (main thread: produce, fetch)",
            id="fetch-request",
        ),
        pytest.param(
            "_BatchSink.fold (runwatch/processors/app.py:695);"
            "_Agent.send (runwatch/processors/app.py:615);"
            "Producer.send (faust/transport/drivers/aiokafka.py:1451)",
            "outputs handed to the producer",
            id="a-round-s-outputs",
        ),
        pytest.param(
            "ProducerBuffer._handle_pending (faust/transport/producer.py:125);"
            "ProducerBuffer._send_pending (faust/transport/producer.py:97);"
            "Topic.publish_message (faust/topics.py:437)",
            "flush: state writes, changelog acks",
            id="changelog-records-faust-sends-later",
        ),
        pytest.param(
            "clock (runwatch/processors/app.py:920);"
            "AIOKafkaProducer.send (aiokafka/producer/producer.py:502)",
            "the clock's Ticks",
            id="ticks",
        ),
    ],
)
def test_a_sample_counts_for_the_part_its_frames_name(tmp_path: Path, leaf: str, part: str) -> None:
    raw = tmp_path / "spy.raw"
    raw.write_text(f"{_MAIN};{leaf} 7\n")

    assert processors.profile_counts(raw) == {part: 7}
