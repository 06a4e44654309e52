"""The captured tables of a pipeline: config entries (and include patterns) resolved to topics and paths."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cdc_assets.config import (
    DEFAULT_UNAVAILABLE_PLACEHOLDER,
    ChecksAfterMerge,
    ConfigError,
    ConnectorConfig,
    PipelineConfig,
    RowsMatchSourceConfig,
    TableConfig,
)
from cdc_assets.core.apply_modes import ApplyMode, ApplyModeName, apply_mode
from cdc_assets.core.columns import EVERY_COLUMN, ColumnChoices
from cdc_assets.core.reconcile import DIALECT_OF_KIND
from cdc_assets.core.schema_evolution import RegistryEntry
from cdc_assets.io.avro import SchemaRegistrySettings
from cdc_assets.io.delta import DeltaTarget
from cdc_assets.io.transactions import TransactionLog


@dataclass(frozen=True)
class MergeRules:
    """How a table's events become rows of its Delta table: what the micro-batch merge reads and follows."""

    key_columns: tuple[str, ...] | None = None  # None: the record key's fields
    columns: dict[str, str] | None = None  # {name: Spark SQL type} for a topic whose events carry no schema
    apply_mode: ApplyModeName = "scd1"
    column_choices: ColumnChoices = EVERY_COLUMN  # the columns kept, and the update nulls ignored
    document_fields: tuple[tuple[str, str], ...] = ()  # MongoDB: top-level fields kept as typed columns
    schema_registry: SchemaRegistrySettings | None = None  # the connector's format is avro: its schemas
    unavailable_placeholder: str = DEFAULT_UNAVAILABLE_PLACEHOLDER  # the connector's unavailable.value.placeholder
    on_bad_event: str = "halt"
    dead_letter: DeltaTarget | None = None
    on_truncate: str = "halt"


@dataclass(frozen=True)
class TransactionRules:
    """A table that applies whole transactions only: where their BEGIN/END markers and the consistent
    watermarks are, and how long a transaction may block the table before it counts as stalled."""

    log: TransactionLog
    watermarks: DeltaTarget
    timeout_s: float = 300.0


@dataclass(frozen=True)
class CheckLimits:
    """What the table's asset checks compare against (beyond what the merge records)."""

    max_capture_lag_s: float = 3600.0
    max_watermark_lag_s: float = 3600.0
    max_heartbeat_age_s: float | None = None  # the connector sends heartbeats: how old the newest may be
    # Where rows_match_source reads the source table (None: the check is not defined for the table).
    rows_match_source: RowsMatchSourceConfig | None = None
    source_dsn_env: str | None = None


@dataclass(frozen=True)
class AssetSettings:
    """How Dagster shows and schedules the table's asset."""

    owners: tuple[str, ...] = ()
    tags: tuple[tuple[str, str], ...] = ()
    automation: str = "eager"  # how Dagster's declarative automation merges it (config: automation)
    checks_after_merge: ChecksAfterMerge = "blocking"  # the pipeline's: which checks its merge runs evaluate


@dataclass(frozen=True)
class CapturedTable:
    """One captured table (Debezium: data collection): where it comes from and goes, and the settings of
    each job done with it, grouped by that job."""

    connector: str
    kind: str
    topic_prefix: str
    name: str
    topic: str
    target: DeltaTarget
    merge: MergeRules = MergeRules()
    transactions: TransactionRules | None = None  # set when the table applies whole transactions only
    checks: CheckLimits = CheckLimits()
    asset: AssetSettings = AssetSettings()
    retired: bool = False

    @property
    def app_id(self) -> str:
        """The Delta app-transaction id under which this table's offsets are committed."""
        return f"cdc_assets:{self.topic}"

    @property
    def source_table(self) -> str:
        """The source table (Debezium's data collection) whose changes the table holds, ``<schema>.<table>``: the
        one its topic names where the topic is Debezium's ``<topic.prefix>.<schema>.<table>`` (a second Delta
        table of one topic, ``name`` then being the Delta table's own), else its ``name`` (a routed topic).
        What ``rows_match_source`` reads and the incremental snapshots of a backfill or repair name."""
        prefix = f"{self.topic_prefix}."
        rest = self.topic[len(prefix):] if self.topic.startswith(prefix) else ""
        return rest if rest.count(".") == 1 else self.name

    @property
    def mode(self) -> ApplyMode:
        """The rules of the table's apply mode (``core.apply_modes``), for its connector's kind."""
        return apply_mode(self.merge.apply_mode, self.kind)


def pipeline_table_path(root: str, name: str) -> str:
    """Where a pipeline's own tables live: ``<delta root>/_cdc_assets/<name>``."""
    return root.rstrip("/") + "/_cdc_assets/" + name


def _transactions(config: PipelineConfig, connector: ConnectorConfig, table: TableConfig) -> TransactionRules | None:
    consistency = table.consistency or ("transaction" if connector.transaction_metadata else "event")
    if consistency != "transaction":
        return None
    topic = connector.transaction_topic or f"{connector.topic_prefix}.transaction"
    options = dict(config.delta.storage_options)
    log = TransactionLog(topic, DeltaTarget(pipeline_table_path(config.delta.root, f"transactions/{topic}"), options),
                         connector.kind, schema_registry_settings(connector))
    return TransactionRules(log, DeltaTarget(pipeline_table_path(config.delta.root, "watermarks"), options),
                            connector.transaction_timeout_s)


def schema_registry_settings(connector: ConnectorConfig) -> SchemaRegistrySettings | None:
    """Where an Avro connector's schemas are (None: the connector's format is json)."""
    registry = connector.schema_registry
    if connector.format != "avro" or registry is None:
        return None
    return SchemaRegistrySettings(registry.url, registry.basic_auth_user_env, registry.basic_auth_password_env,
                                  registry.ssl_ca_location)


def _is_url(path: str) -> bool:
    return bool(re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", path))


def new_table(config: PipelineConfig, connector: ConnectorConfig, name: str) -> CapturedTable:
    """The table ``name`` of ``connector`` as it is captured once it appears (created at the source
    after deployment): the connector's defaults, no table entry of its own."""
    return _captured_table(config, connector, TableConfig(name=name), "<config>", None)


def table_finder(config: PipelineConfig, tables: Iterable[CapturedTable]) -> Callable[[str, str], CapturedTable]:
    """``find(connector, name)``: the table as resolved in ``tables``, else as ``new_table`` captures it
    (created at the source since the code location loaded)."""
    known = {(table.connector, table.name): table for table in tables}
    connectors = {connector.name: connector for connector in config.connectors}

    def find(connector: str, name: str) -> CapturedTable:
        return known.get((connector, name)) or new_table(config, connectors[connector], name)

    return find


def _captured_table(config: PipelineConfig, connector: ConnectorConfig, table: TableConfig, source: str,
                    entry: RegistryEntry | None) -> CapturedTable:
    options = dict(config.delta.storage_options)
    return CapturedTable(
        connector=connector.name,
        kind=connector.kind,
        topic_prefix=connector.topic_prefix,
        name=table.name,
        topic=table.topic or f"{connector.topic_prefix}.{table.name}",
        target=DeltaTarget(_table_path(config.delta.root, connector, table, source), options),
        merge=MergeRules(
            key_columns=tuple(table.key_columns) if table.key_columns else None,
            columns=dict(table.columns) if table.columns else None,
            apply_mode=table.apply_mode,
            column_choices=table.column_choices,
            document_fields=tuple(table.document_fields.items()),
            schema_registry=schema_registry_settings(connector),
            unavailable_placeholder=connector.unavailable_value_placeholder,
            on_bad_event=table.on_bad_event,
            dead_letter=DeltaTarget(pipeline_table_path(config.delta.root, "dead_letter"), options),
            on_truncate=table.on_truncate,
        ),
        transactions=_transactions(config, connector, table),
        checks=CheckLimits(
            max_capture_lag_s=table.max_capture_lag_s or config.max_capture_lag_s,
            max_watermark_lag_s=connector.max_watermark_lag_s,
            max_heartbeat_age_s=connector.max_heartbeat_age_s,
            **_rows_match_source(connector),
        ),
        asset=AssetSettings(
            owners=tuple(table.owners or connector.owners),
            tags=tuple(sorted({**connector.tags, **table.tags}.items())),
            automation=table.automation or connector.automation,
            checks_after_merge=config.checks_after_merge,
        ),
        retired=entry is not None and entry.status == "retired",
    )


def _rows_match_source(connector: ConnectorConfig) -> dict[str, Any]:
    """The table's ``rows_match_source`` settings: its connector's, or the defaults for a connector whose kind
    the check reads and that names a DSN (a signal channel's); none otherwise."""
    if connector.kind not in DIALECT_OF_KIND or connector.source_dsn_env is None:
        return {}
    return {"rows_match_source": connector.rows_match_source or RowsMatchSourceConfig(),
            "source_dsn_env": connector.source_dsn_env}


def _table_path(root: str, connector: ConnectorConfig, table: TableConfig, source: str) -> str:
    default = posixpath.join(root, connector.topic_prefix, *table.name.split("."))
    if table.path is None:
        return default
    path = table.path if (_is_url(table.path) or table.path.startswith("/")) else posixpath.join(root, table.path)
    normalized = posixpath.normpath(path) if not _is_url(path) else path
    root_normalized = posixpath.normpath(root) if not _is_url(root) else root.rstrip("/")
    if not (normalized == root_normalized or normalized.startswith(root_normalized.rstrip("/") + "/")):
        raise ConfigError(
            f"{source}: table '{connector.name}/{table.name}': path '{table.path}' is outside the Delta root "
            f"'{root}'; keep table paths under the root")
    return normalized


def captures(connector: ConnectorConfig, table: str) -> bool:
    """Whether ``connector`` captures ``table`` (listed, or matched by an include pattern)."""
    return any(t.name == table for t in connector.tables) or any(re.fullmatch(p, table) for p in connector.include)


def resolve_tables(config: PipelineConfig, list_topics: Callable[[], Iterable[str]] | None = None,
                   source: str = "<config>", registry: Mapping[tuple[str, str], RegistryEntry] | None = None
                   ) -> list[CapturedTable]:
    """All captured tables: those listed, topics matching include patterns, and tables the schema
    registry knows (created at the source after deployment, or retired by a DROP).

    ``list_topics`` is only called when a connector has include patterns; it returns the broker's
    topic names (``<topic.prefix>.<schema>.<table>``).
    """
    registry = registry or {}
    tables: list[CapturedTable] = []
    topics: list[str] | None = None
    for connector in config.connectors:
        entries = list(connector.tables)
        listed = {table.name for table in entries}
        if connector.include:
            if list_topics is None:
                raise ConfigError(f"{source}: connector '{connector.name}' uses include patterns, which need "
                                  "the broker's topic list")
            if topics is None:
                topics = sorted(list_topics())
            prefix = connector.topic_prefix + "."
            for topic in topics:
                if not topic.startswith(prefix) or topic.endswith(".transaction") or topic.endswith(".signals"):
                    continue
                name = topic[len(prefix):]
                if name not in listed and any(re.fullmatch(p, name) for p in connector.include):
                    entries.append(TableConfig(name=name))
                    listed.add(name)
        for (registered_connector, name), entry in sorted(registry.items()):
            if registered_connector == connector.name and name not in listed and captures(connector, name):
                entries.append(TableConfig(name=name, key_columns=list(entry.primary_keys) or None,
                                           columns=entry.column_types))
                listed.add(name)
        for table in entries:
            tables.append(_captured_table(config, connector, table, source, registry.get((connector.name, table.name))))
    return tables
