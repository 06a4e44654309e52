"""Signal channels for real: the local broker's signal topic and a PostgreSQL or MariaDB signal table."""

import json
import uuid

import psycopg
import pytest

from cdc_assets.io.signals import (
    KafkaSignalChannel,
    SignalError,
    SnapshotSignal,
    SourceTableSignalChannel,
    data_collection,
)
from tests.support.topics import new_topic, read_topic


def test_kafka_channel_sends_debezium_3s_signal_formats(broker):
    topic = new_topic(broker, "dbserver1.signals")
    channel = KafkaSignalChannel({"bootstrap.servers": broker.bootstrap_servers}, topic, "dbserver1")
    channel.send(SnapshotSignal("s1", "execute-snapshot", ("schema1.products",),
                                additional_conditions=(("schema1.products", "color='blue'"),)))
    channel.send(SnapshotSignal("s2", "execute-snapshot", ("schema1.orders",), snapshot_type="blocking"))
    channel.send(SnapshotSignal("s3", "pause-snapshot"))
    channel.send(SnapshotSignal("s4", "resume-snapshot"))
    channel.send(SnapshotSignal("s5", "stop-snapshot", ("schema1.products",)))
    assert read_topic(broker, topic) == [
        ("dbserver1", {"type": "execute-snapshot", "data": {
            "data-collections": ["schema1.products"], "type": "incremental",
            "additional-conditions": [{"data-collection": "schema1.products", "filter": "color='blue'"}]}}),
        ("dbserver1", {"type": "execute-snapshot", "data": {"data-collections": ["schema1.orders"],
                                                            "type": "blocking"}}),
        ("dbserver1", {"type": "pause-snapshot", "data": {"type": "incremental"}}),
        ("dbserver1", {"type": "resume-snapshot", "data": {"type": "incremental"}}),
        ("dbserver1", {"type": "stop-snapshot", "data": {"data-collections": ["schema1.products"],
                                                         "type": "incremental"}}),
    ]


def test_a_connector_before_2_4_gets_the_single_additional_condition():
    signal = SnapshotSignal("s1", "execute-snapshot", ("s.a", "s.b"), debezium_version="2.3.4.Final",
                            additional_conditions=(("s.a", "x > 1"), ("s.b", "x > 1")))
    signal.validate()
    assert signal.data() == {"data-collections": ["s.a", "s.b"], "type": "incremental", "additional-condition": "x > 1"}


@pytest.mark.parametrize(("signal", "message"), [
    (SnapshotSignal("x", "execute-snapshot", ()), "execute-snapshot needs at least one data collection"),
    (SnapshotSignal("x", "execute-snapshot", ("inventory.(orders",)), "is not a valid regex"),
    (SnapshotSignal("x", "stop-snapshot", ("a.b",), snapshot_type=None), "stop-snapshot needs a snapshot type"),
    (SnapshotSignal("x", "execute-snapshot", ("a.b",), snapshot_type="full"), "is not supported"),  # type: ignore[arg-type]
    (SnapshotSignal("x", "stop-snapshot", ("a.b",), snapshot_type="blocking"), "incremental snapshots only"),
    (SnapshotSignal("x", "pause-snapshot", ("a.b",)), "takes no tables"),
    (SnapshotSignal("x", "resume-snapshot", debezium_version="1.9"), "resume-snapshot needs Debezium 2.0 or later"),
    (SnapshotSignal("x", "execute-snapshot", ("a.b",), snapshot_type="blocking", debezium_version="2.3"),
     "a blocking snapshot needs Debezium 2.4 or later"),
    (SnapshotSignal("x", "execute-snapshot", ("a.b", "a.c"), additional_conditions=(("a.b", "x"), ("a.c", "y")),
                    debezium_version="2.3"), "a filter per data collection needs Debezium 2.4 or later"),
    (SnapshotSignal("x", "stop-snapshot", ("a.b",), additional_conditions=(("a.b", "x"),)),
     "go with execute-snapshot only"),
    (SnapshotSignal("x", "execute-snapshot", ("a.b",), debezium_version="three"), "is not of the form MAJOR.MINOR"),
])
def test_invalid_signals_are_refused_and_nothing_is_sent(broker, signal, message):
    topic = new_topic(broker, "dbserver1.signals")
    channel = KafkaSignalChannel({"bootstrap.servers": broker.bootstrap_servers}, topic, "dbserver1")
    with pytest.raises(SignalError, match=message):
        channel.send(signal)
    assert read_topic(broker, topic) == []


def test_names_with_dots_are_quoted():
    assert data_collection("public", "My.Table") == '"public"."My.Table"'
    assert data_collection("inventory", "orders") == "inventory.orders"


@pytest.fixture
def dsn(postgres):
    return postgres.dsn()


@pytest.fixture
def signal_table(dsn):
    name = f"signal_{uuid.uuid4().hex[:8]}"
    connection = psycopg.connect(dsn, autocommit=True)
    connection.execute(f'CREATE SCHEMA IF NOT EXISTS debezium; CREATE TABLE debezium."{name}" '
                       "(id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048))")
    yield f"debezium.{name}", connection
    connection.execute(f'DROP TABLE debezium."{name}"')
    connection.close()


def test_source_table_channel_inserts_a_row(signal_table, dsn):
    table, connection = signal_table
    SourceTableSignalChannel(dsn, table).send(
        SnapshotSignal("run-1-0", "execute-snapshot", ('"public"."My.Table"',), surrogate_key="pk2"))
    rows = connection.execute(f"SELECT id, type, data FROM {table}").fetchall()
    assert [(i, t, json.loads(d)) for i, t, d in rows] == [
        ("run-1-0", "execute-snapshot", {"data-collections": ['"public"."My.Table"'], "type": "incremental",
                                         "surrogate-key": "pk2"})]


def test_injection_in_the_signal_table_name_is_refused(signal_table, dsn):
    table, connection = signal_table
    for bad in [f"{table}; DROP TABLE {table}", 'debezium."x"', "a.b.c", "", "sig nal"]:
        with pytest.raises(SignalError, match="is not a plain"):
            SourceTableSignalChannel(dsn, bad)
    assert connection.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)


def test_a_condition_with_quotes_is_sent_as_data_not_sql(signal_table, dsn):
    table, connection = signal_table
    condition = "color = 'blue'); DROP TABLE x; --"
    SourceTableSignalChannel(dsn, table).send(
        SnapshotSignal("run-2-0", "execute-snapshot", ("inventory.products",),
                       additional_conditions=(("inventory.products", condition),)))
    (data,) = connection.execute(f"SELECT data FROM {table}").fetchone()
    assert json.loads(data)["additional-conditions"] == [{"data-collection": "inventory.products",
                                                          "filter": condition}]


@pytest.fixture
def maria_signal_table(mariadb):
    """A MariaDB database with a signal table as Debezium's MySQL-family connectors document it."""
    database = f"signals_{uuid.uuid4().hex[:8]}"
    mariadb.execute(f"CREATE DATABASE {database}")
    mariadb.execute("CREATE TABLE debezium_signal (id VARCHAR(64) PRIMARY KEY, type VARCHAR(32) NOT NULL, "
                    "data VARCHAR(2048))", database)
    yield database
    mariadb.execute(f"DROP DATABASE {database}")


def maria_dsn(mariadb, scheme, database=""):
    return f"{scheme}://{mariadb.admin_user}:{mariadb.admin_password}@{mariadb.host}:{mariadb.port}/{database}"


@pytest.mark.parametrize("scheme", ["mariadb", "mysql"])
def test_source_table_channel_inserts_a_row_into_a_mariadb_signal_table(mariadb, maria_signal_table, scheme):
    # The table named database.table, and the table alone in the DSN's database.
    condition = "color = 'blue'); DROP TABLE x; --"
    SourceTableSignalChannel(maria_dsn(mariadb, scheme), f"{maria_signal_table}.debezium_signal").send(
        SnapshotSignal("run-3-0", "execute-snapshot", (f"{maria_signal_table}.orders",),
                       additional_conditions=((f"{maria_signal_table}.orders", condition),)))
    SourceTableSignalChannel(maria_dsn(mariadb, scheme, maria_signal_table), "debezium_signal").send(
        SnapshotSignal("run-3-1", "pause-snapshot"))
    rows = mariadb.query("SELECT id, type, data FROM debezium_signal ORDER BY id", maria_signal_table)
    assert [(r["id"], r["type"], json.loads(r["data"])) for r in rows] == [
        ("run-3-0", "execute-snapshot", {
            "data-collections": [f"{maria_signal_table}.orders"], "type": "incremental",
            "additional-conditions": [{"data-collection": f"{maria_signal_table}.orders", "filter": condition}]}),
        ("run-3-1", "pause-snapshot", {"type": "incremental"})]


def test_a_mariadb_signal_that_cannot_be_inserted_is_an_error_naming_the_table(mariadb, maria_signal_table):
    for table, message in [(f"{maria_signal_table}.no_such_table", "doesn't exist"),
                           ("debezium_signal", "No database selected")]:
        with pytest.raises(SignalError, match=rf"signal run-4-0: cannot insert into signal table '{table}': .*"
                                              rf"{message}"):
            SourceTableSignalChannel(maria_dsn(mariadb, "mariadb"), table).send(
                SnapshotSignal("run-4-0", "execute-snapshot", ("a.b",)))
    with pytest.raises(SignalError, match="Access denied"):
        SourceTableSignalChannel(maria_dsn(mariadb, "mariadb").replace(mariadb.admin_password, "wrong"),
                                 f"{maria_signal_table}.debezium_signal").send(
            SnapshotSignal("run-4-1", "execute-snapshot", ("a.b",)))
    with pytest.raises(SignalError, match="is not a plain"):
        SourceTableSignalChannel(maria_dsn(mariadb, "mariadb"), f"{maria_signal_table}.`x`; DROP TABLE y")
    assert mariadb.query("SELECT count(*) AS n FROM debezium_signal", maria_signal_table) == [{"n": 0}]


@pytest.mark.parametrize(("dsn", "message"), [
    ("mysql://host-only:3306/db", "needs a user and a host"),
    ("mariadb://u:p@h:port/db", "invalid port"),
    ("mariadb://u:p@h:3306/db?ssl=true", "takes no options"),
])
def test_a_malformed_mysql_dsn_is_refused_without_its_password(dsn, message):
    with pytest.raises(SignalError, match=message) as raised:
        SourceTableSignalChannel(dsn, "db.debezium_signal")
    assert ":p@" not in str(raised.value)


@pytest.mark.parametrize("dsn", ["pgsql://dbz:s3cret-pw@127.0.0.1:5432/db", "mysqlx://dbz:s3cret-pw@127.0.0.1/db"])
def test_a_signal_dsn_error_never_shows_the_password(dsn):
    """libpq puts a DSN it cannot parse in its message: the error names the setting, not the secret."""
    with pytest.raises(SignalError, match="cannot insert into signal table") as raised:
        SourceTableSignalChannel(dsn, "debezium_signal").send(SnapshotSignal("run-4-0", "pause-snapshot"))
    assert "s3cret-pw" not in str(raised.value)
