"""Builders of Debezium change events (key, value) as connectors write them, for the demo,
the tests and the benchmark. Values follow the seeds: PostgreSQL, SQL Server and Db2 envelopes,
with or without the JSON converter's schema/payload wrapper.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

Record = tuple[bytes | None, bytes | None]

_CONNECT_TYPES = {bool: "boolean", int: "int64", float: "double", str: "string"}


def _connect_schema(row: Mapping[str, Any], name: str) -> dict[str, Any]:
    fields = [{"type": _CONNECT_TYPES.get(type(value), "string"), "optional": True, "field": column}
              for column, value in row.items()]
    return {"type": "struct", "fields": fields, "optional": True, "name": name}


def encode_key(key: Mapping[str, Any], with_schema: bool = False, name: str = "Key") -> bytes:
    """A record key as the JSON converter writes it."""
    body: Any = dict(key)
    if with_schema:
        body = {"schema": _connect_schema(key, name), "payload": body}
    return json.dumps(body).encode()


def envelope(op: str, before: Mapping[str, Any] | None, after: Mapping[str, Any] | None,
             source: Mapping[str, Any], ts_ms: int, transaction: Mapping[str, Any] | None = None,
             with_schema: bool = False, row_name: str = "Value") -> bytes:
    """An envelope value (optionally wrapped in schema/payload)."""
    payload = {"before": before, "after": after, "source": dict(source), "op": op, "ts_ms": ts_ms,
               "transaction": transaction}
    if not with_schema:
        return json.dumps(payload).encode()
    image = after or before or {}
    row_schema = _connect_schema(image, row_name)
    schema = {
        "type": "struct",
        "name": row_name.replace(".Value", ".Envelope"),
        "fields": [
            {**row_schema, "field": "before"},
            {**row_schema, "field": "after"},
            {"type": "struct", "field": "source", "optional": False,
             "fields": [{"type": "string", "optional": True, "field": k} for k in source]},
            {"type": "string", "optional": False, "field": "op"},
            {"type": "int64", "optional": True, "field": "ts_ms"},
        ],
    }
    return json.dumps({"schema": schema, "payload": payload}).encode()


def postgres_source(lsn: int, ts_ms: int, schema: str, table: str, snapshot: str = "false",
                    tx_id: int = 600) -> dict[str, Any]:
    """``source`` of a PostgreSQL event (Debezium 1.x-2.x field set)."""
    return {"version": "2.3.4.Final", "connector": "postgresql", "name": "dbserver1", "ts_ms": ts_ms,
            "snapshot": snapshot, "db": "postgres", "schema": schema, "table": table, "txId": tx_id,
            "lsn": lsn, "xmin": None}


def sqlserver_source(commit_lsn: str | None, change_lsn: str | None, serial: int | None, ts_ms: int,
                     schema: str, table: str, snapshot: str = "false") -> dict[str, Any]:
    """``source`` of an SQL Server event."""
    return {"version": "2.3.4.Final", "connector": "sqlserver", "name": "server1", "ts_ms": ts_ms,
            "snapshot": snapshot, "db": "testDB", "schema": schema, "table": table,
            "change_lsn": change_lsn, "commit_lsn": commit_lsn, "event_serial_no": serial}


def db2_source(commit_lsn: str | None, change_lsn: str, ts_ms: int, schema: str, table: str,
               snapshot: str = "false") -> dict[str, Any]:
    """``source`` of a Db2 event."""
    return {"version": "2.3.4.Final", "connector": "db2", "name": "myconnector", "ts_ms": ts_ms,
            "snapshot": snapshot, "db": "mydatabase", "schema": schema, "table": table,
            "change_lsn": change_lsn, "commit_lsn": commit_lsn}


def lsn(n: int) -> str:
    """An SQL Server / Db2 style LSN string for a counter."""
    return f"{n >> 32:08x}:{n & 0xFFFFFFFF:08x}:{n % 7 + 1:04x}"
