"""A ``cdc_merge_job`` run over tables with nothing new is cheap (issue 60), on real parts (a broker, Delta tables,
the local Spark server, real Dagster runs) and each writer: a table whose latest commit recorded its topic's end
costs one look at its Delta log (its newest commit) and no Spark request, its checks are not evaluated (skipped,
not failed), and it records no materialization where its latest one already records those offsets (one where
Dagster has none, or where another step of the run reads it), while a table with one new event in the same run
is merged and checked. Spark requests are counted at the Spark Connect client, Delta reads at delta-rs's
``DeltaTable``."""

from __future__ import annotations

import collections
import time
import uuid
from collections.abc import Iterator

import pytest
from dagster import (
    AssetCheckKey,
    AssetKey,
    DagsterInstance,
    MaterializeResult,
    asset,
    build_schedule_context,
    instance_for_test,
    materialize,
)
from deltalake import DeltaTable
from pyspark.sql.connect.client.core import SparkConnectClient

from cdc_assets.config import parse_config
from cdc_assets.definitions import build_definitions
from cdc_assets.demo.events import encode_key, envelope, postgres_source
from tests.support.topics import new_topic_named, produce

CONFIG = """\
kafka: {{bootstrap_servers: "{bootstrap}"}}
delta: {{root: "{root}", writer: {writer}}}
connectors:
  - name: shop
    kind: postgresql
    topic.prefix: {prefix}
    tables: [{{name: s.calm}}, {{name: s.busy}}]
merge_schedule: {{cron: "*/5 * * * *"}}
"""


def changes(table: str, first: int, count: int) -> list[tuple[bytes, bytes]]:
    """``count`` creates of keys from ``first`` in ``table``, as the PostgreSQL connector writes them."""
    now = int(time.time() * 1000)
    return [(encode_key({"id": i}), envelope("c", None, {"id": i, "v": f"{table}-{i}"},
                                             postgres_source(i, now, "s", table), now))
            for i in range(first, first + count)]


class Reads:
    """What a run asks of Spark (each request to the server, with its plan's text) and of delta-rs (each load of
    a table's log, look at its history, refresh and scan of its files), counted where they are made."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.spark: list[str] = []
        self.delta: collections.Counter[tuple[str, str]] = collections.Counter()
        for name in ("_execute", "_execute_and_fetch_as_iterator", "_analyze"):
            self._count_spark(monkeypatch, name)
        load = DeltaTable.__init__

        def loaded(table: DeltaTable, table_uri: object, *args: object, **kwargs: object) -> None:
            self.delta[(str(table_uri), "load")] += 1
            load(table, table_uri, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(DeltaTable, "__init__", loaded)
        for name in ("history", "update_incremental", "to_pyarrow_dataset", "to_pyarrow_table"):
            self._count_delta(monkeypatch, name)

    def _count_spark(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        method = getattr(SparkConnectClient, name)

        def counted(client: SparkConnectClient, *args: object, **kwargs: object) -> object:
            self.spark.append(f"{name}: {args} {kwargs}")
            return method(client, *args, **kwargs)

        monkeypatch.setattr(SparkConnectClient, name, counted)

    def _count_delta(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        method = getattr(DeltaTable, name)

        def counted(table: DeltaTable, *args: object, **kwargs: object) -> object:
            self.delta[(table.table_uri, f"{name}{args or ''}")] += 1
            return method(table, *args, **kwargs)

        monkeypatch.setattr(DeltaTable, name, counted)

    def of(self, path: str) -> dict[str, int]:
        """The Delta reads of the table at ``path``."""
        return {what: n for (uri, what), n in self.delta.items() if uri.rstrip("/").endswith(path.rstrip("/"))}

    def clear(self) -> None:
        self.spark.clear()
        self.delta.clear()


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[Reads]:
    yield Reads(monkeypatch)


def test_a_table_with_nothing_new_costs_one_look_at_its_log_and_no_spark_request(spark, broker, writer, tmp_path,
                                                                                reads):
    prefix = f"calm{uuid.uuid4().hex[:8]}"
    topics = {name: new_topic_named(broker, f"{prefix}.s.{name}", partitions=2) for name in ("calm", "busy")}
    for name, topic in topics.items():
        produce(broker, topic, changes(name, 1, 6))
    defs = build_definitions(parse_config(CONFIG.format(bootstrap=broker.bootstrap_servers, root=tmp_path,
                                                        writer=writer.name, prefix=prefix)))
    job = defs.resolve_job_def("cdc_merge_job")
    calm, busy = (AssetKey([prefix, "s", name]) for name in ("calm", "busy"))
    with instance_for_test() as instance:
        first = job.execute_in_process(instance=instance)
        merged = {m.asset_key: m.metadata for m in first.asset_materializations_for_node("shop_merge")}
        assert {key: merged[key]["events_read"].value for key in (calm, busy)} == {calm: 6, busy: 6}
        paths = {key: str(merged[key]["delta_path"].value) for key in (calm, busy)}

        # Nothing new anywhere: no Spark request at all, one load and one newest commit of each table's log, and
        # nothing recorded: each table's latest materialization (the first run's) already records those offsets.
        reads.clear()
        quiet = job.execute_in_process(instance=instance)
        assert quiet.success
        assert reads.spark == []
        assert {key: reads.of(path) for key, path in paths.items()} == {
            key: {"load": 1, "history(1,)": 1} for key in paths}
        assert quiet.get_asset_check_evaluations() == []
        assert quiet.get_asset_materialization_events() == []
        assert instance.get_latest_materialization_event(calm).run_id == first.run_id  # type: ignore[union-attr]
        # The merge schedule reads the latest materializations: it still finds every table caught up.
        tick = defs.get_schedule_def("cdc_merge_schedule").evaluate_tick(build_schedule_context(instance=instance))
        assert tick.skip_message == "all 2 tables are caught up: no new events in their topics"

        # One new event in one table: it is merged and checked; the other costs what it cost alone.
        produce(broker, topics["busy"], changes("busy", 7, 1))
        reads.clear()
        mixed = job.execute_in_process(instance=instance)
        assert mixed.success
        assert reads.of(paths[calm]) == {"load": 1, "history(1,)": 1}
        assert [request for request in reads.spark if paths[calm] in request] == []
        assert reads.spark  # the busy table's fold (and, with delta-spark, its MERGE) did ask Spark
        materialized = {m.asset_key: m.metadata for m in mixed.asset_materializations_for_node("shop_merge")}
        assert set(materialized) == {busy}
        assert materialized[busy]["events_read"].value == 1 and materialized[busy]["rows_inserted"].value == 1
        # The busy table's blocking checks are evaluated; the calm table's are not, and show as skipped (planned in a
        # run that succeeded), not failed.
        names = ("primary_key", "unavailable_values_kept")
        assert {(e.asset_key, e.check_name): e.passed for e in mixed.get_asset_check_evaluations()} == {
            (busy, name): True for name in names}
        calm_checks = [AssetCheckKey(calm, name) for name in names]
        latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(calm_checks)
        assert {key: (latest[key].run_id, latest[key].status.value) for key in calm_checks} == {
            key: (mixed.run_id, "PLANNED") for key in calm_checks}
        # The run's log names the table with nothing new, and Dagster's the checks it did not evaluate.
        messages = [entry.user_message for entry in instance.all_logs(mixed.run_id)]
        assert [m for m in messages if "had nothing new" in m] == [
            "1 of 2 tables had nothing new (their latest commits recorded their topics' end offsets), with no merge "
            "and no check evaluated; 1 not materialized again (their latest materializations record those "
            "offsets): s.calm"]
        [omitted] = [m for m in messages if "did not yield or return expected outputs" in m]
        assert "__s__calm_primary_key" in omitted and "__s__busy" not in omitted
        assert not [m for m in messages if "Emitting implicit Nothing" in m]

    # An instance with no record of the tables (a new one, or its history deleted): each is materialized once as
    # caught up, offsets where its commit left them and its column schema, still with no Spark request; the merge
    # schedule then finds it caught up instead of asking for it again at every tick.
    with instance_for_test() as fresh:
        reads.clear()
        recorded = job.execute_in_process(instance=fresh)
        assert recorded.success and reads.spark == []
        caught_up = {m.asset_key: m.metadata for m in recorded.asset_materializations_for_node("shop_merge")}
        assert set(caught_up) == {calm, busy}
        assert caught_up[calm]["events_read"].value == 0 and caught_up[calm]["caught_up"].value
        assert caught_up[calm]["batches"].value == 0
        assert {p: span["to"] for p, span in caught_up[calm]["offsets"].value.items()} == \
            {p: span["to"] for p, span in merged[calm]["offsets"].value.items()}
        assert "dagster/column_schema" in caught_up[calm]
        assert recorded.get_asset_check_evaluations() == []
        tick = defs.get_schedule_def("cdc_merge_schedule").evaluate_tick(build_schedule_context(instance=fresh))
        assert tick.skip_message == "all 2 tables are caught up: no new events in their topics"
        assert job.execute_in_process(instance=fresh).get_asset_materialization_events() == []
    rows = sorted(r["id"] for r in DeltaTable(paths[busy]).to_pyarrow_table(columns=["id"]).to_pylist())
    assert rows == list(range(1, 8))


def test_a_quiet_table_read_by_another_step_of_the_run_is_materialized(spark, broker, tmp_path):
    """A step that reads a table with nothing new still runs in the same run: Dagster skips a step whose input
    was not produced, so the table is materialized as caught up there, recorded or not."""
    prefix = f"read{uuid.uuid4().hex[:8]}"
    topics = {name: new_topic_named(broker, f"{prefix}.s.{name}") for name in ("calm", "busy")}
    for name, topic in topics.items():
        produce(broker, topic, changes(name, 1, 3))
    defs = build_definitions(parse_config(CONFIG.format(bootstrap=broker.bootstrap_servers, root=tmp_path,
                                                        writer="delta-rs", prefix=prefix)))
    calm, busy = (AssetKey([prefix, "s", name]) for name in ("calm", "busy"))

    @asset(deps=[calm, busy])
    def report() -> MaterializeResult:
        """A user's asset over both tables."""
        return MaterializeResult(metadata={"rows": len(DeltaTable(str(tmp_path / prefix / "s" / "calm"))
                                                       .to_pyarrow_table().to_pylist())})

    merge = defs.get_assets_def(calm)
    with DagsterInstance.ephemeral() as instance:
        assert defs.resolve_job_def("cdc_merge_job").execute_in_process(instance=instance).success
        produce(broker, topics["busy"], changes("busy", 4, 1))
        both = materialize([merge, report], selection=[calm, busy, report.key], resources=defs.resources,
                           instance=instance)
        assert both.success
        materialized = {event.asset_key: event.event_specific_data.materialization.metadata  # type: ignore[union-attr]
                        for event in both.get_asset_materialization_events()}
        assert set(materialized) == {calm, busy, report.key}
        assert materialized[calm]["caught_up"].value and materialized[calm]["events_read"].value == 0
        assert materialized[busy]["events_read"].value == 1
        assert materialized[report.key]["rows"].value == 3
