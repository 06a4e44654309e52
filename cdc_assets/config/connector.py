"""One Debezium connector's settings, and the rules between them and its tables'."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from cdc_assets.config.base import ConfigModel
from cdc_assets.config.rows_match_source import RowsMatchSourceConfig
from cdc_assets.config.schema_registry import RecordFormat, SchemaRegistryConfig
from cdc_assets.config.snapshots import SignalConfig, SnapshotScheduleConfig
from cdc_assets.config.tables import Automation, TableConfig
from cdc_assets.core.apply_modes import apply_mode
from cdc_assets.core.columns import EVERY_COLUMN
from cdc_assets.core.layout import DOCUMENT_KINDS, MONGODB_ID_COLUMN
from cdc_assets.core.reconcile import DIALECT_OF_KIND

DEFAULT_UNAVAILABLE_PLACEHOLDER = "__debezium_unavailable_value"
# Each has its ordering rule in core.position.POSITION_RULES (mariadb shares the MySQL family's).
ConnectorKind = Literal["postgresql", "sqlserver", "db2", "mongodb", "mysql", "mariadb", "oracle"]


class ConnectorConfig(ConfigModel):
    """One Debezium connector: its kind, ``topic.prefix`` and captured tables."""

    name: str
    kind: ConnectorKind
    topic_prefix: str = Field(alias="topic.prefix")
    tables: list[TableConfig] = Field(default_factory=list)
    include: list[str] = Field(default_factory=list, description="regexes over '<schema>.<table>'")
    signal: SignalConfig | None = None
    snapshot_schedules: list[SnapshotScheduleConfig] = Field(default_factory=list)
    rows_match_source: RowsMatchSourceConfig | None = None
    transaction_metadata: bool = Field(default=False, description="provide.transaction.metadata is on")
    unavailable_value_placeholder: str = Field(
        default=DEFAULT_UNAVAILABLE_PLACEHOLDER, alias="unavailable.value.placeholder", min_length=1,
        description="the connector's unavailable.value.placeholder (PostgreSQL unchanged TOAST, Oracle LOBs): "
                    "a column carrying it is unchanged, never a value")
    transaction_topic: str | None = Field(default=None, description="default '<topic.prefix>.transaction'")
    max_watermark_lag_s: float = Field(default=3600.0, gt=0, description="bound of the watermark check")
    transaction_timeout_s: float = Field(default=300.0, gt=0, description=(
        "transaction_metadata: how long a table may wait for a transaction that blocks it (events missing, or "
        "no END) before its blocking transactions_reconciled check fails naming it, from its first event's "
        "source time"))
    max_heartbeat_age_s: float | None = Field(
        default=None, gt=0, description="the connector sends heartbeats (heartbeat.interval.ms > 0): the freshness "
                                        "check fails when the newest is older than this")
    owners: list[str] = Field(default_factory=list, description="default owners of the connector's tables")
    tags: dict[str, str] = Field(default_factory=dict, description="default tags of the connector's tables")
    automation: Automation = Field(default="eager", description=(
        "how Dagster's declarative automation merges a table: eager = when its topic's observation shows new "
        "events (once the automation sensor runs), none = only by a run a schedule, sensor or user launches"))
    format: RecordFormat = Field(default="json", description=(
        "the connector's converter: json = Kafka Connect's JsonConverter (with or without schemas); avro = an "
        "Avro converter writing the Confluent wire format (magic byte, schema id, body) with schema_registry"))
    schema_registry: SchemaRegistryConfig | None = Field(default=None, validate_default=True,
                                                         description="where format: avro reads its schemas")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("schema_registry")
    @classmethod
    def _registry_for_avro(cls, registry: SchemaRegistryConfig | None,
                           info: ValidationInfo) -> SchemaRegistryConfig | None:
        record_format = info.data.get("format")
        if record_format == "avro" and registry is None:
            raise ValueError("format: avro needs a schema_registry (its url) to read the records' schemas")
        if record_format == "json" and registry is not None:
            raise ValueError("schema_registry is read only with format: avro (this connector's format is json)")
        return registry

    @field_validator("include")
    @classmethod
    def _valid_regexes(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"include pattern '{pattern}' is not a valid regex: {exc}") from exc
        return patterns

    @model_validator(mode="after")
    def _captures_something(self) -> ConnectorConfig:
        if not self.tables and not self.include:
            raise ValueError(f"connector '{self.name}' names no tables and no include patterns")
        names = [table.name for table in self.tables]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"connector '{self.name}' lists tables more than once: {duplicates}")
        for table in self.tables:
            try:
                apply_mode(table.apply_mode, self.kind)  # refuses a mode the connector's rows cannot take
            except ValueError as exc:
                raise ValueError(f"connector '{self.name}', table '{table.name}': {exc}") from None
            if table.document_fields and self.kind not in DOCUMENT_KINDS:
                raise ValueError(f"connector '{self.name}', table '{table.name}': document_fields are for MongoDB "
                                 f"collections, not {self.kind} tables (columns come from the events)")
            clash = sorted(set(table.document_fields) & set(table.key_columns or [MONGODB_ID_COLUMN]))
            if clash:
                raise ValueError(f"connector '{self.name}', table '{table.name}': document_fields names key "
                                 f"column(s) {clash}")
            if self.kind in DOCUMENT_KINDS and table.column_choices != EVERY_COLUMN:
                raise ValueError(f"connector '{self.name}', table '{table.name}': column choices (include_columns, "
                                 f"exclude_columns, ignore_null_updates, track_history_*) are for columns, and "
                                 f"{self.kind} rows are whole documents")
            if table.rows_match_source is not None and (self.kind not in DIALECT_OF_KIND
                                                        or self.source_dsn_env is None):
                raise ValueError(f"connector '{self.name}', table '{table.name}': a rows_match_source schedule needs "
                                 "a connector whose rows_match_source can read the source (PostgreSQL, MariaDB or "
                                 "MySQL, with dsn_env or a signal channel with dsn_env)")
        if self.snapshot_schedules and self.signal is None:
            raise ValueError(f"connector '{self.name}' has snapshot_schedules but no signal channel")
        if self.rows_match_source is not None:
            if self.kind not in DIALECT_OF_KIND:
                raise ValueError(f"connector '{self.name}': rows_match_source reads PostgreSQL, MariaDB and MySQL "
                                 f"sources only, not {self.kind}")
            if self.source_dsn_env is None:
                raise ValueError(f"connector '{self.name}': rows_match_source needs dsn_env (or a signal channel "
                                 "with dsn_env)")
            settings = self.rows_match_source
            if settings.kafka_connect_url is not None and DIALECT_OF_KIND[self.kind] != "mysql":
                raise ValueError(f"connector '{self.name}': rows_match_source.kafka_connect_url is for MariaDB and "
                                 f"MySQL connectors (a {self.kind} source reports how far its connector has read)")
            if settings.kafka_connect_connector is not None and settings.kafka_connect_url is None:
                raise ValueError(f"connector '{self.name}': rows_match_source.kafka_connect_connector needs "
                                 "kafka_connect_url (the Kafka Connect REST API to ask)")
        return self

    @property
    def source_dsn_env(self) -> str | None:
        """The env var naming a connection string of the source database: ``rows_match_source.dsn_env``, else
        the signal channel's ``dsn_env``."""
        own = self.rows_match_source.dsn_env if self.rows_match_source is not None else None
        return own or (self.signal.dsn_env if self.signal is not None else None)
