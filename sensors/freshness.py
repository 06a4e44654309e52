"""Events waiting, observed: an asset observation per table with how many events wait in its topic
and since when, so the UI plots a table's backlog between merges as well as at them."""

from collections.abc import Mapping, Sequence
from typing import Any

from dagster import AssetObservation, SensorDefinition, SensorEvaluationContext, SensorResult, sensor

from cdc_assets.catalog import CapturedTable
from cdc_assets.checks import freshness_metadata, live_freshness
from cdc_assets.io.freshness import TopicProbe
from cdc_assets.io.kafka_source import SourceError
from cdc_assets.translator import CdcTranslator


def make_events_waiting_sensor(tables: Sequence[CapturedTable], kafka_settings: Mapping[str, Any],
                               minimum_interval_seconds: int = 60,
                               translator: CdcTranslator | None = None) -> SensorDefinition:
    """A sensor that records an ``events_waiting`` observation of each live table per tick."""
    translator = translator or CdcTranslator()

    @sensor(name="events_waiting_sensor", minimum_interval_seconds=minimum_interval_seconds,
            description="Observes how many change events wait in each table's topic, and since when")
    def events_waiting_sensor(context: SensorEvaluationContext) -> SensorResult:
        observations = []
        with TopicProbe(kafka_settings) as probe:
            for table in tables:
                try:
                    state, heartbeat = live_freshness(table, probe)
                except SourceError as exc:  # one missing topic must not hide the other tables' backlogs
                    context.log.warning(f"{table.topic}: {exc}")
                    continue
                observations.append(AssetObservation(asset_key=translator.get_asset_key(table),
                                                     metadata=freshness_metadata(state, heartbeat)))
        return SensorResult(asset_events=observations)

    return events_waiting_sensor
