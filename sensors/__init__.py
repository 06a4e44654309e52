"""Sensors of the code location."""

from sensors.backfill import make_snapshot_backfill_sensor
from sensors.drift_repair import make_drift_repair_sensor
from sensors.freshness import make_events_waiting_sensor
from sensors.schema_changes import make_schema_change_sensor
from sensors.transactions import make_transaction_sensor

__all__ = ["make_drift_repair_sensor", "make_events_waiting_sensor", "make_schema_change_sensor",
           "make_snapshot_backfill_sensor", "make_transaction_sensor"]
