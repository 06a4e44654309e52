"""Whether a Delta table holds its source table's rows: counts and checksums per key bucket computed where
the data lives (aggregate SQL in PostgreSQL or MariaDB/MySQL through a read-only connection, Spark SQL on the
Delta table; ``core.reconcile`` writes both), and only the rows of buckets that differ read as (key, md5).

The source keeps changing while this looks, so a difference is drift only once it outlived the changes in
flight (``reconcile``):

1. Both sides' checksums per bucket; the source's in one snapshot, with its position (PostgreSQL's
   ``pg_current_wal_insert_lsn()``, MariaDB's ``binlog_snapshot_file``/``_position``) taken in that snapshot.
2. Buckets that differ are looked at again, key by key, once the table has applied everything up to that
   position (``reached``): the Delta table's version first, then the source in a new snapshot.
3. Keys that still differ are looked at once more after the table has reached the second look's position,
   Delta first again. A key is drift when its source row did not change between the second and third looks
   (same md5: so the Delta table, which has applied everything up to the second look and nothing after the
   third, holds exactly the changes the source made to it) and Delta still differs. A key whose source row
   changed in between is in flight, never drift.

Each look runs both sides at once (``_look``): the Delta table's latest version is pinned first, then the source's
query runs in a thread of its own while Spark reads that version, so a look takes about as long as its slower
side, and the Delta table still holds nothing the source's snapshot does not.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from pyspark.sql import SparkSession
from pyspark.sql import types as T

from cdc_assets.core.apply_modes import ApplyMode
from cdc_assets.core.position import source_position_of
from cdc_assets.core.reconcile import (
    DIALECT_OF_KIND,
    BucketSums,
    ComparedColumn,
    Dialect,
    DriftedRanges,
    KeyDifference,
    KeyRows,
    TableQueries,
    compared_columns,
    differing_buckets,
    key_differences,
    key_rows,
    live_rows,
    quote,
)
from cdc_assets.io.delta import DeltaRsWriter, DeltaTarget
from cdc_assets.io.signals import MySQLAddress, mysql_address, without_secrets
from cdc_assets.io.storage import spark_path


class ReconcileError(RuntimeError):
    """The comparison could not be made: a source it cannot reach or read, a table it cannot compare."""


Rows = list[tuple[Any, ...]]


class SourceDatabase(Protocol):
    """A read-only connection to the source database."""

    dialect: Dialect

    def column_types(self, table: str) -> dict[str, str]:
        """The data type of each column of ``table`` (``schema.table``), as ``information_schema`` names it."""
        ...

    def look(self, query: str) -> tuple[str, Rows]:
        """``query``'s rows read in one snapshot, with the source position of that snapshot (the connector
        kind's fixed-width form, ``core.position``)."""
        ...

    def confirmed_position(self) -> str | None:
        """The position up to which the connector has confirmed reading the source (PostgreSQL: the smallest
        ``confirmed_flush_lsn`` of the database's logical slots), or None where the database does not know."""
        ...

    def close(self) -> None:
        """Close the connection."""
        ...


def _pg_position(lsn: str) -> str:
    high, low = lsn.split("/")
    return source_position_of({"lsn": (int(high, 16) << 32) + int(low, 16)}, "postgresql")


class PostgresSource:
    """PostgreSQL through psycopg: each look a read-only repeatable-read transaction."""

    dialect: Dialect = "postgresql"

    def __init__(self, dsn: str):
        import psycopg

        try:
            self._connection = psycopg.connect(dsn, connect_timeout=10, autocommit=True)
        except psycopg.Error as exc:
            raise ReconcileError(f"cannot connect to the source PostgreSQL: {without_secrets(str(exc), dsn)}") from None
        # Each look's transaction (``transaction()``) begins with these: one snapshot for all its statements.
        self._connection.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        self._connection.read_only = True
        self._connection.execute("SET TIME ZONE 'UTC'")

    def column_types(self, table: str) -> dict[str, str]:
        schema, name = _schema_and_name(table, "public")
        rows = self._connection.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = %s AND "
            "table_name = %s", (schema, name)).fetchall()
        return {str(column): str(data_type) for column, data_type in rows}

    def look(self, query: str) -> tuple[str, Rows]:
        with self._connection.transaction(force_rollback=True):
            # The first statement takes the snapshot: every commit it sees is before this position. The insert
            # position, not the write position, which an asynchronous commit's record may not have reached yet.
            position = self._connection.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
            rows = self._connection.execute(query).fetchall()  # type: ignore[arg-type]  # built by core.reconcile
        assert position is not None
        return _pg_position(str(position[0])), [tuple(row) for row in rows]

    def confirmed_position(self) -> str | None:
        row = self._connection.execute(
            "SELECT min(confirmed_flush_lsn)::text FROM pg_replication_slots WHERE slot_type = 'logical' "
            "AND database = current_database()").fetchone()
        return _pg_position(str(row[0])) if row is not None and row[0] is not None else None

    def close(self) -> None:
        self._connection.close()


class ConnectOffsets:
    """How far a MariaDB/MySQL connector has read, from the offsets Kafka Connect has committed for it
    (``GET /connectors/<name>/offsets``, Kafka Connect 3.5 or later): Connect commits a source offset only once
    the records up to it are in Kafka, and a Debezium binlog offset's ``file``/``pos`` is where the connector
    resumes, so every transaction committed before that position is in Kafka."""

    def __init__(self, url: str, connector: str, kind: str, timeout_s: float = 10.0):
        self.url, self.connector, self.kind, self._timeout_s = url.rstrip("/"), connector, kind, timeout_s

    def position(self) -> str | None:
        """The binlog position (``core.position``'s form, row 0) of the connector's committed offsets; None
        before it has committed one, or while its initial snapshot is under way (its rows are not all sent)."""
        where = f"{self.url}/connectors/{urllib.parse.quote(self.connector, safe='')}/offsets"
        try:
            with urllib.request.urlopen(urllib.request.Request(where, headers={"Accept": "application/json"}),
                                        timeout=self._timeout_s) as response:
                answer = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            hint = (" (no such connector in that Connect cluster: set rows_match_source.kafka_connect_connector, or "
                    "the Connect cluster is older than 3.5)" if exc.code in (404, 405) else "")
            raise ReconcileError(f"Kafka Connect at {self.url} answered GET /connectors/{self.connector}/offsets "
                                 f"with {exc.code}{hint}: {exc.read().decode(errors='replace')[:300]}") from None
        except (OSError, ValueError) as exc:
            raise ReconcileError(f"cannot read the offsets of connector {self.connector} from Kafka Connect at "
                                 f"{self.url}: {exc}") from None
        positions = [_binlog_position(entry.get("offset") or {}, self.kind) for entry in answer.get("offsets", [])]
        if not positions or None in positions:
            return None
        return min(position for position in positions if position is not None)


def _binlog_position(offset: dict[str, Any], kind: str) -> str | None:
    """The resume position of one Debezium binlog offset; None for one taken during a snapshot that has not
    completed, or one without ``file``/``pos``."""
    snapshotting = str(offset.get("snapshot", "false")).lower() not in ("false", "")
    if (snapshotting and str(offset.get("snapshot_completed", "false")).lower() != "true") or \
            "file" not in offset or "pos" not in offset:
        return None
    return source_position_of({"file": offset["file"], "pos": offset["pos"], "row": 0}, kind)


class MySQLSource:
    """MariaDB or MySQL through PyMySQL: each look a read-only transaction with a consistent snapshot, whose
    binlog position MariaDB reports as ``binlog_snapshot_file`` / ``binlog_snapshot_position``; ``connector``:
    the connector's committed offsets in Kafka Connect, if it is known where to ask."""

    dialect: Dialect = "mysql"

    def __init__(self, address: MySQLAddress, connector: ConnectOffsets | None = None):
        import pymysql

        self._connector = connector
        try:
            self._connection = address.connect()
        except pymysql.err.MySQLError as exc:
            raise ReconcileError(f"cannot connect to the source database at {address.host}:{address.port}: "
                                 f"{exc}") from None
        with self._connection.cursor() as cursor:
            cursor.execute("SET time_zone = '+00:00'")

    def column_types(self, table: str) -> dict[str, str]:
        schema, name = _schema_and_name(table, None)
        with self._connection.cursor() as cursor:
            cursor.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = "
                           "COALESCE(%s, DATABASE()) AND table_name = %s", (schema, name))
            return {str(column): str(data_type) for column, data_type in cursor.fetchall()}

    def look(self, query: str) -> tuple[str, Rows]:
        with self._connection.cursor() as cursor:
            cursor.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
            try:
                cursor.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
                status = {str(name): str(value) for name, value in cursor.fetchall()}
                cursor.execute(query)
                rows = [tuple(row) for row in cursor.fetchall()]
            finally:
                cursor.execute("ROLLBACK")
        if "Binlog_snapshot_file" not in status:
            raise ReconcileError("the source reports no binlog_snapshot_file: binary logging is off, or the "
                                 "server is not MariaDB")
        position = source_position_of({"file": status["Binlog_snapshot_file"],
                                       "pos": status["Binlog_snapshot_position"], "row": 0}, "mariadb")
        return position, rows

    def confirmed_position(self) -> str | None:
        # The server does not know how far the connector has read: Kafka Connect's offsets do.
        return self._connector.position() if self._connector is not None else None

    def close(self) -> None:
        self._connection.close()


def _schema_and_name(table: str, default_schema: str | None) -> tuple[str | None, str]:
    schema, _, name = table.rpartition(".")
    return schema or default_schema, name


def open_source(kind: str, dsn: str, connector: ConnectOffsets | None = None) -> SourceDatabase:
    """A read-only connection to the source database of a connector of ``kind`` at ``dsn`` (PostgreSQL: a
    libpq DSN; MariaDB/MySQL: ``mariadb://user:password@host:port/database``, with ``connector``'s offsets in
    Kafka Connect as how far it has read)."""
    dialect = DIALECT_OF_KIND.get(kind)
    if dialect is None:
        raise ReconcileError(f"rows_match_source cannot read a {kind} source (PostgreSQL, MariaDB and MySQL only)")
    address = mysql_address(dsn)
    if dialect == "mysql":
        if address is None:
            raise ReconcileError(f"a {kind} source needs a mysql:// or mariadb:// DSN")
        return MySQLSource(address, connector)
    if address is not None:
        raise ReconcileError(f"a {kind} source needs a PostgreSQL (libpq) DSN, not a {dsn.split(':')[0]}:// one")
    return PostgresSource(dsn)


def recorded_position(target: DeltaTarget, app_id: str, writer: DeltaRsWriter | None = None
                      ) -> Callable[[], str | None]:
    """A look-up of the source position the latest batch commit of ``app_id`` recorded in ``target``'s log
    (``TableProgress.source_position``; None before any, or for a table last written before positions were
    recorded), through ``writer`` (default a new one): the log's new commits only, never the table's rows."""
    writer = writer or DeltaRsWriter()  # keeps the table loaded: each look reads only the commits since the last

    def position() -> str | None:
        progress = writer.read_progress(target, app_id)
        return progress.source_position if progress is not None else None

    return position


class DeltaSide:
    """The Delta table in Spark: its rows that stand for the source's (``core.reconcile.live_rows``) in a
    temporary view, read again at every query (at the version it names, else the table's latest). ``recorded``: the
    position its commits recorded (``recorded_position``), read before scanning the rows for one."""

    def __init__(self, spark: SparkSession, path: str, mode: ApplyMode,
                 recorded: Callable[[], str | None] | None = None):
        # Spark opens an object store's path by its Hadoop name (s3:// as s3a://).
        self._spark, self._path, self.mode, self._recorded = spark, spark_path(path), mode, recorded
        self.view = f"rows_match_source_{uuid.uuid4().hex}"

    def schema(self) -> T.StructType:
        """The Delta table's schema."""
        return self._spark.read.format("delta").load(self._path).schema

    def version(self) -> int:
        """The table's latest version, read from its log (no rows read)."""
        history = self._spark.sql(f"DESCRIBE HISTORY delta.{quote(self._path, 'spark')} LIMIT 1")
        return int(history.select("version").collect()[0][0])

    def query(self, sql: str, version: int | None = None) -> Rows:
        """``sql`` (on ``self.view``) against the table's ``version`` (default its latest)."""
        reader = self._spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        reader.load(self._path).createOrReplaceTempView(self.view)
        return [tuple(row) for row in self._spark.sql(sql).collect()]

    def position(self) -> str:
        """The greatest source position of a change the table has applied: as its latest batch commit recorded
        it, else (a table last written before commits recorded it) the newest its rows hold (the apply mode's
        ``changed_at_column``), a lower bound (an scd1 delete leaves no row to read it from) read by a scan."""
        recorded = self._recorded() if self._recorded is not None else None
        if recorded is not None:
            return recorded
        column = quote(self.mode.changed_at_column, "spark")
        newest = self.query(f"SELECT max({column}) FROM {self.view}")[0][0]
        return str(newest or "")

    def close(self) -> None:
        """Drop the temporary view."""
        self._spark.catalog.dropTempView(self.view)


@dataclass
class DriftedBucket:
    """A key bucket whose rows differ after the changes in flight were applied."""

    bucket: int
    differences: list[KeyDifference]

    def counts(self) -> dict[str, int]:
        """How many keys are missing, extra and different."""
        kinds = [difference.kind for difference in self.differences]
        return {kind: kinds.count(kind) for kind in ("missing", "extra", "different")}


@dataclass(frozen=True)
class Look:
    """When each side's part of one look ran, in seconds since the comparison began: the Delta table's from
    pinning its version to having its rows, the source's its snapshot's transaction."""

    delta: tuple[float, float]
    source: tuple[float, float]

    @property
    def overlap_s(self) -> float:
        """How long both sides ran at once."""
        return max(0.0, min(self.delta[1], self.source[1]) - max(self.delta[0], self.source[0]))

    def to_metadata(self) -> dict[str, list[float]]:
        """Its spans, rounded to milliseconds."""
        return {"delta": [round(t, 3) for t in self.delta], "source": [round(t, 3) for t in self.source]}


@dataclass
class Reconciliation:
    """What one comparison found."""

    buckets: int
    columns: list[str]
    left_out: list[str]
    source_rows: int = 0
    delta_rows: int = 0
    first_position: str = ""
    last_position: str = ""
    differing_first: list[int] = field(default_factory=list)  # buckets that differed at the first look
    drifted: list[DriftedBucket] = field(default_factory=list)
    in_flight_keys: int = 0  # keys whose source row changed between the last two looks
    unsettled: list[int] = field(default_factory=list)  # buckets the table did not catch up on in time
    looks: list[Look] = field(default_factory=list)
    waited_s: float = 0.0
    wall_s: float = 0.0  # the whole comparison, from reading the schemas to the last look
    key_columns: tuple[ComparedColumn, ...] = ()

    @property
    def source_s(self) -> float:
        """Seconds the source database spent on the looks."""
        return sum(look.source[1] - look.source[0] for look in self.looks)

    @property
    def delta_s(self) -> float:
        """Seconds Spark spent on the looks (the Delta table's versions and rows)."""
        return sum(look.delta[1] - look.delta[0] for look in self.looks)

    @property
    def side_by_side_s(self) -> float:
        """Seconds both sides ran at once."""
        return sum(look.overlap_s for look in self.looks)

    @property
    def passed(self) -> bool:
        """No drift, and no bucket left unsettled."""
        return not self.drifted and not self.unsettled

    def drifted_ranges(self) -> DriftedRanges:
        """The drifted keys, machine-readable, for a repair (``core.reconcile.DriftedRanges``)."""
        return DriftedRanges.of(self.buckets, self.key_columns,
                                [difference for bucket in self.drifted for difference in bucket.differences])


Reached = Callable[[str], bool]


def committed_position_reached(delta: DeltaSide, source: SourceDatabase,
                               events_waiting: Callable[[], int] | None = None) -> Reached:
    """Whether the table has applied every change of the source up to a position: its newest change is at or
    past it (``DeltaSide.position``); or, for a table with no change since (a quiet table's newest change stays
    behind the source's position for ever), the connector has confirmed reading the source past it
    (``SourceDatabase.confirmed_position``: it has written every event up to there to Kafka) and then
    ``events_waiting`` says no event of the table waits in its topic unmerged."""

    def reached(position: str) -> bool:
        if delta.position()[:len(position)] >= position:
            return True
        if events_waiting is None:
            return False
        confirmed = source.confirmed_position()
        return confirmed is not None and confirmed >= position and events_waiting() == 0

    return reached


_T = TypeVar("_T")


def _timed(work: Callable[[], _T], began: float) -> tuple[_T, tuple[float, float]]:
    """``work()``'s answer, and when it ran (seconds since ``began``, a ``time.perf_counter()``)."""
    start = time.perf_counter() - began
    answer = work()
    return answer, (start, time.perf_counter() - began)


def _look(result: Reconciliation, began: float, source: SourceDatabase, source_sql: str, delta: DeltaSide,
          delta_sql: str) -> tuple[str, Rows, Rows]:
    """The source's position and rows for ``source_sql`` and the Delta table's for ``delta_sql``, both sides at
    once: the table's version is pinned before the source's snapshot is taken (so the table holds nothing that
    snapshot does not), then the source's query runs in a thread while Spark reads that version."""
    start = time.perf_counter() - began
    version = delta.version()
    # The worker only waits on the database's socket; leaving the pool waits for it even when Spark fails.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="rows_match_source") as pool:
        looking = pool.submit(_timed, lambda: source.look(source_sql), began)
        delta_rows = delta.query(delta_sql, version)
        delta_span = (start, time.perf_counter() - began)
        (position, source_rows), source_span = looking.result()
    result.looks.append(Look(delta_span, source_span))
    return position, source_rows, delta_rows


def _sums(rows: Rows) -> BucketSums:
    return {int(b): (int(count), int(total)) for b, count, total in rows}


def reconcile(source: SourceDatabase, delta: DeltaSide, table: str, key_columns: Sequence[str],
              buckets: int = 256, reached: Reached | None = None, settle_timeout_s: float = 300.0,
              poll_s: float = 2.0) -> Reconciliation:
    """Compare the Delta table of ``delta`` with ``table`` (``schema.table``) of ``source`` over ``key_columns``
    split into ``buckets``; ``reached``: whether the table has applied the source up to a position (default
    ``committed_position_reached``), waited for at most ``settle_timeout_s`` before each look again, polled
    every ``poll_s``."""
    began = time.perf_counter()
    reached = reached or committed_position_reached(delta, source)
    source_types = source.column_types(table)
    if not source_types:
        raise ReconcileError(f"the source has no table {table} (or this connection may not read it)")
    columns, left_out = compared_columns(delta.schema(), source_types, source.dialect)
    by_name = {column.name: column for column in columns}
    missing_keys = [name for name in key_columns if name not in by_name]
    if missing_keys:
        raise ReconcileError(f"{table}: key column(s) {missing_keys} cannot be compared (absent on one side, or of "
                             "a type with no common text)")
    keys: tuple[ComparedColumn, ...] = tuple(by_name[name] for name in key_columns)
    mine = TableQueries(_relation(table, source.dialect), keys, tuple(columns), buckets, source.dialect)
    theirs = TableQueries(delta.view, keys, tuple(columns), buckets, "spark", live_rows(delta.mode))
    result = Reconciliation(buckets, [column.name for column in columns], left_out, key_columns=keys)
    try:
        _compare(result, began, source, delta, mine, theirs, reached, settle_timeout_s, poll_s)
    finally:
        result.wall_s = time.perf_counter() - began
    return result


def _compare(result: Reconciliation, began: float, source: SourceDatabase, delta: DeltaSide, mine: TableQueries,
             theirs: TableQueries, reached: Reached, settle_timeout_s: float, poll_s: float) -> None:
    """``reconcile``'s looks, into ``result``."""
    position, source_rows, delta_rows = _look(result, began, source, mine.checksums(), delta, theirs.checksums())
    source_sums, delta_sums = _sums(source_rows), _sums(delta_rows)
    result.source_rows = sum(count for count, _ in source_sums.values())
    result.delta_rows = sum(count for count, _ in delta_sums.values())
    result.first_position = result.last_position = position
    differing = result.differing_first = differing_buckets(source_sums, delta_sums)

    previous: dict[str, KeyDifference] | None = None
    previous_source: KeyRows = {}
    while differing:
        if not _wait(reached, position, settle_timeout_s, poll_s, result):
            result.unsettled = differing
            return
        position, source_rows, delta_rows = _look(result, began, source, mine.rows_in(differing), delta,
                                                  theirs.rows_in(differing))
        result.last_position = position
        source_keys, delta_keys = key_rows(source_rows), key_rows(delta_rows)
        found = key_differences(source_keys, delta_keys)
        if previous is None:
            previous, previous_source = found, source_keys
            differing = sorted({difference.bucket for difference in found.values()})
            continue
        steady = {key: difference for key, difference in found.items()
                  if key in previous and _digest(source_keys, key) == _digest(previous_source, key)}
        result.in_flight_keys = len(found) - len(steady)
        by_bucket: dict[int, list[KeyDifference]] = {}
        for difference in steady.values():
            by_bucket.setdefault(difference.bucket, []).append(difference)
        result.drifted = [DriftedBucket(b, differences) for b, differences in sorted(by_bucket.items())]
        for drifted in result.drifted:
            drifted.differences.sort(key=lambda d: d.display)
        break


def _relation(table: str, dialect: Dialect) -> str:
    """``table`` (``schema.table``) quoted for ``dialect``."""
    return ".".join(quote(part, dialect) for part in table.split("."))


def rows_matching(source: SourceDatabase, table: str, condition: str) -> tuple[str, int]:
    """How many rows of ``table`` (``schema.table``) the SQL predicate ``condition`` selects, with the source
    position of that look."""
    position, rows = source.look(f"SELECT count(*) FROM {_relation(table, source.dialect)} WHERE {condition}")
    return position, int(rows[0][0])


def _digest(rows: KeyRows, key: str) -> str | None:
    """The md5 of ``key``'s row, None where the side has no row for it."""
    row = rows.get(key)
    return row.digest if row is not None else None


def _wait(reached: Reached, position: str, timeout_s: float, poll_s: float, result: Reconciliation) -> bool:
    """Wait until the table has applied the source up to ``position``; False if it did not in ``timeout_s``."""
    start = time.monotonic()
    try:
        while not reached(position):
            if time.monotonic() - start >= timeout_s:
                return False
            time.sleep(poll_s)
        return True
    finally:
        result.waited_s += time.monotonic() - start
