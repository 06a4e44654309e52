"""The code location tests/definitions/test_daemon.py runs under ``dagster-daemon``: the project's definitions for the
pipeline config ``CDC_ASSETS_CONFIG`` names, with the events-waiting sensor, the drift repair sensor and the
automation condition sensor ticking every few seconds instead of their production 60 s and 30 s (nothing else
changed)."""

from dagster import AssetSelection, AutomationConditionSensorDefinition, Definitions, SensorDefinition

from cdc_assets.config import load_config
from cdc_assets.definitions import build_definitions

# Under the daemons' 5 s loops, so that every loop ticks: at 5 s, a loop that came a moment under 5 s after the last
# tick skipped it, and ticks came 5 or 10 s apart (the daemon's log, 2026-11-30); no tick comes sooner than a loop.
TEST_INTERVAL_S = 1

def faster(sensor: SensorDefinition) -> SensorDefinition:
    """``sensor`` evaluating the same function at each of the daemon's loops (``TEST_INTERVAL_S``)."""
    if sensor.name not in ("events_waiting_sensor", "drift_repair_sensor"):
        return sensor
    return SensorDefinition(name=sensor.name, evaluation_fn=sensor._raw_fn, description=sensor.description,
                            minimum_interval_seconds=TEST_INTERVAL_S,
                            jobs=sensor.jobs if sensor.has_jobs else None)


def with_faster_sensors(project: Definitions) -> Definitions:
    """``project`` with its events-waiting and drift repair sensors and its automation condition sensor
    ``faster``."""
    # Named as Dagster names the sensor it adds by itself, so the test turns on the sensor a user turns on.
    automation = AutomationConditionSensorDefinition("default_automation_condition_sensor",
                                                     target=AssetSelection.all(),
                                                     minimum_interval_seconds=TEST_INTERVAL_S)
    return Definitions(assets=project.assets, asset_checks=project.asset_checks, jobs=project.jobs,
                       schedules=project.schedules, resources=project.resources, executor=project.executor,
                       sensors=[*(faster(sensor) for sensor in project.sensors or []), automation])


defs = with_faster_sensors(build_definitions(load_config()))
