"""The code location: one Definitions assembling CDC assets, jobs, schedules, sensors and resources
from the pipeline config, built when Dagster's loaders call ``defs`` (not when this module is imported)."""

from __future__ import annotations

from collections.abc import Sequence

from dagster import AssetCheckKey, Definitions, definitions, in_process_executor

from cdc_assets.assets import build_connector_assets, merge_op_name
from cdc_assets.catalog import CapturedTable, resolve_tables, table_finder
from cdc_assets.checks import build_freshness_checks, build_rows_match_source_checks, build_scheduled_table_checks
from cdc_assets.config import PipelineConfig, load_config
from cdc_assets.io.delta import DeltaTarget
from cdc_assets.io.kafka import KafkaSource
from cdc_assets.io.registry import read_registry
from cdc_assets.resources import build_resources, kafka_client_settings, registry_path
from cdc_assets.topics import build_observe_topics_job, build_topic_sources
from cdc_assets.translator import CdcTranslator, dagster_name
from jobs import (
    build_apply_schema_change_job,
    build_compaction_job,
    build_compaction_schedule,
    build_freshness_job,
    build_freshness_schedule,
    build_merge_job,
    build_merge_schedules,
    build_preflight_job,
    build_rows_match_source_job,
    build_snapshot_schedules,
    incremental_snapshot_job,
    pause_snapshot_job,
    resume_snapshot_job,
    stop_snapshot_job,
)
from jobs.merge import UI_MERGE_JOB
from sensors import (
    make_drift_repair_sensor,
    make_events_waiting_sensor,
    make_schema_change_sensor,
    make_snapshot_backfill_sensor,
    make_transaction_sensor,
)

# A connector's tables share their ops up to this many: Dagster's handling of each result an op yields walks
# every output of the op, so a run's cost grew with the square of a connector's table count (28 ms a result
# at 800 tables in one op; docs/performance.md).
TABLES_PER_OP = 100


def op_groups(tables: Sequence[CapturedTable], size: int = TABLES_PER_OP) -> list[tuple[str, list[CapturedTable]]]:
    """One connector's ``tables`` in groups of at most ``size``, in config order, each with the suffix of
    its ops' names: "" for the first (a connector of up to ``size`` tables keeps the names it always had),
    then "_2", "_3"... The transaction-consistent tables all go to the first group, however many: they
    merge one after another, sharing the connector's transaction log and watermark."""
    consistent = [table for table in tables if table.transactions is not None]
    rest = [table for table in tables if table.transactions is None]
    first = max(size - len(consistent), 0)
    groups = [consistent + rest[:first]]
    groups += [rest[start:start + size] for start in range(first, len(rest), size)]
    return [("" if index == 0 else f"_{index + 1}", group) for index, group in enumerate(groups) if group]


def broker_topics(config: PipelineConfig) -> list[str]:
    """The topics of the config's broker, for its connectors' include patterns: one metadata request."""
    source = KafkaSource(kafka_client_settings(config.kafka),
                         address_source=config.where_set("kafka.bootstrap_servers"))
    try:
        return source.topics()
    finally:
        source.close()


def build_definitions(config: PipelineConfig, translator: CdcTranslator | None = None,
                      topics: Sequence[str] | None = None) -> Definitions:
    """Assets (one per captured table), checks, jobs, schedules, sensors and resources for a pipeline
    config; ``translator`` (default ``CdcTranslator()``) decides how each table appears in Dagster.

    ``topics``: the broker's topics as known (a state-backed component's); None: asked of the broker when
    a connector's include patterns need them (``broker_topics``)."""
    translator = translator or CdcTranslator()
    kafka_settings = kafka_client_settings(config.kafka)
    registry = read_registry(registry_path(config), config.delta.storage_options)
    tables = resolve_tables(config, list_topics=(lambda: topics) if topics is not None else (
        lambda: broker_topics(config)), registry=registry)
    live = [table for table in tables if not table.retired]
    signalled = {connector.name for connector in config.connectors if connector.signal is not None}
    table_for = table_finder(config, tables)
    apply_schema_change_job = build_apply_schema_change_job(table_for, config.batch)
    sensors = [make_schema_change_sensor(config, table_for, apply_schema_change_job, translator=translator),
               make_events_waiting_sensor(live, kafka_settings, translator=translator)]
    # Per group of a connector's tables (``op_groups``), one op for their merges (and the checks its merge
    # runs evaluate), one for their live freshness checks, one for the checks left to their schedule: each
    # table is still an asset with checks of its own, but a few ops rather than six or more per table keep
    # the load (every run worker loads it) short with thousands of tables.
    by_connector: dict[str, list[CapturedTable]] = {}
    for table in tables:
        by_connector.setdefault(table.connector, []).append(table)
    groups = [(connector, suffix, group) for connector, members in by_connector.items()
              for suffix, group in op_groups(members)]
    scheduled_ops = [build_freshness_checks(f"{dagster_name(connector)}_freshness{suffix}", group, translator)
                     for connector, suffix, group in groups]
    scheduled_ops += [op for connector, suffix, group in groups
                      if (op := build_scheduled_table_checks(f"{dagster_name(connector)}_table_checks{suffix}",
                                                             group, translator)) is not None]
    # The checks on the freshness schedule: those of the ops above, for the tables still captured.
    live_keys = {translator.get_asset_key(table) for table in live}
    scheduled_checks = [key for op in scheduled_ops for key in op.check_keys if key.asset_key in live_keys]
    freshness_job = build_freshness_job(scheduled_checks)
    # rows_match_source: on demand (the UI) and on the connector's own schedule, in no merge or freshness run.
    source_ops = [(connector, op) for connector, suffix, group in groups
                  if (op := build_rows_match_source_checks(
                      f"{dagster_name(connector)}_rows_match_source{suffix}", group, translator)) is not None]
    names = {translator.get_asset_key(table): table.name for table in tables}
    source_checks: dict[str, dict[str, AssetCheckKey]] = {}  # per connector, by table name
    for connector_name, op in source_ops:
        source_checks.setdefault(connector_name, {}).update({names[key.asset_key]: key for key in op.check_keys})
    source_jobs = {connector.name: build_rows_match_source_job(connector, source_checks[connector.name])
                   for connector in config.connectors if connector.name in source_checks}
    left_out = [*scheduled_checks, *(key for keys in source_checks.values() for key in keys.values())]
    merge_job = build_merge_job(left_out)
    ui_merge_job = build_merge_job(left_out, UI_MERGE_JOB)  # the job the UI's Materialize runs
    compaction_job = build_compaction_job(config, live)
    transactional: dict[str, dict[str, DeltaTarget]] = {}
    for table in tables:
        if table.transactions is not None and not table.retired:
            transactional.setdefault(table.connector, {})[table.name] = table.target
    for connector in config.connectors:
        if connector.name in transactional:
            sensors.append(make_transaction_sensor(connector, [t for t in tables if t.connector == connector.name],
                                                   kafka_settings, merge_job,
                                                   translator=translator))
    if signalled:
        sensors.append(make_snapshot_backfill_sensor([t for t in live if t.connector in signalled],
                                                     incremental_snapshot_job, merge_job,
                                                     kafka_settings, translator=translator))
    repair = make_drift_repair_sensor(live, config.connectors, incremental_snapshot_job,
                                      {name: job for name, (job, _) in source_jobs.items()}, translator=translator)
    if repair is not None:
        sensors.append(repair)
    topic_sources = [build_topic_sources(tables, kafka_settings, translator)] if tables else []
    return Definitions(
        assets=[*(build_connector_assets(group, config.batch, transactional.get(connector), translator,
                                         name=merge_op_name(connector) + suffix)
                  for connector, suffix, group in groups),
                *topic_sources],
        asset_checks=[*scheduled_ops, *(op for _, op in source_ops)],
        jobs=[merge_job, ui_merge_job, incremental_snapshot_job, stop_snapshot_job, pause_snapshot_job,
              resume_snapshot_job, apply_schema_change_job, freshness_job, compaction_job,
              build_preflight_job(config), *(build_observe_topics_job(sources) for sources in topic_sources),
              *(job for job, _ in source_jobs.values())],
        schedules=[*build_merge_schedules(config, merge_job, tables, kafka_settings, translator),
                   *(schedule for _, schedules in source_jobs.values() for schedule in schedules),
                   *build_snapshot_schedules(config),
                   build_freshness_schedule(config, freshness_job), build_compaction_schedule(config, compaction_job)],
        sensors=sensors,
        resources=build_resources(config),
        # One process and one Spark session for all tables of a run: a JVM start costs seconds.
        executor=in_process_executor,
    )


@definitions
def defs() -> Definitions:
    """The code location of ``CDC_ASSETS_CONFIG``'s pipeline (default: the demo's): what ``dagster`` and
    ``workspace.yaml`` load of this module, built on their call, so an import (the component's, a test's)
    reads no config and asks no broker."""
    return build_definitions(load_config())
