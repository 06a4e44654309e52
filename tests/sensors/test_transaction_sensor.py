"""The transaction sensor on a transaction topic with several partitions."""

import json

import pytest
from dagster import DagsterInstance, build_sensor_context

from tests.support.topics import produce
from tests.support.transactions import transaction_sensor, tx_event


def test_a_malformed_event_stops_only_its_partition(broker, tmp_path):
    defs, sensor, tx_topic = transaction_sensor(broker, tmp_path, partitions=2)
    produce(broker, tx_topic, [tx_event("BEGIN", "1:10"), (b'{"id": "bad"}', b"not json"),
                               tx_event("BEGIN", "2:20"), tx_event("END", "2:20", {"s.a": 1})], partition=0)
    produce(broker, tx_topic, [tx_event("BEGIN", "3:30"), tx_event("END", "3:30", {"s.b": 1}),
                               tx_event("BEGIN", "4:40"), tx_event("END", "4:40", {"s.c": 2})], partition=1)
    with DagsterInstance.ephemeral() as instance:
        first = sensor.evaluate_tick(build_sensor_context(instance=instance, definitions=defs))
        # Partition 0 stops before its malformed event; partition 1 is read to its end, its ENDs acted on.
        [request] = first.run_requests
        assert sorted(k.path[-1] for k in request.asset_selection) == ["b", "c"]
        assert request.run_key == f"transactions:{tx_topic}:1:1-3"
        cursor = json.loads(first.cursor)
        assert cursor == {"offsets": {"0": 1, "1": 4}}
        # The next tick stops at the same event again, requests nothing twice and names the event.
        with pytest.raises(Exception, match=rf"{tx_topic} partition 0 offset 1: "):
            sensor.evaluate_tick(build_sensor_context(instance=instance, cursor=first.cursor, definitions=defs))


def test_transactions_completed_on_every_partition_make_one_run(broker, tmp_path):
    defs, sensor, tx_topic = transaction_sensor(broker, tmp_path, partitions=3)
    for partition, table in enumerate(("a", "b", "c")):
        tx_id = f"{partition + 1}:{partition + 10}"
        produce(broker, tx_topic, [tx_event("BEGIN", tx_id), tx_event("END", tx_id, {f"s.{table}": 1})],
                partition=partition)
    with DagsterInstance.ephemeral() as instance:
        tick = sensor.evaluate_tick(build_sensor_context(instance=instance, definitions=defs))
        [request] = tick.run_requests
        assert sorted(k.path[-1] for k in request.asset_selection) == ["a", "b", "c"]
        assert request.run_key == f"transactions:{tx_topic}:0:1-1,1:1-1,2:1-1"
        assert json.loads(tick.cursor) == {"offsets": {"0": 2, "1": 2, "2": 2}}
