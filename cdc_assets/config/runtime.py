"""Where the pipeline runs (Kafka, Spark, Delta) and how much one batch and one run take."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from cdc_assets.config.base import ConfigModel
from cdc_assets.io.storage import check_storage

WriterName = Literal["auto", "delta-rs", "delta-spark"]

# librdkafka settings that carry secrets: they must come from the environment (the *_env fields).
_SECRET_SETTING = re.compile(r"(password|secret|\.pem$|sasl\.jaas|token)", re.IGNORECASE)


class KafkaConfig(ConfigModel):
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


class SparkConfig(ConfigModel):
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


class DeltaConfig(ConfigModel):
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


class BatchLimits(ConfigModel):
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
