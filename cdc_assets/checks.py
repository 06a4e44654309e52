"""Asset checks of every CDC table: the keys are unique and never null (blocking: they guard
correctness for anything downstream), the table is fresh now (no event waits in its topic longer
than its bound, the connector's heartbeats are recent), the capture lag of the last merge is under
its bound, no event of the table sits in the dead-letter table, and the Delta schema holds every
column the source last announced.

Each table shows its own checks, but they are not an op each (thousands of ops made the code location
load in minutes): the checks a merge run evaluates after each table's merge (``merge_check_specs``: the
blocking key checks, or all with ``checks_after_merge: all``) are check specs of the connector's merge
op (``cdc_assets.assets``), also evaluated on their own when only they are selected; the others, and the
live ``freshness`` checks, are a subsettable check op each per connector, run on the freshness schedule."""

import functools
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import pyarrow.compute as pc
from confluent_kafka import KafkaException
from dagster import (
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    DagsterInstance,
    MaterializeResult,
    MetadataValue,
    multi_asset_check,
)
from deltalake import DeltaTable

from cdc_assets.catalog import CapturedTable
from cdc_assets.check_names import (
    CAPTURE_LAG_CHECK,
    DEAD_LETTERS_CHECK,
    FRESHNESS_CHECK,
    KEY_CHECK,
    ROWS_MATCH_SOURCE_CHECK,
    SCHEMA_CHECK,
    TRANSACTIONS_CHECK,
    UNAVAILABLE_CHECK,
    WATERMARK_CHECK,
)
from cdc_assets.core.apply_modes import apply_mode
from cdc_assets.core.layout import PLACEHOLDER_KINDS
from cdc_assets.core.reconcile import DIALECT_OF_KIND, live_rows
from cdc_assets.core.schema_evolution import RegistryEntry
from cdc_assets.core.transaction_status import counts_from_metadata
from cdc_assets.io.avro import record_decoder
from cdc_assets.io.delta import DeltaRsWriter, DeltaTarget, DeltaWriter, KeyReport, open_table
from cdc_assets.io.freshness import FreshnessProbe, TableFreshness, freshness_verdict
from cdc_assets.io.kafka import SourceError
from cdc_assets.io.reconcile import (
    ConnectOffsets,
    DeltaSide,
    ReconcileError,
    Reconciliation,
    committed_position_reached,
    open_source,
    reconcile,
    recorded_position,
)
from cdc_assets.io.registry import read_registry
from cdc_assets.io.storage import StorageConfigError
from cdc_assets.io.transactions import latest_watermark
from cdc_assets.resources import DeltaResource, KafkaResource, SparkResource
from cdc_assets.translator import CdcTranslator


def duration_text(seconds: float) -> str:
    """``seconds`` as a person reads a duration: "0.4 s", "42 s", "3 min 5 s", "1 h 26 min", "2 d 3 h"."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    for unit, size, smaller, smaller_size in (("d", 86400, "h", 3600), ("h", 3600, "min", 60), ("min", 60, "s", 1)):
        if whole >= size:
            rest = (whole % size) // smaller_size
            return f"{whole // size} {unit}" + (f" {rest} {smaller}" if rest else "")
    return f"{whole} s"


NOT_MATERIALIZED = "cannot evaluate: {name} has no materialization yet (materialize it, or run cdc_merge_job)"


def _not_evaluated(key: AssetKey, check_name: str, why: str) -> AssetCheckResult:
    """A check that could not look: a warning that says why, never a pass."""
    return AssetCheckResult(asset_key=key, check_name=check_name, passed=False, severity=AssetCheckSeverity.WARN,
                            description=why, metadata={"evaluated": False})


def _key_report(table: CapturedTable, writer: DeltaWriter, merged_keys: Sequence[str]) -> KeyReport | None:
    """Key statistics of the table; its key columns are the configured ones, else those this step's merge
    recorded (``merged_keys``) or, if it applied nothing, its last batch commit (taken from the record keys)."""
    keys = table.merge.key_columns or tuple(merged_keys)
    if not keys:
        progress = writer.read_progress(table.target, table.app_id)
        keys = progress.key_columns if progress else ()
    return writer.key_report(table.target, keys) if keys else None


def live_freshness(table: CapturedTable, probe: FreshnessProbe) -> tuple[TableFreshness, datetime | None]:
    """The table's topic against the offsets its Delta table committed, and the connector's newest
    heartbeat (looked up only for a connector that sends them)."""
    progress = DeltaRsWriter().read_progress(table.target, table.app_id)  # the Delta log alone: no Spark
    state = probe.table_freshness(table.topic, progress.offsets if progress else None,
                                  record_decoder(table.merge.schema_registry))
    heartbeat = probe.last_heartbeat(table.topic_prefix) if table.checks.max_heartbeat_age_s else None
    return state, heartbeat


def freshness_metadata(state: TableFreshness, heartbeat: datetime | None) -> dict[str, Any]:
    """What the freshness check and the events-waiting observations show."""
    metadata: dict[str, Any] = {"events_waiting": state.events_waiting, "behind_s": round(state.behind_s, 3),
                                "behind": duration_text(state.behind_s)}
    if state.waiting_since is not None:
        metadata["waiting_since"] = state.waiting_since.isoformat()
    if state.newest_source_time is not None:
        metadata["newest_waiting_source_time"] = state.newest_source_time.isoformat()
    if heartbeat is not None:
        metadata["last_heartbeat_at"] = heartbeat.isoformat()
        metadata["heartbeat_age_s"] = round((state.checked_at - heartbeat).total_seconds(), 3)
    return metadata


def table_check_specs(table: CapturedTable, key: AssetKey) -> list[AssetCheckSpec]:
    """The specs of the checks that look at what the merges of ``table`` left (``evaluate_table_checks``):
    those its merge runs evaluate (``merge_check_specs``) are check specs of the connector's merge op, the
    others (``scheduled_check_specs``) of its scheduled check op (``build_scheduled_table_checks``)."""
    name = table.name
    specs = [
        # One key check, not two: each evaluation is an event Dagster stores, 31-38 ms apiece in its SQLite
        # storage (docs/performance.md).
        AssetCheckSpec(KEY_CHECK, asset=key, blocking=True, description=(
            f"Each key of {name} appears once and no row has a null key (current versions for scd2).")),
        AssetCheckSpec(CAPTURE_LAG_CHECK, asset=key, description=(
            f"The newest change applied by the last merge of {name} is at most "
            f"{duration_text(table.checks.max_capture_lag_s)} old.")),
        AssetCheckSpec(DEAD_LETTERS_CHECK, asset=key, description=f"No event of {name} is in the dead-letter table."),
        AssetCheckSpec(SCHEMA_CHECK, asset=key,
                       description=f"The Delta table of {name} has every column the source last announced."),
    ]
    if table.transactions is not None:
        timeout_s = table.transactions.timeout_s
        specs += [
            AssetCheckSpec(TRANSACTIONS_CHECK, asset=key, blocking=True, description=(
                f"No transaction has kept {name} from applying anything for "
                f"{duration_text(timeout_s)} or more (events its END announces missing, or no "
                "END).")),
            AssetCheckSpec(WATERMARK_CHECK, asset=key, description=(
                f"The connector's consistent watermark is at most "
                f"{duration_text(table.checks.max_watermark_lag_s)} old.")),
        ]
    if table.kind in PLACEHOLDER_KINDS:
        # Evaluated after each merge, on that merge's own count: a later merge's would hide it.
        specs.append(AssetCheckSpec(UNAVAILABLE_CHECK, asset=key, blocking=True, description=(
            f"Every value of {name} the source left unavailable (PostgreSQL's unchanged TOAST, Oracle's LOBs) "
            "was kept from the table's row: none was stored as null.")))
    return specs


def evaluated_after_merge(table: CapturedTable, spec: AssetCheckSpec) -> bool:
    """Whether a merge run of ``table`` evaluates its check ``spec``: the blocking checks always (they stop
    what depends on a table whose keys broke), the warnings with ``checks_after_merge: all`` only, else on the
    freshness schedule. Each evaluation is an event Dagster stores (31-38 ms each in its SQLite storage: five
    checks a table were half of a 50-table run's time, docs/performance.md)."""
    return spec.blocking or table.asset.checks_after_merge == "all"


def merge_check_specs(table: CapturedTable, key: AssetKey) -> list[AssetCheckSpec]:
    """The checks of ``table`` (``table_check_specs``) that its merge run evaluates."""
    return [spec for spec in table_check_specs(table, key) if evaluated_after_merge(table, spec)]


def scheduled_check_specs(table: CapturedTable, key: AssetKey) -> list[AssetCheckSpec]:
    """The checks of ``table`` (``table_check_specs``) left to the freshness schedule's runs."""
    return [spec for spec in table_check_specs(table, key) if not evaluated_after_merge(table, spec)]


def merge_run_checks(selected: Mapping[AssetKey, CapturedTable]) -> list[AssetCheckKey]:
    """The checks a merge run of the ``selected`` tables evaluates, for its run request to name: without
    them Dagster adds every check of the selected assets, the scheduled ones' ops too."""
    return [spec.key for key, table in selected.items() for spec in merge_check_specs(table, key)]


def selected_check_names(check_keys: Iterable[AssetCheckKey]) -> dict[AssetKey, set[str]]:
    """An op run's selected ``check_keys`` as the check names of each asset."""
    names: dict[AssetKey, set[str]] = {}
    for check_key in check_keys:
        names.setdefault(check_key.asset_key, set()).add(check_key.name)
    return names


def freshness_check_spec(table: CapturedTable, key: AssetKey) -> AssetCheckSpec:
    """The spec of the live ``freshness`` check (``build_freshness_checks``: kafka only, no pool)."""
    max_age_s = table.checks.max_heartbeat_age_s
    heartbeat_rule = (f"; the connector's newest heartbeat is at most {duration_text(max_age_s)} old"
                      if max_age_s else "")
    return AssetCheckSpec(FRESHNESS_CHECK, asset=key, description=(
        f"Live, on its own schedule: no event of {table.name} has waited in its topic longer than "
        f"{duration_text(table.checks.max_capture_lag_s)}{heartbeat_rule}."))


class RunReads:
    """What the checks of one op run read once for all its tables (read per table, a run's checks grew with
    the square of the connector's tables): the schema registry, and the dead-letter table's count per topic,
    read again only when a commit has changed it."""

    def __init__(self, delta: DeltaResource):
        self._delta = delta
        self._dead_letters: dict[str, tuple[DeltaTable, int, dict[str, int]]] = {}

    def dead_letters(self, target: DeltaTarget) -> dict[str, int]:
        """The events in the dead-letter table ``target`` per topic, as of its latest version."""
        seen = self._dead_letters.get(target.path)
        table = seen[0] if seen is not None else open_table(target)
        if table is None:
            return {}  # none yet: looked for again by the next check, as a merge may create it
        if seen is not None:
            table.update_incremental()  # a merge of this run may have dead-lettered events since
            if table.version() == seen[1]:
                return seen[2]
        topics = table.to_pyarrow_dataset().to_table(columns=["topic"]).column("topic")
        counts = {str(row["values"]): int(row["counts"]) for row in pc.value_counts(topics).to_pylist()}
        self._dead_letters[target.path] = (table, table.version(), counts)
        return counts

    @functools.cached_property
    def registry(self) -> dict[tuple[str, str], RegistryEntry]:
        """The latest registry entry per (connector, table), as the run's first check found it."""
        return read_registry(self._delta.registry_path, self._delta.as_config().storage_options)


def evaluate_table_checks(table: CapturedTable, key: AssetKey, selected: set[str], instance: DagsterInstance,
                          delta: DeltaResource, spark: SparkResource, reads: RunReads,
                          materialized: MaterializeResult | None = None, merged_by: DeltaWriter | None = None
                          ) -> Iterator[AssetCheckResult]:
    """The results of the ``selected`` checks (names) of ``table`` among ``table_check_specs``;
    ``reads``: the op run's shared reads; ``materialized``: the table's materialization in this step, if
    it merged (else its latest is read from ``instance``), and ``merged_by`` the writer that merged it,
    whose loaded table the key check reads (else the writer of ``delta`` loads it)."""
    merged = _plain_metadata(materialized)
    latest = None if materialized is not None else instance.get_latest_materialization_event(key)
    if materialized is None and latest is None:
        # Never merged: every check of what merges left would pass on nothing, so none claims to.
        for name in sorted(selected):
            yield _not_evaluated(key, name, NOT_MATERIALIZED.format(name=table.name))
        return
    if KEY_CHECK in selected:
        writer = merged_by or delta.writer_for_schema_changes(spark)
        yield _primary_key(key, _key_report(table, writer, merged.get("key_columns") or ()))
    last: dict[str, Any] = merged  # the metadata of the table's latest materialization
    if latest is not None and latest.asset_materialization is not None:
        last = {name: value.value for name, value in latest.asset_materialization.metadata.items()}
    if CAPTURE_LAG_CHECK in selected:
        yield _capture_lag(table, key, last)
    if DEAD_LETTERS_CHECK in selected:
        yield _no_dead_letters(table, key, reads)
    if SCHEMA_CHECK in selected:
        yield _schema_matches_source(table, key, delta, spark, reads.registry.get((table.connector, table.name)))
    if TRANSACTIONS_CHECK in selected and table.transactions is not None:
        yield _transactions_reconciled(table, key, last)
    if WATERMARK_CHECK in selected and table.transactions is not None:
        yield _consistent_watermark_fresh(table, key)
    if UNAVAILABLE_CHECK in selected:
        yield _unavailable_values_kept(table, key, last)


def _primary_key(key: AssetKey, report: KeyReport | None) -> AssetCheckResult:
    """The ``primary_key`` check's result from the table's key statistics (None: no batch applied yet)."""
    if report is None:
        return AssetCheckResult(asset_key=key, check_name=KEY_CHECK, passed=True,
                                metadata={"rows": 0, "note": "no batch applied yet"})
    problems = [f"{report.duplicate_keys} key(s) appear more than once"] if report.duplicate_keys else []
    if report.null_keys:
        problems.append(f"{report.null_keys} row(s) have a null key")
    return AssetCheckResult(
        asset_key=key, check_name=KEY_CHECK, passed=not problems, description="; ".join(problems) or None,
        metadata={"rows": report.rows, "duplicate_keys": report.duplicate_keys, "null_keys": report.null_keys})


def _plain_metadata(materialized: MaterializeResult | None) -> dict[str, Any]:
    """A materialization's metadata as plain values (none if ``materialized`` is None)."""
    metadata = (materialized.metadata or {}) if materialized is not None else {}
    return {name: value.value if isinstance(value, MetadataValue) else value for name, value in metadata.items()}


def _capture_lag(table: CapturedTable, key: AssetKey, last: Mapping[str, Any]) -> AssetCheckResult:
    lag = last.get("capture_lag_s")
    if lag is None:
        return AssetCheckResult(asset_key=key, check_name=CAPTURE_LAG_CHECK, passed=True,
                                description="the last merge applied no change: no lag to measure",
                                metadata={"note": "the last merge applied no change"})
    passed = lag <= table.checks.max_capture_lag_s
    description = (f"the newest change the last merge applied was {duration_text(lag)} old "
                   f"({'within' if passed else 'beyond'} the bound of {duration_text(table.checks.max_capture_lag_s)})")
    return AssetCheckResult(asset_key=key, check_name=CAPTURE_LAG_CHECK, passed=passed, description=description,
                            severity=AssetCheckSeverity.WARN,
                            metadata={"capture_lag": duration_text(lag), "capture_lag_s": lag,
                                      "bound_s": table.checks.max_capture_lag_s})


def _no_dead_letters(table: CapturedTable, key: AssetKey, reads: "RunReads") -> AssetCheckResult:
    dead_letter = table.merge.dead_letter
    count = reads.dead_letters(dead_letter).get(table.topic, 0) if dead_letter is not None else 0
    return AssetCheckResult(asset_key=key, check_name=DEAD_LETTERS_CHECK, passed=count == 0,
                            severity=AssetCheckSeverity.WARN, metadata={"dead_lettered_events": count})


def _schema_matches_source(table: CapturedTable, key: AssetKey, delta: DeltaResource, spark: SparkResource,
                           entry: RegistryEntry | None) -> AssetCheckResult:
    if entry is None:
        return AssetCheckResult(asset_key=key, check_name=SCHEMA_CHECK, passed=True,
                                metadata={"note": "no schema-change event announced this table"})
    schema = delta.writer_for_schema_changes(spark).table_schema(table.target)
    present = set(schema.fieldNames()) if schema is not None else set()
    missing = [column for column in entry.columns.fieldNames() if column not in present]
    return AssetCheckResult(asset_key=key, check_name=SCHEMA_CHECK, passed=not missing,
                            severity=AssetCheckSeverity.WARN,
                            metadata={"missing_columns": missing, "announced": entry.columns.fieldNames()})


def _transactions_reconciled(table: CapturedTable, key: AssetKey, last: Mapping[str, Any]) -> AssetCheckResult:
    """Fails on a transaction that has kept the table from applying anything for ``transaction_timeout_s``: its
    END announces more events than the table's topic holds, or there is no END naming the table. One that is
    incomplete for less long passes, listed: a connector writes the END and the events to different
    partitions, and a restarted one writes again what it had not stored as sent."""
    incomplete: dict[str, Any] = dict(last.get("transactions_incomplete") or {})
    stalled = counts_from_metadata(last.get("transactions_stalled"))
    problems = [(f"transaction {tx}: END announces {n.expected} events for {table.name}, the topic holds {n.seen}"
                 if n.expected is not None else
                 f"transaction {tx}: {n.seen} of its events for {table.name} are in the topic and the transaction "
                 f"log has no END naming {table.name} for it")
                + f"; it has kept {table.name} from applying anything for {duration_text(n.waiting_s or 0.0)}"
                for tx, n in stalled.items()]
    return AssetCheckResult(asset_key=key, check_name=TRANSACTIONS_CHECK, passed=not problems,
                            description="; ".join(problems) or None,
                            metadata={"incomplete_transactions": sorted(incomplete),
                                      "stalled_transactions": sorted(stalled)})


def _unavailable_values_kept(table: CapturedTable, key: AssetKey, last: Mapping[str, Any]) -> AssetCheckResult:
    """Fails when the last merge stored unavailable values as null (``unavailable_never_seen``): neither its
    events nor the table held the value (a key change whose delete it did not read, a row never captured)."""
    never_seen = int(last.get("unavailable_never_seen") or 0)
    description = (f"the last merge of {table.name} stored {never_seen} value(s) the source left unavailable as "
                   "null: neither its events nor the table's rows held them (a primary-key change whose delete "
                   "it did not read, or a row the table never had)") if never_seen else None
    return AssetCheckResult(asset_key=key, check_name=UNAVAILABLE_CHECK, passed=not never_seen,
                            description=description, metadata={"unavailable_never_seen": never_seen})


def _consistent_watermark_fresh(table: CapturedTable, key: AssetKey) -> AssetCheckResult:
    assert table.transactions is not None
    latest = latest_watermark(table.transactions.watermarks, table.connector)
    if latest is None or latest["transaction_ts"] is None:
        return AssetCheckResult(asset_key=key, check_name=WATERMARK_CHECK, passed=False,
                                severity=AssetCheckSeverity.WARN,
                                description="no consistent watermark recorded yet (no transaction applied whole)",
                                metadata={"note": "no consistent watermark recorded yet"})
    age = (datetime.now(timezone.utc) - latest["transaction_ts"]).total_seconds()
    return AssetCheckResult(asset_key=key, check_name=WATERMARK_CHECK,
                            passed=age <= table.checks.max_watermark_lag_s, severity=AssetCheckSeverity.WARN,
                            description=f"the consistent watermark is {duration_text(age)} old (bound "
                                        f"{duration_text(table.checks.max_watermark_lag_s)})",
                            metadata={"transaction_id": latest["transaction_id"], "age_s": round(age, 3),
                                      "versions": json.loads(latest["versions"])})


def build_scheduled_table_checks(name: str, tables: Sequence[CapturedTable],
                                 translator: CdcTranslator | None = None) -> AssetChecksDefinition | None:
    """The checks of ``tables`` (one connector's) that their merge runs leave to the freshness schedule
    (``scheduled_check_specs``), in one subsettable check op named ``name`` without the merge op's pool (a
    merge waits for no check); None when the merge runs evaluate every check. Each looks at the table's
    latest materialization, Delta table and the dead-letter table as they are when it runs."""
    translator = translator or CdcTranslator()
    by_key = {translator.get_asset_key(table): table for table in tables}
    specs = [spec for key, table in by_key.items() for spec in scheduled_check_specs(table, key)]
    if not specs:
        return None

    @multi_asset_check(name=name, specs=specs, can_subset=True)
    def table_checks(context: AssetCheckExecutionContext, spark: SparkResource,
                     delta: DeltaResource) -> Iterator[AssetCheckResult]:
        reads = RunReads(delta)
        for key, names in selected_check_names(context.selected_asset_check_keys).items():
            yield from evaluate_table_checks(by_key[key], key, names, context.instance, delta, spark, reads)

    return table_checks


def build_freshness_checks(name: str, tables: Sequence[CapturedTable],
                           translator: CdcTranslator | None = None) -> AssetChecksDefinition:
    """The live ``freshness`` checks of ``tables`` (one connector's) in one check op named ``name``,
    subsettable: each table keeps a check of its own in the UI."""
    translator = translator or CdcTranslator()
    by_key = {translator.get_asset_key(table): table for table in tables}

    @multi_asset_check(name=name, specs=[freshness_check_spec(table, key) for key, table in by_key.items()],
                       can_subset=True)
    def freshness(context: AssetCheckExecutionContext, kafka: KafkaResource) -> Iterator[AssetCheckResult]:
        settings = kafka.client_settings()
        unreachable: str | None = None  # once the broker is unreachable, the other tables are not probed
        with FreshnessProbe(settings) as probe:
            for check_key in context.selected_asset_check_keys:
                table = by_key[check_key.asset_key]
                if unreachable is not None:
                    yield _not_evaluated(check_key.asset_key, FRESHNESS_CHECK, unreachable)
                    continue
                try:
                    state, heartbeat = live_freshness(table, probe)
                except SourceError as exc:
                    why = f"cannot evaluate: {exc}"
                    if isinstance(exc.__cause__, KafkaException):
                        unreachable = why = (
                            f"cannot evaluate: Kafka at {settings.get('bootstrap.servers')} did not answer ({exc}): "
                            "is the broker running, and is kafka.bootstrap_servers in the pipeline config right?")
                    yield _not_evaluated(check_key.asset_key, FRESHNESS_CHECK, why)
                    continue
                verdict = freshness_verdict(state, table.checks.max_capture_lag_s, heartbeat,
                                            table.checks.max_heartbeat_age_s)
                yield AssetCheckResult(
                    asset_key=check_key.asset_key, check_name=FRESHNESS_CHECK, passed=verdict.passed,
                    description=verdict.reason,
                    metadata={**freshness_metadata(state, heartbeat), "bound_s": table.checks.max_capture_lag_s})

    return freshness


# The rows_match_source metadata entry holding the drifted keys machine-readable, for a repair.
DRIFTED_RANGES = "drifted_ranges"
# What rows_match_source compares in each apply mode.
_COMPARED_ROWS = {"scd1": "rows", "soft_delete": "live rows (not marked deleted)", "scd2": "current versions"}


def rows_match_source_spec(table: CapturedTable, key: AssetKey) -> AssetCheckSpec:
    """The spec of ``table``'s ``rows_match_source`` check (a table whose connector names a source DSN)."""
    return AssetCheckSpec(ROWS_MATCH_SOURCE_CHECK, asset=key, description=(
        f"On demand or on its schedule: the {_COMPARED_ROWS[table.merge.apply_mode]} of {table.name}'s Delta table "
        f"equal the source table's, by counts and checksums per key bucket; a difference is drift only once the "
        f"changes in flight when it was seen have been applied."))


def evaluate_rows_match_source(table: CapturedTable, key: AssetKey, spark: SparkResource,
                               kafka: KafkaResource) -> AssetCheckResult:
    """``table``'s ``rows_match_source`` result: the comparison of ``cdc_assets.io.reconcile``, waiting for the
    changes in flight with the table's topic (``events_waiting``) for a table that has none of its own."""
    settings, dsn_env = table.checks.rows_match_source, table.checks.source_dsn_env
    assert settings is not None and dsn_env is not None
    dsn = os.environ.get(dsn_env)
    if not dsn:
        return _not_evaluated(key, ROWS_MATCH_SOURCE_CHECK, f"cannot evaluate: the environment variable {dsn_env} "
                              "(the source database's connection string) is not set")
    writer = DeltaRsWriter()
    progress = writer.read_progress(table.target, table.app_id)
    keys = table.merge.key_columns or (progress.key_columns if progress else ())
    if progress is None or not keys:
        return _not_evaluated(key, ROWS_MATCH_SOURCE_CHECK, NOT_MATERIALIZED.format(name=table.name))
    connect_url = settings.kafka_connect_url
    connector = (ConnectOffsets(connect_url, settings.kafka_connect_connector or table.connector, table.kind)
                 if connect_url is not None else None)
    try:
        session = spark.delta_reading_session
        source = open_source(table.kind, dsn, connector)
        delta = DeltaSide(session, table.target.path, apply_mode(table.merge.apply_mode, table.kind),
                          recorded_position(table.target, table.app_id, writer))
        try:
            with FreshnessProbe(kafka.client_settings()) as probe:
                def events_waiting() -> int:
                    return live_freshness(table, probe)[0].events_waiting

                result = reconcile(source, delta, table.source_table, keys, settings.buckets,
                                   committed_position_reached(delta, source, events_waiting),
                                   settings.settle_timeout_s)
        finally:
            delta.close()
            source.close()
    except (ReconcileError, SourceError, StorageConfigError) as exc:
        return _not_evaluated(key, ROWS_MATCH_SOURCE_CHECK, f"cannot evaluate: {exc}")
    return _rows_match_source_result(table, key, result, settings.sample_keys)


def _rows_match_source_result(table: CapturedTable, key: AssetKey, result: Reconciliation,
                              sample_keys: int) -> AssetCheckResult:
    drifted = [{"bucket": bucket.bucket, **bucket.counts(),
                "sample_keys": [f"{d.kind}: {d.display}" for d in bucket.differences[:sample_keys]]}
               for bucket in result.drifted]
    compared = _COMPARED_ROWS[table.merge.apply_mode]
    if result.drifted:
        totals = {kind: sum(bucket.counts()[kind] for bucket in result.drifted)
                  for kind in ("missing", "extra", "different")}
        description = (f"{table.name}: {len(drifted)} of {result.buckets} key buckets drifted from the source "
                       f"({totals['missing']} key(s) missing, {totals['extra']} extra, {totals['different']} with "
                       "different values)")
    elif result.unsettled:
        description = (f"{table.name}: {len(result.unsettled)} key bucket(s) differed and the table did not apply "
                       f"the source up to position {result.first_position} in time: not compared again (no drift "
                       "claimed)")
        if DIALECT_OF_KIND.get(table.kind) == "mysql" and table.checks.rows_match_source is not None and \
                table.checks.rows_match_source.kafka_connect_url is None:
            description += ("; a quiet MariaDB/MySQL table settles only with rows_match_source.kafka_connect_url "
                            "(the server does not know how far the connector has read)")
    else:
        description = f"{table.name}: its {compared} equal the source table's ({result.source_rows} rows)"
    metadata: dict[str, Any] = {
        "compared": compared, "buckets": result.buckets, "source_rows": result.source_rows,
        "delta_rows": result.delta_rows, "columns_compared": result.columns, "columns_left_out": result.left_out,
        "differing_at_first_look": len(result.differing_first), "drifted_buckets": MetadataValue.json(drifted),
        "in_flight_keys": result.in_flight_keys, "unsettled_buckets": result.unsettled,
        "source_position": result.first_position, "last_source_position": result.last_position,
        "source_s": round(result.source_s, 3), "delta_s": round(result.delta_s, 3),
        "waited_s": round(result.waited_s, 3), "live_rows_filter": live_rows(apply_mode(table.merge.apply_mode)) or "",
    }
    if result.drifted:  # what drift_repair_sensor's targeted snapshot reads (``core.reconcile.DriftedRanges``)
        metadata[DRIFTED_RANGES] = MetadataValue.json(result.drifted_ranges().to_metadata())
    return AssetCheckResult(asset_key=key, check_name=ROWS_MATCH_SOURCE_CHECK, passed=result.passed,
                            severity=AssetCheckSeverity.ERROR if result.drifted else AssetCheckSeverity.WARN,
                            description=description, metadata=metadata)


def build_rows_match_source_checks(name: str, tables: Sequence[CapturedTable],
                                   translator: CdcTranslator | None = None) -> AssetChecksDefinition | None:
    """The ``rows_match_source`` checks of ``tables`` (one connector's) whose connector names a source DSN, in
    one subsettable check op named ``name`` (None: no table has one). No job but their own runs them."""
    translator = translator or CdcTranslator()
    by_key = {translator.get_asset_key(table): table for table in tables
              if table.checks.rows_match_source is not None and not table.retired}
    if not by_key:
        return None

    @multi_asset_check(name=name, specs=[rows_match_source_spec(table, key) for key, table in by_key.items()],
                       can_subset=True)
    def rows_match_source(context: AssetCheckExecutionContext, spark: SparkResource,
                          kafka: KafkaResource) -> Iterator[AssetCheckResult]:
        for check_key in context.selected_asset_check_keys:
            yield evaluate_rows_match_source(by_key[check_key.asset_key], check_key.asset_key, spark, kafka)

    return rows_match_source
