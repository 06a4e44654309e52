"""The demo's sample on a real broker as the code location reads it, and plain change events of one table."""

from __future__ import annotations

import contextlib

from confluent_kafka import KafkaException
from dagster import AssetKey

from cdc_assets.demo.events import encode_key, envelope, postgres_source
from cdc_assets.demo.sample import publish_sample

CONFIG = """\
kafka:
  bootstrap_servers: {bootstrap}
delta:
  root: {root}
  writer: delta-rs
connectors:
  - name: inventory
    kind: postgresql
    topic.prefix: dbserver1
    tables:
      - name: inventory.products
      - name: inventory.customers
  - name: sales
    kind: sqlserver
    topic.prefix: server1
    tables:
      - name: dbo.orders
"""


KEYS = [AssetKey(["dbserver1", "inventory", "products"]), AssetKey(["dbserver1", "inventory", "customers"]),
        AssetKey(["server1", "dbo", "orders"])]


def sample_published(broker):
    """The demo sample on the session's broker, published once whichever test comes first."""
    with contextlib.suppress(KafkaException):  # TOPIC_ALREADY_EXISTS: an earlier test published it
        publish_sample(broker.bootstrap_servers)


def events(start, count, topic_key=lambda i: i % 5):
    """``count`` changes of s.t from LSN ``start + 1``: creates for the first five, updates after, keyed by
    ``topic_key``."""
    return [(encode_key({"id": topic_key(i)}),
             envelope("c" if i < 5 else "u", None, {"id": topic_key(i), "v": i},
                      postgres_source(i + 1, i, "s", "t"), i))
            for i in range(start, start + count)]
