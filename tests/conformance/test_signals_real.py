"""Debezium 3.6's PostgreSQL connector acting on the signals the project's jobs send: pause_snapshot_job
pauses a running incremental snapshot, resume_snapshot_job resumes it (it then completes), and
incremental_snapshot_job with snapshot_type blocking runs a blocking snapshot; the connector's own
notifications (sink channel) say so."""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import psycopg
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support import harness as h

DSN_ENV = "CDC_SIGNALS_REAL_DSN"
INCREMENTAL, INITIAL = "Incremental Snapshot", "Initial Snapshot"


def _notifications(runner: h.DebeziumRunner, topic: str, aggregate: str, kind: str) -> list[dict[str, Any]]:
    sent = runner.status().get("notifications", {}).get(topic, [])
    return [n for n in sent if n.get("aggregate_type") == aggregate and n.get("type") == kind]


def _next(runner: h.DebeziumRunner, topic: str, aggregate: str, kind: str, seen: int, what: str,
          timeout_s: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        found = _notifications(runner, topic, aggregate, kind)
        if len(found) > seen:
            return found[seen]
        runner.check_alive(what)
        if time.monotonic() > deadline:
            raise AssertionError(f"the connector did not act on {what} in {timeout_s}s: {runner.status()}\n"
                                 f"{runner.log_tail()}")
        time.sleep(0.2)


def test_the_connector_pauses_resumes_and_runs_a_blocking_snapshot_on_the_projects_jobs(broker, postgres,
                                                                                       tmp_path):
    run_id = uuid.uuid4().hex[:6]
    prefix = f"sg{run_id}"
    dsn = postgres.create_database(f"signals_{run_id}")
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute("CREATE TABLE debezium_signal (id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL, "
                           "data varchar(2048)); CREATE TABLE cdc_marker (id int PRIMARY KEY); "
                           "CREATE TABLE big (id int PRIMARY KEY, v text)")
        # Large enough (1,250 chunks of 16) for an incremental snapshot to be paused before it ends.
        connection.execute("INSERT INTO big SELECT g, 'row ' || g FROM generate_series(1, 20000) g")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.create_topics([NewTopic(f"{prefix}.signals", num_partitions=1, replication_factor=1)])[
        f"{prefix}.signals"].result()
    notifications = f"{prefix}.notifications"
    properties = h.connector_properties(
        "sig", prefix, h.parse_dsn(dsn), ["public.big", "public.debezium_signal", "public.cdc_marker"], tmp_path,
        **{"snapshot.mode": "no_data", "signal.enabled.channels": "source,kafka",
           "signal.data.collection": "public.debezium_signal", "incremental.snapshot.chunk.size": "16",
           "signal.poll.interval.ms": "200", "notification.enabled.channels": "sink",
           "notification.sink.topic.name": notifications, "signal.kafka.topic": f"{prefix}.signals",
           "signal.kafka.bootstrap.servers": broker.bootstrap_servers, "signal.kafka.groupId": f"signals-{run_id}"})
    runner = h.DebeziumRunner(broker.bootstrap_servers, [properties], tmp_path)
    os.environ[DSN_ENV] = dsn
    config = f"""\
kafka: {{bootstrap_servers: "{broker.bootstrap_servers}"}}
delta: {{root: "{tmp_path / 'delta'}"}}
connectors:
  - name: sig
    kind: postgresql
    topic.prefix: {prefix}
    signal: {{channel: kafka, topic: "{prefix}.signals", table: public.debezium_signal, dsn_env: {DSN_ENV},
              debezium_version: "3.6"}}
    tables: [{{name: public.big}}]
"""

    def job(name: str, op: str, **settings: Any) -> None:
        run = h.run_job(config, name, {"ops": {op: {"config": {"connector": "sig", **settings}}}})
        assert run.success, h.failures(run)

    runner.start()
    try:
        with psycopg.connect(dsn, autocommit=True) as connection:  # streaming once a marker row comes through
            deadline, marker = time.monotonic() + 180, 0
            while True:
                marker += 1
                connection.execute("INSERT INTO cdc_marker VALUES (%s)", [marker])
                try:
                    runner.wait_for_marker(1, timeout_s=3)
                    break
                except AssertionError:
                    if time.monotonic() > deadline:
                        raise
        started = len(_notifications(runner, notifications, INCREMENTAL, "STARTED"))
        job("incremental_snapshot_job", "send_execute_snapshot", tables=["public.big"])
        _next(runner, notifications, INCREMENTAL, "STARTED", started, "execute-snapshot")
        job("pause_snapshot_job", "send_pause_snapshot")
        paused = _next(runner, notifications, INCREMENTAL, "PAUSED", 0, "pause-snapshot")
        # The resumed snapshot reads on from where it paused to the key it ended at; with the rows past the first
        # hundred gone its next chunk is empty and it completes at once, instead of reading 1,250 chunks of 16.
        with psycopg.connect(dsn, autocommit=True) as connection:
            connection.execute("DELETE FROM big WHERE id > 100")
        job("resume_snapshot_job", "send_resume_snapshot", channel="source")
        resumed = _next(runner, notifications, INCREMENTAL, "RESUMED", 0, "resume-snapshot")
        _next(runner, notifications, INCREMENTAL, "COMPLETED", 0, "the resumed snapshot")
        blocking_before = len(_notifications(runner, notifications, INITIAL, "COMPLETED"))
        job("incremental_snapshot_job", "send_execute_snapshot", tables=["public.big"], snapshot_type="blocking")
        blocking = _next(runner, notifications, INITIAL, "COMPLETED", blocking_before, "a blocking snapshot")
        assert float(paused["timestamp"]) <= float(resumed["timestamp"]) <= float(blocking["timestamp"])
    finally:
        runner.stop()
        os.environ.pop(DSN_ENV, None)
