"""PostgreSQL primary-key changes of rows with TOASTed values, spread over partitions, and the rows they leave."""

from __future__ import annotations

import json

from confluent_kafka import Producer

from cdc_assets.demo.broker import PRODUCER_SETTINGS
from cdc_assets.demo.events import envelope, postgres_source
from tests.support.merges import read_rows


def produce_spread(broker, topic, recs, partitions, rng):
    """Produce ``recs`` over ``partitions`` partitions, each key to one partition drawn by ``rng`` (as a
    connector's partitioner keeps a key's events in order), the partitions' order left to the broker."""
    partition_of: dict[bytes, int] = {}
    producer = Producer({**PRODUCER_SETTINGS, "bootstrap.servers": broker.bootstrap_servers})
    for key, value in recs:
        partition = partition_of.setdefault(key, rng.randrange(partitions))
        producer.produce(topic, key=key, value=value, partition=partition)
    assert producer.flush(30) == 0


def scd2_versions(spark, writer, table) -> dict[int, list[dict]]:
    """The scd2 table's versions per key, in ``_cdc_valid_from`` order."""
    if writer.name == "delta-rs":
        from deltalake import DeltaTable

        versions = DeltaTable(table.target.path).to_pyarrow_table().to_pylist()
    else:
        versions = [r.asDict() for r in spark.read.format("delta").load(table.target.path).collect()]
    by_key: dict[int, list[dict]] = {}
    for version in sorted(versions, key=lambda v: v["_cdc_valid_from"]):
        by_key.setdefault(version["id"], []).append(version)
    return by_key


# Debezium's placeholder for an unchanged TOASTed value, and the columns of the table that holds one.
UNAVAILABLE = "__debezium_unavailable_value"
TOAST_COLUMNS = {"id": "bigint", "big": "string", "n": "bigint"}


def pg_change(op: str, key: int, lsn: int, big: str = UNAVAILABLE, n: int = 0, commit: int | None = None
              ) -> list[tuple[bytes, bytes | None]]:
    """A PostgreSQL change of s.t as Debezium sends it: a delete's before image holds the key only (REPLICA
    IDENTITY DEFAULT) and is followed by its tombstone; ``big`` unchanged and TOASTed is the placeholder;
    ``commit``: the last commit LSN of ``sequence``."""
    source = postgres_source(lsn, 1_700_000_000_000 + lsn, "s", "t")
    if commit is not None:
        source["sequence"] = json.dumps([str(commit), str(lsn)])
    record_key = json.dumps({"id": key}).encode()
    if op == "d":
        return [(record_key, envelope("d", {"id": key}, None, source, 1_700_000_000_000 + lsn)), (record_key, None)]
    return [(record_key, envelope(op, None, {"id": key, "big": big, "n": n}, source, 1_700_000_000_000 + lsn))]


def pk_change(old: int, new: int, lsn: int, n: int = 0) -> list[tuple[bytes, bytes | None]]:
    """``UPDATE t SET id = new WHERE id = old`` leaving ``big`` alone: a delete and a create at one LSN."""
    return pg_change("d", old, lsn) + pg_change("c", new, lsn, n=n)


def current_values(spark, writer, table) -> dict[int, tuple[str | None, int]]:
    """``{id: (big, n)}`` of the live rows (scd2: of the current versions)."""
    if table.merge.apply_mode == "scd2":
        return {k: (v["big"], v["n"]) for k, vs in scd2_versions(spark, writer, table).items() for v in vs
                if v["_cdc_current"]}
    return {k[0]: (r["big"], r["n"]) for k, r in read_rows(spark, writer, table, visible_only=False).items()
            if not r.get("_cdc_deleted")}
