"""The source database's tables and the writes made to them: fixed edge cases and seeded random workloads."""

from __future__ import annotations

import datetime as dt
import json
import random
import string
import uuid
from decimal import Decimal
from typing import Any

import psycopg

from tests.support import harness as h

# The random workloads' tables (``rnd_changes``).
RND_COLUMNS = "(id int PRIMARY KEY, grp int, name text, amount numeric(12,4), score double precision, at timestamptz)"

SCHEMA = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE cdc_marker (id int PRIMARY KEY);
CREATE TABLE debezium_signal (id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048));
CREATE TABLE alltypes (
  id int PRIMARY KEY,
  c_smallint smallint, c_int integer, c_bigint bigint,
  c_num numeric(20,8), c_num_wide numeric(38,12), c_num0 numeric(10,0), c_numeric numeric, c_numeric_extreme numeric,
  c_real real, c_double double precision, c_money money, c_bool boolean,
  c_char char(5), c_varchar varchar(20), c_text text, c_bytea bytea,
  c_date date, c_time time, c_timetz timetz, c_ts timestamp, c_ts3 timestamp(3), c_tstz timestamptz,
  c_interval interval, c_uuid uuid, c_json json, c_jsonb jsonb, c_enum mood, c_int_arr int[], c_text_arr text[]);
CREATE TABLE toast (id int PRIMARY KEY, small int, t text, jb jsonb, b bytea, arr text[], iarr int[]);
ALTER TABLE toast ALTER COLUMN t SET STORAGE EXTERNAL, ALTER COLUMN jb SET STORAGE EXTERNAL,
  ALTER COLUMN b SET STORAGE EXTERNAL, ALTER COLUMN arr SET STORAGE EXTERNAL, ALTER COLUMN iarr SET STORAGE EXTERNAL;
CREATE TABLE full_ident (id int PRIMARY KEY, v text, n numeric(10,2), big text);
ALTER TABLE full_ident REPLICA IDENTITY FULL;
CREATE TABLE nokey (code text NOT NULL, v int, note text);
ALTER TABLE nokey REPLICA IDENTITY FULL;
CREATE TABLE trunc (id int PRIMARY KEY, v text);
CREATE TABLE rnd RND_COLUMNS;
CREATE TABLE tx_a (id int PRIMARY KEY, v int, note text);
CREATE TABLE tx_b (id int PRIMARY KEY, v int, note text);
CREATE TABLE snap_k (id int PRIMARY KEY, v text, n int);
CREATE TABLE snap_s (id int PRIMARY KEY, v text, n int);
CREATE TABLE snap_big (id int PRIMARY KEY, v text, n int);
""".replace("RND_COLUMNS", RND_COLUMNS)

# Column -> SQL type for the casts of inserted values (alltypes).
ALLTYPES = {
    "c_smallint": "smallint", "c_int": "integer", "c_bigint": "bigint", "c_num": "numeric(20,8)",
    "c_num_wide": "numeric(38,12)", "c_num0": "numeric(10,0)", "c_numeric": "numeric", "c_numeric_extreme": "numeric",
    "c_real": "real", "c_double": "double precision", "c_money": "money", "c_bool": "boolean", "c_char": "char(5)",
    "c_varchar": "varchar(20)", "c_text": "text", "c_bytea": "bytea", "c_date": "date", "c_time": "time",
    "c_timetz": "timetz", "c_ts": "timestamp", "c_ts3": "timestamp(3)", "c_tstz": "timestamptz",
    "c_interval": "interval", "c_uuid": "uuid", "c_json": "json", "c_jsonb": "jsonb", "c_enum": "mood",
    "c_int_arr": "int[]", "c_text_arr": "text[]",
}

EDGE_ROWS: list[dict[str, Any]] = [
    {"id": 1, "c_smallint": -32768, "c_int": -2147483648, "c_bigint": -9223372036854775808,
     "c_num": Decimal("-81657634825.91843167"), "c_num_wide": Decimal("12345678901234567890123456.123456789012"),
     "c_num0": Decimal("9999999999"), "c_numeric": Decimal("-123456789012345678.123456789"),
     "c_numeric_extreme": Decimal("0.00000000000000000001"),
     "c_real": 1e-7, "c_double": 1e-7, "c_money": "-1234567.89", "c_bool": True, "c_char": "ab",
     "c_varchar": "héllo wörld ☃", "c_text": 'line1\nline2 "q" \\ tab\t ☃ 𝄞 \'', "c_bytea": b"\x00\xff\x10",
     "c_date": "2024-02-29", "c_time": "23:59:59.999999", "c_timetz": "10:15:30.123456+05:30",
     "c_ts": "2024-01-02 03:04:05.678901", "c_ts3": "2024-01-02 03:04:05.678",
     "c_tstz": "2024-01-02 03:04:05.678901+01",
     "c_interval": "1 year 2 mons 3 days 04:05:06.789", "c_uuid": "0b6f8d6e-1d2c-4c4e-9a57-3c1e2f4a5b6c",
     "c_json": '{"a": 1,  "b": [true, null]}', "c_jsonb": '{"k": "v", "n": 1.50}', "c_enum": "happy",
     "c_int_arr": [1, None, 3], "c_text_arr": ["a b", None, '"q"']},
    {"id": 2},  # NULL in every column
    {"id": 3, "c_smallint": 32767, "c_int": 2147483647, "c_bigint": 9223372036854775807,
     "c_num": Decimal("0.00000001"), "c_num_wide": Decimal("-0.000000000001"), "c_num0": Decimal("-1"),
     "c_numeric": Decimal("0.000000000000000001"),
     "c_numeric_extreme": Decimal("123456789012345678901234567890.5"),
     "c_real": -3.4028235e38, "c_double": -1.7976931348623157e308, "c_money": "0.01", "c_bool": False,
     "c_char": "", "c_varchar": "", "c_text": "", "c_bytea": b"", "c_date": "1969-12-31", "c_time": "00:00:00",
     "c_timetz": "23:59:59-08", "c_ts": "1969-07-20 20:17:40.000001", "c_ts3": "1969-07-20 20:17:40.001",
     "c_tstz": "1970-01-01 00:00:00+00", "c_interval": "-00:05:00", "c_uuid": "ffffffff-ffff-ffff-ffff-ffffffffffff",
     "c_json": "[]", "c_jsonb": "{}", "c_enum": "sad", "c_int_arr": [], "c_text_arr": []},
    {"id": 4, "c_real": 2.5, "c_double": 5e-324, "c_num": Decimal("12.5"), "c_numeric": Decimal("12345678901234567890"),
     "c_interval": "00:00:00.000001", "c_time": "12:00:00.5", "c_timetz": "00:00:00.000001+00",
     "c_ts": "2000-01-01 00:00:00", "c_tstz": "2262-04-11 23:47:16.854775+00", "c_money": "92233720368547758.07"},
]


def _random_text(rng: random.Random, length: int) -> str:
    alphabet = string.ascii_letters + string.digits + " \n\t\"'\\{}[],:é☃𝄞"
    return "".join(rng.choice(alphabet) for _ in range(length))


def random_alltypes_row(rng: random.Random, row_id: int) -> dict[str, Any]:
    """A row of ``alltypes`` with seeded random values, about one column in six NULL."""
    def maybe(value: Any) -> Any:
        return None if rng.random() < 0.15 else value

    moment = dt.datetime(1900, 1, 1) + dt.timedelta(microseconds=rng.randrange(200 * 365 * 86400 * 10**6))
    offset = dt.timedelta(minutes=rng.randrange(-12 * 60, 14 * 60, 30))
    zone = dt.timezone(offset)
    day_micros = rng.randrange(86400 * 10**6)
    time_of_day = (dt.datetime.min + dt.timedelta(microseconds=day_micros)).time()
    interval = (f"{rng.randrange(-3, 4)} years {rng.randrange(-11, 12)} mons " if rng.random() < 0.5 else "") + \
        f"{rng.randrange(-400, 400)} days {dt.timedelta(microseconds=rng.randrange(86400 * 10**6))}"
    return {
        "id": row_id,
        "c_smallint": maybe(rng.randint(-32768, 32767)), "c_int": maybe(rng.randint(-2**31, 2**31 - 1)),
        "c_bigint": maybe(rng.randint(-2**63, 2**63 - 1)),
        "c_num": maybe(Decimal(rng.randint(-10**20 + 1, 10**20 - 1)).scaleb(-8)),
        "c_num_wide": maybe(Decimal(rng.randint(-10**38 + 1, 10**38 - 1)).scaleb(-12)),
        "c_num0": maybe(Decimal(rng.randint(-10**10 + 1, 10**10 - 1))),
        "c_numeric": maybe(Decimal(rng.randint(-10**20 + 1, 10**20 - 1)).scaleb(-rng.randint(0, 18))),
        "c_numeric_extreme": maybe(Decimal(rng.randint(-10**36, 10**36)).scaleb(-rng.randint(0, 36))),
        "c_real": maybe(rng.uniform(-1e6, 1e6)), "c_double": maybe(rng.uniform(-1, 1) * 10.0 ** rng.randint(-30, 30)),
        "c_money": maybe(str(Decimal(rng.randint(-10**13, 10**13)).scaleb(-2))), "c_bool": maybe(rng.random() < 0.5),
        "c_char": maybe(_random_text(rng, rng.randint(0, 5)).replace("\\", "x").rstrip()),
        "c_varchar": maybe(_random_text(rng, rng.randint(0, 20))),
        "c_text": maybe(_random_text(rng, rng.randint(0, 200))),
        "c_bytea": maybe(rng.randbytes(rng.randint(0, 64))),
        "c_date": maybe((dt.date(1900, 1, 1) + dt.timedelta(days=rng.randrange(200 * 365))).isoformat()),
        "c_time": maybe(time_of_day.isoformat()),
        "c_timetz": maybe(time_of_day.isoformat() + dt.datetime.now(zone).strftime("%z")),
        "c_ts": maybe(moment.isoformat(sep=" ")), "c_ts3": maybe(moment.isoformat(sep=" ", timespec="milliseconds")),
        "c_tstz": maybe(moment.replace(tzinfo=zone).isoformat(sep=" ")), "c_interval": maybe(interval),
        "c_uuid": maybe(str(uuid.UUID(int=rng.getrandbits(128)))),
        "c_json": maybe(json.dumps({"k": _random_text(rng, 5), "n": rng.randint(0, 9), "l": [1, None]})),
        "c_jsonb": maybe(json.dumps({"x": rng.random(), "s": _random_text(rng, 8)})),
        "c_enum": maybe(rng.choice(["sad", "ok", "happy"])),
        "c_int_arr": maybe([None if rng.random() < 0.1 else rng.randint(-2**31, 2**31 - 1)
                            for _ in range(rng.randint(0, 5))]),
        "c_text_arr": maybe([None if rng.random() < 0.1 else _random_text(rng, rng.randint(0, 10))
                             for _ in range(rng.randint(0, 4))]),
    }


def insert(connection: psycopg.Connection, table: str, row: dict[str, Any], types: dict[str, str]) -> None:
    """Insert ``row`` (column -> value), each value cast to its column's SQL type."""
    columns = list(row)
    values = ", ".join(f"%s::{types[c]}" if c in types else "%s" for c in columns)
    connection.execute(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({values})", list(row.values()))


def update(connection: psycopg.Connection, table: str, key: dict[str, Any], changes: dict[str, Any],
           types: dict[str, str]) -> None:
    """Update the row with ``key`` to ``changes``."""
    sets = ", ".join(f"{c} = %s::{types[c]}" if c in types else f"{c} = %s" for c in changes)
    where = " AND ".join(f"{c} = %s" for c in key)
    connection.execute(f"UPDATE {table} SET {sets} WHERE {where}", [*changes.values(), *key.values()])


def alltypes_random_changes(connection: psycopg.Connection, rng: random.Random, ids: list[int], next_id: int,
                            steps: int) -> int:
    """Random inserts, column updates (to values and to NULL) and deletes of ``alltypes``; returns the next id."""
    for _ in range(steps):
        choice = rng.random()
        if choice < 0.35 or not ids:
            insert(connection, "alltypes", random_alltypes_row(rng, next_id), ALLTYPES)
            ids.append(next_id)
            next_id += 1
        elif choice < 0.85:
            row_id = rng.choice(ids)
            fresh = random_alltypes_row(rng, row_id)
            columns = rng.sample(sorted(ALLTYPES), rng.randint(1, 6))
            update(connection, "alltypes", {"id": row_id}, {c: fresh[c] for c in columns}, ALLTYPES)
        else:
            row_id = rng.choice(ids)
            ids.remove(row_id)
            connection.execute("DELETE FROM alltypes WHERE id = %s", [row_id])
    return next_id


def big_toast_row(rng: random.Random, row_id: int) -> dict[str, Any]:
    """A ``toast`` row whose large columns are stored out of line (TOASTed)."""
    return {"id": row_id, "small": rng.randint(0, 1000), "t": _random_text(rng, 9000),
            "jb": json.dumps({"doc": _random_text(rng, 6000), "n": row_id}), "b": rng.randbytes(8000),
            "arr": [_random_text(rng, 400) for _ in range(15)], "iarr": [rng.randint(-2**31, 2**31 - 1)
                                                                     for _ in range(3000)]}


TOAST_TYPES = {"jb": "jsonb", "arr": "text[]", "iarr": "int[]"}



def seed_alltypes_and_toast(connection: psycopg.Connection, rng: random.Random) -> tuple[list[int], int, list[int]]:
    """The workload's schema, its edge rows and first random changes of ``alltypes``, and 8 TOASTed rows:
    returns ``alltypes``' ids, its next free id and the ``toast`` ids."""
    connection.execute(SCHEMA)
    for row in EDGE_ROWS:
        insert(connection, "alltypes", row, ALLTYPES)
    alltypes_ids = [row["id"] for row in EDGE_ROWS]
    next_alltypes = alltypes_random_changes(connection, rng, alltypes_ids, 100, 25)
    toast_ids = list(range(1, 9))
    for row_id in toast_ids:
        insert(connection, "toast", big_toast_row(rng, row_id), TOAST_TYPES)
    return alltypes_ids, next_alltypes, toast_ids

def toast_changes(connection: psycopg.Connection, rng: random.Random, ids: list[int], next_id: int,
                  steps: int) -> int:
    """Mostly updates that leave the large columns untouched (Debezium sends placeholders for them), some that
    change one large column, inserts followed at once by an untouching update, deletes."""
    for _ in range(steps):
        choice = rng.random()
        if choice < 0.6 and ids:
            connection.execute("UPDATE toast SET small = %s WHERE id = %s", [rng.randint(0, 1000), rng.choice(ids)])
        elif choice < 0.75 and ids:
            row_id, fresh = rng.choice(ids), big_toast_row(rng, 0)
            column = rng.choice(["t", "jb", "b", "arr", "iarr"])
            update(connection, "toast", {"id": row_id}, {column: fresh[column]}, TOAST_TYPES)
        elif choice < 0.9:
            insert(connection, "toast", big_toast_row(rng, next_id), TOAST_TYPES)
            connection.execute("UPDATE toast SET small = small + 1 WHERE id = %s", [next_id])
            ids.append(next_id)
            next_id += 1
        elif ids:
            row_id = rng.choice(ids)
            ids.remove(row_id)
            connection.execute("DELETE FROM toast WHERE id = %s", [row_id])
    return next_id


def rnd_changes(connection: psycopg.Connection, rng: random.Random, ids: list[int], next_id: int,
                steps: int, table: str = "rnd", key_changes: list[tuple[int, int]] | None = None) -> int:
    """Random inserts, updates, deletes and primary-key changes of ``table`` (``rnd`` by default), some grouped
    in transactions; each key change's (old id, new id) is appended to ``key_changes`` when given."""
    def row_values() -> list[Any]:
        return [rng.randint(0, 9), None if rng.random() < 0.1 else _random_text(rng, rng.randint(0, 30)),
                Decimal(rng.randint(-10**12, 10**12)).scaleb(-4), rng.uniform(-1e9, 1e9),
                dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=rng.getrandbits(45))]

    step = 0
    while step < steps:
        with connection.transaction():
            for _ in range(rng.choice([1, 1, 1, 3, 8])):
                step += 1
                choice = rng.random()
                if choice < 0.35 or not ids:
                    connection.execute(f"INSERT INTO {table} VALUES (%s, %s, %s, %s, %s, %s)",
                                       [next_id, *row_values()])
                    ids.append(next_id)
                    next_id += 1
                elif choice < 0.75:
                    values = row_values()
                    connection.execute(f"UPDATE {table} SET grp = %s, name = %s, amount = %s, score = %s, at = %s "
                                       "WHERE id = %s", [*values, rng.choice(ids)])
                elif choice < 0.85:
                    old = rng.choice(ids)
                    ids.remove(old)
                    ids.append(next_id)
                    connection.execute(f"UPDATE {table} SET id = %s, grp = grp + 1 WHERE id = %s", [next_id, old])
                    if key_changes is not None:
                        key_changes.append((old, next_id))
                    next_id += 1
                elif choice < 0.9:
                    connection.execute(f"UPDATE {table} SET score = score * 2 WHERE grp = %s", [rng.randint(0, 9)])
                else:
                    old = rng.choice(ids)
                    ids.remove(old)
                    connection.execute(f"DELETE FROM {table} WHERE id = %s", [old])
    return next_id


def tx_changes(connection: psycopg.Connection, rng: random.Random, ids: dict[str, list[int]], next_id: int,
               transactions: int) -> int:
    """Transactions over ``tx_a`` and ``tx_b``: most touch both tables, with up to 40 changes each."""
    for _ in range(transactions):
        with connection.transaction():
            tables = rng.choice([["tx_a", "tx_b"], ["tx_a", "tx_b"], ["tx_a"], ["tx_b"]])
            for _ in range(rng.randint(1, 40)):
                table = rng.choice(tables)
                live = ids[table]
                choice = rng.random()
                if choice < 0.5 or not live:
                    connection.execute(f"INSERT INTO {table} VALUES (%s, %s, %s)",
                                       [next_id, rng.randint(0, 100), _random_text(rng, 10)])
                    live.append(next_id)
                    next_id += 1
                elif choice < 0.85:
                    connection.execute(f"UPDATE {table} SET v = v + 1, note = %s WHERE id = %s",
                                       [_random_text(rng, 10), rng.choice(live)])
                else:
                    old = rng.choice(live)
                    live.remove(old)
                    connection.execute(f"DELETE FROM {table} WHERE id = %s", [old])
    return next_id


def snap_changes(connection: psycopg.Connection, rng: random.Random, table: str, ids: list[int], next_id: int,
                 steps: int) -> int:
    """Writes to a table while it is incrementally snapshotted."""
    for _ in range(steps):
        choice = rng.random()
        if choice < 0.3:
            connection.execute(f"INSERT INTO {table} VALUES (%s, %s, %s)", [next_id, _random_text(rng, 12), 0])
            ids.append(next_id)
            next_id += 1
        elif choice < 0.8:
            connection.execute(f"UPDATE {table} SET n = n + 1, v = %s WHERE id = %s",
                               [_random_text(rng, 12), rng.choice(ids)])
        else:
            old = rng.choice(ids)
            ids.remove(old)
            connection.execute(f"DELETE FROM {table} WHERE id = %s", [old])
    return next_id


def big_transaction(connection: Any, rng: random.Random, ids: dict[str, list[int]], next_id: int, rows: int) -> int:
    """One transaction over every table of ``ids`` (columns ``id, v, note``): ``rows`` inserts into each (multi-row
    statements), then ``rows / 10`` updates and ``rows / 20`` deletes of its live rows. ``connection``: psycopg's, or
    anything with its ``execute`` and ``transaction``; returns the next id."""
    with connection.transaction():
        for table, live in ids.items():
            for start in range(0, rows, 200):
                chunk = range(next_id + start, next_id + min(rows, start + 200))
                connection.execute(f"INSERT INTO {table} VALUES " + ", ".join(["(%s, %s, %s)"] * len(chunk)),
                                   [value for row_id in chunk for value in (row_id, rng.randint(0, 100),
                                                                            f"big {row_id}")])
            live.extend(range(next_id, next_id + rows))
            next_id += rows
            for row_id in rng.sample(live, rows // 10):
                connection.execute(f"UPDATE {table} SET v = v + 1, note = %s WHERE id = %s", ["big update", row_id])
            for row_id in rng.sample(live, rows // 20):
                live.remove(row_id)
                connection.execute(f"DELETE FROM {table} WHERE id = %s", [row_id])
    return next_id


# The PostgreSQL type workload as the conformance tests compare it: the source query (the oracle) and how each
# column of the source and of the Delta table is normalised before comparing.
_ORACLE_CASTS = {
    "c_money": "c_money::numeric", "c_uuid": "c_uuid::text", "c_json": "c_json::text", "c_jsonb": "c_jsonb::text",
    "c_enum": "c_enum::text",
    # Debezium reads an interval's fields (years ... seconds); MicroDuration is computed from them.
    "c_interval": "CASE WHEN c_interval IS NOT NULL THEN ARRAY[extract(year FROM c_interval), "
                  "extract(month FROM c_interval), extract(day FROM c_interval), extract(hour FROM c_interval), "
                  "extract(minute FROM c_interval), extract(second FROM c_interval)] END",
}
ALLTYPES_QUERY = "SELECT id, " + ", ".join(f"{_ORACLE_CASTS.get(c, c)} AS {c}" for c in ALLTYPES) + " FROM alltypes"


def expected_alltypes(time_mode: str, decimal_mode: str) -> dict[str, h.Normaliser]:
    """How the source's ``alltypes`` values are normalised under a connector's time and decimal modes."""
    millis = time_mode == "connect"
    expected: dict[str, h.Normaliser] = {
        "c_timetz": h.utc_time,
        "c_tstz": h.instant,
        "c_interval": h.interval_micros,
        "c_time": h.to_millis if millis else (lambda v: v),
        "c_ts": h.to_millis if millis else (lambda v: v),
    }
    if decimal_mode == "double":
        expected.update({c: h.as_float for c in ("c_num", "c_num_wide", "c_num0", "c_numeric", "c_numeric_extreme",
                                                  "c_money")})
    return expected


def actual_alltypes(decimal_mode: str, binary_mode: str) -> dict[str, h.Normaliser]:
    """How the Delta table's ``alltypes`` values are normalised under a connector's decimal and binary modes."""
    decimals = {"precise": h.decimal_value, "string": h.decimal_text, "double": h.as_float}[decimal_mode]
    # Unconstrained numeric (VariableScaleDecimal) is decimal(38,18); the column whose values go beyond it is
    # declared string in the table's columns config and holds each value's exact text.
    variable, extreme = (decimals, h.decimal_text) if decimal_mode == "precise" else (decimals, decimals)
    return {
        "id": h.typed(int), "c_smallint": h.typed(int), "c_int": h.typed(int), "c_bigint": h.typed(int),
        "c_num": decimals, "c_num_wide": decimals, "c_num0": decimals, "c_money": decimals,
        "c_numeric": variable, "c_numeric_extreme": extreme,
        "c_real": h.as_float, "c_double": h.as_float, "c_bool": h.typed(bool),
        "c_char": h.typed(str), "c_varchar": h.typed(str), "c_text": h.typed(str),
        "c_bytea": {"bytes": h.typed(bytes), "base64": h.base64_bytes, "hex": h.hex_bytes}[binary_mode],
        "c_date": h.typed(dt.date), "c_time": h.time_text, "c_timetz": h.time_text,
        "c_ts": h.naive_timestamp, "c_ts3": h.naive_timestamp, "c_tstz": h.instant, "c_interval": h.typed(int),
        "c_uuid": h.typed(str), "c_json": h.typed(str), "c_jsonb": h.typed(str), "c_enum": h.typed(str),
        "c_int_arr": h.typed(list), "c_text_arr": h.typed(list),
    }


TOAST_QUERY = "SELECT id, small, t, jb::text AS jb, b, arr, iarr FROM toast"
TOAST_ACTUAL = {"id": h.typed(int), "small": h.typed(int), "t": h.typed(str), "jb": h.typed(str),
                "b": h.typed(bytes), "arr": h.typed(list), "iarr": h.typed(list)}
