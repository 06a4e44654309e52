"""Kafka problems are reported in seconds and in one line (issue 44): librdkafka's log lines go through
Python logging, each once; an address no broker answers fails at its first request, naming the address
and the setting to fix; an unknown topic is not retried and its message names the closest topics."""

import logging
import time

import pytest

from cdc_assets.demo.broker import ApacheKafkaBroker, free_port
from cdc_assets.io.kafka import LIBRDKAFKA_LOGGER, KafkaSource, SourceError, UnknownTopicError
from tests.support.topics import new_topic, produce


def _librdkafka_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LIBRDKAFKA_LOGGER.name]


def test_an_address_no_broker_answers_fails_at_once_in_one_line(caplog, capfd):
    """A closed port: librdkafka fails to connect every ~50 ms (each failure a raw stderr line before,
    hundreds of them, and four attempts over 27 s); now one error at the first request's timeout, naming
    the address and where to set it, and librdkafka's failure logged once, nothing printed raw."""
    port = free_port()
    caplog.set_level(logging.WARNING, logger=LIBRDKAFKA_LOGGER.name)
    where = "kafka.bootstrap_servers in my-pipeline.yaml (read from MY_BROKERS)"  # PipelineConfig.where_set's
    source = KafkaSource({"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "nobody"}, retries=3,
                         backoff_s=5.0, address_source=where)
    started = time.monotonic()
    with pytest.raises(SourceError) as failure:
        source.read_batch("dbserver1.inventory.customers", None, 100, 10**9, 10)
    elapsed = time.monotonic() - started
    source.close()  # librdkafka hands its queued log lines over here at the latest
    message = str(failure.value)
    assert f"cannot reach Kafka at 127.0.0.1:{port}" in message and "\n" not in message
    assert message.endswith(f"If not this address, set it in {where}")
    assert elapsed < 5.0 + 5.0, "retried (a retry waits the 5 s backoff first)"
    lines = _librdkafka_lines(caplog)
    assert 1 <= len(lines) <= 2, lines  # the refused connection, once (was ~100 in those 5 s)
    assert all(f"127.0.0.1:{port}" in line for line in lines)
    assert [line for line in capfd.readouterr().err.splitlines() if line.startswith("%")] == []


def test_a_broker_that_answered_once_is_retried_when_it_goes_away(tmp_path):
    """Only a broker this source never reached fails at once: one that answered before is retried (a
    restart, a leader moving), then fails naming the attempts."""
    port = free_port()
    broker = ApacheKafkaBroker(tmp_path / "broker", port).start()
    try:
        topic = new_topic(broker, "gone.s.t")
        produce(broker, topic, [(b'{"id": 1}', b"x")])
        source = KafkaSource({"bootstrap.servers": broker.bootstrap_servers, "group.id": "gone"}, retries=1,
                             backoff_s=0.1)
        assert source.read_batch(topic, None, 100, 10**9, 10).records.num_rows == 1
    finally:
        broker.stop()
    try:
        with pytest.raises(SourceError, match=rf"on Kafka at 127\.0\.0\.1:{port} failed after 2 attempt\(s\)"):
            source.read_batch(topic, {0: 1}, 100, 10**9, 5)
    finally:
        source.close()


def test_an_unknown_topic_is_not_retried_and_names_the_closest_topics_of_its_prefix(broker):
    """A topic name with a typo: the error comes from the first answer (a retry would wait the 5 s
    backoff), and lists the closest existing topics of the same prefix, closest first."""
    customers = new_topic(broker, "shopdb.inventory.customers")
    prefix = customers.split(".")[0]
    new_topic(broker, "shopdb.inventory.orders")
    new_topic(broker, "otherdb.inventory.customers")
    typo = customers[:-len("s.xxxxxxxx")] + customers[-len(".xxxxxxxx"):]  # customer.<suffix>
    source = KafkaSource({"bootstrap.servers": broker.bootstrap_servers, "group.id": "typo"}, retries=3,
                         backoff_s=5.0)
    try:
        started = time.monotonic()
        with pytest.raises(UnknownTopicError) as failure:
            source.read_batch(typo, None, 100, 10**9, 10)
        assert time.monotonic() - started < 5.0, "retried"
    finally:
        source.close()
    message = str(failure.value)
    assert message.startswith(f"topic '{typo}' does not exist on {broker.bootstrap_servers}; the closest topics of "
                              f"prefix '{prefix}': {customers}")
    assert "otherdb" not in message and "\n" not in message
