"""The pipeline without Dagster: apply a topic's pending change events to a Delta table from a plain
script, as Airflow, a notebook or a cron job would.

    python examples/without_dagster.py BOOTSTRAP_SERVERS TOPIC DELTA_PATH

e.g. ``python examples/without_dagster.py 127.0.0.1:9092 dbserver1.inventory.customers /tmp/customers``.
The Spark session is the local Spark server's (started if none runs); the table's Kafka offsets live
in its Delta commits, so running it again applies only what arrived since.
"""

from __future__ import annotations

import sys

from cdc_assets import TableSpec, apply_pending


def main(bootstrap_servers: str, topic: str, target: str) -> int:
    table = TableSpec(kind="postgresql", topic=topic, target=target)
    reports = apply_pending(table, kafka=bootstrap_servers)
    for number, report in enumerate(reports, 1):
        changed = report.outcome
        print(f"batch {number}: {report.events_read} events read, offsets {report.offsets_json()}"
              + (f", Delta version {changed.delta_version}" if changed else ", nothing to commit"))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    sys.exit(main(*sys.argv[1:]))
