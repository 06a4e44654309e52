"""Dagster resources: Spark (dagster-pyspark), Kafka and Delta, built from the pipeline config."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from dagster import Config, ConfigurableResource, Failure, InitResourceContext
from pydantic import BaseModel, Field, PrivateAttr
from pyspark.sql import SparkSession

from cdc_assets.catalog import pipeline_table_path
from cdc_assets.config import (
    DeltaConfig,
    KafkaConfig,
    PipelineConfig,
    SignalConfig,
    SparkConfig,
    as_section,
    with_fields_of,
)
from cdc_assets.io.delta import DeltaRsWriter, DeltaWriter, select_writer
from cdc_assets.io.kafka import KafkaSource, TopicProbe
from cdc_assets.io.kafka.errors import DEFAULT_ADDRESS_SOURCE
from cdc_assets.io.preflight import CheckFailed, tcp_reachable
from cdc_assets.io.signals import (
    KafkaSignalChannel,
    SignalChannel,
    SignalError,
    SourceTableSignalChannel,
)
from cdc_assets.io.spark import new_session, spark_config
from cdc_assets.io.spark_server import connect, disconnect, ensure_local_server

REGISTRY_TABLE = "schema_registry"  # the schema registry's name among the pipeline's own tables


@with_fields_of(SparkConfig)
class SparkResource(ConfigurableResource):
    """The run's Spark session, made when first asked for: with the local server (the embedded default)
    a Spark Connect session on the shared local server for ``spark_config`` (started if none runs),
    else a session for ``spark_config`` itself (a cluster master, a remote Spark Connect URL, or a
    JVM of the run's own).

    Its fields are the pipeline config's ``spark`` section and the Delta store Spark writes to; the facts of
    the machine (Delta's jars, JVM flags, the class archive) join them in ``spark_config`` when the session
    is made, so the launchpad shows only what a user sets."""

    delta_root: str = Field(default="", description="the Delta root (delta.root): which store's settings apply")
    storage_options: dict[str, str] = Field(default_factory=dict, description="the store's settings "
                                                                              "(delta.storage_options)")
    delta_writer: str = Field(default="auto", description="the Delta writer (delta.writer): a session that writes "
                                                           "to object storage gets the store's connector jars")
    _session: SparkSession | None = PrivateAttr(default=None)
    _reading_session: SparkSession | None = PrivateAttr(default=None)

    def as_config(self) -> SparkConfig:
        """Its pipeline config section."""
        return as_section(self, SparkConfig)

    @property
    def spark_config(self) -> dict[str, str]:
        """The session's full Spark settings (``cdc_assets.io.spark.spark_config``); a run's own JVM maps the
        class archive, the long-lived local server does not."""
        return self._settings(self.delta_writer)

    def _settings(self, writer: str) -> dict[str, str]:
        spark = self.as_config()
        return spark_config(spark.master, spark.remote, spark.conf, use_class_archive=not spark.uses_local_server,
                            delta_root=self.delta_root, storage_options=self.storage_options, writer=writer)

    @property
    def spark_session(self) -> SparkSession:
        """The session, made on first use."""
        if self._session is None:
            self._session = self._new_session(self.spark_config)
        return self._session

    @property
    def delta_reading_session(self) -> SparkSession:
        """A session that reads the Delta tables in Spark where they live (``rows_match_source``): the run's
        ``spark_session`` when it has the store's connector, else one of its own with the connector's jars (on
        the local server, a server for those settings): delta-rs writing to S3 or ADLS leaves them out of the
        run's session, the AWS SDK bundle being a large jar. ``StorageConfigError`` when they are not installed."""
        settings = self._settings("delta-spark")
        if settings == self.spark_config:
            return self.spark_session
        if self._reading_session is None:
            self._reading_session = self._new_session(settings)
        return self._reading_session

    def start_local_server(self) -> None:
        """Start the shared local Spark server of this resource's sessions, if runs use one and none runs: the
        start the first run would otherwise wait for (the demo has it made while its broker starts)."""
        self._local_server(self.spark_config)

    def _local_server(self, settings: dict[str, str]) -> str | None:
        """The URL of the local Spark server for ``settings``, started if none runs; None where runs use none."""
        spark = self.as_config()
        return ensure_local_server(settings, spark.local_server_idle_timeout_s) if spark.uses_local_server else None

    def _new_session(self, settings: dict[str, str]) -> SparkSession:
        url = self._local_server(settings)
        return connect(url) if url is not None else new_session(settings)

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        if self.as_config().uses_local_server:
            for session in (self._session, self._reading_session):
                if session is not None:
                    disconnect(session)  # this run's part only: the server stays up, warm
        self._session = self._reading_session = None


class MissingSecretError(RuntimeError):
    """A secret the config names by environment variable is not set where a run needs it."""


@with_fields_of(KafkaConfig)
class KafkaResource(ConfigurableResource):
    """The Kafka connection: the pipeline config's ``kafka`` section. Secrets are named by environment
    variable there and read when a client is made, so Dagster never shows, logs or stores them."""

    address_source: str = Field(default=DEFAULT_ADDRESS_SOURCE, description=(
        "where bootstrap_servers is set (the config file's field, and the environment variable it reads): what a "
        "message says to change when no broker answers"))

    def as_config(self) -> KafkaConfig:
        """Its pipeline config section."""
        return as_section(self, KafkaConfig)

    def client_settings(self) -> dict[str, Any]:
        """librdkafka settings (secrets included: keep them out of logs)."""
        return kafka_client_settings(self.as_config(), require_secrets=True)

    def new_source(self) -> KafkaSource:
        """A Kafka source of the caller's own, to close when done: tables merged side by side each read
        with their own (a source reads one topic at a time)."""
        kafka = self.as_config()
        return KafkaSource(kafka_client_settings(kafka, require_secrets=True), kafka.retries, kafka.retry_backoff_s,
                           self.address_source)

    def end_offsets(self, topics: Iterable[str]) -> dict[str, dict[int, int]]:
        """Each of ``topics``' high watermarks per partition now, from one look at them all
        (``TopicProbe.end_offsets``; a topic that does not exist is left out)."""
        with TopicProbe(self.client_settings()) as probe:
            return probe.end_offsets(topics)

    def check_reachable(self) -> None:
        """Fail a run before it starts Spark when no broker takes a connection at ``bootstrap_servers``: a
        ``Failure`` whose message is one line naming the address and where it is set (in milliseconds for a
        closed port, ``CONNECT_TIMEOUT_S`` for an address that never answers)."""
        try:
            tcp_reachable(self.as_config().bootstrap_servers)
        except CheckFailed as error:
            raise Failure(description=f"{error}: set the address in {self.address_source}",
                          allow_retries=False) from None


def kafka_client_settings(kafka: KafkaConfig, require_secrets: bool = False) -> dict[str, Any]:
    """librdkafka settings of a ``kafka`` config section, secrets read from the environment now (at load, for
    the topics of include patterns and the sensors; in a run, by ``KafkaResource``). ``require_secrets``: a
    secret's variable that is not set is an error naming it (a run), rather than a client without it (a load,
    which must not fail on a machine without the secrets)."""

    def env(name: str | None) -> str | None:
        value = os.environ.get(name) if name else None
        if require_secrets and name and not value:
            raise MissingSecretError(f"kafka: the environment variable {name} (named by the pipeline config's kafka "
                                     "section) is not set in this run's environment")
        return value

    security = {
        "security.protocol": kafka.security_protocol,
        "sasl.mechanism": kafka.sasl_mechanism,
        "sasl.username": env(kafka.sasl_username_env),
        "sasl.password": env(kafka.sasl_password_env),
        "ssl.ca.location": kafka.ssl_ca_location,
        "ssl.key.password": env(kafka.ssl_key_password_env),
    }
    return {**kafka.settings, "bootstrap.servers": kafka.bootstrap_servers, "group.id": kafka.group_id,
            **{key: value for key, value in security.items() if value}}


@with_fields_of(DeltaConfig)
class DeltaResource(ConfigurableResource):
    """The pipeline config's ``delta`` section: which Delta writer commits batches (``auto``, ``delta-rs`` or
    ``delta-spark``), and where the pipeline's own tables (the schema registry) live."""

    def as_config(self) -> DeltaConfig:
        """Its pipeline config section."""
        return as_section(self, DeltaConfig)

    @property
    def registry_path(self) -> str:
        """The schema registry table (``registry_path``)."""
        return pipeline_table_path(self.as_config().root, REGISTRY_TABLE)

    def writer_for(self, spark: SparkSession) -> DeltaWriter:
        """The writer for this Spark session (``auto``: delta-spark if the session has Delta)."""
        delta = self.as_config()
        return select_writer(delta.writer, spark, delta.deletion_vectors)

    def writer_for_schema_changes(self, spark: SparkResource) -> DeltaWriter:
        """The writer for schema changes (and compaction); starts Spark only when the writer may need it."""
        return DeltaRsWriter() if self.as_config().writer == "delta-rs" else self.writer_for(spark.spark_session)


@with_fields_of(SignalConfig)
class ConnectorSignals(Config):
    """One connector's signal channel: its pipeline config ``signal`` section, and its ``topic.prefix``."""

    topic_prefix: str


class SignalsResource(ConfigurableResource):
    """Signal channels per connector and the signals audit table."""

    connectors: dict[str, ConnectorSignals] = {}
    audit_path: str
    storage_options: dict[str, str] = {}

    def settings(self, connector: str) -> SignalConfig:
        """The signal settings of ``connector``, or a ``SignalError`` naming the configured ones."""
        return as_section(self._connector(connector), SignalConfig)

    def _connector(self, connector: str) -> ConnectorSignals:
        settings = self.connectors.get(connector)
        if settings is None:
            raise SignalError(f"connector '{connector}' has no signal channel configured "
                              f"(configured: {sorted(self.connectors) or 'none'})")
        return settings

    def channel(self, connector: str, kafka: KafkaResource, channel: str | None = None) -> SignalChannel:
        """The channel to signal ``connector`` through (its configured one unless ``channel`` says)."""
        topic_prefix, settings = self._connector(connector).topic_prefix, self.settings(connector)
        wanted = channel or settings.channel
        if wanted == "kafka" and settings.topic:
            return KafkaSignalChannel(kafka.client_settings(), settings.topic, topic_prefix)
        dsn = os.environ.get(settings.dsn_env) if settings.dsn_env else None
        if wanted == "source" and settings.table and dsn:
            return SourceTableSignalChannel(dsn, settings.table)
        raise SignalError(f"connector '{connector}' has no '{wanted}' signal channel configured")


def build_resources(config: PipelineConfig) -> dict[str, Any]:
    """The resources a pipeline config asks for, keyed as the assets expect them: each takes its config
    section's fields as they are."""

    def section(model: BaseModel) -> dict[str, Any]:
        return {name: getattr(model, name) for name in type(model).model_fields}

    return {
        "spark": SparkResource(**section(config.spark), delta_root=config.delta.root,
                               storage_options=dict(config.delta.storage_options), delta_writer=config.delta.writer),
        "kafka": KafkaResource(**section(config.kafka), address_source=config.where_set("kafka.bootstrap_servers")),
        "delta": DeltaResource(**section(config.delta)),
        "signals": SignalsResource(
            connectors={connector.name: ConnectorSignals(**section(connector.signal),
                                                         topic_prefix=connector.topic_prefix)
                        for connector in config.connectors if connector.signal is not None},
            audit_path=signals_audit_path(config),
            storage_options=dict(config.delta.storage_options),
        ),
    }


def registry_path(config: PipelineConfig) -> str:
    """The schema registry table: ``<delta root>/_cdc_assets/schema_registry``."""
    return pipeline_table_path(config.delta.root, REGISTRY_TABLE)


def signals_audit_path(config: PipelineConfig) -> str:
    """The signals audit table: ``<delta root>/_cdc_assets/signals``."""
    return pipeline_table_path(config.delta.root, "signals")
