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

POSTGRES_DSN = "host=127.0.0.1 port=5432 dbname=test user=postgres connect_timeout=5"


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


def test_kafka_channel_sends_the_seed_format(broker):
    topic = new_topic(broker, "dbserver1.signals")
    channel = KafkaSignalChannel({"bootstrap.servers": broker.bootstrap_servers}, topic, "dbserver1")
    channel.send(SnapshotSignal("s1", "execute-snapshot", ("schema1.products",),
                                additional_condition="color='blue'"))
    channel.send(SnapshotSignal("s2", "stop-snapshot", ("schema1.products",)))
    assert read_topic(broker, topic) == [
        ("dbserver1", {"type": "execute-snapshot", "data": {"data-collections": ["schema1.products"],
                                                            "type": "incremental",
                                                            "additional-condition": "color='blue'"}}),
        ("dbserver1", {"type": "stop-snapshot", "data": {"data-collections": ["schema1.products"],
                                                         "type": "incremental"}}),
    ]


@pytest.mark.parametrize(("signal", "message"), [
    (SnapshotSignal("x", "execute-snapshot", ()), "execute-snapshot needs at least one data collection"),
    (SnapshotSignal("x", "execute-snapshot", ("inventory.(orders",)), "is not a valid regex"),
    (SnapshotSignal("x", "stop-snapshot", ("a.b",), snapshot_type=None), "stop-snapshot needs a snapshot type"),
    (SnapshotSignal("x", "execute-snapshot", ("a.b",), snapshot_type="blocking"), "is not supported"),
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
def signal_table():
    name = f"signal_{uuid.uuid4().hex[:8]}"
    try:
        connection = psycopg.connect(POSTGRES_DSN, autocommit=True)
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL at 127.0.0.1:5432 is needed for the signal-table tests: {exc}")
    connection.execute(f'CREATE SCHEMA IF NOT EXISTS debezium; CREATE TABLE debezium."{name}" '
                       "(id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048))")
    yield f"debezium.{name}", connection
    connection.execute(f'DROP TABLE debezium."{name}"')
    connection.close()


def test_source_table_channel_inserts_a_row(signal_table):
    table, connection = signal_table
    SourceTableSignalChannel(POSTGRES_DSN, table).send(
        SnapshotSignal("run-1-0", "execute-snapshot", ('"public"."My.Table"',), surrogate_key="pk2"))
    rows = connection.execute(f"SELECT id, type, data FROM {table}").fetchall()
    assert [(i, t, json.loads(d)) for i, t, d in rows] == [
        ("run-1-0", "execute-snapshot", {"data-collections": ['"public"."My.Table"'], "type": "incremental",
                                         "surrogate-key": "pk2"})]


def test_injection_in_the_signal_table_name_is_refused(signal_table):
    table, connection = signal_table
    for bad in [f"{table}; DROP TABLE {table}", 'debezium."x"', "a.b.c", "", "sig nal"]:
        with pytest.raises(SignalError, match="is not a plain"):
            SourceTableSignalChannel(POSTGRES_DSN, bad)
    assert connection.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)


def test_a_condition_with_quotes_is_sent_as_data_not_sql(signal_table):
    table, connection = signal_table
    condition = "color = 'blue'); DROP TABLE x; --"
    SourceTableSignalChannel(POSTGRES_DSN, table).send(
        SnapshotSignal("run-2-0", "execute-snapshot", ("inventory.products",), additional_condition=condition))
    (data,) = connection.execute(f"SELECT data FROM {table}").fetchone()
    assert json.loads(data)["additional-condition"] == condition
