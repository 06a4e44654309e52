"""Debezium schema-change events (seed 004's Db2 table) for the schema-change rules, sensor and job."""

from __future__ import annotations

import json

COLUMNS = [
    {"name": "ID", "jdbcType": 4, "typeName": "int identity", "length": 10, "scale": 0, "position": 1,
     "optional": False},
    {"name": "FIRST_NAME", "jdbcType": 12, "typeName": "varchar", "length": 255, "scale": None, "position": 2,
     "optional": False},
    {"name": "LAST_NAME", "jdbcType": 12, "typeName": "varchar", "length": 255, "scale": None, "position": 3,
     "optional": False},
    {"name": "EMAIL", "jdbcType": 12, "typeName": "varchar", "length": 255, "scale": None, "position": 4,
     "optional": False},
]


def schema_change(change_type, columns, commit_lsn="00000025:00000d98:00a2", ddl=None, table="CUSTOMERS",
                  snapshot="true"):
    """Seed 004's schema-change value (Db2: ddl null; made by its snapshot), for a CREATE, ALTER or DROP."""
    return json.dumps({"schema": {}, "payload": {
        "source": {"version": "2.3.4.Final", "connector": "db2", "name": "db2", "ts_ms": 0, "snapshot": snapshot,
                   "db": "testdb", "schema": "DB2INST1", "table": table, "change_lsn": None,
                   "commit_lsn": commit_lsn, "event_serial_no": None},
        "ts_ms": 1588252618953, "databaseName": "TESTDB", "schemaName": "DB2INST1", "ddl": ddl,
        "tableChanges": [{"type": change_type, "id": f'"DB2INST1"."{table}"', "table": {
            "defaultCharsetName": None, "primaryKeyColumnNames": ["ID"], "columns": columns,
            "attributes": [{"customAttribute": "attributeValue"}]}}]}}).encode()
