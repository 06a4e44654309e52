"""The settings of a connector's ``rows_match_source`` checks (its Delta tables compared with the source)."""

from __future__ import annotations

from pydantic import Field

from cdc_assets.config.base import ConfigModel


class RowsMatchSourceConfig(ConfigModel):
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
