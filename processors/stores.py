"""Where a worker keeps its tables: in memory (the default) or in RocksDB on local disk.

Both stores are caches of the changelog topics; Kafka holds the truth. They differ in what
a successor of a crashed worker has to read before it processes again:

* ``memory``: nothing survives the process; a successor replays every changelog partition
  it is assigned from the beginning (each run's states, compacted or not yet).
* ``rocksdb``: one RocksDB database per table partition under the worker's data dir
  (``$RUNWATCH_HOME/processors/<app id>``), with the changelog offset it holds. A
  successor on the same host with that dir replays only the changelog records past it;
  on a fresh host it replays everything, like ``memory``, into RocksDB.

faust-streaming's RocksDB store files each write under the partition of the *current
event* (``current_event().message.partition``, asserted non-None). The batch path has no
current event, and a batch of the stream path mixes partitions, so `RunRocksStore` files
a key under the partition its changelog record goes to instead: the producer's default
partitioner on the run id (`processors.logread.partition_for`), since the tables use the
partitioner and are co-partitioned with their inputs. Reads go to that partition's
database directly. Everything else (offsets kept per database, recovery from them,
opening and closing databases on rebalance) is faust's.
"""

from __future__ import annotations

from typing import Any

import faust
from faust.stores.rocksdb import Store as FaustRocksStore
from yarl import URL

from runwatch.processors.logread import partition_for
from runwatch.processors.settings import Store


def rocksdb_missing() -> str | None:
    """None when faust can open RocksDB here, else why not (one line)."""
    try:
        import rocksdict  # noqa: F401
    except ImportError:
        return "the rocksdb store needs rocksdict: pip install 'runwatch[rocksdb]'"
    return None


class RunRocksStore(FaustRocksStore):
    """faust's RocksDB store, with each key filed under its changelog partition."""

    def _partition_of(self, key: bytes) -> int:
        count = self.table.partitions or self.app.conf.topic_partitions  # always set here
        return partition_for(key.decode(), count)

    def _set(self, key: bytes, value: bytes | None) -> None:
        partition = self._partition_of(key)
        self._key_index[key] = partition
        self._db_for_partition(partition).put(key, value)

    def _get(self, key: bytes) -> bytes | None:
        value: bytes | None = self._db_for_partition(self._partition_of(key)).get(key)
        return value

    def _contains(self, key: bytes) -> bool:
        return self._get(key) is not None

    def _del(self, key: bytes) -> None:
        self._db_for_partition(self._partition_of(key)).delete(key)

    def partition_keys(self, partition: int) -> list[bytes]:
        """The keys of one partition, read from its database alone.

        A Tick fans out to the runs of its partition; reading every active database for
        each one (faust's ``keys()``) would cost a pass over the whole table per Tick.
        """
        return list(self._visible_keys(self._db_for_partition(partition)))


class RunTable(faust.Table[bytes, bytes]):
    """A faust table whose ``rocksdb://`` store is `RunRocksStore`.

    The batch path does not write it through ``table[key] = value``, which hands the
    changelog record to faust's producer buffer and forgets it (a failed send is a log
    line at most, and faust's commit trusts a producer flush that returns after 0.1 s
    without progress, writes still buffered): it hands each flush's records to aiokafka in
    one batch per partition, awaits Kafka's answers, and sets the store's values and
    persisted offsets itself (`processors.app._Agent.write_unwritten`,
    `processors.changelog_batches`).
    """

    def _new_store_by_url(self, url: str | URL) -> Any:
        if URL(str(url)).scheme != "rocksdb":
            return super()._new_store_by_url(url)
        return RunRocksStore(
            url,
            self.app,
            self,
            table_name=self.name,
            key_type=self.key_type,
            key_serializer=self.key_serializer,
            value_serializer=self.value_serializer,
            value_type=self.value_type,
            loop=self.loop,
            options=self.options,
        )


def store_url(kind: Store) -> str:
    """The faust ``store`` setting of a store kind."""
    return "rocksdb://" if kind == "rocksdb" else "memory://"
