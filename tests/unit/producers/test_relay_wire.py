"""The relay's frames: every kind round-trips, any chunking reassembles, garbage is refused."""

from __future__ import annotations

import socket
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runwatch.producers.relay_client import RelayFailed, RelayProducer, RelayUnavailable
from runwatch.producers.relay_wire import (
    MAX_FRAME_BYTES,
    EventFrame,
    FrameError,
    FrameReader,
    Hello,
    Outcome,
    encode_event,
    encode_flush,
    encode_hello,
    encode_outcome,
)


def test_every_kind_round_trips():
    stream = (
        encode_hello("run-a", 3, 123)
        + encode_event(7, "p.heartbeats", b"run-a", b'{"x":1}')
        + encode_flush()
        + encode_outcome(Outcome(7, True))
        + encode_outcome(Outcome(8, False, "KafkaError: no"))
    )
    assert FrameReader().feed(stream) == [
        Hello(1, "run-a", 3, 123),
        EventFrame(7, "p.heartbeats", b"run-a", b'{"x":1}'),
        None,
        Outcome(7, True),
        Outcome(8, False, "KafkaError: no"),
    ]


@given(
    st.lists(
        st.tuples(
            st.integers(0, 2**64 - 1),
            st.text(max_size=30),
            st.binary(max_size=40),
            st.binary(max_size=300),
        ),
        max_size=8,
    ),
    st.lists(st.integers(1, 50), min_size=1, max_size=20),
)
def test_any_chunking_gives_the_same_frames(events, cuts):
    stream = b"".join(encode_event(s, t, k, v) for s, t, k, v in events)
    reader, got, pos, i = FrameReader(), [], 0, 0
    while pos < len(stream):
        step = cuts[i % len(cuts)]
        got += reader.feed(stream[pos : pos + step])
        pos, i = pos + step, i + 1
    assert got == [EventFrame(s, t, k, v) for s, t, k, v in events]
    assert reader.pending_bytes == 0


@pytest.mark.parametrize(
    "data",
    [
        (MAX_FRAME_BYTES + 1).to_bytes(4, "big") + b"E",
        (0).to_bytes(4, "big"),
        (3).to_bytes(4, "big") + b"Zab",
        (5).to_bytes(4, "big") + b"E\x00\x00\x00\x01",
        (10).to_bytes(4, "big") + b"H" + b"not json!",
    ],
)
def test_garbage_is_a_frame_error(data):
    with pytest.raises(FrameError):
        FrameReader().feed(data)


def test_no_relay_is_retriable(tmp_path):
    with pytest.raises(RelayUnavailable, match="no relay at"):
        RelayProducer(str(tmp_path / "none.sock"), "r", 0, "t")


def test_acks_and_nacks_resolve_futures_and_a_lost_link_fails_the_rest(tmp_path):
    path = str(tmp_path / "s.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    seen: list[object] = []
    got_three = threading.Event()

    def serve():
        conn, _ = server.accept()
        reader = FrameReader()
        while len(seen) < 4:  # hello + 3 events
            seen.extend(reader.feed(conn.recv(4096)))
        got_three.set()
        conn.sendall(encode_outcome(Outcome(1, True)) + encode_outcome(Outcome(2, False, "bad")))
        conn.close()  # event 3 never answered

    thread = threading.Thread(target=serve)
    thread.start()
    producer = RelayProducer(path, "run-a", 1, "t")
    outcomes: dict[int, object] = {}
    for n in (1, 2, 3):
        f = producer.send("topic", value=b"v%d" % n, key=b"run-a")
        f.add_callback(lambda n, _m: outcomes.__setitem__(n, "ok"), n)
        f.add_errback(lambda n, e: outcomes.__setitem__(n, e), n)
    assert got_three.wait(10)
    thread.join(10)
    producer.flush(timeout=10)  # returns once every record has an outcome
    assert outcomes[1] == "ok"
    assert isinstance(outcomes[2], RelayFailed) and str(outcomes[2]) == "bad"
    assert isinstance(outcomes[3], RelayFailed)
    assert seen[0] == Hello(1, "run-a", 1, seen[0].pid)  # type: ignore[union-attr]
    assert [e.value for e in seen[1:]] == [b"v1", b"v2", b"v3"]  # type: ignore[union-attr]
    server.close()
    with pytest.raises(RelayUnavailable):  # the relay is gone: the caller retries later
        producer.send("topic", value=b"v4", key=b"run-a")
    producer.close(timeout=1)
