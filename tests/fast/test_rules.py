"""Pure rules, no Spark, broker or database: signal validation and payloads, the freshness verdict,
schema-change parsing and schema diffs, the translator's names."""

import json
from datetime import datetime, timedelta, timezone

import pytest
from pyspark.sql import types as T

from cdc_assets.catalog import AssetSettings, CapturedTable
from cdc_assets.core.schema_change import SchemaChangeError, diff_schema, parse_schema_change, table_name_from_id
from cdc_assets.io.delta import DeltaTarget
from cdc_assets.io.freshness import TableFreshness, freshness_verdict
from cdc_assets.io.signals import SignalError, SnapshotSignal, parse_version
from cdc_assets.translator import CdcTranslator
from tests.support.schema_changes import COLUMNS, schema_change

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize(("version", "expected"), [("3.6", (3, 6)), ("2.3.4.Final", (2, 3)), (" 10.0 ", (10, 0))])
def test_versions_parse_to_major_minor(version, expected):
    assert parse_version(version) == expected


def test_additional_conditions_take_the_form_the_version_reads():
    conditions = (("s.a", "x > 1"),)
    new = SnapshotSignal("i", "execute-snapshot", ("s.a",), additional_conditions=conditions, debezium_version="2.4")
    old = SnapshotSignal("i", "execute-snapshot", ("s.a",), additional_conditions=conditions, debezium_version="2.3")
    assert new.data()["additional-conditions"] == [{"data-collection": "s.a", "filter": "x > 1"}]
    assert old.data()["additional-condition"] == "x > 1" and "additional-conditions" not in old.data()


@pytest.mark.parametrize(("signal", "message"), [
    (SnapshotSignal("x", "execute-snapshot", ("a.b",), additional_conditions=(("a.b", " "),)), "is empty"),
    (SnapshotSignal("", "pause-snapshot"), "needs an id"),
    (SnapshotSignal("x", "stop-snapshot", debezium_version="1.9"), "stop-snapshot needs Debezium 2.0"),
])
def test_signal_rules_refuse_with_a_reason(signal, message):
    with pytest.raises(SignalError, match=message):
        signal.validate()


def freshness(waiting, waited_s=0.0):
    since = NOW - timedelta(seconds=waited_s) if waiting else None
    return TableFreshness("p.s.t", waiting, since, None, NOW)


@pytest.mark.parametrize(("state", "heartbeat_age_s", "passed", "reason"), [
    (freshness(0), None, True, "caught up"),
    (freshness(5, 10), None, True, "5 events wait"),
    (freshness(5, 120), None, False, "the pipeline is stalled"),
    (freshness(0), 30, True, "the source is quiet"),
    (freshness(0), 600, False, "the connector has stopped"),
    (freshness(5, 120), 30, False, "the pipeline is stalled"),
])
def test_freshness_tells_stalled_from_quiet_from_stopped(state, heartbeat_age_s, passed, reason):
    heartbeat = NOW - timedelta(seconds=heartbeat_age_s) if heartbeat_age_s is not None else None
    verdict = freshness_verdict(state, 60, heartbeat, 300 if heartbeat_age_s is not None else None)
    assert verdict.passed is passed and reason in verdict.reason


def test_a_connector_expected_to_send_heartbeats_that_sent_none_is_not_fresh():
    assert not freshness_verdict(freshness(0), 60, None, 300).passed


def test_schema_change_events_parse_into_table_changes_and_diffs():
    event = parse_schema_change(schema_change("CREATE", COLUMNS), "db2")
    [change] = event.changes
    assert (change.type, change.name, change.primary_keys) == ("CREATE", "DB2INST1.CUSTOMERS", ("ID",))
    assert change.columns["ID"].dataType == T.LongType()  # the wide-type policy: every integer is bigint
    current = T.StructType([T.StructField("ID", T.LongType()), T.StructField("OLD", T.StringType()),
                            T.StructField("_cdc_op", T.StringType())])
    diff = diff_schema(current, change.columns)
    assert [f.name for f in diff.added] == ["FIRST_NAME", "LAST_NAME", "EMAIL"] and diff.dropped == ("OLD",)
    assert table_name_from_id('"DB2INST1"."CUSTOMERS"') == "DB2INST1.CUSTOMERS"
    refused = diff_schema(T.StructType([T.StructField("ID", T.DecimalType(38, 2))]), change.columns).refused
    assert refused == ("ID: decimal(38,2) -> bigint",)
    with pytest.raises(SchemaChangeError):
        parse_schema_change(json.dumps({"payload": {"tableChanges": "x"}}).encode(), "db2")


def test_a_snapshot_drop_is_not_acted_on_and_unsigned_bigints_are_decimals():
    """MariaDB's snapshot emits DROP TABLE IF EXISTS before each CREATE TABLE: no table was dropped."""
    def event(change_type, snapshot):
        return json.dumps({"schema": {}, "payload": {
            "source": {"connector": "mariadb", "file": "mariadb-bin.000002", "pos": 4567, "snapshot": snapshot},
            "databaseName": "shop", "ddl": "DROP TABLE IF EXISTS `shop`.`orders`",
            "tableChanges": [{"type": change_type, "id": '"shop"."orders"', "table": {"columns": [
                {"name": "id", "jdbcType": -5, "typeName": "BIGINT UNSIGNED", "position": 1},
                {"name": "flags", "jdbcType": -7, "typeName": "BIT", "length": 8, "position": 2},
                {"name": "on", "jdbcType": -7, "typeName": "BIT", "length": 1, "position": 3}]}}]}}).encode()

    snapshot_drop = parse_schema_change(event("DROP", "true"), "mariadb")
    assert snapshot_drop.snapshot and snapshot_drop.acted_on == ()
    assert parse_schema_change(event("DROP", "false"), "mariadb").acted_on[0].type == "DROP"
    create = parse_schema_change(event("CREATE", "last"), "mariadb")
    assert [c.type for c in create.acted_on] == ["CREATE"]
    assert create.source_position == " " * 46 + "mariadb-bin.000002" + "4567".rjust(20, "0") + "0" * 20
    types = {f.name: f.dataType for f in create.changes[0].columns.fields}
    assert types == {"id": T.DecimalType(38, 0), "flags": T.BinaryType(), "on": T.BooleanType()}


def test_the_translator_names_every_table_the_same_way():
    table = CapturedTable("inventory-eu", "postgresql", "db.server1", "in.ventory.My-Table", "t",
                          DeltaTarget("/x"), asset=AssetSettings(owners=("team:data",), tags=(("tier", "gold"),)),
                          retired=True)
    translator = CdcTranslator()
    assert translator.get_asset_key(table).path == ["db_server1", "in", "ventory", "My_Table"]
    assert translator.get_group_name(table) == "inventory_eu"
    assert translator.get_tags(table) == {"tier": "gold", "cdc_assets/status": "retired"}
    assert translator.get_owners(table) == ["team:data"]
    assert "keys: from the record key" in translator.get_description(table)


@pytest.mark.parametrize("placeholder", ["__debezium_unavailable_value", "un changed/toast"])
def test_every_form_of_the_placeholder_contains_a_needle_and_other_values_none(placeholder):
    """A batch is read without the placeholder's tests only when its raw values hold no needle: every
    form the connector writes (as the JSON converter writes it) must hold one."""
    import base64
    import hashlib
    from uuid import UUID

    from cdc_assets.core.types import placeholder_needles

    raw = placeholder.encode()
    b64 = base64.b64encode(raw).decode()
    uuid = str(UUID(bytes=hashlib.md5(raw).digest(), version=3))
    forms = [placeholder, b64, raw.hex(), json.dumps({placeholder: placeholder}), [placeholder], [uuid], [b64],
             list(raw), {placeholder: placeholder}]
    needles = placeholder_needles(placeholder)
    assert needles is not None
    for form in forms:
        for text in (json.dumps({"after": {"c": form}}, ensure_ascii=False),
                     json.dumps({"after": {"c": form}}, ensure_ascii=False, separators=(",", ":"))):
            assert any(needle in text.encode() for needle in needles), text
    plain = json.dumps({"after": {"c": "a value", "n": [1, 2, 3], "b": base64.b64encode(b"bytes").decode()}})
    assert not any(needle in plain.encode() for needle in needles)
    assert placeholder_needles('un"changed') is None and placeholder_needles("a\\b") is None
    assert placeholder_needles("ünchanged") is None
