"""Each captured table's Kafka topic as an observable source asset, upstream of its Delta table.

A topic's data version is its end offsets: an observation with a new one means new change events, which is
what a table's automation condition (``AutomationCondition.eager()`` and the like) reacts to. One consumer
observes every topic at once (``TopicProbe.end_offsets``), whether the observation comes from the topics'
op (the UI's "Observe", an observation run) or from ``topic_observations`` (a sensor's tick, no run).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetKey,
    AssetObservation,
    AssetsDefinition,
    AssetSelection,
    AssetSpec,
    BetaWarning,
    DagsterInstance,
    DataVersion,
    EventLogEntry,
    JsonMetadataValue,
    ObserveResult,
    define_asset_job,
    in_process_executor,
    multi_observable_source_asset,
)

# Not exported at dagster's top level: the tag under which an observation carries its data version.
from dagster._core.definitions.data_version import DATA_VERSION_TAG

from cdc_assets.catalog import CapturedTable
from cdc_assets.io.kafka import TopicProbe
from cdc_assets.translator import CdcTranslator

if TYPE_CHECKING:  # what define_asset_job returns; Dagster does not export its name
    from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

TOPIC_KINDS = {"kafka"}
OBSERVE_TOPICS_JOB = "cdc_observe_topics_job"


def topic_data_version(ends: Mapping[int, int]) -> str:
    """A topic's data version: its end offsets per partition (changed by every new record, nothing else)."""
    return json.dumps({str(partition): ends[partition] for partition in sorted(ends)}, separators=(",", ":"))


def topic_observations(tables: Sequence[CapturedTable], probe: TopicProbe, translator: CdcTranslator,
                       recorded: Mapping[AssetKey, Mapping[int, int] | None] | None = None
                       ) -> list[AssetObservation]:
    """An observation of each table's topic: its data version (``topic_data_version``), end offsets and, where
    ``recorded`` gives the end offsets the table's latest materialization applied, the events waiting past
    them (records retention deleted counted too). A missing topic is left out (its table's run says why)."""
    ends = probe.end_offsets(table.topic for table in tables)
    observations = []
    for table in tables:
        end = ends.get(table.topic)
        if end is None:
            continue
        metadata: dict[str, Any] = {"topic": table.topic, "end_offsets": {str(p): o for p, o in sorted(end.items())}}
        if recorded is not None:
            applied = recorded.get(translator.get_asset_key(table)) or {}
            metadata["events_waiting"] = sum(max(0, offset - applied.get(partition, 0))
                                             for partition, offset in end.items())
        observations.append(AssetObservation(asset_key=translator.get_topic_asset_key(table), metadata=metadata,
                                             tags={DATA_VERSION_TAG: topic_data_version(end)}))
    return observations


def build_topic_sources(tables: Sequence[CapturedTable], kafka_settings: Mapping[str, Any],
                        translator: CdcTranslator | None = None, name: str = "cdc_topics") -> AssetsDefinition:
    """The topics of ``tables`` as observable source assets (one subsettable op observes the selected ones
    with one consumer), each in its table's group."""
    translator = translator or CdcTranslator()
    by_key = {translator.get_topic_asset_key(table): table for table in tables}
    specs = [AssetSpec(key, group_name=translator.get_group_name(table), kinds=TOPIC_KINDS,
                       description=f"Kafka topic `{table.topic}`: the change events of `{table.name}` "
                                   f"({table.kind} connector `{table.connector}`).",
                       metadata={"topic": table.topic})
             for key, table in by_key.items()]

    def cdc_topics(context) -> Iterator[ObserveResult]:  # Dagster refuses a string annotation of context here
        selected = [table for key, table in by_key.items() if key in context.selected_asset_keys]
        with TopicProbe(kafka_settings) as probe:
            recorded = recorded_ends(context.instance, [translator.get_asset_key(table) for table in selected])
            observations = topic_observations(selected, probe, translator, recorded)
        for observation in observations:
            yield ObserveResult(asset_key=observation.asset_key, metadata=observation.metadata,
                                data_version=DataVersion(observation.tags[DATA_VERSION_TAG]))

    # A beta API, chosen knowingly: its warning would otherwise open every run's and every load's log.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BetaWarning)
        return multi_observable_source_asset(name=name, specs=specs, can_subset=True,
                                             description="Observes the topics' end offsets (their data versions)"
                                             )(cdc_topics)


def build_observe_topics_job(sources: AssetsDefinition) -> UnresolvedAssetJobDefinition:
    """The job that observes every topic of ``sources`` once (what the UI's "Observe sources" does for a
    selection), for a first observation before any sensor runs."""
    return define_asset_job(OBSERVE_TOPICS_JOB, selection=AssetSelection.assets(sources),
                            executor_def=in_process_executor,
                            description="Observe every topic once: its end offsets (data version) and the events "
                                        "waiting for its table.")


def recorded_ends(instance: DagsterInstance, keys: Sequence[AssetKey]) -> dict[AssetKey, dict[int, int] | None]:
    """The end offsets the latest materialization of each table asset of ``keys`` recorded, from one event-log
    query (None: none, or one that recorded none)."""
    latest = instance.get_latest_materialization_events(keys)
    return {key: materialized_ends(latest.get(key)) for key in keys}


def materialized_ends(entry: EventLogEntry | None) -> dict[int, int] | None:
    """The end offsets per partition a materialization's ``offsets`` metadata (``report_metadata``) recorded, or
    None (no materialization, or one of a schema change)."""
    materialization = entry.asset_materialization if entry is not None else None
    offsets = materialization.metadata.get("offsets") if materialization is not None else None
    if not isinstance(offsets, JsonMetadataValue) or not isinstance(offsets.value, dict):
        return None
    return {int(partition): int(span["to"]) for partition, span in offsets.value.items()}
