"""Dagster resources: Spark (dagster-pyspark), Kafka and Delta, built from the pipeline config."""

from __future__ import annotations

import os
from typing import Any

from dagster import Config, ConfigurableResource, EnvVar, InitResourceContext
from pydantic import PrivateAttr
from pyspark.sql import SparkSession

from cdc_assets.catalog import pipeline_table_path
from cdc_assets.config import KafkaConfig, PipelineConfig
from cdc_assets.io.delta import DeltaRsWriter, DeltaWriter, select_writer
from cdc_assets.io.kafka import KafkaSource
from cdc_assets.io.signals import (
    DEFAULT_DEBEZIUM_VERSION,
    KafkaSignalChannel,
    SignalChannel,
    SignalError,
    SourceTableSignalChannel,
)
from cdc_assets.io.spark import new_session, spark_config
from cdc_assets.io.spark_server import connect, disconnect, ensure_local_server


class SparkResource(ConfigurableResource):
    """The run's Spark session, made when first asked for: with ``local_server`` (the embedded default)
    a Spark Connect session on the shared local server for ``spark_config`` (started if none runs),
    else a session for ``spark_config`` itself (a cluster master, a remote Spark Connect URL, or a
    JVM of the run's own).

    Its fields are the pipeline config's; the facts of the machine (Delta's jars, JVM flags, the class
    archive) join them in ``spark_config`` when the session is made, so the launchpad shows only what a
    user sets."""

    master: str = "local[*]"
    remote: str | None = None
    conf: dict[str, str] = {}
    delta_root: str = ""
    storage_options: dict[str, str] = {}
    local_server: bool = False
    local_server_idle_timeout_s: float = 900.0
    _session: SparkSession | None = PrivateAttr(default=None)

    @property
    def spark_config(self) -> dict[str, str]:
        """The session's full Spark settings (``cdc_assets.io.spark.spark_config``); a run's own JVM maps the
        class archive, the long-lived local server does not."""
        return spark_config(self.master, self.remote, self.conf, use_class_archive=not self.local_server,
                            delta_root=self.delta_root, storage_options=self.storage_options)

    @property
    def spark_session(self) -> SparkSession:
        """The session, made on first use."""
        if self._session is None:
            self._session = (connect(ensure_local_server(self.spark_config, self.local_server_idle_timeout_s))
                             if self.local_server else new_session(self.spark_config))
        return self._session

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        if self.local_server and self._session is not None:
            disconnect(self._session)  # this run's part only: the server stays up, warm
        self._session = None


class KafkaResource(ConfigurableResource):
    """The Kafka connection. Secrets are passed as ``EnvVar`` so Dagster never shows or logs them."""

    bootstrap_servers: str
    group_id: str = "cdc-assets"
    security_protocol: str | None = None
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = None
    ssl_ca_location: str | None = None
    ssl_key_password: str | None = None
    settings: dict[str, str] = {}
    retries: int = 3
    retry_backoff_s: float = 1.0

    def client_settings(self) -> dict[str, Any]:
        """librdkafka settings (secrets included: keep them out of logs)."""
        return _client_settings(self.bootstrap_servers, self.group_id, self.settings, {
            "security.protocol": self.security_protocol,
            "sasl.mechanism": self.sasl_mechanism,
            "sasl.username": self.sasl_username,
            "sasl.password": self.sasl_password,
            "ssl.ca.location": self.ssl_ca_location,
            "ssl.key.password": self.ssl_key_password,
        })

    def new_source(self) -> KafkaSource:
        """A Kafka source of the caller's own, to close when done: tables merged side by side each read
        with their own (a source reads one topic at a time)."""
        return KafkaSource(self.client_settings(), self.retries, self.retry_backoff_s)


def _client_settings(bootstrap_servers: str, group_id: str, settings: dict[str, str],
                     security: dict[str, str | None]) -> dict[str, Any]:
    return {**settings, "bootstrap.servers": bootstrap_servers, "group.id": group_id,
            **{key: value for key, value in security.items() if value}}


def kafka_client_settings(kafka: KafkaConfig) -> dict[str, Any]:
    """librdkafka settings straight from the config, secrets read from the environment now.

    For load-time work (listing topics for include patterns); runs use ``KafkaResource``.
    """

    def env(name: str | None) -> str | None:
        return os.environ.get(name) if name else None

    return _client_settings(kafka.bootstrap_servers, kafka.group_id, dict(kafka.settings), {
        "security.protocol": kafka.security_protocol,
        "sasl.mechanism": kafka.sasl_mechanism,
        "sasl.username": env(kafka.sasl_username_env),
        "sasl.password": env(kafka.sasl_password_env),
        "ssl.ca.location": kafka.ssl_ca_location,
        "ssl.key.password": env(kafka.ssl_key_password_env),
    })


class DeltaResource(ConfigurableResource):
    """Which Delta writer commits batches (``auto``, ``delta-rs`` or ``delta-spark``), and where the
    pipeline's own tables (the schema registry) live."""

    writer: str = "auto"
    registry_path: str = ""
    storage_options: dict[str, str] = {}
    deletion_vectors: bool = False

    def writer_for(self, spark: SparkSession) -> DeltaWriter:
        """The writer for this Spark session (``auto``: delta-spark if the session has Delta)."""
        return select_writer(self.writer, spark, self.deletion_vectors)

    def writer_for_schema_changes(self, spark: SparkResource) -> DeltaWriter:
        """The writer for schema changes (and compaction); starts Spark only when the writer may need it."""
        return DeltaRsWriter() if self.writer == "delta-rs" else self.writer_for(spark.spark_session)


class ConnectorSignals(Config):
    """One connector's signal channel settings."""

    topic_prefix: str
    channel: str
    topic: str | None = None
    table: str | None = None
    dsn: str | None = None
    debezium_version: str = DEFAULT_DEBEZIUM_VERSION


class SignalsResource(ConfigurableResource):
    """Signal channels per connector and the signals audit table."""

    connectors: dict[str, ConnectorSignals] = {}
    audit_path: str
    storage_options: dict[str, str] = {}

    def settings(self, connector: str) -> ConnectorSignals:
        """The signal settings of ``connector``, or a ``SignalError`` naming the configured ones."""
        settings = self.connectors.get(connector)
        if settings is None:
            raise SignalError(f"connector '{connector}' has no signal channel configured "
                              f"(configured: {sorted(self.connectors) or 'none'})")
        return settings

    def channel(self, connector: str, kafka: KafkaResource, channel: str | None = None) -> SignalChannel:
        """The channel to signal ``connector`` through (its configured one unless ``channel`` says)."""
        settings = self.settings(connector)
        wanted = channel or settings.channel
        if wanted == "kafka" and settings.topic:
            return KafkaSignalChannel(kafka.client_settings(), settings.topic, settings.topic_prefix)
        if wanted == "source" and settings.table and settings.dsn:
            return SourceTableSignalChannel(settings.dsn, settings.table)
        raise SignalError(f"connector '{connector}' has no '{wanted}' signal channel configured")


def build_resources(config: PipelineConfig) -> dict[str, Any]:
    """The resources a pipeline config asks for, keyed as the assets expect them."""
    kafka = config.kafka

    def secret(name: str | None) -> Any:
        return EnvVar(name) if name else None

    return {
        "spark": SparkResource(
            master=config.spark.master, remote=config.spark.remote, conf=dict(config.spark.conf),
            delta_root=config.delta.root, storage_options=dict(config.delta.storage_options),
            local_server=config.spark.uses_local_server,
            local_server_idle_timeout_s=config.spark.local_server_idle_timeout_s),
        "kafka": KafkaResource(
            bootstrap_servers=kafka.bootstrap_servers,
            group_id=kafka.group_id,
            security_protocol=kafka.security_protocol,
            sasl_mechanism=kafka.sasl_mechanism,
            sasl_username=secret(kafka.sasl_username_env),
            sasl_password=secret(kafka.sasl_password_env),
            ssl_ca_location=kafka.ssl_ca_location,
            ssl_key_password=secret(kafka.ssl_key_password_env),
            settings=dict(kafka.settings),
            retries=kafka.retries,
            retry_backoff_s=kafka.retry_backoff_s,
        ),
        "delta": DeltaResource(writer=config.delta.writer, registry_path=registry_path(config),
                               storage_options=dict(config.delta.storage_options),
                               deletion_vectors=config.delta.deletion_vectors),
        "signals": SignalsResource(
            connectors={
                connector.name: ConnectorSignals(
                    topic_prefix=connector.topic_prefix, channel=connector.signal.channel,
                    topic=connector.signal.topic, table=connector.signal.table,
                    dsn=secret(connector.signal.dsn_env), debezium_version=connector.signal.debezium_version)
                for connector in config.connectors if connector.signal is not None
            },
            audit_path=signals_audit_path(config),
            storage_options=dict(config.delta.storage_options),
        ),
    }


def registry_path(config: PipelineConfig) -> str:
    """The schema registry table: ``<delta root>/_cdc_assets/schema_registry``."""
    return pipeline_table_path(config.delta.root, "schema_registry")


def signals_audit_path(config: PipelineConfig) -> str:
    """The signals audit table: ``<delta root>/_cdc_assets/signals``."""
    return pipeline_table_path(config.delta.root, "signals")
