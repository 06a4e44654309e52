"""drift_repair_sensor end to end on a real database captured by real Debezium, whatever the database: the flow
``tests/conformance/test_drift_repair_real.py`` (PostgreSQL, embedded engine) and
``test_mariadb_drift_repair_real.py`` (MariaDB, Kafka Connect) share. The test owns the database, the connector
and the pipeline's definitions (connector ``shop``, one table ``items`` of ``ROWS`` rows: ``id`` int key, ``v``
text, ``n`` decimal); ``DriftRepair`` runs the jobs and ticks the sensor on one Dagster instance and asserts:

1. ``heal``: rows deleted from and changed in the Delta table behind the pipeline's back fail the check naming
   them; the sensor requests one incremental snapshot whose additional condition selects exactly those keys in
   the real database; once its reads are merged the re-check passes, the history reads [True, False, True] and
   the connector read the drifted rows alone.
2. ``names_changes_made_while_away``: after ``AWAY_CHANGES`` were made while the connector was away and it came
   back with new offsets and ``snapshot.mode: no_data`` (the test's redeployment), the check names those keys.
3. ``fails_at_once_on_events_lost_to_retention``: a change's event deleted from the topic before it was merged
   halts the merge and fails the check at once with ``lost_to_retention``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from dagster import (
    AssetCheckKey,
    AssetCheckSeverity,
    AssetKey,
    DagsterInstance,
    Definitions,
    RunRequest,
    build_sensor_context,
)
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from deltalake import DeltaTable

from cdc_assets.config import parse_config
from cdc_assets.definitions import build_definitions
from sensors.drift_repair import REPAIR_TAG, STEP_TAG
from tests.support import harness as h

ROWS = 300  # the table's rows before the test changes any: ids 1..ROWS
# Written while the connector is away, in either database's SQL: 1 key missing from Delta, 2 with other values.
AWAY_CHANGES = ("UPDATE items SET v = 'changed while away' WHERE id IN (60, 61)",
                "INSERT INTO items VALUES (301, 'inserted while away', 1)")


def flow_definitions(bootstrap_servers: str, root: Path, kind: str, prefix: str, table: str, signal: str,
                     check: str = "") -> Definitions:
    """The pipeline the flow runs: connector ``shop`` of ``kind`` with its one ``table`` at ``root/items`` (the
    flow's ``path``) and rows_match_source over 16 buckets; ``signal``: the connector's signal channel and
    ``check``: more rows_match_source settings, in the config's YAML."""
    return build_definitions(parse_config(f"""\
kafka: {{bootstrap_servers: "{bootstrap_servers}"}}
delta: {{root: "{root}", writer: delta-rs}}
freshness_schedule: {{running: false}}
connectors:
  - name: shop
    kind: {kind}
    topic.prefix: {prefix}
    signal: {signal}
    tables: [{{name: {table}, path: "{root / 'items'}"}}]
    rows_match_source: {{buckets: 16, settle_timeout_s: 120{check}}}
"""), topics=[f"{prefix}.{table}"])


class SourceSQL(Protocol):
    """The captured database, through an account that may write its tables (``items``, ``debezium_signal``)."""

    def execute(self, sql: str) -> None:
        """Run one statement (autocommit)."""

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        """A query's rows."""


@dataclass
class DriftRepair:
    """The flow on one Dagster instance; ``defs`` and ``log_tail`` may be replaced when the connector is
    redeployed (a Connect connector under a new name is read by other definitions)."""

    bootstrap_servers: str
    defs: Definitions
    instance: DagsterInstance
    source: SourceSQL
    source_table: str  # as the pipeline's config names it: ``public.items``, ``<database>.items``
    prefix: str  # the connector's topic prefix
    path: Path  # the table's Delta table
    log_tail: Callable[[], str]  # the connector's log, for a failure's message

    @property
    def topic(self) -> str:
        """The table's topic."""
        return f"{self.prefix}.{self.source_table}"

    @property
    def check(self) -> AssetCheckKey:
        """The table's rows_match_source check."""
        return AssetCheckKey(AssetKey([self.prefix, *self.source_table.split(".")]), "rows_match_source")

    def run(self, job: str | None, tags: Mapping[str, str] | None = None, run_config: dict | None = None,
            checks: list[AssetCheckKey] | None = None) -> Any:
        """One successful run of ``job`` on the instance; ``checks``: those checks alone."""
        assert job is not None
        definition = self.defs.resolve_job_def(job)
        if checks is not None:  # the subset the daemon launches for a request naming checks alone
            definition = definition.get_subset(asset_selection=set(), asset_check_selection=set(checks))
        result = definition.execute_in_process(instance=self.instance, tags=dict(tags or {}), run_config=run_config,
                                               raise_on_error=False)
        assert result.success, h.failures(result)
        return result

    def check_run(self) -> Any:
        """The evaluation of one run of the connector's rows_match_source job."""
        return evaluation(self.run("shop_rows_match_source_job"))

    def tick(self, cursor: str | None) -> Any:
        """One evaluation of drift_repair_sensor from ``cursor``."""
        sensor = self.defs.resolve_sensor_def("drift_repair_sensor")
        return sensor.evaluate_tick(build_sensor_context(instance=self.instance, cursor=cursor, definitions=self.defs))

    def heal(self) -> str:
        """Once the initial snapshot's ``ROWS`` events are in the topic: drift made in Delta, found, repaired
        with a targeted snapshot, and passed again (module docstring, 1). Returns the sensor's cursor."""
        deadline = time.monotonic() + 180
        while sum(h.end_offsets(self.bootstrap_servers, self.topic).values()) < ROWS:  # the initial snapshot
            assert time.monotonic() < deadline, self.log_tail()
            time.sleep(0.5)
        self.run("cdc_merge_job")
        assert len(DeltaTable(str(self.path)).to_pyarrow_table()) == ROWS
        passed = self.check_run()
        assert passed.passed, passed.description

        table = DeltaTable(str(self.path))  # behind the pipeline's back
        table.delete("id IN (5, 250)")
        table.update(updates={"v": "'wrong'"}, predicate="id = 17")
        failed = self.check_run()
        assert not failed.passed, failed.description
        ranges = failed.metadata["drifted_ranges"].value
        assert len(ranges["keys"]) == 3 and ranges["extra_keys"] == 0

        first = self.tick(None)
        [request] = first.run_requests
        assert request.job_name == "incremental_snapshot_job" and request.tags[STEP_TAG] == "snapshot"
        [condition] = request.run_config["ops"]["send_execute_snapshot"]["config"]["additional_conditions"]
        assert condition["table"] == self.source_table
        # The WHERE selects exactly the drifted keys.
        selected = self.source.rows(f"SELECT id FROM {self.source_table} WHERE {condition['filter']}")
        assert sorted(row[0] for row in selected) == [5, 17, 250]
        assert [o.metadata["drift_repair"].value for o in first.asset_events] == ["snapshot requested"]
        again = self.tick(first.cursor)
        assert again.run_requests == [] and again.asset_events == []  # idempotent: nothing twice
        assert self.tick(None).run_requests[0].run_key == request.run_key  # a lost cursor: the same run key

        self.run(request.job_name, request.tags, request.run_config)
        [(data,)] = self.source.rows("SELECT data FROM debezium_signal WHERE type = 'execute-snapshot'")
        assert json.loads(data)["additional-conditions"][0]["filter"] == condition["filter"]

        cursor, recheck = again.cursor, None
        deadline = time.monotonic() + 300
        while recheck is None:
            assert time.monotonic() < deadline, f"no re-check requested: {cursor}\n{self.log_tail()}"
            self.run("cdc_merge_job")
            step = self.tick(cursor)
            cursor = step.cursor
            recheck = next(iter(step.run_requests), None)
            time.sleep(1)
        assert isinstance(recheck, RunRequest) and recheck.asset_check_keys == [self.check]
        assert recheck.tags[REPAIR_TAG] == request.tags[REPAIR_TAG] and recheck.tags[STEP_TAG] == "recheck"
        [done] = step.asset_events
        assert done.metadata["drift_repair"].value == "snapshot done"
        assert done.metadata["snapshot_reads_merged"].value == done.metadata["source_rows_selected"].value == 3

        healed = evaluation(self.run(recheck.job_name, recheck.tags, checks=list(recheck.asset_check_keys or [])))
        assert healed.passed, healed.description
        assert self.tick(cursor).run_requests == []  # a passed evaluation: nothing more

        # The connector read the drifted rows alone.
        reads = {r.key["id"] for r in h.read_topic(self.bootstrap_servers, self.topic)
                 if r.value is not None and r.value["source"]["snapshot"] == "incremental"}
        assert reads == {5, 17, 250}
        history = [evaluation.passed for evaluation in check_history(self.instance, self.check)]
        assert history == [True, False, True]
        assert cursor is not None
        return cursor

    def change_while_away(self) -> None:
        """``AWAY_CHANGES``, made while the connector is away."""
        for statement in AWAY_CHANGES:
            self.source.execute(statement)

    def names_changes_made_while_away(self) -> None:
        """Drift no event shows (module docstring, 2): the connector, redeployed with new offsets and
        ``snapshot.mode: no_data``, streams again; the merge has nothing to apply; the check names exactly the keys
        ``AWAY_CHANGES`` changed."""
        self.run("cdc_merge_job")
        lost = self.check_run()
        assert not lost.passed and lost.severity == AssetCheckSeverity.ERROR, lost.description
        ranges = lost.metadata["drifted_ranges"].value
        assert len(ranges["keys"]) == 3 and ranges["extra_keys"] == 0, ranges
        assert "(1 key(s) missing, 0 extra, 2 with different values)" in (lost.description or ""), lost.description

    def fails_at_once_on_events_lost_to_retention(self, cursor: str) -> None:
        """Events deleted before they were merged, as retention deletes them (module docstring, 3): the partition's
        earliest retained offset moved past the table's committed one. The merge halts naming where; the check
        fails at once (no wait for a table that cannot catch up) naming the same offsets, and, nothing of the
        table being left in its topic, the keys that differ: key 90's lost change among them."""
        since = h.end_offsets(self.bootstrap_servers, self.topic)
        self.source.execute("UPDATE items SET v = 'lost to retention' WHERE id = 90")
        h.wait_for_growth(self.bootstrap_servers, self.topic, since)
        ends = h.end_offsets(self.bootstrap_servers, self.topic)
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        for deleted in admin.delete_records([TopicPartition(self.topic, p, end) for p, end in ends.items()]
                                            ).values():
            deleted.result()
        [gap] = [f"{self.topic}[{p}]: committed offset {since[p]} is below the earliest retained offset {end}"
                 for p, end in sorted(ends.items()) if end > since[p]]  # the partition of key 90's event
        halted = self.defs.resolve_job_def("cdc_merge_job").execute_in_process(instance=self.instance,
                                                                               raise_on_error=False)
        assert not halted.success and any(gap in failure for failure in h.failures(halted)), h.failures(halted)
        retained = self.check_run()
        assert not retained.passed and retained.severity == AssetCheckSeverity.ERROR, retained.description
        assert "deleted by retention before they were merged" in (retained.description or "")
        assert [gap in entry for entry in retained.metadata["lost_to_retention"].value] == [True]
        assert retained.metadata["waited_s"].value < 5, retained.metadata["waited_s"]
        named = [key for bucket in retained.metadata["drifted_buckets"].value for key in bucket["sample_keys"]]
        if named:  # the look found the connector confirmed past the source's position: the keys settle at once
            assert sorted(named) == ["different: 60", "different: 61", "different: 90", "missing: 301"], named
        else:  # it had not confirmed it yet (the suite's load): counted, never named wrongly
            assert "cannot be named" in (retained.description or ""), retained.description
        assert "drifted_ranges" not in retained.metadata  # a snapshot's reads would wait behind the gap
        assert self.tick(cursor).run_requests == []


def evaluation(result: Any) -> Any:
    """The rows_match_source evaluation of a run."""
    [found] = [e for e in result.get_asset_check_evaluations() if e.check_name == "rows_match_source"]
    return found


def check_history(instance: DagsterInstance, check: AssetCheckKey) -> list[Any]:
    """The check's evaluations, oldest first."""
    records = instance.event_log_storage.get_asset_check_execution_history(
        check, limit=100, status={AssetCheckExecutionRecordStatus.SUCCEEDED, AssetCheckExecutionRecordStatus.FAILED})
    return [r.event.dagster_event.event_specific_data for r in reversed(records)
            if r.event is not None and r.event.dagster_event is not None]
