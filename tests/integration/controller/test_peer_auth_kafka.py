"""Finding 12's last sentence, as the attacker writes it: a forged AgentReady names no host.

A multi-node agent's `PeerWatch` (built as `controller.agent.build_controller` builds it,
with the agent's command key) reads the controller topic of a real broker. Node 1's
genuine agent announces itself through `EventPublisher`, signed as every agent signs
(`controller.agent.signing_ready`). The attacker, with plain kafka-python and write access
to the controller topic (any client of a broker without an authorizer) but without the
command key, then produces three announcements for the same restart: one unsigned claiming
to be node 0 at ``attacker.example`` (node 0 lost: its host would become the next
MASTER_ADDR), one signed with a key of its own, and the genuine record with its host
rewritten. None is believed: the agents heard are node 1 alone, at its own host, and the
three are counted as refused.
"""

from __future__ import annotations

import time
import uuid

import msgspec
import pytest
from kafka import KafkaProducer

from runwatch import admin
from runwatch.controller.agent import signing_ready
from runwatch.controller.loop import EventPublisher, PeerWatch
from runwatch.controller.peer_auth import check_ready, sign_ready
from runwatch.schemas.codec import encode, encode_key
from runwatch.schemas.events import AgentReady
from runwatch.schemas.signing import CommandKey
from runwatch.schemas.topics import names
from tests.integration.processors.harness import COMMAND_KEY

pytestmark = pytest.mark.integration

RUN = "peers"


def test_forged_agent_ready_is_not_believed(kafka_bootstrap: str) -> None:
    prefix = f"pa{uuid.uuid4().hex[:10]}"
    admin.create_topics(kafka_bootstrap, admin.catalogue(prefix, 2))
    key = CommandKey.from_secret(COMMAND_KEY.encode())
    keys = {key.key_id: key}
    peers = PeerWatch(
        kafka_bootstrap, prefix, [RUN], check_ready=lambda ready: check_ready(ready, keys)
    )
    publisher = EventPublisher(kafka_bootstrap, prefix, {})
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    try:
        genuine = AgentReady(
            run_id=RUN,
            ts_ns=time.time_ns(),
            command_id="c1",
            incarnation=1,
            node_rank=1,
            nnodes=2,
            host="node-one",
        )
        signing_ready(keys, publisher.publish)(genuine)
        captured: list[object] = []
        signing_ready(keys, captured.append)(genuine)
        (signed,) = captured
        assert isinstance(signed, AgentReady)
        claim = msgspec.structs.replace(genuine, node_rank=0, host="attacker.example")
        forged = [
            claim,  # unsigned
            sign_ready(claim, CommandKey.from_secret(b"the-attackers-own-key-0123")),
            msgspec.structs.replace(signed, host="attacker.example"),  # a genuine one, altered
        ]
        topic = names(prefix).controller
        for record in forged:
            producer.send(topic, key=encode_key(RUN), value=encode(record)).get(30)

        deadline = time.monotonic() + 60
        while peers.refused_ready < len(forged):
            assert time.monotonic() < deadline, f"refused {peers.refused_ready} of {len(forged)}"
            peers.poll(200)
        heard = peers.await_ready(RUN, 1, nnodes=2, timeout_s=2.0)
        assert set(heard) == {1}, heard
        assert heard[1].host == "node-one" and heard[1].signature == signed.signature
        assert peers.refused_ready == len(forged)
    finally:
        producer.close()
        publisher.close()
        peers.close()
