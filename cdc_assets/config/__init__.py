"""The pipeline configuration: one YAML file a person writes, validated on load.

The file is named by the environment variable ``CDC_ASSETS_CONFIG`` (default: the bundled demo
config). String values may use ``${VAR}`` or ``${VAR:-default}`` to take non-secret settings from
the environment; secrets are never written inline but named by ``*_env`` fields, which the Dagster
resources read from the environment when they make a client, so they never reach logs or run config.

Every validation error names the file, the line and the field that is wrong.

Each module holds one part: ``runtime`` (Kafka, Spark, Delta, batch limits), ``tables``, ``connector`` (with
``snapshots``, ``rows_match_source`` and ``schema_registry``), ``schedules``, ``pipeline`` (the whole),
``loading`` (file, YAML and error locations), ``environment`` (``${VAR}``) and ``sections`` (a model's fields
declared on a resource or the component).
"""

from cdc_assets.config.base import ConfigError
from cdc_assets.config.connector import DEFAULT_UNAVAILABLE_PLACEHOLDER, ConnectorConfig, ConnectorKind
from cdc_assets.config.loading import CONFIG_ENV_VAR, DEMO_CONFIG_PATH, load_config, parse_config, validate_config
from cdc_assets.config.pipeline import ChecksAfterMerge, PipelineConfig
from cdc_assets.config.rows_match_source import RowsMatchSourceConfig
from cdc_assets.config.runtime import BatchLimits, DeltaConfig, KafkaConfig, SparkConfig, WriterName
from cdc_assets.config.schedules import CompactionConfig, FreshnessScheduleConfig, MergeScheduleConfig
from cdc_assets.config.schema_registry import RecordFormat, SchemaRegistryConfig
from cdc_assets.config.sections import as_section, with_fields_of
from cdc_assets.config.snapshots import SignalConfig, SnapshotScheduleConfig
from cdc_assets.config.tables import Automation, TableConfig

__all__ = [
    "CONFIG_ENV_VAR",
    "DEFAULT_UNAVAILABLE_PLACEHOLDER",
    "DEMO_CONFIG_PATH",
    "Automation",
    "BatchLimits",
    "ChecksAfterMerge",
    "CompactionConfig",
    "ConfigError",
    "ConnectorConfig",
    "ConnectorKind",
    "DeltaConfig",
    "FreshnessScheduleConfig",
    "KafkaConfig",
    "MergeScheduleConfig",
    "PipelineConfig",
    "RecordFormat",
    "RowsMatchSourceConfig",
    "SchemaRegistryConfig",
    "SignalConfig",
    "SnapshotScheduleConfig",
    "SparkConfig",
    "TableConfig",
    "WriterName",
    "as_section",
    "load_config",
    "parse_config",
    "validate_config",
    "with_fields_of",
]
