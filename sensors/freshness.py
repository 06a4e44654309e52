"""Events waiting, observed: an observation of each table's topic (``cdc_assets.topics``) per tick, with its
data version (its end offsets: a new one means new events, which a table's automation condition reacts to)
and how many events wait in it for the table and since when, so the UI plots a table's backlog between
merges as well as at them."""

from collections.abc import Mapping, Sequence
from typing import Any

from dagster import AssetObservation, SensorDefinition, SensorEvaluationContext, SensorResult, sensor

from cdc_assets.catalog import CapturedTable
from cdc_assets.checks import freshness_metadata, live_freshness
from cdc_assets.io.freshness import FreshnessProbe
from cdc_assets.io.kafka import SourceError
from cdc_assets.topics import topic_observations
from cdc_assets.translator import CdcTranslator


def make_events_waiting_sensor(tables: Sequence[CapturedTable], kafka_settings: Mapping[str, Any],
                               minimum_interval_seconds: int = 60,
                               translator: CdcTranslator | None = None) -> SensorDefinition:
    """A sensor that records an observation of each live table's topic per tick (one consumer for all)."""
    translator = translator or CdcTranslator()

    @sensor(name="events_waiting_sensor", minimum_interval_seconds=minimum_interval_seconds,
            description="Observes each table's topic: its end offsets (its data version, which the tables' "
                        "automation conditions react to) and the change events waiting in it, since when. No "
                        "cursor: the observations are the topics' state, recorded on the topic assets")
    def events_waiting_sensor(context: SensorEvaluationContext) -> SensorResult:
        observations = []
        with FreshnessProbe(kafka_settings) as probe:
            topics = {observation.asset_key: observation for observation in topic_observations(tables, probe,
                                                                                                 translator)}
            for table in tables:
                seen = topics.get(translator.get_topic_asset_key(table))
                if seen is None:  # one missing topic must not hide the other tables' backlogs
                    context.log.warning(f"{table.topic}: topic '{table.topic}' does not exist")
                    continue
                try:
                    state, heartbeat = live_freshness(table, probe)
                except SourceError as exc:  # nor one unreadable topic
                    context.log.warning(f"{table.topic}: {exc}")
                    continue
                metadata = {**seen.metadata, **freshness_metadata(state, heartbeat)}
                observations.append(AssetObservation(asset_key=seen.asset_key, tags=seen.tags, metadata=metadata))
        return SensorResult(asset_events=observations)

    return events_waiting_sensor
