"""Topics written by Kafka Connect with exactly-once source support (``exactly.once.source.support=enabled``),
which Debezium's PostgreSQL connector supports: Connect writes each poll's records in a producer transaction, so
every partition holds commit markers, offsets that no record shows, and a partition's high watermark read at
a batch's start often falls just past one. Read while the connector keeps writing, every batch ends at once,
and together they hold every record once.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from cdc_assets.io.kafka import KafkaSource
from tests.support import harness as h
from tests.support.connect import ConnectWorker

pytestmark = pytest.mark.conformance

ROWS = 300  # inserted while the batches read, one transaction each


class ExactlyOnceConnectWorker(ConnectWorker):
    """A Kafka Connect worker (``tests.connect``) whose source connectors write in producer transactions."""

    def _properties(self) -> dict[str, str]:
        return {**super()._properties(), "exactly.once.source.support": "enabled"}


def test_topics_written_in_transactions_read_to_their_end_while_the_connector_writes(broker: Any, postgres: Any,
                                                                                       tmp_path: Path) -> None:
    run_id = uuid.uuid4().hex[:6]
    dsn = postgres.create_database(f"eos_{run_id}")
    prefix, name = f"eos{run_id}", f"pg-eos-{run_id}"
    topic = f"{prefix}.public.t"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])[topic].result()
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        connection.execute("INSERT INTO t VALUES (0, 'snapshot')")
    source = KafkaSource({"bootstrap.servers": broker.bootstrap_servers, "group.id": f"eos-{run_id}"}, retries=1,
                         backoff_s=0.1)
    with ExactlyOnceConnectWorker(broker.bootstrap_servers, tmp_path / "connect") as worker:
        worker.register(name, h.connect_config(prefix, h.parse_dsn(dsn), ["public.t"],
                                               **{"exactly.once.support": "required"}))
        try:
            worker.wait_running(name)
            h.wait_for_growth(broker.bootstrap_servers, topic, dict.fromkeys(range(3), 0))  # the snapshot's row

            def write() -> None:
                with psycopg.connect(dsn, autocommit=True) as connection:
                    for row in range(1, ROWS + 1):
                        connection.execute("INSERT INTO t VALUES (%s, 'streamed')", [row])
                        time.sleep(0.01)

            writer = threading.Thread(target=write)
            writer.start()
            read: list[tuple[int, int]] = []
            offsets: dict[int, int] | None = None
            ends: dict[int, int] | None = None
            slowest = 0.0
            deadline = time.monotonic() + 120
            # Until the batches reach the high watermarks too: a batch that ends at its record limit on the last
            # record leaves the last commit marker for the next one.
            while writer.is_alive() or len(read) < ROWS + 1 or offsets != ends:
                assert time.monotonic() < deadline, f"{len(read)} of {ROWS + 1} records read, at {offsets} of {ends}"
                started = time.monotonic()
                batch = source.read_batch(topic, offsets, 50, 10**9, poll_timeout_s=5)
                slowest = max(slowest, time.monotonic() - started)
                assert offsets is None or batch.start_offsets == offsets
                read += zip(batch.records["partition"].to_pylist(), batch.records["offset"].to_pylist(), strict=True)
                offsets, ends = batch.end_offsets, batch.high_watermarks
            writer.join()
        finally:
            worker.delete(name)
            source.close()
            h.drop_replication_slots(dsn)
    assert len(read) == len(set(read)) == ROWS + 1
    assert sum(batch.high_watermarks.values()) > len(read)  # the commit markers' offsets
    assert offsets == batch.high_watermarks and slowest < 5  # no batch waited for the poll timeout
