"""The whole pipeline config: Kafka, Spark, Delta, batch limits, schedules and connectors, and where it was read."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PrivateAttr, model_validator

from cdc_assets.config.base import ConfigModel
from cdc_assets.config.connector import ConnectorConfig
from cdc_assets.config.runtime import BatchLimits, DeltaConfig, KafkaConfig, SparkConfig
from cdc_assets.config.schedules import CompactionConfig, FreshnessScheduleConfig, MergeScheduleConfig

# Which table checks a merge run evaluates (``cdc_assets.checks.evaluated_after_merge``).
ChecksAfterMerge = Literal["blocking", "all"]


class PipelineConfig(ConfigModel):
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
