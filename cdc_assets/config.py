"""The pipeline configuration: one YAML file a person writes, validated on load.

The file is named by the environment variable ``CDC_ASSETS_CONFIG`` (default: the bundled demo
config). String values may use ``${VAR}`` or ``${VAR:-default}`` to take non-secret settings from
the environment; secrets are never written inline but named by ``*_env`` fields, which the Dagster
resources read from the environment when they make a client, so they never reach logs or run config.

Every validation error names the file, the line and the field that is wrong.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from cdc_assets.core.apply_modes import ApplyModeName, apply_mode
from cdc_assets.core.columns import EVERY_COLUMN, ColumnChoices
from cdc_assets.core.layout import (
    DOCUMENT_KINDS,
    HIDDEN_PREFIX,
    MONGODB_DOCUMENT_COLUMN,
    MONGODB_ID_COLUMN,
    document_field_type,
)
from cdc_assets.core.reconcile import DIALECT_OF_KIND
from cdc_assets.io.signals import DEFAULT_DEBEZIUM_VERSION
from cdc_assets.io.storage import check_storage

CONFIG_ENV_VAR = "CDC_ASSETS_CONFIG"
DEMO_CONFIG_PATH = Path(__file__).parent / "demo" / "pipeline.yaml"

DEFAULT_UNAVAILABLE_PLACEHOLDER = "__debezium_unavailable_value"
# Each has its ordering rule in core.position.POSITION_RULES (mariadb shares the MySQL family's).
ConnectorKind = Literal["postgresql", "sqlserver", "db2", "mongodb", "mysql", "mariadb", "oracle"]
WriterName = Literal["auto", "delta-rs", "delta-spark"]

# librdkafka settings that carry secrets: they must come from the environment (the *_env fields).
_SECRET_SETTING = re.compile(r"(password|secret|\.pem$|sasl\.jaas|token)", re.IGNORECASE)
_ENV_REFERENCE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}")
_IDENTIFIER_PART = r"[^.\s]+"
_TABLE_NAME = re.compile(rf"^{_IDENTIFIER_PART}(\.{_IDENTIFIER_PART})?$")

_Section = TypeVar("_Section", bound=BaseModel)
_Declaring = TypeVar("_Declaring", bound=BaseModel)


class ConfigError(ValueError):
    """The pipeline config is not valid; the message names file, line and field."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KafkaConfig(_Model):
    """How to reach the brokers. Secrets are named by environment variable, never inline."""

    bootstrap_servers: str
    group_id: str = "cdc-assets"
    security_protocol: str | None = None
    sasl_mechanism: str | None = None
    sasl_username_env: str | None = None
    sasl_password_env: str | None = None
    ssl_ca_location: str | None = None
    ssl_key_password_env: str | None = None
    settings: dict[str, str] = Field(default_factory=dict)
    retries: int = Field(default=3, ge=0, description="retries of metadata/watermark requests, with backoff")
    retry_backoff_s: float = Field(default=1.0, ge=0)

    @field_validator("settings")
    @classmethod
    def _no_inline_secrets(cls, settings: dict[str, str]) -> dict[str, str]:
        for name in settings:
            if _SECRET_SETTING.search(name):
                raise ValueError(
                    f"'{name}' carries a secret: set it through an environment variable "
                    "(sasl_password_env, ssl_key_password_env), never inline"
                )
        return settings


class SparkConfig(_Model):
    """Where Spark runs: local Spark (default: the shared local Spark server), a cluster master URL or a
    Spark Connect URL."""

    master: str = "local[*]"
    remote: str | None = Field(default=None, description="Spark Connect URL, e.g. sc://host:15002")
    conf: dict[str, str] = Field(default_factory=dict)
    local_server: bool = Field(default=True, description=(
        "local master only: run Spark as a local Spark Connect server shared by runs and kept warm "
        "(cdc_assets.io.spark_server), instead of a JVM in each run's process"))
    local_server_idle_timeout_s: float = Field(
        default=900.0, gt=0, description="the local server stops after this long with no client connected")

    @property
    def uses_local_server(self) -> bool:
        """Whether runs use the shared local Spark server."""
        return self.local_server and not self.remote and self.master.startswith("local")


class DeltaConfig(_Model):
    """Where the Delta tables live and which writer commits to them."""

    root: str = Field(description="a local path, or s3:// (s3a://), abfss:// or gs:// (docs/storage.md)")
    writer: WriterName = "auto"
    storage_options: dict[str, str] = Field(default_factory=dict, description=(
        "the store's settings, in delta-rs's names (endpoint, region, allow_http, account_name, ...); a secret "
        "is named by '<option>_env: ENV_VAR', never inline. Both writers get them (cdc_assets.io.storage)"))
    deletion_vectors: bool = Field(default=False, description="delta-spark writer: create tables with deletion "
                                                              "vectors (readers must support them; delta-rs does not)")

    @model_validator(mode="after")
    def _reachable_storage(self) -> DeltaConfig:
        check_storage(self.root, self.storage_options)  # its errors name the field
        if self.writer == "delta-spark" and self.root.lower().startswith("az://"):
            raise ValueError(f"delta.root: '{self.root}' is delta-rs's scheme, Spark's ABFS opens abfss:// (or "
                             "abfs://) roots: abfss://<container>@<account>.dfs.core.windows.net/...")
        return self


class BatchLimits(_Model):
    """Bounds of one micro-batch of one table, and of a run's work on a connector's tables."""

    max_records: int = Field(default=100_000, gt=0)
    max_bytes: int = Field(default=256 * 1024 * 1024, gt=0)
    poll_timeout_s: float = Field(default=30.0, gt=0)
    max_batches_per_run: int = Field(
        default=10, gt=0, description="micro-batches one run applies to a table while it is behind (each its own "
        "Delta commit): a backlog is drained by one Spark session and one warm JVM, not by one run per batch")
    concurrent_tables: int = Field(
        default=2, gt=0, description="tables of a connector one run merges at once, each with its own Spark "
        "queries and Delta commits: a small table's merge is mostly fixed costs, which overlap (docs/performance.md)")
    shared_plan_max_records: int = Field(
        default=10_000, ge=0, description="a table whose new records, at most this many, fit in its first batch "
        "of a run is decoded and folded in one Spark query with the run's other such tables of its layout (a "
        "shared plan: docs/architecture.md); a larger backlog merges alone. 0: every table alone")


Automation = Literal["eager", "none"]


class TableConfig(_Model):
    """One captured table (Debezium: data collection), named ``schema.table``."""

    name: str
    key_columns: list[str] | None = None
    columns: dict[str, str] | None = Field(
        default=None, description="column -> Spark SQL type, or a Debezium/Connect logical type name "
                           "(io.debezium.time.MicroTimestamp), used when events carry no schema"
    )
    path: str | None = None
    topic: str | None = None
    on_bad_event: Literal["halt", "dead_letter"] = Field(
        default="halt", description="halt: commit nothing and fail; dead_letter: apply the rest, keep bad events "
                                    "in the pipeline's dead-letter table")
    apply_mode: ApplyModeName = "scd1"
    on_truncate: Literal["halt", "ignore", "apply"] = Field(
        default="halt", description="a TRUNCATE event (op t, skipped.operations=none): halt = stop before it, "
                                    "committing nothing, naming topic/partition/offset; ignore = skip it (counted); "
                                    "apply = remove the rows from before it, as the source did (soft_delete marks "
                                    "them deleted, scd2 ends their versions)")
    owners: list[str] = Field(default_factory=list, description="Dagster asset owners (emails or team:name)")
    tags: dict[str, str] = Field(default_factory=dict, description="Dagster asset tags")
    automation: Automation | None = Field(default=None, description="default: the connector's")
    max_capture_lag_s: float | None = Field(default=None, gt=0, description="capture-lag check bound")
    consistency: Literal["event", "transaction"] | None = Field(
        default=None, description="transaction: apply only whole transactions (default when the connector has "
                                  "transaction metadata on)")
    include_columns: list[str] | None = Field(
        default=None, description="the columns the Delta table keeps besides its key columns (default: every one)")
    exclude_columns: list[str] = Field(
        default_factory=list, description="columns the Delta table never keeps (a key column is always kept); a "
                                          "schema change adding one adds nothing")
    ignore_null_updates: bool | list[str] = Field(
        default=False, description="true (every column) or a list of columns: a null in an update (op u) keeps "
                                   "the value the table holds; a delete still deletes, a create writes its nulls")
    track_history_columns: list[str] | None = Field(
        default=None, description="scd2: the columns whose change opens a new version (default: every one); a "
                                  "change confined to the others updates the current version in place")
    track_history_except_columns: list[str] = Field(
        default_factory=list, description="scd2: the columns whose change alone updates the current version in "
                                          "place (instead of track_history_columns)")
    rows_match_source: MergeScheduleConfig | None = Field(
        default=None, description="this table's rows_match_source check on a cron of its own (cron, running, "
                                  "timezone) instead of its connector's; the other settings are the connector's")
    document_fields: dict[str, str] = Field(
        default_factory=dict, description="MongoDB: top-level field -> Spark SQL type (string, boolean, "
                                          "tinyint, smallint, int, bigint, float, double, decimal(p,s), date, "
                                          "timestamp), kept as a typed column beside the document")

    @field_validator("document_fields")
    @classmethod
    def _document_fields(cls, fields: dict[str, str]) -> dict[str, str]:
        for name, type_text in fields.items():
            if not name or "." in name or "'" in name or name.startswith(("$", HIDDEN_PREFIX)) \
                    or name == MONGODB_DOCUMENT_COLUMN:
                raise ValueError(f"document_fields: '{name}' is not a top-level field name a column can take (no "
                                 f"'.', quote or leading '$', not '{MONGODB_DOCUMENT_COLUMN}' nor {HIDDEN_PREFIX}*)")
            try:
                document_field_type(type_text)
            except ValueError as exc:
                raise ValueError(f"document_fields: field '{name}': {exc}") from None
        return fields

    @field_validator("name")
    @classmethod
    def _schema_dot_table(cls, name: str) -> str:
        if not _TABLE_NAME.match(name):
            raise ValueError(f"table name '{name}' must be '<schema>.<table>' (or '<table>')")
        return name

    @field_validator("key_columns")
    @classmethod
    def _non_empty_keys(cls, keys: list[str] | None) -> list[str] | None:
        if keys is not None and not keys:
            raise ValueError("key_columns must name at least one column")
        return keys

    @field_validator("include_columns", "exclude_columns", "ignore_null_updates", "track_history_columns",
                     "track_history_except_columns")
    @classmethod
    def _named_once(cls, names: Any, info: ValidationInfo) -> Any:
        if isinstance(names, list):
            if not names and info.field_name not in ("exclude_columns", "track_history_except_columns"):
                raise ValueError(f"{info.field_name} must name at least one column")
            duplicates = sorted({name for name in names if names.count(name) > 1})
            if duplicates:
                raise ValueError(f"{info.field_name} names columns more than once: {duplicates}")
        return names

    @model_validator(mode="after")
    def _consistent_column_choices(self) -> TableConfig:
        if self.include_columns is not None and self.exclude_columns:
            raise ValueError("include_columns and exclude_columns exclude each other: name the columns kept, or "
                             "those left out")
        tracking = {"track_history_columns": self.track_history_columns or [],
                    "track_history_except_columns": self.track_history_except_columns}
        if self.track_history_columns is not None and self.track_history_except_columns:
            raise ValueError("track_history_columns and track_history_except_columns exclude each other: name the "
                             "columns whose history is kept, or those whose is not")
        if any(tracking.values()) and self.apply_mode != "scd2":
            raise ValueError(f"track_history_columns / track_history_except_columns are for apply_mode scd2 (this "
                             f"table's is {self.apply_mode})")
        if any(tracking.values()) and self.on_truncate == "apply":
            # The current version a change updates in place may be one that the batch's TRUNCATE ends.
            raise ValueError("track_history_columns / track_history_except_columns do not go with on_truncate: "
                             "apply yet: use halt or ignore")
        choices = self.column_choices
        problem = choices.key_problem(self.key_columns or ())
        if problem:
            raise ValueError(problem)
        nulls = self.ignore_null_updates if isinstance(self.ignore_null_updates, list) else []
        for field, names in {"ignore_null_updates": nulls, **tracking}.items():
            keys = [name for name in names if name in (self.key_columns or ())]
            if keys:
                raise ValueError(f"{field} names key column(s) {keys}: a key never changes in an update")
            dropped = [name for name in names if not choices.keeps(name)]
            if dropped:
                raise ValueError(f"{field} names column(s) {dropped} that the table does not keep "
                                 "(include_columns / exclude_columns)")
        return self

    @property
    def column_choices(self) -> ColumnChoices:
        """The table's column choices (``core.columns``)."""
        nulls = self.ignore_null_updates
        tracked = self.track_history_columns
        return ColumnChoices(tuple(self.include_columns) if self.include_columns is not None else None,
                             tuple(self.exclude_columns), tuple(nulls) if isinstance(nulls, list) else nulls,
                             tuple(tracked) if tracked is not None else None,
                             tuple(self.track_history_except_columns))


class SignalConfig(_Model):
    """How to send the connector signals (incremental snapshots): its Kafka signal topic, or the
    signal table in the source database (connection string from an env var)."""

    channel: Literal["kafka", "source"] = "kafka"
    topic: str | None = Field(default=None, description="the connector's signal.kafka.topic")
    table: str | None = Field(default=None, description="the connector's signal.data.collection, schema.table")
    dsn_env: str | None = Field(default=None, description="env var with the source database connection string")
    debezium_version: str = Field(default=DEFAULT_DEBEZIUM_VERSION, pattern=r"^\d+\.\d+",
                                  description="the connector's Debezium version: which signals it takes, "
                                              "and in which form")

    @model_validator(mode="after")
    def _channel_settings(self) -> SignalConfig:
        if self.channel == "kafka" and not self.topic:
            raise ValueError("the kafka signal channel needs 'topic' (the connector's signal.kafka.topic)")
        if self.channel == "source" and not (self.table and self.dsn_env):
            raise ValueError("the source signal channel needs 'table' and 'dsn_env'")
        return self


class RowsMatchSourceConfig(_Model):
    """The ``rows_match_source`` checks of a connector's tables (``cdc_assets.io.reconcile``): each compares its
    Delta table with the source table through a read-only connection. Runnable from the UI whenever the connector
    names a DSN; on a schedule only with a ``cron`` (stopped unless ``running``)."""

    dsn_env: str | None = Field(default=None, description=(
        "env var with a read-only connection string to the source database (PostgreSQL: a libpq DSN; MariaDB or "
        "MySQL: mariadb://user:password@host:port/database); default: the signal channel's dsn_env"))
    cron: str | None = Field(default=None, description="the checks' schedule (every table of the connector)")
    running: bool = False
    timezone: str = "UTC"
    buckets: int = Field(default=256, gt=0, le=65536, description=(
        "key buckets each table is split into: a bucket that differs is read again key by key"))
    settle_timeout_s: float = Field(default=300.0, gt=0, description=(
        "how long a check waits for the table to apply the changes that were in flight when it first looked; "
        "a bucket still waiting is reported as unsettled (a warning), never as drift"))
    sample_keys: int = Field(default=5, gt=0, description="keys named per drifted bucket")
    kafka_connect_url: str | None = Field(default=None, pattern=r"^https?://[^\s/]+(/\S*)?$", description=(
        "MariaDB/MySQL: the REST API of the Kafka Connect cluster running the connector (Kafka Connect 3.5 or "
        "later), e.g. http://connect:8083: the binlog position in the connector's committed offsets settles a "
        "quiet table, which the server alone cannot"))
    kafka_connect_connector: str | None = Field(default=None, min_length=1, description=(
        "the connector's name in Kafka Connect (default: this connector's name); with kafka_connect_url only"))
    repair_timeout_s: float = Field(default=3600.0, gt=0, description=(
        "drift_repair_sensor: how long after requesting a repair's snapshot it re-runs the check even if fewer "
        "snapshot reads than the source's matching rows were merged (rows deleted meanwhile, a stopped "
        "connector)"))


class SnapshotScheduleConfig(_Model):
    """A cron schedule that requests an incremental snapshot of some tables (e.g. a weekly repair)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_]+$")
    cron: str
    tables: list[str] = Field(min_length=1, description="table names or regexes, '<schema>.<table>'")
    additional_condition: str | None = None
    surrogate_key: str | None = None
    running: bool = False
    timezone: str = "UTC"


RecordFormat = Literal["json", "avro"]


class SchemaRegistryConfig(_Model):
    """The schema registry an Avro connector's converter registers its schemas in (Confluent's, or one with
    its API: Apicurio's ``/apis/ccompat/v7``). Secrets are named by environment variable, never inline."""

    url: str = Field(pattern=r"^https?://\S+$", description="the registry's Confluent-compatible API, "
                                                              "e.g. http://registry:8080/apis/ccompat/v7")
    basic_auth_user_env: str | None = Field(default=None, description="env var with the basic-auth user")
    basic_auth_password_env: str | None = Field(default=None, description="env var with the basic-auth password")
    ssl_ca_location: str | None = Field(default=None, description="CA certificate file (PEM) of an https registry")

    @model_validator(mode="after")
    def _auth_pairs(self) -> SchemaRegistryConfig:
        if (self.basic_auth_user_env is None) != (self.basic_auth_password_env is None):
            raise ValueError("basic auth needs both basic_auth_user_env and basic_auth_password_env")
        if self.ssl_ca_location is not None:
            if not self.url.startswith("https://"):
                raise ValueError(f"ssl_ca_location is for an https:// registry, url is '{self.url}'")
            if not Path(self.ssl_ca_location).is_file():
                raise ValueError(f"ssl_ca_location '{self.ssl_ca_location}' is not a readable file")
        return self


class ConnectorConfig(_Model):
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


# Which table checks a merge run evaluates (``cdc_assets.checks.evaluated_after_merge``).
ChecksAfterMerge = Literal["blocking", "all"]


class MergeScheduleConfig(_Model):
    """A cron schedule for ``cdc_merge_job``."""

    cron: str
    running: bool = False
    timezone: str = "UTC"


class FreshnessScheduleConfig(MergeScheduleConfig):
    """A cron schedule for the freshness checks (read-only, so running by default)."""

    cron: str = "*/5 * * * *"
    running: bool = True


class CompactionConfig(MergeScheduleConfig):
    """``cdc_compaction_job``'s schedule and threshold: tables with at least ``min_files`` data files are compacted."""

    cron: str = "0 3 * * *"
    min_files: int = Field(default=32, gt=0)


class PipelineConfig(_Model):
    """The whole pipeline: Kafka, Spark, Delta, batch limits, connectors and the merge schedule."""

    kafka: KafkaConfig
    spark: SparkConfig = Field(default_factory=SparkConfig)
    delta: DeltaConfig
    batch: BatchLimits = Field(default_factory=BatchLimits)
    merge_schedule: MergeScheduleConfig | None = None
    freshness_schedule: FreshnessScheduleConfig = Field(default_factory=FreshnessScheduleConfig)
    compaction: CompactionConfig = Field(default_factory=CompactionConfig)
    max_capture_lag_s: float = Field(default=3600.0, gt=0, description="default bound of the capture-lag check")
    checks_after_merge: ChecksAfterMerge = Field(default="blocking", description=(
        "the checks a merge run evaluates: 'blocking' (primary_key; the warnings run with the "
        "freshness checks on freshness_schedule) or 'all'"))
    connectors: list[ConnectorConfig]
    # Where it was read from, and the environment variables each setting reads (``where_set``).
    _source: str = PrivateAttr(default="the pipeline config")
    _env_references: dict[str, tuple[str, ...]] = PrivateAttr(default_factory=dict)

    @property
    def source(self) -> str:
        """The file (or YAML) the config was read from."""
        return self._source

    def variables_of(self, field: str) -> tuple[str, ...]:
        """The environment variables ``field`` (dotted, as in the YAML: ``kafka.bootstrap_servers``) reads."""
        return self._env_references.get(field, ())

    def where_set(self, field: str) -> str:
        """Where a user sets ``field``: the field in the file loaded, and the environment variable(s) it reads,
        for messages that say what to change."""
        variables = self.variables_of(field)
        read = f" (read from {', '.join(variables)})" if variables else ""
        return f"{field} in {self._source}{read}"

    @model_validator(mode="after")
    def _unique_connectors(self) -> PipelineConfig:
        names = [connector.name for connector in self.connectors]
        if len(set(names)) != len(names):
            raise ValueError(f"connector names must be unique, got {names}")
        prefixes = [connector.topic_prefix for connector in self.connectors]
        if len(set(prefixes)) != len(prefixes):
            raise ValueError(f"topic.prefix values must be unique, got {prefixes}")
        return self


def with_fields_of(model: type[BaseModel], annotate: Callable[[FieldInfo], Any] = lambda field: field.annotation
                   ) -> Callable[[type[_Declaring]], type[_Declaring]]:
    """A class decorator: the decorated pydantic class (a Dagster resource, its config, the dg component) with
    ``model``'s fields added as its own, by name, type (``annotate`` of the field), default and description,
    so that a setting is declared once, in its config model here, and shown with its description wherever it
    is set. The validators stay the model's: ``as_section`` rebuilds it from a declaring object."""

    def declare(cls: type[_Declaring]) -> type[_Declaring]:
        fields: dict[str, Any] = {}
        for name, field in model.model_fields.items():
            default: dict[str, Any] = ({"default_factory": field.default_factory} if field.default_factory
                                       else {} if field.is_required() else {"default": field.default})
            fields[name] = (annotate(field), Field(description=field.description, **default))
        declared = create_model(cls.__name__, __base__=cls, __module__=cls.__module__, __doc__=cls.__doc__,
                                **fields)
        declared.__qualname__ = cls.__qualname__
        return declared

    return declare


def as_section(declaring: BaseModel, model: type[_Section]) -> _Section:
    """The config ``model`` whose fields ``declaring`` took by ``with_fields_of``, as it holds them (validated
    once, when the pipeline config was loaded, not again on each use)."""
    return model.model_construct(**{name: getattr(declaring, name) for name in model.model_fields})


def load_config(path: str | os.PathLike[str] | None = None) -> PipelineConfig:
    """Load and validate the pipeline config (``path``, else ``$CDC_ASSETS_CONFIG``, else the demo)."""
    config_path = Path(path or os.environ.get(CONFIG_ENV_VAR) or DEMO_CONFIG_PATH)
    try:
        text = config_path.read_text()
    except OSError as exc:
        raise ConfigError(f"{config_path}: cannot read the pipeline config: {exc}") from exc
    return parse_config(text, source=str(config_path))


def parse_config(text: str, source: str = "<config>") -> PipelineConfig:
    """Validate config text; errors name ``source``, the line and the field."""
    try:
        root = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
    return validate_config(data, source, root)


def validate_config(data: Any, source: str, root: yaml.Node | None = None,
                    prefix: Sequence[str] = ()) -> PipelineConfig:
    """Validate config ``data`` read from ``source``, whose YAML node ``root`` (if known) gives the line of
    each error; ``prefix``: the fields above the config in that YAML (a component's ``attributes``)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the pipeline config must be a mapping with kafka, delta, connectors")
    references = _env_references(data)
    try:
        data = _interpolate_env(data)
    except KeyError as exc:
        raise ConfigError(f"{source}: {exc.args[0]}") from exc
    try:
        config = PipelineConfig.model_validate(data)
        config._source, config._env_references = source, references
        return config
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            location = [*prefix, *error["loc"]]
            line = _line_of(root, location) if root is not None else None
            field = ".".join(str(part) for part in location) or "(top level)"
            where = f"line {line}" if line else "?"
            problems.append(f"{source}:{where}: {field}: {error['msg']}")
        raise ConfigError("invalid pipeline config:\n  " + "\n  ".join(problems)) from None


def _env_references(value: Any, path: str = "") -> dict[str, tuple[str, ...]]:
    """The ``${VAR}`` references of each string setting, by its dotted path (list items by index)."""
    if isinstance(value, str):
        names = tuple(match.group("name") for match in _ENV_REFERENCE.finditer(value))
        return {path: names} if names else {}
    items = value.items() if isinstance(value, Mapping) else enumerate(value) if isinstance(value, list) else ()
    found: dict[str, tuple[str, ...]] = {}
    for key, item in items:
        found.update(_env_references(item, f"{path}.{key}" if path else str(key)))
    return found


def _interpolate_env(value: Any) -> Any:
    if isinstance(value, str):

        def substitute(match: re.Match[str]) -> str:
            name, default = match.group("name"), match.group("default")
            if name in os.environ:
                return os.environ[name]
            if default is None:
                raise KeyError(f"environment variable {name} is not set (referenced as ${{{name}}})")
            return default

        return _ENV_REFERENCE.sub(substitute, value)
    if isinstance(value, Mapping):
        return {key: _interpolate_env(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_interpolate_env(item) for item in value]
    return value


def _line_of(node: yaml.Node | None, location: list[Any]) -> int | None:
    """1-based line of the deepest YAML node along a pydantic error location."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in location:
        if isinstance(node, yaml.MappingNode):
            child = next((value for key, value in node.value if key.value == str(part)), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            child = node.value[part]
        else:
            child = None
        if child is None:
            break
        node = child
        line = node.start_mark.line + 1
    return line
