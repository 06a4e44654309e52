"""Signal channels for real: the local broker's signal topic and a PostgreSQL signal table."""

import json
import uuid

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition

from cdc_assets.io.signals import (
    KafkaSignalChannel,
    SignalError,
    SnapshotSignal,
    SourceTableSignalChannel,
    data_collection,
)
from tests.conftest import new_topic


def read_topic(broker, topic):
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "signal-tests",
                         "enable.auto.commit": False})
    _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    consumer.assign([TopicPartition(topic, 0, 0)])
    messages = []
    while len(messages) < high:
        messages += [m for m in consumer.consume(100, timeout=2) if m.error() is None]
    consumer.close()
    return [(m.key().decode(), json.loads(m.value())) for m in messages]


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
