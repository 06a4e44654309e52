"""Debezium signals: ``execute-snapshot`` (incremental or blocking), ``stop-snapshot``,
``pause-snapshot`` and ``resume-snapshot``, sent through the connector's Kafka signal topic or its
signal table in the source database (PostgreSQL, MySQL or MariaDB), and audited.

Nothing is sent unless the signal validates for the connector's Debezium version: ``data-collections``
non-empty for execute and each a valid regex, a snapshot type the signal takes, a signal the version
supports, a signal table name made of plain identifiers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal, Protocol
from urllib.parse import unquote, urlsplit

import pyarrow as pa
from confluent_kafka import KafkaException, Producer

from cdc_assets.io.delta import NEW_TABLE_PROPERTIES
from cdc_assets.io.kafka import LIBRDKAFKA_LOGGER
from cdc_assets.io.storage import delta_rs_options

SignalType = Literal["execute-snapshot", "stop-snapshot", "pause-snapshot", "resume-snapshot"]
SnapshotType = Literal["incremental", "blocking"]
SIGNAL_TYPES: tuple[SignalType, ...] = ("execute-snapshot", "stop-snapshot", "pause-snapshot", "resume-snapshot")
SNAPSHOT_TYPES: tuple[SnapshotType, ...] = ("incremental", "blocking")
DEFAULT_DEBEZIUM_VERSION = "3.0"
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")

# The Debezium version that first understood each signal feature (its release notes: stop, pause and
# resume came with 2.0; blocking snapshots and per-collection ``additional-conditions`` with 2.4, which
# also stopped reading the single ``additional-condition``).
SINCE: dict[str, tuple[int, int]] = {
    "execute-snapshot": (1, 6), "stop-snapshot": (2, 0), "pause-snapshot": (2, 0), "resume-snapshot": (2, 0),
    "blocking": (2, 4), "additional-conditions": (2, 4),
}

AUDIT_SCHEMA = pa.schema([
    ("id", pa.string()),
    ("sent_at", pa.timestamp("us", tz="UTC")),
    ("channel", pa.string()),
    ("connector", pa.string()),
    ("type", pa.string()),
    ("payload", pa.string()),
    ("run_id", pa.string()),
])


_PASSWORDS = re.compile(r"(password\s*=\s*|://[^:/@\s]*:)[^\s@]+", re.IGNORECASE)


class SignalError(ValueError):
    """A signal is not valid or could not be sent; nothing was sent."""


def data_collection(*parts: str) -> str:
    """A fully qualified table name for ``data-collections``; when a part contains a dot, every part
    is quoted (``"public"."My.Table"``), as Debezium expects."""
    if any("." in part for part in parts):
        return ".".join(f'"{part}"' for part in parts)
    return ".".join(parts)


def parse_version(version: str) -> tuple[int, int]:
    """``"3.6"`` / ``"3.6.3.Final"`` as ``(3, 6)``."""
    match = re.match(r"^(\d+)\.(\d+)", version.strip())
    if match is None:
        raise SignalError(f"Debezium version '{version}' is not of the form MAJOR.MINOR")
    return int(match.group(1)), int(match.group(2))


@dataclass(frozen=True)
class SnapshotSignal:
    """A snapshot signal for a connector of ``debezium_version``.

    ``additional_conditions``: ``(data collection, filter)`` pairs; the filter is a SQL predicate for
    an incremental snapshot and the snapshot's SELECT statement for a blocking one."""

    id: str
    type: SignalType
    data_collections: tuple[str, ...] = ()
    snapshot_type: SnapshotType | None = "incremental"
    additional_conditions: tuple[tuple[str, str], ...] = ()
    surrogate_key: str | None = None
    debezium_version: str = DEFAULT_DEBEZIUM_VERSION

    def _needs(self, feature: str, what: str) -> None:
        since = SINCE[feature]
        if parse_version(self.debezium_version) < since:
            raise SignalError(f"signal {self.id}: {what} needs Debezium {since[0]}.{since[1]} or later "
                              f"(the connector's signal.debezium_version is {self.debezium_version})")

    def validate(self) -> None:
        """Raise ``SignalError`` naming what is wrong."""
        if self.type not in SIGNAL_TYPES:
            raise SignalError(f"signal {self.id}: unknown signal type '{self.type}'")
        if not self.id:
            raise SignalError("a signal needs an id")
        self._needs(self.type, self.type)
        if self.type == "execute-snapshot" and not self.data_collections:
            raise SignalError(f"signal {self.id}: execute-snapshot needs at least one data collection")
        if self.type in ("execute-snapshot", "stop-snapshot"):
            if self.snapshot_type is None:
                raise SignalError(f"signal {self.id}: {self.type} needs a snapshot type "
                                  f"(one of {list(SNAPSHOT_TYPES)})")
            if self.snapshot_type.lower() not in SNAPSHOT_TYPES:
                raise SignalError(f"signal {self.id}: snapshot type '{self.snapshot_type}' is not supported "
                                  f"(expected one of {list(SNAPSHOT_TYPES)})")
        if self.snapshot_type == "blocking":
            if self.type != "execute-snapshot":
                raise SignalError(f"signal {self.id}: {self.type} applies to incremental snapshots only; a "
                                  "blocking snapshot cannot be stopped, paused or resumed")
            self._needs("blocking", "a blocking snapshot")
        if self.type in ("pause-snapshot", "resume-snapshot") and (self.data_collections or self.additional_conditions):
            raise SignalError(f"signal {self.id}: {self.type} takes no tables: it pauses or resumes the whole "
                              "incremental snapshot")
        if self.additional_conditions or self.surrogate_key:
            if self.type != "execute-snapshot":
                raise SignalError(f"signal {self.id}: additional conditions and a surrogate key go with "
                                  "execute-snapshot only")
            filters = {condition for _, condition in self.additional_conditions}
            if parse_version(self.debezium_version) < SINCE["additional-conditions"] and (
                    len(filters) > 1 or {c for c, _ in self.additional_conditions} != set(self.data_collections)):
                self._needs("additional-conditions", "a filter per data collection")
        for collection in (*self.data_collections, *(c for c, _ in self.additional_conditions)):
            if not collection.strip():
                raise SignalError(f"signal {self.id}: an empty data collection name")
            try:
                re.compile(collection)
            except re.error as exc:
                raise SignalError(f"signal {self.id}: data collection '{collection}' is not a valid regex: "
                                  f"{exc}") from exc
        for collection, condition in self.additional_conditions:
            if not condition.strip():
                raise SignalError(f"signal {self.id}: the additional condition of '{collection}' is empty")

    def data(self) -> dict[str, object]:
        """The signal's ``data`` object, in Debezium's field names, in the form its version reads."""
        data: dict[str, object] = {}
        if self.data_collections:
            data["data-collections"] = list(self.data_collections)
        if self.snapshot_type is not None:
            data["type"] = self.snapshot_type.lower()
        if self.additional_conditions:
            if parse_version(self.debezium_version) >= SINCE["additional-conditions"]:
                data["additional-conditions"] = [{"data-collection": collection, "filter": condition}
                                                 for collection, condition in self.additional_conditions]
            else:
                data["additional-condition"] = self.additional_conditions[0][1]
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

        producer = Producer({"logger": LIBRDKAFKA_LOGGER, **self._settings, "enable.idempotence": True})
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


# DSN schemes that name a MySQL-family server (MySQL, MariaDB); any other DSN is PostgreSQL's (libpq).
MYSQL_SCHEMES = ("mysql", "mariadb")


@dataclass(frozen=True)
class MySQLAddress:
    """Where a ``mysql://`` / ``mariadb://`` DSN points: ``<scheme>://user[:password]@host[:port][/database]``."""

    host: str
    port: int
    user: str
    password: str
    database: str | None

    def connect(self, timeout_s: float = 10) -> Any:
        """A PyMySQL connection (autocommit, utf8mb4) to this server, giving up after ``timeout_s``."""
        import pymysql

        return pymysql.connect(host=self.host, port=self.port, user=self.user, password=self.password,
                               database=self.database, charset="utf8mb4", connect_timeout=int(timeout_s),
                               autocommit=True)


def without_secrets(message: str, dsn: str) -> str:
    """A database error's ``message`` with the DSN and any password it holds left out (libpq echoes a DSN it
    cannot parse, password and all): DSNs come from secrets."""
    return _PASSWORDS.sub(r"\1***", message.replace(dsn, "<dsn>")).strip()


def mysql_address(dsn: str) -> MySQLAddress | None:
    """The server a MySQL-family DSN names, or None for any other DSN; ``SignalError`` for a malformed one."""
    parts = urlsplit(dsn)
    if parts.scheme.lower() not in MYSQL_SCHEMES:
        return None
    # The password is left out of every message: DSNs come from secrets.
    if parts.query or parts.fragment:
        raise SignalError(f"the {parts.scheme} signal DSN takes no options (?... or #...): "
                          "<scheme>://user:password@host:port/database")
    try:
        port = parts.port or 3306
    except ValueError as exc:
        raise SignalError(f"the {parts.scheme} signal DSN has an invalid port: {exc}") from None
    if not parts.hostname or not parts.username:
        raise SignalError(f"the {parts.scheme} signal DSN needs a user and a host: "
                          "<scheme>://user:password@host:port/database")
    database = unquote(parts.path.lstrip("/")) or None
    return MySQLAddress(parts.hostname, port, unquote(parts.username), unquote(parts.password or ""), database)


class SourceTableSignalChannel:
    """The connector's signal table in the source database: ``INSERT INTO <table> (id, type, data)``,
    parameterised, with the table name quoted. The DSN's scheme decides the database: ``mysql://`` or
    ``mariadb://`` (MySQL, MariaDB, through PyMySQL), otherwise PostgreSQL (libpq's DSN, through psycopg)."""

    name = "source"

    def __init__(self, dsn: str, table: str):
        self._dsn = dsn
        self.table = table
        self._identifier = signal_table_identifier(table)
        self._mysql = mysql_address(dsn)

    def send(self, signal: SnapshotSignal) -> None:
        signal.validate()
        row = (signal.id, signal.type, json.dumps(signal.data()))
        if self._mysql is not None:
            self._insert_mysql(self._mysql, signal.id, row)
        else:
            self._insert_postgresql(signal.id, row)

    def _insert_postgresql(self, signal_id: str, row: tuple[str, str, str]) -> None:
        import psycopg
        from psycopg import sql

        statement = sql.SQL("INSERT INTO {} (id, type, data) VALUES (%s, %s, %s)").format(
            sql.Identifier(*self._identifier))
        try:
            with psycopg.connect(self._dsn, connect_timeout=10) as connection:
                connection.execute(statement, row)
        except psycopg.Error as exc:
            # A DSN libpq cannot parse comes back in its message, password and all.
            raise SignalError(f"signal {signal_id}: cannot insert into signal table '{self.table}': "
                              f"{without_secrets(str(exc), self._dsn)}") from exc

    def _insert_mysql(self, address: MySQLAddress, signal_id: str, row: tuple[str, str, str]) -> None:
        import pymysql

        # signal_table_identifier admits plain identifiers only, so backquoting needs no escaping.
        table = ".".join(f"`{part}`" for part in self._identifier)
        try:
            connection = address.connect()
            try:
                with connection.cursor() as cursor:
                    cursor.execute(f"INSERT INTO {table} (id, type, data) VALUES (%s, %s, %s)", row)
            finally:
                connection.close()
        except pymysql.err.MySQLError as exc:
            raise SignalError(f"signal {signal_id}: cannot insert into signal table '{self.table}': "
                              f"{exc}") from exc


def audit_signal(audit_path: str, storage_options: Mapping[str, str], signal: SnapshotSignal, channel: str,
                 connector: str, run_id: str) -> dict[str, object]:
    """Append the sent signal to the pipeline's signals audit table (Delta); returns the audit row."""
    from deltalake import write_deltalake

    row = {"id": signal.id, "sent_at": datetime.now(timezone.utc), "channel": channel, "connector": connector,
           "type": signal.type, "payload": json.dumps({"type": signal.type, "data": signal.data()}),
           "run_id": run_id}
    write_deltalake(audit_path, pa.Table.from_pylist([row], schema=AUDIT_SCHEMA), mode="append",
                    configuration=NEW_TABLE_PROPERTIES, storage_options=delta_rs_options(storage_options))
    return row


def signal_ids(run_id: str, count: int) -> Sequence[str]:
    """Unique, traceable signal ids: the Dagster run id and the signal's index in the run."""
    return [f"cdc-assets-{run_id}-{index}" for index in range(count)]
