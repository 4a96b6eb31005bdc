"""faust's Kafka transport with a retry backoff sized for outages, not for blips.

aiokafka retries everything that fails on a connection (metadata refresh, fetch, group
coordinator lookup, heartbeat, produce) after a fixed ``retry_backoff_ms`` of 100 ms, and
has no growing reconnect backoff. While a broker is down, each of the worker's retry loops
(its consumer's fetcher, coordinator and metadata synchroniser, its producer's sender)
fails at once and tries again 100 ms later: measured on one worker over a 16 s broker stop
(`bench/outage.py`), 1,070 refused connection attempts and 1,398 error lines. faust passes
no ``retry_backoff_ms`` to aiokafka, so this transport does:

* the producer through faust's own hook (``Producer._producer_type``);
* the consumer, whose construction faust does not expose, by setting the backoff on the
  consumer and its client right after faust builds it and before it starts (the fetcher
  and the coordinator are created in ``start()`` from it). `set_retry_backoff` checks the
  attributes exist, so an aiokafka that renames them fails the worker's start loudly
  rather than silently going back to 100 ms.

Worse, aiokafka's producer sender spins without any backoff while a partition's leader is
unknown and the broker refuses connections (`_BackoffClient`): the busy loop of a worker
at 70 % of a core during an outage. Both clients here wait the backoff after a failed
metadata update.

`RETRY_BACKOFF_MS` is the one figure: a retry after a failed request (a broker gone, a
leader moved) waits this long. 500 ms keeps a failover after a leader move well under a
second while cutting the outage loop five-fold; the log lines are summarised on top
(`runwatch.logsummary`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final

import aiokafka
import faust
from aiokafka.client import AIOKafkaClient
from faust.transport.drivers import aiokafka as driver

FAUST_LOGGER: Final = logging.getLogger("faust.transport.runwatch")
"""The logger of these faust services: under ``faust``, so faust's levels apply (mode names
a service's logger after its class's module, which would put faust's chatter under
``processors``)."""

RETRY_BACKOFF_MS: Final = 500
"""aiokafka's ``retry_backoff_ms`` for the worker's consumer and producer (default 100)."""


class _BackoffClient(AIOKafkaClient):  # type: ignore[misc]
    """An aiokafka client whose failed metadata update lasts at least its retry backoff.

    aiokafka's producer sender, while a partition's leader is unknown, forces a metadata
    update and waits for it, then loops (its comment says "and wait backoff time"; it does
    not). With the broker down the update fails at once (connection refused), so the
    sender spun: py-spy showed the worker's main thread in ``_md_synchronizer`` /
    ``_get_conn``, ~70 % of a core, ~1,000 refused connections a second, whenever the
    broker's last metadata before it stopped named no leader (its controlled shutdown
    does). Waiting the backoff after a failed update bounds every loop that waits on one.
    """

    async def _metadata_update(self, cluster_metadata: Any, topics: Any) -> bool:
        updated = bool(await super()._metadata_update(cluster_metadata, topics))
        if not updated:
            await asyncio.sleep(self._retry_backoff)
        return updated


def _with_metadata_backoff(client: object) -> None:
    """Make an aiokafka client (built by aiokafka, which takes no client class) a `_BackoffClient`.

    Raises:
        RuntimeError: ``client`` is not a plain `aiokafka.client.AIOKafkaClient`.
    """
    if type(client) is not AIOKafkaClient:
        raise RuntimeError(
            f"aiokafka {aiokafka.__version__}: expected an AIOKafkaClient, got "
            f"{type(client).__name__}; processors.transport needs updating"
        )
    client.__class__ = _BackoffClient  # same layout, one method more: no state to move


def set_retry_backoff(consumer: aiokafka.AIOKafkaConsumer, backoff_ms: int) -> None:
    """Give a consumer that has not started yet ``backoff_ms`` as its retry backoff.

    Raises:
        RuntimeError: aiokafka's consumer no longer has the attributes this sets.
    """
    client = getattr(consumer, "_client", None)
    if not hasattr(consumer, "_retry_backoff_ms") or not hasattr(client, "_retry_backoff"):
        raise RuntimeError(
            f"aiokafka {aiokafka.__version__}: AIOKafkaConsumer has no _retry_backoff_ms / "
            "_client._retry_backoff; processors.transport needs updating"
        )
    consumer._retry_backoff_ms = backoff_ms  # read by start() for the fetcher and coordinator
    client._retry_backoff = backoff_ms / 1000  # type: ignore[union-attr]
    _with_metadata_backoff(client)


class _BackoffProducer(aiokafka.AIOKafkaProducer):  # type: ignore[misc]
    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("retry_backoff_ms", RETRY_BACKOFF_MS)
        super().__init__(**kwargs)
        _with_metadata_backoff(self.client)


class Producer(driver.Producer):
    """faust's aiokafka producer, built with `RETRY_BACKOFF_MS`."""

    logger = FAUST_LOGGER

    @property
    def _producer_type(self) -> type[aiokafka.AIOKafkaProducer]:
        return _BackoffProducer


class _ConsumerThread(driver.AIOKafkaConsumerThread):
    logger = FAUST_LOGGER

    def _create_consumer(self, loop: asyncio.AbstractEventLoop) -> aiokafka.AIOKafkaConsumer:
        consumer = super()._create_consumer(loop)
        set_retry_backoff(consumer, RETRY_BACKOFF_MS)
        return consumer


class Consumer(driver.Consumer):
    """faust's aiokafka consumer, its aiokafka consumer given `RETRY_BACKOFF_MS`."""

    logger = FAUST_LOGGER

    def _new_consumer_thread(self) -> driver.AIOKafkaConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class Transport(driver.Transport):
    """faust's aiokafka transport with this module's consumer and producer."""

    Consumer = Consumer
    Producer = Producer


class App(faust.App):
    """A faust app whose Kafka clients use `Transport` (everything else is faust's)."""

    logger = FAUST_LOGGER

    def _new_transport(self) -> Transport:
        return Transport(self.conf.broker_consumer, self)

    def _new_producer_transport(self) -> Transport:
        return Transport(self.conf.broker_producer, self)
