"""A connector config with a Kafka signal channel and snapshot schedules, for the snapshot jobs and sensors."""

from __future__ import annotations

CONFIG = """\
kafka:
  bootstrap_servers: {bootstrap}
delta:
  root: {root}
connectors:
  - name: inventory
    kind: postgresql
    topic.prefix: dbserver1
    signal:
      channel: kafka
      topic: {signal_topic}
    snapshot_schedules:
      - name: weekly
        cron: "0 3 * * 0"
        tables: [inventory.customers]
        additional_condition: "region = 'eu'"
      - name: nightly
        cron: "0 1 * * *"
        tables: ["inventory\\\\.orders_.*"]
        running: true
    tables:
      - name: inventory.customers
"""
