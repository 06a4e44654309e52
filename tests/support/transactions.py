"""PostgreSQL transaction metadata as Debezium writes it, and a connector's transaction sensor on a real broker."""

from __future__ import annotations

import itertools
import json

from cdc_assets.config import parse_config
from cdc_assets.definitions import build_definitions
from cdc_assets.demo.events import encode_key, envelope, postgres_source
from tests.support.topics import new_topic, new_topic_named

_LSN = itertools.count(53_195_829)


def tx_event(status, tx_id, collections=None):
    """A BEGIN or END of PostgreSQL transaction ``tx_id`` (its txID) as Debezium writes it: the id is
    ``txID:LSN`` with the LSN of the event itself, so BEGIN and END ids differ (seed 001)."""
    body = {"status": status, "id": f"{tx_id}:{next(_LSN)}", "ts_ms": 1_700_000_000_000, "event_count": None,
            "data_collections": None}
    if status == "END":
        body["event_count"] = sum(collections.values())
        body["data_collections"] = [{"data_collection": c, "event_count": n} for c, n in collections.items()]
    return encode_key({"id": body["id"]}), json.dumps(body).encode()


def tx_create(table, row, lsn, tx_id=None, order=1):
    """A create of PostgreSQL table s.``table`` with ``row`` (its key: ``row["id"]``) at ``lsn``, in transaction
    ``tx_id`` (None: outside any) as its ``order``-th event: the block's id carries the event's own LSN."""
    transaction = {"id": f"{tx_id}:{lsn}", "total_order": order, "data_collection_order": order} if tx_id else None
    ts_ms = 1_700_000_000_000 + lsn
    return encode_key({"id": row["id"]}), envelope("c", None, row, postgres_source(lsn, ts_ms, "s", table), ts_ms,
                                                   transaction)


def transaction_sensor(broker, tmp_path, partitions):
    """The sensor of a connector with tables s.a, s.b, s.c and a transaction topic of ``partitions``."""
    prefix = new_topic(broker, "mpsens").replace(".", "_")
    tx_topic = new_topic_named(broker, f"{prefix}.transaction", partitions=partitions)
    config = f"""\
kafka: {{bootstrap_servers: "{broker.bootstrap_servers}"}}
delta: {{root: "{tmp_path}"}}
connectors:
  - name: txdb
    kind: postgresql
    topic.prefix: {prefix}
    transaction_metadata: true
    tables: [{{name: s.a}}, {{name: s.b}}, {{name: s.c}}]
"""
    defs = build_definitions(parse_config(config))
    return defs, defs.resolve_sensor_def("txdb_transaction_sensor"), tx_topic
