"""How a connector is asked for incremental snapshots: its signal channel, and the schedules that request them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from cdc_assets.config.base import ConfigModel
from cdc_assets.io.signals import DEFAULT_DEBEZIUM_VERSION


class SignalConfig(ConfigModel):
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


class SnapshotScheduleConfig(ConfigModel):
    """A cron schedule that requests an incremental snapshot of some tables (e.g. a weekly repair)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_]+$")
    cron: str
    tables: list[str] = Field(min_length=1, description="table names or regexes, '<schema>.<table>'")
    additional_condition: str | None = None
    surrogate_key: str | None = None
    running: bool = False
    timezone: str = "UTC"
