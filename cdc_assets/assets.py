"""One software-defined asset per captured table: materializing it merges its new change events, in
micro-batches. The tables of a connector share one subsettable op (one op per table made the code
location load in minutes with thousands of tables): a run merges the tables it selects, several at once."""

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from dagster import (
    AssetCheckResult,
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    AssetSpec,
    Config,
    MaterializeResult,
    MetadataValue,
    TableColumn,
    TableSchema,
    multi_asset,
)
from pydantic import Field, create_model
from pydantic.fields import FieldInfo
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from cdc_assets.catalog import CapturedTable
from cdc_assets.checks import (
    RunReads,
    evaluate_table_checks,
    merge_check_specs,
    selected_check_names,
)
from cdc_assets.config import BatchLimits
from cdc_assets.io.delta import DeltaTarget, DeltaWriter
from cdc_assets.io.kafka import KafkaSource, SourceError
from cdc_assets.io.transactions import update_watermark
from cdc_assets.merge import BatchReport, FirstBatch, MergeFailed, merge_concurrently, merge_micro_batches
from cdc_assets.merge.quiet import TableState, caught_up
from cdc_assets.merge.report import offsets_metadata
from cdc_assets.resources import DeltaResource, KafkaResource, SparkResource
from cdc_assets.topics import materialized_ends
from cdc_assets.translator import CdcTranslator, dagster_name

CDC_KINDS = {"spark", "delta", "kafka"}


class MergeConfig(Config):
    """Run config of a connector's merge (launchpad): the pipeline's batch limits, for this run."""

    max_records_per_batch: int = Field(gt=0, description="max records per micro-batch (batch.max_records)")
    max_batches_per_run: int = Field(gt=0, description="micro-batches one run applies to a table while it is "
                                                       "behind (batch.max_batches_per_run)")
    concurrent_tables: int = Field(gt=0, description="tables merged at once (batch.concurrent_tables)")


def merge_config_type(limits: BatchLimits) -> type[MergeConfig]:
    """``MergeConfig`` with the pipeline's ``limits`` as its defaults: the launchpad opens with the values a run
    uses, under the merge op's name, for a user to change."""

    def default(name: str, value: int) -> tuple[type[int], FieldInfo]:
        return int, FieldInfo.merge_field_infos(MergeConfig.model_fields[name], default=value)

    return create_model(
        "MergeConfig", __base__=MergeConfig, __doc__=MergeConfig.__doc__,
        max_records_per_batch=default("max_records_per_batch", limits.max_records),
        max_batches_per_run=default("max_batches_per_run", limits.max_batches_per_run),
        concurrent_tables=default("concurrent_tables", limits.concurrent_tables))


def report_metadata(reports: Sequence[BatchReport]) -> dict[str, Any]:
    """Materialization metadata for a run's batches of one table: counts summed over the batches,
    offsets from the first batch's start to the last one's end, state as of the last batch; numbers
    as numbers, so the UI plots them."""
    last = reports[-1]
    summaries = [r.summary for r in reports if r.summary is not None]
    outcomes = [r.outcome for r in reports if r.outcome is not None]
    stages: dict[str, float] = {}
    for report in reports:
        for stage, seconds in report.timings.items():
            stages[stage] = stages.get(stage, 0.0) + seconds
    metadata: dict[str, Any] = {
        "batches": len(reports),
        "events_read": sum(r.events_read for r in reports),
        "tombstones_skipped": sum(r.tombstones for r in reports),
        "dead_lettered_events": sum(r.dead_lettered for r in reports),
        "offsets": MetadataValue.json(last.offsets(since=reports[0].raw.start_offsets)),
        "caught_up": last.raw.caught_up,
        "writer": last.writer,
        "delta_path": MetadataValue.path(last.table.target.path),
        "stage_seconds": MetadataValue.json({k: round(v, 3) for k, v in stages.items()}),
    }
    if summaries:
        metadata.update(
            events_create=sum(s.creates for s in summaries),
            events_update=sum(s.updates for s in summaries),
            events_delete=sum(s.deletes for s in summaries),
            events_snapshot_read=sum(s.snapshot_reads for s in summaries),
            incremental_snapshot_reads=sum(s.incremental_snapshot_reads for s in summaries),
        )
        truncates = sum(len(s.truncates) for s in summaries)
        if truncates:  # TRUNCATE events; with on_truncate apply, the events before them were read, not applied
            metadata.update(events_truncate=truncates,
                            events_before_truncate=sum(s.before_truncate for s in summaries))
        never_seen = sum(s.unavailable_never_seen for s in summaries)
        if never_seen:  # values the source left unavailable and nothing held: stored as null (a failed check)
            metadata["unavailable_never_seen"] = never_seen
        last_read = max((s.last_incremental_snapshot_read_ts for s in summaries
                         if s.last_incremental_snapshot_read_ts is not None), default=None)
        if last_read is not None:
            metadata["last_incremental_snapshot_read_at"] = last_read.isoformat()
    latest_applied = next((r for r in reversed(reports) if r.summary is not None), None)
    if latest_applied is not None and latest_applied.capture_lag_s is not None:
        metadata["capture_lag_s"] = round(latest_applied.capture_lag_s, 3)
    if latest_applied is not None and latest_applied.capture_lag_p50_s is not None:
        metadata["capture_lag_p50_s"] = round(latest_applied.capture_lag_p50_s, 3)
    if last.transactions is not None:
        metadata["transactions_applied"] = sum(r.transactions.applied for r in reports if r.transactions is not None)
        status = last.transactions.to_metadata()  # the JSON its commit records (``transactions_reconciled`` reads it)
        for name in ("waiting", "waiting_s", "incomplete", "stalled"):
            metadata[f"transactions_{name}"] = MetadataValue.json(status[name])
    if "total_s" in stages:
        metadata["batch_seconds"] = round(stages["total_s"], 3)
    if latest_applied is not None and latest_applied.key_columns:
        metadata["key_columns"] = list(latest_applied.key_columns)
    if outcomes:
        metadata.update(
            rows_inserted=sum(o.inserted for o in outcomes),
            rows_updated=sum(o.updated for o in outcomes),
            rows_deleted=sum(o.deleted for o in outcomes),
            delta_version=outcomes[-1].delta_version,
            already_applied=all(o.already_applied for o in outcomes),
        )
    return metadata


def caught_up_metadata(table: CapturedTable, state: TableState) -> dict[str, Any]:
    """Materialization metadata of a table with nothing new in a run (``merge.quiet``): no batch, no event
    read, offsets where its latest commit left them (its topic's end), caught up; and its column schema."""
    assert state.progress is not None  # caught up: its latest batch commit recorded its topic's end
    committed = state.progress.offsets
    offsets = offsets_metadata(committed, committed, committed, committed)
    metadata: dict[str, Any] = {
        "batches": 0, "events_read": 0, "tombstones_skipped": 0, "dead_lettered_events": 0,
        "offsets": MetadataValue.json(offsets),
        "caught_up": True,
        "delta_path": MetadataValue.path(table.target.path),
    }
    schema = column_schema(state.schema)
    if schema is not None:
        metadata["dagster/column_schema"] = schema
    return metadata


class QuietRecords:
    """Which of a run's tables with nothing new to materialize as caught up: a table is not materialized again
    when its latest materialization in Dagster already records the offsets and Delta path its latest commit
    recorded (Dagster's record is current: a second one would say the same, at two stored events a table) and
    no other step of the run reads its output (Dagster skips a step whose input was not produced). Otherwise
    (no materialization yet, one of other offsets, a schema change's, another Delta root, a consumer in the
    run) it is materialized as caught up, so the merge schedule, which reads the latest materialization,
    finds it current. One event-log query for the run's ``chosen`` tables, made at the first quiet one."""

    def __init__(self, context: AssetExecutionContext, chosen: Mapping[AssetKey, CapturedTable]):
        self._latest = context.instance.get_latest_materialization_events(list(chosen))
        outputs = context.job_def.dependency_structure.output_to_downstream_inputs_for_node(context.op_handle.name)
        consumed = {output.output_name for output, inputs in outputs.items() if inputs}
        self._consumed = {key for key in chosen if context.assets_def.get_output_name_for_asset_key(key) in consumed}
        self.materialized: list[str] = []
        self.unchanged: list[str] = []

    def needs_materialization(self, key: AssetKey, table: CapturedTable, state: TableState) -> bool:
        """Whether the quiet ``table`` (its Delta log told ``state``) is materialized as caught up in this run."""
        assert state.progress is not None  # caught up: its latest batch commit recorded its topic's end
        entry = self._latest.get(key)
        materialization = entry.asset_materialization if entry is not None else None
        path = materialization.metadata.get("delta_path") if materialization is not None else None
        current = (key not in self._consumed and caught_up(materialized_ends(entry), state.progress.offsets)
                   and path is not None and str(path.value) == table.target.path)
        (self.unchanged if current else self.materialized).append(table.name)
        return not current

    def summary(self, quiet: Sequence[str], selected: int) -> str:
        """The run's log line on its tables with nothing new."""
        parts = []
        if self.unchanged:
            parts.append(f"{len(self.unchanged)} not materialized again (their latest materializations record "
                         f"those offsets): {', '.join(self.unchanged)}")
        if self.materialized:
            parts.append(f"{len(self.materialized)} materialized as caught up: {', '.join(self.materialized)}")
        return (f"{len(quiet)} of {selected} tables had nothing new (their latest commits recorded their topics' "
                "end offsets), with no merge and no check evaluated; " + "; ".join(parts))


def column_schema(schema: StructType | None) -> TableSchema | None:
    """A Delta schema as Dagster column metadata."""
    if schema is None:
        return None
    return TableSchema(columns=[TableColumn(field.name, field.dataType.simpleString(),
                                            description="hidden CDC column" if field.name.startswith("_cdc_")
                                            else None)
                                for field in schema.fields])


def merge_op_name(connector: str) -> str:
    """The name of the op that merges the tables of ``connector`` (its launchpad config goes under it)."""
    return f"{dagster_name(connector)}_merge"


def build_connector_assets(tables: Sequence[CapturedTable], limits: BatchLimits,
                           peers: Mapping[str, DeltaTarget] | None = None,
                           translator: CdcTranslator | None = None, name: str | None = None) -> AssetsDefinition:
    """The assets of one connector's captured tables, one asset per table, in one subsettable op
    (``name``, default ``<connector>_merge``): a run merges the selected tables, ``concurrent_tables`` at once
    (``merge_concurrently``), each MERGEing its new change events into Delta one micro-batch (one commit) at a
    time, up to ``max_batches_per_run``, and then evaluates each table's checks (``merge_check_specs``), in
    config order; a table with nothing new (``merge.quiet``) is materialized as caught up, its checks not
    evaluated. The run config (``MergeConfig``) sets those limits, ``limits`` by default.
    A table whose merge fails does not stop the others; the op fails after them, naming it.

    ``peers``: the transaction-consistent tables of the connector (for the watermark);
    ``translator``: how the tables appear in Dagster (default ``CdcTranslator()``)."""
    translator = translator or CdcTranslator()
    if not tables:
        raise ValueError("a connector's assets need at least one table")
    connector = tables[0].connector
    by_key = {translator.get_asset_key(table): table for table in tables}
    # No read of the tables' storage here: the code location loads in every run worker, and the column
    # schema reaches the UI with each materialization.
    # skippable: a table with nothing new that Dagster already records as caught up yields no output (no event)
    specs = [AssetSpec(key, group_name=translator.get_group_name(table), kinds=CDC_KINDS, skippable=True,
                       description=translator.get_description(table), metadata=translator.get_metadata(table),
                       owners=translator.get_owners(table) or None, tags=translator.get_tags(table),
                       freshness_policy=translator.get_freshness_policy(table),
                       deps=[translator.get_topic_asset_key(table)],  # its topic (cdc_assets.topics)
                       automation_condition=translator.get_automation_condition(table))
             for key, table in by_key.items()]

    def merge_tables(context: AssetExecutionContext, config: MergeConfig, spark: SparkResource,
                     kafka: KafkaResource, delta: DeltaResource) -> Iterator[MaterializeResult | AssetCheckResult]:
        selected = context.selected_asset_keys
        checks = selected_check_names(context.selected_asset_check_keys)
        chosen = {key: table for key, table in by_key.items() if key in selected}

        run_limits = limits.model_copy(update={"max_records": config.max_records_per_batch,
                                               "max_batches_per_run": config.max_batches_per_run})

        def merge(key: AssetKey, session: SparkSession, source: KafkaSource, writer: DeltaWriter,
                  log: Callable[[str], None], first: FirstBatch | None) -> MaterializeResult:
            return merge_table(chosen[key], run_limits, peers, session, source, writer, key, log, first)

        ends = None
        if chosen:
            kafka.check_reachable()  # a wrong address fails here, in a line, before a Spark server starts
            try:  # tells the tables with nothing new
                ends = kafka.end_offsets(table.topic for table in chosen.values())
            except SourceError as error:  # each table's merge reads its own topic, and reports what fails
                context.log.warning(f"the topics' end offsets could not be read ({error}): every table is merged")
        merges = merge_concurrently(chosen, merge, config.concurrent_tables, lambda: spark.spark_session,
                                    kafka.new_source, delta.writer_for, shared=run_limits, ends=ends)
        reads = RunReads(delta)
        failures: list[tuple[CapturedTable, Exception]] = []
        quiet: list[str] = []  # the tables with nothing new
        recorded: QuietRecords | None = None  # looked up at the first table with nothing new
        for key, table in by_key.items():  # in config order, each as soon as its merge (and those before) ended
            materialized, merged_by = None, None
            if key in chosen:
                merged = next(merges)
                if merged.caught_up is not None:
                    # Nothing new: its checks are not evaluated again on a table this run did not change (Dagster
                    # shows them skipped), nor are its merge's reads made; materialized as caught up unless Dagster
                    # already records it so and nothing in this run consumes it (``QuietRecords``).
                    quiet.append(table.name)
                    recorded = recorded or QuietRecords(context, chosen)
                    if recorded.needs_materialization(key, table, merged.caught_up):
                        yield MaterializeResult(asset_key=key,
                                                metadata=caught_up_metadata(table, merged.caught_up))
                    continue
                if len(merged.log) > 1:  # a line per batch; one batch's is its materialization's metadata
                    for line in merged.log:
                        context.log.info(line)
                if merged.error is not None:  # the other tables go on; the op fails after them
                    context.log.error(f"{table.topic}: merge failed: {merged.error}")
                    failures.append((table, merged.error))
                    continue  # its checks are not evaluated, as when its own op failed
                materialized, merged_by = merged.result, merged.writer
                assert materialized is not None
                yield materialized
            if checks.get(key):
                # As results, not evaluation events: Dagster then counts each selected check's output as
                # yielded (else every run logs "did not yield or return expected outputs").
                yield from evaluate_table_checks(table, key, checks[key], context.instance, delta, spark, reads,
                                                 materialized, merged_by)
        if quiet:
            assert recorded is not None
            context.log.info(recorded.summary(quiet, len(chosen)))
        if len(failures) == 1:
            raise failures[0][1]
        if failures:
            raise MergeFailed(failures)

    # Dagster reads the op's config schema from this annotation: the connector's limits as its defaults.
    merge_tables.__annotations__["config"] = merge_config_type(limits)
    return multi_asset(
        name=name or merge_op_name(connector),
        specs=specs,
        check_specs=[spec for key, table in by_key.items() for spec in merge_check_specs(table, key)],
        can_subset=True,
        # One pool per connector: with a pool limit of 1 (see README), two runs never merge one table at once.
        pool=f"cdc_connector_{dagster_name(connector)}",
    )(merge_tables)


def merge_table(table: CapturedTable, limits: BatchLimits, peers: Mapping[str, DeltaTarget] | None,
                session: SparkSession, source: KafkaSource, writer: DeltaWriter, key: AssetKey,
                log: Callable[[str], None], first: FirstBatch | None = None) -> MaterializeResult:
    """One table's merge in a run, by ``writer``, within the run's ``limits``: its pending micro-batches
    applied, the first one ``first`` where it was read before (``merge.shared``), and what they did; ``log``
    is told each batch."""
    reports = []
    # Until caught up, or nothing could be applied (a transaction waits): the next run goes on.
    for report in merge_micro_batches(session, source, writer, table, limits, first):
        reports.append(report)
        log(f"{table.topic}: {report.events_read} events read, offsets {report.offsets_json()}")
    applied = [r for r in reports if r.outcome is not None]
    if applied:
        source.commit_group_offsets(table.topic, applied[-1].raw.end_offsets)
    metadata = report_metadata(reports)
    if table.transactions is not None and applied:
        rules = table.transactions
        watermark = update_watermark(table.connector, rules.log, peers or {}, rules.watermarks)
        if watermark is not None:
            metadata["consistent_watermark"] = MetadataValue.json({
                "transaction_id": watermark["transaction_id"], "end_offset": watermark["end_offset"],
                "versions": json.loads(watermark["versions"])})
    schema = column_schema(writer.table_schema(table.target))
    if schema is not None:
        metadata["dagster/column_schema"] = schema
    return MaterializeResult(asset_key=key, metadata=metadata)
