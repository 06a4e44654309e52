"""Ordering positions compare the way each connector's source committed."""

from typing import get_args

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_assets.config import ConnectorKind
from cdc_assets.core.envelope import source_type
from cdc_assets.core.position import POSITION_RULES, event_position


def positions(spark, kind, sources, partition=0):
    source = source_type(kind)
    rows = [(i, {**dict.fromkeys(source.fieldNames()), **s}) for i, s in enumerate(sources)]
    df = spark.createDataFrame(rows, T.StructType([T.StructField("offset", T.LongType()),
                                                   T.StructField("source", source)]))
    df = df.select(event_position(F.col("source"), kind, F.lit(partition), F.col("offset")).alias("p"))
    return [row.p for row in df.collect()]


def test_sqlserver_lsns_compare_as_numbers_not_strings_of_different_widths(spark):
    # "F:..." sorts after "00000010:..." as a string, but is the smaller LSN.
    earlier = {"commit_lsn": "F:758:5", "change_lsn": "F:758:3", "event_serial_no": "1"}
    later = {"commit_lsn": "00000010:00000758:0005", "change_lsn": "00000010:00000758:0003", "event_serial_no": "1"}
    p_earlier, p_later = positions(spark, "sqlserver", [earlier, later])
    assert p_earlier < p_later
    assert earlier["commit_lsn"] > later["commit_lsn"]  # the string comparison that would be wrong


def test_sqlserver_event_serial_no_orders_events_sharing_both_lsns(spark):
    base = {"commit_lsn": "00000027:00000758:0005", "change_lsn": "00000027:00000758:0003"}
    # Offsets reversed on purpose: the serial number decides, not the Kafka offset.
    second, first = positions(spark, "sqlserver", [{**base, "event_serial_no": "2"},
                                                   {**base, "event_serial_no": "1"}])
    assert first < second


def test_postgresql_lsn_numbers_and_numeric_strings_order_numerically(spark):
    small, big, as_string = positions(spark, "postgresql", [{"lsn": "9"}, {"lsn": "34078720"}, {"lsn": "100"}])
    assert small < as_string < big


def test_postgresql_sequence_stands_in_for_a_missing_lsn(spark):
    with_lsn, from_sequence = positions(spark, "postgresql", [{"lsn": "100"}, {"sequence": '["90", "200"]'}])
    assert with_lsn < from_sequence and len(with_lsn) == len(from_sequence)


def test_postgresql_sequence_without_an_lsn_in_it_orders_first_instead_of_failing_the_batch(spark):
    # A sequence is "[last commit LSN, LSN]"; one of a single element used to fail the whole Spark job
    # (INVALID_ARRAY_INDEX) instead of ordering as an event with no LSN.
    no_lsn, short_sequence, with_lsn = positions(spark, "postgresql", [{}, {"sequence": '["90"]'}, {"lsn": "1"}])
    assert no_lsn[:16] == short_sequence[:16] == "0" * 16  # the LSN part; the Kafka offset follows
    assert short_sequence < with_lsn


def test_db2_snapshot_reads_without_commit_lsn_sort_before_streamed_changes(spark):
    read, change = positions(spark, "db2", [
        {"change_lsn": "00000027:00000700:0001", "commit_lsn": None},
        {"change_lsn": "00000027:00000758:0003", "commit_lsn": "00000027:00000758:0005"},
    ])
    assert read < change


def test_mongodb_orders_by_ts_then_ord(spark):
    a, b, c = positions(spark, "mongodb", [{"ts_ms": "1558965508000", "ord": "31"},
                                           {"ts_ms": "1558965508000", "ord": "6"},
                                           {"ts_ms": "1558965509000", "ord": "1"}])
    assert b < a < c


def test_kafka_offset_breaks_ties(spark):
    first, second = positions(spark, "postgresql", [{"lsn": "5"}, {"lsn": "5"}])
    assert first < second


def test_unknown_kind_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown connector kind 'cassandra'"):
        event_position(F.col("s"), "cassandra", F.lit(0), F.lit(0))


def test_mariadb_orders_as_the_mysql_family_by_binlog_file_pos_and_row(spark):
    # Positions as MariaDB's connector sends them (source.connector "mariadb"); offsets reversed on purpose.
    later_file, later_row, first, later_pos = positions(spark, "mariadb", [
        {"file": "mariadb-bin.000010", "pos": "4", "row": "0"},
        {"file": "mariadb-bin.000009", "pos": "2642", "row": "1"},
        {"file": "mariadb-bin.000009", "pos": "2642", "row": "0"},
        {"file": "mariadb-bin.000009", "pos": "100000", "row": "0"},
    ])
    assert first < later_row < later_pos < later_file
    assert source_type("mariadb") == source_type("mysql")


def test_every_configurable_connector_kind_has_a_position_rule():
    assert set(get_args(ConnectorKind)) == set(POSITION_RULES)
    assert POSITION_RULES["mariadb"] is POSITION_RULES["mysql"]
