"""Debezium signals: ``execute-snapshot`` / ``stop-snapshot`` (incremental snapshots), sent through
the connector's Kafka signal topic or its signal table in the source database, and audited.

Nothing is sent unless the signal validates: ``data-collections`` non-empty for execute and each a
valid regex, a known snapshot ``type``, a signal table name made of plain identifiers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Literal, Protocol

import pyarrow as pa
from confluent_kafka import KafkaException, Producer

SignalType = Literal["execute-snapshot", "stop-snapshot"]
SNAPSHOT_TYPES = ("incremental",)
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")

AUDIT_SCHEMA = pa.schema([
    ("id", pa.string()),
    ("sent_at", pa.timestamp("us", tz="UTC")),
    ("channel", pa.string()),
    ("connector", pa.string()),
    ("type", pa.string()),
    ("payload", pa.string()),
    ("run_id", pa.string()),
])


class SignalError(ValueError):
    """A signal is not valid or could not be sent; nothing was sent."""


def data_collection(*parts: str) -> str:
    """A fully qualified table name for ``data-collections``; when a part contains a dot, every part
    is quoted (``"public"."My.Table"``), as Debezium expects."""
    if any("." in part for part in parts):
        return ".".join(f'"{part}"' for part in parts)
    return ".".join(parts)


@dataclass(frozen=True)
class SnapshotSignal:
    """An ``execute-snapshot`` or ``stop-snapshot`` signal."""

    id: str
    type: SignalType
    data_collections: tuple[str, ...] = ()
    snapshot_type: str | None = "incremental"
    additional_condition: str | None = None
    surrogate_key: str | None = None

    def validate(self) -> None:
        """Raise ``SignalError`` naming what is wrong."""
        if self.type not in ("execute-snapshot", "stop-snapshot"):
            raise SignalError(f"signal {self.id}: unknown signal type '{self.type}'")
        if not self.id:
            raise SignalError("a signal needs an id")
        if self.type == "execute-snapshot" and not self.data_collections:
            raise SignalError(f"signal {self.id}: execute-snapshot needs at least one data collection")
        if self.snapshot_type is None:
            raise SignalError(f"signal {self.id}: {self.type} needs a snapshot type (incremental)")
        if self.snapshot_type.lower() not in SNAPSHOT_TYPES:
            raise SignalError(f"signal {self.id}: snapshot type '{self.snapshot_type}' is not supported "
                              f"(expected one of {list(SNAPSHOT_TYPES)})")
        for collection in self.data_collections:
            if not collection.strip():
                raise SignalError(f"signal {self.id}: an empty data collection name")
            try:
                re.compile(collection)
            except re.error as exc:
                raise SignalError(f"signal {self.id}: data collection '{collection}' is not a valid regex: "
                                  f"{exc}") from exc

    def data(self) -> dict[str, object]:
        """The signal's ``data`` object, in Debezium's field names."""
        data: dict[str, object] = {}
        if self.data_collections:
            data["data-collections"] = list(self.data_collections)
        if self.snapshot_type is not None:
            data["type"] = self.snapshot_type.lower()
        if self.additional_condition:
            data["additional-condition"] = self.additional_condition
        if self.surrogate_key:
            data["surrogate-key"] = self.surrogate_key
        return data


class SignalChannel(Protocol):
    """Where signals go."""

    name: str

    def send(self, signal: SnapshotSignal) -> None:
        """Validate and deliver ``signal``, or raise ``SignalError`` having sent nothing."""
        ...


class KafkaSignalChannel:
    """The connector's Kafka signal topic: key = ``topic.prefix``, value ``{"type", "data"}``."""

    name = "kafka"

    def __init__(self, settings: Mapping[str, object], topic: str, topic_prefix: str, timeout_s: float = 30.0):
        self._settings = {k: v for k, v in settings.items() if k != "group.id"}
        self.topic, self.topic_prefix, self._timeout_s = topic, topic_prefix, timeout_s

    def send(self, signal: SnapshotSignal) -> None:
        signal.validate()
        failures: list[str] = []

        def delivered(error: object, _message: object) -> None:
            if error is not None:
                failures.append(str(error))

        producer = Producer({**self._settings, "enable.idempotence": True})
        try:
            producer.produce(self.topic, key=self.topic_prefix.encode(),
                             value=json.dumps({"type": signal.type, "data": signal.data()}).encode(),
                             on_delivery=delivered)
            remaining = producer.flush(self._timeout_s)
        except KafkaException as exc:
            raise SignalError(f"signal {signal.id}: cannot produce to '{self.topic}': {exc}") from exc
        if remaining or failures:
            raise SignalError(f"signal {signal.id}: not delivered to '{self.topic}': "
                              f"{failures or 'timed out'}")


def signal_table_identifier(table: str) -> tuple[str, ...]:
    """``schema.table`` (or ``table``) split into plain identifiers; anything else is refused."""
    parts = tuple(table.split("."))
    if not 1 <= len(parts) <= 2 or not all(_IDENTIFIER.match(part) for part in parts):
        raise SignalError(f"signal table '{table}' is not a plain [schema.]table name")
    return parts


class SourceTableSignalChannel:
    """The connector's signal table in the source database (PostgreSQL through psycopg):
    ``INSERT INTO <table> (id, type, data)``, parameterised, with the table name quoted."""

    name = "source"

    def __init__(self, dsn: str, table: str):
        self._dsn = dsn
        self.table = table
        self._identifier = signal_table_identifier(table)

    def send(self, signal: SnapshotSignal) -> None:
        import psycopg
        from psycopg import sql

        signal.validate()
        statement = sql.SQL("INSERT INTO {} (id, type, data) VALUES (%s, %s, %s)").format(
            sql.Identifier(*self._identifier))
        try:
            with psycopg.connect(self._dsn, connect_timeout=10) as connection:
                connection.execute(statement, (signal.id, signal.type, json.dumps(signal.data())))
        except psycopg.Error as exc:
            raise SignalError(f"signal {signal.id}: cannot insert into signal table '{self.table}': "
                              f"{str(exc).strip()}") from exc


def audit_signal(audit_path: str, storage_options: Mapping[str, str], signal: SnapshotSignal, channel: str,
                 connector: str, run_id: str) -> dict[str, object]:
    """Append the sent signal to the pipeline's signals audit table (Delta); returns the audit row."""
    from deltalake import write_deltalake

    row = {"id": signal.id, "sent_at": datetime.now(timezone.utc), "channel": channel, "connector": connector,
           "type": signal.type, "payload": json.dumps({"type": signal.type, "data": signal.data()}),
           "run_id": run_id}
    write_deltalake(audit_path, pa.Table.from_pylist([row], schema=AUDIT_SCHEMA), mode="append",
                    storage_options=dict(storage_options))
    return row


def signal_ids(run_id: str, count: int) -> Sequence[str]:
    """Unique, traceable signal ids: the Dagster run id and the signal's index in the run."""
    return [f"cdc-assets-{run_id}-{index}" for index in range(count)]
