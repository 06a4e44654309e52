"""Sensors of the code location."""

from sensors.backfill import make_snapshot_backfill_sensor

__all__ = ["make_snapshot_backfill_sensor"]
