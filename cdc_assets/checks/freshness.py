"""The live ``freshness`` check: no event waits in a table's topic past its bound, and the connector's
heartbeats are recent."""

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from confluent_kafka import KafkaException
from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSpec,
    AssetKey,
    multi_asset_check,
)

from cdc_assets.catalog import CapturedTable
from cdc_assets.check_names import FRESHNESS_CHECK
from cdc_assets.checks.results import duration_text, not_evaluated
from cdc_assets.io.avro import record_decoder
from cdc_assets.io.delta import DeltaRsWriter
from cdc_assets.io.freshness import FreshnessProbe, TableFreshness, freshness_verdict
from cdc_assets.io.kafka import SourceError
from cdc_assets.resources import KafkaResource
from cdc_assets.translator import CdcTranslator


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


def freshness_check_spec(table: CapturedTable, key: AssetKey) -> AssetCheckSpec:
    """The spec of the live ``freshness`` check (``build_freshness_checks``: kafka only, no pool)."""
    max_age_s = table.checks.max_heartbeat_age_s
    heartbeat_rule = (f"; the connector's newest heartbeat is at most {duration_text(max_age_s)} old"
                      if max_age_s else "")
    return AssetCheckSpec(FRESHNESS_CHECK, asset=key, description=(
        f"Live, on its own schedule: no event of {table.name} has waited in its topic longer than "
        f"{duration_text(table.checks.max_capture_lag_s)}{heartbeat_rule}."))


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
                    yield not_evaluated(check_key.asset_key, FRESHNESS_CHECK, unreachable)
                    continue
                try:
                    state, heartbeat = live_freshness(table, probe)
                except SourceError as exc:
                    why = f"cannot evaluate: {exc}"
                    if isinstance(exc.__cause__, KafkaException):
                        unreachable = why = (
                            f"cannot evaluate: Kafka at {settings.get('bootstrap.servers')} did not answer ({exc}): "
                            "is the broker running, and is kafka.bootstrap_servers in the pipeline config right?")
                    yield not_evaluated(check_key.asset_key, FRESHNESS_CHECK, why)
                    continue
                verdict = freshness_verdict(state, table.checks.max_capture_lag_s, heartbeat,
                                            table.checks.max_heartbeat_age_s)
                yield AssetCheckResult(
                    asset_key=check_key.asset_key, check_name=FRESHNESS_CHECK, passed=verdict.passed,
                    description=verdict.reason,
                    metadata={**freshness_metadata(state, heartbeat), "bound_s": table.checks.max_capture_lag_s})

    return freshness
