"""The pipeline without Dagster: describe a captured table, apply its pending change events.

From a script, a notebook or another orchestrator::

    from cdc_assets import TableSpec, apply_pending

    customers = TableSpec(kind="postgresql", topic="dbserver1.inventory.customers",
                          target="/lake/cdc/customers")
    for report in apply_pending(customers, kafka="broker1:9092"):
        print(report.events_read, report.outcome)

The Dagster assets call ``apply_pending`` the same way, with the run's Spark session and Kafka
source.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

from pyspark.sql import SparkSession

from cdc_assets.catalog import CapturedTable, MergeRules, pipeline_table_path
from cdc_assets.config import BatchLimits, ConnectorKind
from cdc_assets.core.apply_modes import ApplyModeName
from cdc_assets.io.delta import DeltaTarget, DeltaWriter, select_writer
from cdc_assets.io.kafka import KafkaSource
from cdc_assets.merge import BatchReport, merge_micro_batches

WriterName = Literal["auto", "delta-rs", "delta-spark"]
BadEventPolicy = Literal["halt", "dead_letter"]


@dataclass(frozen=True, kw_only=True)
class TableSpec:
    """One captured table: where its change events come from, where its Delta table lives, how they apply.

    ``topic`` is ``<topic.prefix>.<schema>.<table>``. ``key_columns`` default to the record key's
    fields; ``columns`` (``{name: Spark SQL type}``) type a topic whose events carry no schema.
    A ``dead_letter`` policy keeps bad events in ``<target's parent>/_cdc_assets/dead_letter`` unless
    ``dead_letter_path`` says where.
    """

    kind: ConnectorKind
    topic: str
    target: str
    storage_options: Mapping[str, str] = field(default_factory=dict)
    key_columns: tuple[str, ...] | None = None
    columns: Mapping[str, str] | None = None
    apply_mode: ApplyModeName = "scd1"
    on_bad_event: BadEventPolicy = "halt"
    dead_letter_path: str | None = None

    def captured_table(self) -> CapturedTable:
        """The pipeline's own description of the table."""
        prefix, _, name = self.topic.partition(".")
        if not name:
            raise ValueError(f"topic '{self.topic}' is not '<topic.prefix>.<schema>.<table>'")
        options = dict(self.storage_options)
        dead_letter = self.dead_letter_path or pipeline_table_path(self.target.rstrip("/").rsplit("/", 1)[0],
                                                                   "dead_letter")
        return CapturedTable(connector=prefix, kind=self.kind, topic_prefix=prefix, name=name, topic=self.topic,
                             target=DeltaTarget(self.target, options),
                             merge=MergeRules(key_columns=self.key_columns,
                                              columns=dict(self.columns) if self.columns else None,
                                              apply_mode=self.apply_mode, on_bad_event=self.on_bad_event,
                                              dead_letter=DeltaTarget(dead_letter, options)))


@contextlib.contextmanager
def _default_session(target: DeltaTarget, writer: WriterName | DeltaWriter) -> Iterator[SparkSession]:
    """The local Spark server's session, with the settings of the store ``target`` is on (and its connector
    when ``writer`` is Spark's)."""
    from cdc_assets.io.spark import spark_config
    from cdc_assets.io.spark_server import connect, disconnect, ensure_local_server

    session = connect(ensure_local_server(spark_config(delta_root=target.path, storage_options=target.storage_options,
                                                       writer=writer if isinstance(writer, str) else writer.name)))
    try:
        yield session
    finally:
        disconnect(session)


def apply_pending(table: TableSpec | CapturedTable, *, kafka: str | Mapping[str, object] | KafkaSource,
                  spark: SparkSession | None = None, writer: WriterName | DeltaWriter = "delta-rs",
                  limits: BatchLimits | None = None,
                  on_batch: Callable[[BatchReport], None] | None = None) -> list[BatchReport]:
    """Apply the table's pending change events to its Delta table, one micro-batch (one commit, data
    and offsets together) after another, until caught up or ``limits.max_batches_per_run``; returns
    each batch's report.

    ``kafka``: bootstrap servers, librdkafka settings, or a ``KafkaSource`` to reuse. ``spark``: a
    session to use; by default one on the local Spark server (started if none runs, left running
    warm for the next call). A bad event raises ``BadEventError`` naming its topic, partition and
    offset (the batches before it stay committed). ``writer``: a writer's name, or a writer to reuse.
    """
    captured = table.captured_table() if isinstance(table, TableSpec) else table
    with contextlib.ExitStack() as cleanup:
        if isinstance(kafka, KafkaSource):
            source = kafka
        else:
            settings = {"bootstrap.servers": kafka} if isinstance(kafka, str) else dict(kafka)
            source = KafkaSource({"group.id": "cdc-assets", **settings})
            cleanup.callback(source.close)
        session = spark or cleanup.enter_context(_default_session(captured.target, writer))
        reports = []
        delta = select_writer(writer, session) if isinstance(writer, str) else writer
        for report in merge_micro_batches(session, source, delta, captured, limits or BatchLimits()):
            reports.append(report)
            if on_batch is not None:
                on_batch(report)
        return reports
