"""Comparing a Delta table with its source table where each lives: the SQL that gives every row the same
canonical text on the source database (PostgreSQL, MariaDB/MySQL) and in Spark, and what the counts and
checksums of both sides say.

Rows are split into key buckets by a hash of the key, ``md5(key text)`` read as a number, modulo the bucket
count. Both sides compute it from the same canonical text with the same functions (md5 and hexadecimal
digits), so a row lands in the same bucket on both whatever their collations, orderings or key types; ordered
key ranges would need both engines to sort keys alike (text collations, composite keys, Spark's byte order),
which they do not. A bucket's checksum is the row count and the sum of the first 15 hexadecimal digits of each
row's ``md5``: order-independent, and exact in both engines' decimal sums.

Each column is written as a canonical text chosen by its Delta type (the type the project's rules in
``core.types`` gave the Debezium value) and the source's type, so that equal values read alike:

| Delta type     | canonical text                                                              |
|----------------|-----------------------------------------------------------------------------|
| bigint and other integers | decimal digits                                                  |
| boolean        | ``true`` / ``false``                                                        |
| decimal (or the string of a wider numeric) | the exact decimal, trailing fractional zeros removed |
| double         | its exact binary value as Java's ``Double.toHexString`` (``0x1.8p1``; zero ``0x0.0p0``) |
| date           | ``YYYY-MM-DD``                                                              |
| timestamp_ntz  | ``YYYY-MM-DD HH:MM:SS.ffffff`` (the wall clock)                             |
| timestamp      | microseconds since the epoch (the instant, whatever the session's zone)     |
| binary         | upper-case hexadecimal                                                      |
| string of a source ``time`` | ``HH:MM:SS.ffffff``                                            |
| other strings (text, JSON, UUID, enums) | the text as is                                     |

PostgreSQL's ``real`` is compared as the double of its shortest text, which is what Debezium sends.
A null is ``~``, any other value its length, ``:`` and its text, so no two rows run together alike.
A column with no rule here (structs, arrays, MariaDB's FLOAT) is left out of the comparison, and named.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, get_args

from pyspark.sql import types as T

from cdc_assets.core.apply_modes import ApplyMode
from cdc_assets.core.layout import DELETED_COLUMN, HIDDEN_PREFIX

Dialect = Literal["postgresql", "mysql", "spark"]
Canonical = Literal["integer", "boolean", "decimal", "double", "date", "wall_time", "instant", "bytes", "time",
                    "text"]
# Source kinds whose database this module reads (MariaDB's connector is the MySQL family's).
DIALECT_OF_KIND: dict[str, Dialect] = {"postgresql": "postgresql", "mysql": "mysql", "mariadb": "mysql"}

NULL_TEXT = "~"
_HASH_DIGITS = 15  # a row's checksum part: 60 bits, summed exactly as decimals on both sides
_BUCKET_DIGITS = 8

_NUMERIC_SOURCE = {"numeric", "decimal", "money"}
_TIME_SOURCE = {"time", "time without time zone"}
_INTEGER_TYPES = (T.LongType, T.IntegerType, T.ShortType, T.ByteType)


@dataclass(frozen=True)
class ComparedColumn:
    """One column both sides compare: its name and the canonical text it is written as."""

    name: str
    canonical: Canonical
    source_type: str = ""


def canonical_of(delta_type: T.DataType, source_type: str, dialect: Dialect) -> Canonical | None:
    """The canonical text of a column of ``delta_type`` whose source column is of ``source_type`` (the
    database's ``information_schema`` data type), or None when this module has no rule that both sides
    compute alike."""
    source = source_type.lower()
    if isinstance(delta_type, _INTEGER_TYPES):
        return "integer"
    if isinstance(delta_type, T.BooleanType):
        return "boolean"
    if isinstance(delta_type, T.DecimalType):
        return "decimal"
    if isinstance(delta_type, (T.DoubleType, T.FloatType)):
        # MariaDB's FLOAT reaches Delta from the snapshot at 6 digits, streamed as its 32-bit value: no one text.
        return "double" if dialect == "postgresql" or source == "double" else None
    if isinstance(delta_type, T.DateType):
        return "date"
    if isinstance(delta_type, T.TimestampNTZType):
        return "wall_time"
    if isinstance(delta_type, T.TimestampType):
        return "instant"
    if isinstance(delta_type, T.BinaryType):
        return "bytes"
    if isinstance(delta_type, T.StringType):
        if source in _NUMERIC_SOURCE:
            return "decimal"
        if source in _TIME_SOURCE:
            return "time"
        return "text"
    return None


def compared_columns(delta_schema: T.StructType, source_types: Mapping[str, str], dialect: Dialect
                     ) -> tuple[list[ComparedColumn], list[str]]:
    """The row columns of the Delta table (hidden ``_cdc_`` columns left out) that both sides compare, and the
    names of those left out: absent at the source, or of a type with no common canonical text."""
    compared: list[ComparedColumn] = []
    left_out: list[str] = []
    for field in delta_schema.fields:
        if field.name.startswith(HIDDEN_PREFIX):
            continue
        source_type = source_types.get(field.name)
        canonical = canonical_of(field.dataType, source_type, dialect) if source_type is not None else None
        if canonical is None:
            left_out.append(field.name)
        else:
            compared.append(ComparedColumn(field.name, canonical, source_type or ""))
    return compared, left_out


def quote(name: str, dialect: Dialect) -> str:
    """An identifier quoted for ``dialect``."""
    if dialect == "postgresql":
        return '"' + name.replace('"', '""') + '"'
    return "`" + name.replace("`", "``") + "`"


def _strip_zeros(text: str, dialect: Dialect) -> str:
    """A decimal's text without trailing fractional zeros (and without a point left bare)."""
    # Spark's and MariaDB's string literals take a backslash as an escape, PostgreSQL's (standard) do not.
    escape = "\\" if dialect == "postgresql" else "\\\\"
    group = "$1" if dialect == "spark" else f"{escape}1"
    inner = f"regexp_replace({text}, '({escape}.[0-9]*[1-9])0+$', '{group}')"
    return f"regexp_replace({inner}, '{escape}.0+$', '')"


# A double's canonical text is its exact binary value, never a decimal rounding of it: Java's formatter rounds
# the decimal digits Double.toString chose (half up), C's printf the binary value, and the two differ by one in
# the last digit for about one double in 30 (3129881278.388425: 3.12988127838843e+09 and 3.12988127838842e+09).
_ZERO_HEX = "0x0.0p0"


def _double_spark(c: str) -> str:
    """A Spark double's ``Double.toHexString`` (``format_string``'s ``%a``), both zeros ``0x0.0p0``, null null
    (``format_string`` would write the text ``null``)."""
    return f"CASE WHEN {c} IS NULL THEN NULL WHEN {c} = 0 THEN '{_ZERO_HEX}' ELSE format_string('%a', {c}) END"


def _double_postgresql(number: str) -> str:
    """A PostgreSQL float8's ``Double.toHexString`` from its IEEE 754 bits (``float8send``): sign, ``0x1.`` and the
    52-bit fraction's hexadecimal digits without trailing zeros (``0x0.`` and exponent -1022 for a subnormal),
    ``p`` and the unbiased exponent; NaN and the infinities as Java writes them."""
    bits = f"encode(float8send({number}), 'hex')"
    exponent = f"(('x' || left({bits}, 3))::bit(12)::int & 2047)"
    fraction = f"rtrim(right({bits}, 13), '0')"
    return (f"CASE WHEN {number} IS NULL THEN NULL "
            f"WHEN {number} IN ('NaN', 'Infinity', '-Infinity') THEN {number}::text "
            f"WHEN {number} = 0 THEN '{_ZERO_HEX}' "
            f"ELSE CASE WHEN {number} < 0 THEN '-' ELSE '' END || CASE WHEN {exponent} = 0 "
            f"THEN '0x0.' || {fraction} || 'p-1022' "
            f"ELSE '0x1.' || coalesce(nullif({fraction}, ''), '0') || 'p' || ({exponent} - 1023)::text END END")


def _double_mysql(c: str) -> str:
    """A MariaDB/MySQL double's ``Double.toHexString`` computed exactly (neither has its bits or ``%a``): the
    exponent from ``LOG2`` corrected by powers of two, the 52-bit fraction as the integer ``(|c| / 2^e - 1) * 2^52``
    (a subnormal's as ``|c| * 2^1074``); each step is exact in doubles."""
    a = f"ABS({c})"
    # LOG2 rounds: the exponent is its floor or one beside it (kept in -1074..1023, as 2^1024 is out of range).
    guess = f"LEAST(1023, GREATEST(-1074, FLOOR(LOG2({a}))))"
    exponent = (f"CAST({guess} + CASE WHEN {a} / 2 >= POW(2, {guess}) THEN 1 WHEN {a} < POW(2, {guess}) THEN -1 "
                f"ELSE 0 END AS SIGNED)")

    def digits(fraction: str) -> str:
        return f"TRIM(TRAILING '0' FROM LOWER(LPAD(HEX(CAST({fraction} AS UNSIGNED)), 13, '0')))"

    normal = f"COALESCE(NULLIF({digits(f'({a} / POW(2, {exponent}) - 1) * 4503599627370496')}, ''), '0')"
    subnormal = digits(f"{a} * POW(2, 1022) * 4503599627370496")
    return (f"CASE WHEN {c} IS NULL THEN NULL WHEN {c} = 0 THEN '{_ZERO_HEX}' ELSE CONCAT(IF({c} < 0, '-', ''), "
            f"IF({a} < POW(2, -1022), CONCAT('0x0.', {subnormal}, 'p-1022'), "
            f"CONCAT('0x1.', {normal}, 'p', {exponent}))) END")


def value_text(column: ComparedColumn, dialect: Dialect) -> str:
    """The SQL of ``column``'s canonical text in ``dialect`` (null for a null value)."""
    c = quote(column.name, dialect)
    kind = column.canonical
    if dialect == "spark":
        return {
            "integer": f"CAST({c} AS STRING)", "boolean": f"CAST({c} AS STRING)",
            "decimal": _strip_zeros(f"CAST({c} AS STRING)", dialect),
            "double": _double_spark(c),
            "date": f"date_format({c}, 'yyyy-MM-dd')",
            "wall_time": f"date_format({c}, 'yyyy-MM-dd HH:mm:ss.SSSSSS')",
            "instant": f"CAST(unix_micros({c}) AS STRING)",
            "bytes": f"hex({c})", "time": c, "text": c,
        }[kind]
    if dialect == "postgresql":
        # A real's exact binary value is not what Debezium sends: its shortest text is.
        number = f"{c}::text::float8" if column.source_type == "real" else f"{c}::float8"
        return {
            "integer": f"{c}::text", "boolean": f"{c}::text",
            "decimal": _strip_zeros(f"{c}::numeric::text", dialect),
            "double": _double_postgresql(number),
            "date": f"to_char({c}, 'YYYY-MM-DD')",
            "wall_time": f"to_char({c}, 'YYYY-MM-DD HH24:MI:SS.US')",
            "instant": f"(extract(epoch from {c}) * 1000000)::numeric(30, 0)::text",
            "bytes": f"upper(encode({c}, 'hex'))",
            "time": f"to_char({c}::interval, 'HH24:MI:SS.US')", "text": f"{c}::text",
        }[kind]
    return {
        "integer": f"CAST({c} AS CHAR)", "boolean": f"CAST({c} AS CHAR)",
        "decimal": _strip_zeros(f"CAST({c} AS CHAR)", dialect),
        "double": _double_mysql(c),
        "date": f"DATE_FORMAT({c}, '%Y-%m-%d')",
        "wall_time": f"DATE_FORMAT({c}, '%Y-%m-%d %H:%i:%s.%f')",
        # The session's time zone is UTC (io.reconcile), so the epoch seconds are the instant's.
        "instant": f"CAST(UNIX_TIMESTAMP({c}) * 1000000 AS DECIMAL(30, 0))",
        "bytes": f"HEX({c})", "time": f"TIME_FORMAT({c}, '%H:%i:%s.%f')", "text": f"CAST({c} AS CHAR)",
    }[kind]


def _part(text: str, dialect: Dialect) -> str:
    """A value's text prefixed with its length, or the null text: parts never run together alike."""
    if dialect == "spark":
        return f"coalesce(concat(CAST(char_length({text}) AS STRING), ':', {text}), '{NULL_TEXT}')"
    if dialect == "postgresql":
        return f"coalesce(length({text})::text || ':' || {text}, '{NULL_TEXT}')"
    return f"COALESCE(CONCAT(CHAR_LENGTH({text}), ':', {text}), '{NULL_TEXT}')"


def row_text(columns: Sequence[ComparedColumn], dialect: Dialect) -> str:
    """The SQL of the canonical text of a row's ``columns``."""
    return f"concat_ws('|', {', '.join(_part(value_text(column, dialect), dialect) for column in columns)})"


def _hex_number(text: str, digits: int, dialect: Dialect) -> str:
    """The first ``digits`` hexadecimal digits of ``md5(text)`` as a non-negative integer."""
    if dialect == "spark":
        return f"CAST(conv(substr(md5({text}), 1, {digits}), 16, 10) AS DECIMAL(38, 0))"
    if dialect == "postgresql":
        return f"('x' || substr(md5({text}), 1, {digits}))::bit({digits * 4})::bigint"
    return f"CAST(CONV(SUBSTR(MD5({text}), 1, {digits}), 16, 10) AS UNSIGNED)"


def bucket_of(key_columns: Sequence[ComparedColumn], buckets: int, dialect: Dialect) -> str:
    """The SQL of a row's key bucket, ``0 .. buckets - 1``: the same number on every side."""
    return f"MOD({_hex_number(row_text(key_columns, dialect), _BUCKET_DIGITS, dialect)}, {buckets})"


def key_display(key_columns: Sequence[ComparedColumn], dialect: Dialect) -> str:
    """The SQL of a key as a person reads it: its values' canonical texts, comma-separated."""
    parts = [f"coalesce({value_text(column, dialect)}, 'null')" for column in key_columns]
    return f"concat_ws(', ', {', '.join(parts)})"


@dataclass(frozen=True)
class TableQueries:
    """The queries of one side of one table: per bucket (count, checksum), and per row of some buckets its
    key's text, the key as displayed and the row's md5."""

    relation: str
    key_columns: tuple[ComparedColumn, ...]
    columns: tuple[ComparedColumn, ...]
    buckets: int
    dialect: Dialect
    where: str | None = None  # which rows of the relation stand for the table's rows (apply mode)

    def _filter(self, extra: str | None = None) -> str:
        conditions = [condition for condition in (self.where, extra) if condition]
        return f" WHERE {' AND '.join(conditions)}" if conditions else ""

    def checksums(self) -> str:
        """``bucket, rows, checksum`` per non-empty bucket."""
        bucket = bucket_of(self.key_columns, self.buckets, self.dialect)
        checksum = _hex_number(row_text(self.columns, self.dialect), _HASH_DIGITS, self.dialect)
        return (f"SELECT b, COUNT(*), SUM(h) FROM (SELECT {bucket} AS b, {checksum} AS h FROM {self.relation}"
                f"{self._filter()}) AS rows_of_buckets GROUP BY b")

    def rows_in(self, buckets: Sequence[int]) -> str:
        """``key text, key as displayed, row md5, bucket`` of each row in ``buckets``."""
        bucket = bucket_of(self.key_columns, self.buckets, self.dialect)
        within = f"{bucket} IN ({', '.join(str(int(b)) for b in sorted(buckets))})"
        return (f"SELECT {row_text(self.key_columns, self.dialect)}, {key_display(self.key_columns, self.dialect)}, "
                f"md5({row_text(self.columns, self.dialect)}), {bucket} FROM {self.relation}{self._filter(within)}")


def live_rows(mode: ApplyMode, dialect: Dialect = "spark") -> str | None:
    """Which rows of a Delta table in ``mode`` stand for the source's rows: scd1 every row, soft_delete those
    not marked deleted, scd2 the current versions."""
    if mode.current_column is not None:
        return quote(mode.current_column, dialect)
    if any(field.name == DELETED_COLUMN for field in mode.hidden_fields):
        return f"NOT coalesce({quote(DELETED_COLUMN, dialect)}, false)"
    return None


BucketSums = dict[int, tuple[int, int]]


def differing_buckets(source: BucketSums, delta: BucketSums) -> list[int]:
    """The buckets whose count or checksum differs between the two sides (absent: empty)."""
    return sorted(b for b in {*source, *delta} if source.get(b, (0, 0)) != delta.get(b, (0, 0)))


@dataclass(frozen=True)
class KeyRow:
    """One row of a bucket as ``TableQueries.rows_in`` reads it."""

    display: str  # the key as a person reads it
    digest: str  # the md5 of the row's canonical text
    bucket: int
    copies: int = 1  # rows with the key (more than one: a duplicated key, such as two current scd2 versions)


KeyRows = dict[str, KeyRow]  # by the key's canonical text


def key_rows(rows: Iterable[Sequence[Any]]) -> KeyRows:
    """``TableQueries.rows_in``'s rows by key text, a key's rows counted."""
    found: KeyRows = {}
    for key, display, digest, bucket in rows:
        seen = found.get(str(key))
        found[str(key)] = (KeyRow(str(display), str(digest), int(bucket)) if seen is None
                           else replace(seen, copies=seen.copies + 1))
    return found


@dataclass(frozen=True)
class KeyDifference:
    """A key whose row differs: ``missing`` (in the source, not in Delta), ``extra`` (in Delta only, or in more
    rows than at the source) or ``different`` (values differ)."""

    key: str
    display: str
    kind: Literal["missing", "extra", "different"]
    bucket: int


def key_differences(source: KeyRows, delta: KeyRows) -> dict[str, KeyDifference]:
    """The keys whose rows differ between the two sides, by key text."""
    found: dict[str, KeyDifference] = {}
    for key in {*source, *delta}:
        mine, theirs = source.get(key), delta.get(key)
        if mine is None:
            assert theirs is not None
            found[key] = KeyDifference(key, theirs.display, "extra", theirs.bucket)
        elif theirs is None or theirs.copies < mine.copies:
            found[key] = KeyDifference(key, mine.display, "missing", mine.bucket)
        elif theirs.copies > mine.copies:
            found[key] = KeyDifference(key, mine.display, "extra", mine.bucket)
        elif mine.digest != theirs.digest:
            found[key] = KeyDifference(key, mine.display, "different", mine.bucket)
    return found


# Keys a check lists by name for a repair; past this many, the repair reads their whole buckets.
MAX_LISTED_KEYS = 1000


@dataclass(frozen=True)
class DriftedRanges:
    """What drifted in a table, machine-readable: the check's metadata carries it, a repair's incremental
    snapshot reads it back as the WHERE of exactly those rows (``condition``). Buckets are hash buckets of the
    key (``bucket_of``), not ordered ranges: a drifted range is a bucket, narrowed to its drifted keys.

    Only the keys a snapshot can heal are listed: missing from Delta, or with different values (a snapshot
    re-reads the source's row); a key in Delta only (``extra``) has no source row to read."""

    buckets: int  # the bucket count the check split the key by
    key_columns: tuple[ComparedColumn, ...]
    drifted_buckets: tuple[int, ...]  # the buckets holding a key to heal
    keys: tuple[str, ...] | None  # those keys' canonical texts (``row_text``); None past ``MAX_LISTED_KEYS``
    extra_keys: int = 0  # keys in Delta only, which no snapshot heals

    @classmethod
    def of(cls, buckets: int, key_columns: Sequence[ComparedColumn], differences: Iterable[KeyDifference]
           ) -> DriftedRanges:
        """The ranges of ``differences`` found with ``buckets`` buckets over ``key_columns``."""
        healable = sorted((d for d in differences if d.kind != "extra"), key=lambda d: d.key)
        extra = sum(1 for d in differences if d.kind == "extra")
        keys = tuple(d.key for d in healable) if len(healable) <= MAX_LISTED_KEYS else None
        return cls(buckets, tuple(key_columns), tuple(sorted({d.bucket for d in healable})), keys, extra)

    def to_metadata(self) -> dict[str, Any]:
        """As JSON the check's metadata holds (``from_metadata`` reads it back)."""
        return {"buckets": self.buckets, "drifted_buckets": list(self.drifted_buckets),
                "key_columns": [{"name": c.name, "canonical": c.canonical, "source_type": c.source_type}
                                for c in self.key_columns],
                "keys": list(self.keys) if self.keys is not None else None, "extra_keys": self.extra_keys}

    @classmethod
    def from_metadata(cls, value: Mapping[str, Any]) -> DriftedRanges:
        """The ranges ``to_metadata`` wrote; ``ValueError`` naming what is wrong in anything else."""
        try:
            columns = tuple(ComparedColumn(str(c["name"]), c["canonical"], str(c["source_type"]))
                            for c in value["key_columns"])
            keys = value["keys"]
            ranges = cls(int(value["buckets"]), columns, tuple(int(b) for b in value["drifted_buckets"]),
                         tuple(str(k) for k in keys) if keys is not None else None, int(value.get("extra_keys", 0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"drifted ranges not as rows_match_source writes them ({exc!r}): {value}") from None
        unknown = [c.canonical for c in columns if c.canonical not in _CANONICALS]
        if unknown or not columns:
            raise ValueError(f"drifted ranges with no key column or an unknown canonical text {unknown}: {value}")
        return ranges

    def describe(self) -> str:
        """The ranges as a person reads them: the buckets, and the keys where listed."""
        what = f"{len(self.keys)} key(s)" if self.keys is not None else "every key"
        return f"{what} in bucket(s) {list(self.drifted_buckets)} of {self.buckets}"

    def condition(self, dialect: Dialect, fits: Callable[[str], bool] = lambda _: True) -> str | None:
        """The SQL predicate (``dialect``'s) true for exactly the listed keys' rows, or, when the keys are not
        listed or that predicate does not ``fit`` (the signal that carries it has a size limit), for every row
        of the drifted buckets; None when that does not fit either (or nothing is to heal)."""
        if not self.drifted_buckets:
            return None
        by_keys = self._keys_condition(dialect) if self.keys is not None else None
        if by_keys is not None and fits(by_keys):
            return by_keys
        bucket = bucket_of(self.key_columns, self.buckets, dialect)
        by_buckets = f"{bucket} IN ({', '.join(str(b) for b in self.drifted_buckets)})"
        return by_buckets if fits(by_buckets) else None

    def _keys_condition(self, dialect: Dialect) -> str | None:
        """``(c1, c2) IN ((v1, v2), ...)``: an integer key column compared as itself (an index serves it),
        another by its canonical text; None when a key has a null part (no ``IN`` matches a null)."""
        assert self.keys is not None
        rows: list[str] = []
        for key in self.keys:
            values = [value for value in key_values(key) if value is not None]
            if len(values) != len(self.key_columns):
                return None
            rows.append(", ".join(_literal(column, value, dialect)
                                  for column, value in zip(self.key_columns, values, strict=True)))
        sides = [quote(c.name, dialect) if c.canonical == "integer" else value_text(c, dialect)
                 for c in self.key_columns]
        if len(sides) == 1:
            return f"{sides[0]} IN ({', '.join(rows)})"
        return f"({', '.join(sides)}) IN ({', '.join(f'({row})' for row in rows)})"


_CANONICALS = set(get_args(Canonical))
_INTEGER_TEXT = re.compile(r"^-?[0-9]+$")


def key_values(key: str) -> list[str | None]:
    """The canonical texts of a key's columns from its text (``row_text``: ``length:text`` or ``~`` for a null,
    joined by ``|``); ``ValueError`` for a text not of that form."""
    values: list[str | None] = []
    at = 0
    while True:
        if key.startswith(NULL_TEXT, at):
            values.append(None)
            at += len(NULL_TEXT)
        else:
            colon = key.find(":", at)
            if colon < 0 or not key[at:colon].isdigit():
                raise ValueError(f"not a key's canonical text: {key!r}")
            end = colon + 1 + int(key[at:colon])
            if end > len(key):
                raise ValueError(f"not a key's canonical text: {key!r}")
            values.append(key[colon + 1:end])
            at = end
        if at == len(key):
            return values
        if key[at] != "|":
            raise ValueError(f"not a key's canonical text: {key!r}")
        at += 1


def _literal(column: ComparedColumn, value: str, dialect: Dialect) -> str:
    """``value`` (a canonical text of ``column``) as an SQL literal of ``dialect``: a number for an integer
    column, else a string compared with the column's canonical text."""
    if column.canonical == "integer":
        if not _INTEGER_TEXT.match(value):
            raise ValueError(f"key column {column.name}: {value!r} is not an integer")
        return value
    text = value.replace("'", "''")
    # MariaDB's and MySQL's string literals take a backslash as an escape (unless NO_BACKSLASH_ESCAPES).
    return f"'{text.replace(chr(92), chr(92) * 2)}'" if dialect == "mysql" else f"'{text}'"
