"""Apply modes: how a table's decoded events become the rows of its Delta table.

One object per mode (and one for MongoDB documents, which rebuilds whole documents on top of a
mode) owns everything that differs between them: the hidden columns the table carries, the rows
its MERGE takes, its MERGE clauses, whether the MERGE evolves the schema itself, and whether the
next batch may be folded before this one is committed. Callers ask ``apply_mode(name, kind)`` for
the object and never compare mode names.

Every mode keeps the placeholder rule: a value the connector left unavailable (PostgreSQL TOAST,
Oracle LOBs) is unchanged, so the rows take the value the table holds for the key, or for a primary-key
change's create the old key's (``keep_unavailable``, ``core.key_changes``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import ClassVar, Literal

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_assets.core.arrow import to_arrow
from cdc_assets.core.envelope import ERROR_COLUMN, TRUNCATE_OP
from cdc_assets.core.fold import BatchSummary, bad_events, fold_batch
from cdc_assets.core.history import (
    CLOSE_AT_COLUMN,
    CLOSE_TS_COLUMN,
    IN_PLACE_COLUMN,
    KIND_COLUMN,
    LATEST_COLUMN,
    history_versions,
    latest_positions,
)
from cdc_assets.core.key_changes import ORIGIN_COLUMN, KeyChanges
from cdc_assets.core.layout import (
    CURRENT_COLUMN,
    DELETED_COLUMN,
    DOCUMENT_KINDS,
    HIDDEN_FIELDS,
    MONGODB_DOCUMENT_COLUMN,
    OP_COLUMN,
    POSITION_COLUMN,
    SOURCE_TS_COLUMN,
    UNAVAILABLE_COLUMN,
    VALID_FROM_COLUMN,
    VALID_FROM_TS_COLUMN,
    VALID_TO_COLUMN,
    VALID_TO_TS_COLUMN,
    ChangeEventLayout,
)
from cdc_assets.core.mongodb import BASE_DOCUMENT_COLUMN, BASE_POSITION_COLUMN, replayed_events
from cdc_assets.core.truncation import Truncation

ApplyModeName = Literal["scd1", "soft_delete", "scd2"]

# Source-only columns that steer the MERGE and never reach the table.
HELPER_PREFIX = "_merge_"

# What the table holds for some keys: ``stored(keys, columns)`` gives ``columns`` of the table's rows
# whose key is in ``keys`` (an Arrow table of key columns), or None when there is no table yet.
StoredRows = Callable[[pa.Table, Sequence[str]], "pa.Table | None"]
Quote = Callable[[str], str]


@dataclass(frozen=True)
class Clause:
    """One WHEN clause: ``delete``, ``update`` (``assignments`` None: every column) or ``insert``."""

    action: Literal["delete", "update", "insert"]
    predicate: str | None = None
    assignments: Mapping[str, str] | None = None


@dataclass(frozen=True)
class MergePlan:
    """A MERGE with quoted identifiers: its ON condition, WHEN MATCHED, WHEN NOT MATCHED and WHEN NOT MATCHED BY
    SOURCE clauses in order."""

    condition: str
    matched: list[Clause]
    not_matched: list[Clause]
    not_matched_by_source: list[Clause] = field(default_factory=list)


class ApplyMode(ABC):
    """The rules of one apply mode. Subclasses are stateless; ``apply_mode`` hands out instances."""

    name: ApplyModeName
    # The hidden columns a table carries in this mode, after its row columns.
    hidden_fields: tuple[T.StructField, ...] = HIDDEN_FIELDS
    # The MERGE adds the batch's new columns itself (schema evolution); else the writer adds them first.
    evolves_schema: ClassVar[bool] = True
    # The fold reads nothing of the table but placeholders' values, so the next batch may be folded
    # while this one is merged (and is folded again if it kept a placeholder's value).
    folds_ahead: ClassVar[bool] = True
    # The column that marks the rows holding a key's current values (None: every row does).
    current_column: ClassVar[str | None] = None
    # The hidden column holding the source position of the change a row stands for (a rename's copy
    # compares it with the DDL's position).
    changed_at_column: ClassVar[str] = POSITION_COLUMN

    # The fold is ``fold_batch`` alone, which a shared plan computes for several tables of one layout at once
    # (``core.fold.fold_tables``, then ``completed`` per table); False where the fold reads the table.
    folds_together: ClassVar[bool] = True

    def rows(self, decoded: DataFrame, layout: ChangeEventLayout, stored: StoredRows) -> tuple[pa.Table, BatchSummary]:
        """The rows to MERGE from a batch's decoded events, and the batch summary; no placeholder left."""
        rows, summary = self._fold(decoded, layout, stored)
        return self.completed(rows, summary, decoded, layout, stored)

    def completed(self, rows: pa.Table, summary: BatchSummary, decoded: DataFrame, layout: ChangeEventLayout,
                  stored: StoredRows) -> tuple[pa.Table, BatchSummary]:
        """``rows`` folded from a batch's ``decoded`` events made what its MERGE takes: the values the batch
        left unavailable taken from the table (``keep_unavailable``), and the mode's own columns."""
        ignored_only = [name for name in layout.ignored_nulls if name not in layout.unavailable_tests]
        rows, summary = keep_unavailable(rows, summary, layout.key_columns, stored, self.current_column,
                                         KeyChanges(decoded, layout), ignored_only)
        return self._finish(rows), summary

    def _fold(self, decoded: DataFrame, layout: ChangeEventLayout, stored: StoredRows
              ) -> tuple[pa.Table, BatchSummary]:
        return fold_batch(decoded, layout)

    def _finish(self, rows: pa.Table) -> pa.Table:
        return rows

    @abstractmethod
    def merge_plan(self, key_columns: Sequence[str], columns: Sequence[str], quote: Quote,
                   truncation: Truncation | None = None) -> MergePlan:
        """The MERGE of rows with ``columns`` into the table, identifiers quoted by ``quote``; with
        ``truncation``, it also removes the table's rows from before that TRUNCATE (``core.truncation``),
        whose batch rows all come after it."""


def _key_condition(key_columns: Sequence[str], quote: Quote) -> str:
    return " AND ".join(f"t.{quote(name)} = s.{quote(name)}" for name in key_columns)


_NEWER = f"s.{POSITION_COLUMN} > t.{POSITION_COLUMN}"


def _text(value: str) -> str:
    """A SQL string literal (both writers' dialects)."""
    return "'" + value.replace("'", "''") + "'"


def _moment(value: datetime | None) -> str:
    """A SQL timestamp literal in UTC (both writers' dialects), or NULL."""
    if value is None:
        return "NULL"
    utc = value.astimezone(timezone.utc) if value.tzinfo is not None else value
    return f"CAST({_text(utc.strftime('%Y-%m-%dT%H:%M:%S.%fZ'))} AS TIMESTAMP)"


def _before(column: str, truncation: Truncation) -> str:
    """The target rows a TRUNCATE removes: changed before it."""
    return f"t.{column} < {_text(truncation.position)}"


class Scd1(ApplyMode):
    """One row per live key: a newer delete removes the row, a newer change replaces it, an absent
    key is inserted."""

    name = "scd1"

    def merge_plan(self, key_columns: Sequence[str], columns: Sequence[str], quote: Quote,
                   truncation: Truncation | None = None) -> MergePlan:
        # A batch key's row from before the TRUNCATE is replaced by the batch's newer row, or deleted.
        truncated = [Clause("delete", _before(POSITION_COLUMN, truncation))] if truncation else []
        return MergePlan(_key_condition(key_columns, quote),
                         [Clause("delete", f"s.{OP_COLUMN} = 'd' AND {_NEWER}"), Clause("update", _NEWER)],
                         [Clause("insert", f"s.{OP_COLUMN} <> 'd'")], truncated)


class SoftDelete(ApplyMode):
    """scd1 whose deletes only mark the row (``_cdc_deleted``) and record their position; a delete of
    an absent key is kept as a deleted row, so an older change can never resurrect it."""

    name = "soft_delete"
    hidden_fields = (*HIDDEN_FIELDS, T.StructField(DELETED_COLUMN, T.BooleanType()))

    def _finish(self, rows: pa.Table) -> pa.Table:
        return rows.append_column(DELETED_COLUMN, pc.equal(rows[OP_COLUMN], "d"))

    def merge_plan(self, key_columns: Sequence[str], columns: Sequence[str], quote: Quote,
                   truncation: Truncation | None = None) -> MergePlan:
        marks = {quote(name): f"s.{quote(name)}" for name in (DELETED_COLUMN, OP_COLUMN, POSITION_COLUMN,
                                                                SOURCE_TS_COLUMN)}
        truncated = []
        if truncation is not None:
            # Marked deleted at the TRUNCATE's position, so that no change from before it can revive the row.
            ended = {quote(DELETED_COLUMN): "true", quote(OP_COLUMN): "'d'",
                     quote(POSITION_COLUMN): _text(truncation.position),
                     quote(SOURCE_TS_COLUMN): _moment(truncation.source_ts)}
            truncated = [Clause("update", f"{_before(POSITION_COLUMN, truncation)} AND NOT "
                                          f"coalesce(t.{quote(DELETED_COLUMN)}, false)", ended)]
        return MergePlan(_key_condition(key_columns, quote),
                         [Clause("update", f"s.{OP_COLUMN} = 'd' AND {_NEWER}", marks), Clause("update", _NEWER)],
                         [Clause("insert")], truncated)


class Scd2(ApplyMode):
    """Every change is a version row with the positions and times it was valid (``core.history``):
    versions are inserted once, keyed by ``_cdc_valid_from``, and per-key close markers end the
    current version when the batch's first event is newer.

    Where some columns' history is not tracked (``ChangeEventLayout.untracked``), a change confined to them
    updates the current version in place, and the versions carry ``_cdc_position`` (``core.history``).

    Its MERGE does not evolve the schema: the source also carries the close markers' helper columns,
    which evolution would add to the table. Its fold reads the table (each key's latest position)."""

    name = "scd2"
    hidden_fields = (
        T.StructField(OP_COLUMN, T.StringType()),
        T.StructField(VALID_FROM_COLUMN, T.StringType()),
        T.StructField(VALID_FROM_TS_COLUMN, T.TimestampType()),
        T.StructField(VALID_TO_COLUMN, T.StringType()),
        T.StructField(VALID_TO_TS_COLUMN, T.TimestampType()),
        T.StructField(CURRENT_COLUMN, T.BooleanType()),
    )
    evolves_schema = False
    folds_ahead = False
    folds_together = False
    current_column = CURRENT_COLUMN
    changed_at_column = VALID_FROM_COLUMN

    def _fold(self, decoded: DataFrame, layout: ChangeEventLayout, stored: StoredRows
              ) -> tuple[pa.Table, BatchSummary]:
        decoded = decoded.persist()  # read twice: the fold (for the summary) and the versions
        try:
            _, summary = fold_batch(decoded, layout)
            keyed = decoded.where(F.col(OP_COLUMN) != TRUNCATE_OP)  # a TRUNCATE has no key: never a version
            keys = _good_keys(keyed, layout)
            # Where columns' history is not tracked, the current versions' tracked values and starts too.
            held = [CURRENT_COLUMN, VALID_FROM_TS_COLUMN, *[name for name in layout.row_type.fieldNames()
                                                             if name not in (*layout.key_columns, *layout.untracked)]]
            columns = [*layout.key_columns, VALID_FROM_COLUMN, VALID_TO_COLUMN, POSITION_COLUMN,
                       *(held if layout.untracked else [])]
            versions = stored(keys, columns) if keys.num_rows else None
            latest = current = None
            if versions is not None and versions.num_rows:
                frame = decoded.sparkSession.createDataFrame(versions)
                latest = latest_positions(frame, layout.key_columns)
                current = frame.where(F.col(CURRENT_COLUMN)) if layout.untracked else None
            return to_arrow(history_versions(keyed, layout, latest, current)), summary
        finally:
            decoded.unpersist()

    def merge_plan(self, key_columns: Sequence[str], columns: Sequence[str], quote: Quote,
                   truncation: Truncation | None = None) -> MergePlan:
        keys = _key_condition(key_columns, quote)
        condition = (f"{keys} AND ((s.{KIND_COLUMN} = 'version' AND t.{VALID_FROM_COLUMN} = s.{VALID_FROM_COLUMN}) "
                     f"OR (s.{KIND_COLUMN} = 'close' AND t.{CURRENT_COLUMN} "
                     f"AND t.{VALID_FROM_COLUMN} < s.{CLOSE_AT_COLUMN}))")
        close = {VALID_TO_COLUMN: f"s.{CLOSE_AT_COLUMN}", VALID_TO_TS_COLUMN: f"s.{CLOSE_TS_COLUMN}",
                 CURRENT_COLUMN: "false"}
        truncated = []
        if truncation is not None:
            # A version that lived past the TRUNCATE ends there: the batch's keys' current ones as the others',
            # and one an earlier batch ended later (a change from after the TRUNCATE, read before it).
            ended = _before(VALID_FROM_COLUMN, truncation)
            at, ts = _text(truncation.position), _moment(truncation.source_ts)
            close = {**close, VALID_TO_COLUMN: f"CASE WHEN {ended} THEN {at} ELSE s.{CLOSE_AT_COLUMN} END",
                     VALID_TO_TS_COLUMN: f"CASE WHEN {ended} THEN {ts} ELSE s.{CLOSE_TS_COLUMN} END"}
            truncated = [Clause("update", f"{ended} AND (t.{CURRENT_COLUMN} OR t.{VALID_TO_COLUMN} > {at})",
                                {VALID_TO_COLUMN: at, VALID_TO_TS_COLUMN: ts, CURRENT_COLUMN: "false"})]
        every_column = {quote(name): f"s.{quote(name)}" for name in columns if not name.startswith(HELPER_PREFIX)}
        matched = [Clause("update", f"s.{KIND_COLUMN} = 'close'", close)]
        if IN_PLACE_COLUMN in columns:
            # A change confined to untracked columns: the current version takes it, keeping its start.
            starts = {quote(VALID_FROM_COLUMN), quote(VALID_FROM_TS_COLUMN)}
            matched.append(Clause("update", f"s.{KIND_COLUMN} = 'version' AND s.{IN_PLACE_COLUMN}",
                                  {name: value for name, value in every_column.items() if name not in starts}))
        return MergePlan(condition, matched, [Clause("insert", f"s.{KIND_COLUMN} = 'version'", every_column)],
                         truncated)


class Documents(ApplyMode):
    """MongoDB collections, on any mode (``base``): each event's whole document is rebuilt from the document
    the table holds for its key and the batch's updates (``core.mongodb``), then the events carrying their
    documents are folded (scd1, soft_delete) or made versions (scd2) as ``base`` does with a table's events,
    and merged as ``base`` merges. An update that cannot be applied is a bad event. Its fold reads the table."""

    folds_ahead = False
    folds_together = False

    def __init__(self, base: ApplyMode):
        self.base = base
        self.name = base.name
        self.hidden_fields = base.hidden_fields

    def _held(self, keys: pa.Table, layout: ChangeEventLayout, stored: StoredRows, spark: SparkSession
              ) -> tuple[DataFrame | None, DataFrame | None]:
        """The keys' stored documents and latest positions (``core.mongodb``), and for versioned tables the
        keys' latest positions as ``core.history`` reads them."""
        names = [*layout.key_columns, MONGODB_DOCUMENT_COLUMN]
        if self.current_column is None:
            rows = stored(keys, [*names, POSITION_COLUMN, OP_COLUMN]) if keys.num_rows else None
            if rows is None or not rows.num_rows:
                return None, None
            frame = spark.createDataFrame(rows)
            return frame.select(*layout.key_columns, F.when(F.col(OP_COLUMN) != "d", F.col(MONGODB_DOCUMENT_COLUMN))
                                .alias(BASE_DOCUMENT_COLUMN), F.col(POSITION_COLUMN).alias(BASE_POSITION_COLUMN)), None
        rows = stored(keys, [*names, VALID_FROM_COLUMN, VALID_TO_COLUMN, self.current_column]) if keys.num_rows \
            else None
        if rows is None or not rows.num_rows:
            return None, None
        versions = spark.createDataFrame(rows)
        latest = latest_positions(versions, layout.key_columns)
        current = versions.where(F.col(self.current_column)).select(
            *layout.key_columns, F.col(MONGODB_DOCUMENT_COLUMN).alias(BASE_DOCUMENT_COLUMN))
        held = latest.join(current, list(layout.key_columns), "left").select(
            *layout.key_columns, BASE_DOCUMENT_COLUMN, F.col(LATEST_COLUMN).alias(BASE_POSITION_COLUMN))
        return held, latest

    def _fold(self, decoded: DataFrame, layout: ChangeEventLayout, stored: StoredRows
              ) -> tuple[pa.Table, BatchSummary]:
        decoded = decoded.persist()  # read twice: the fold (for the summary) and the documents
        try:
            # The decoded events carry no document fields yet: the replay reads them from the documents.
            fields = set(layout.document_fields.fieldNames())
            undeclared = replace(layout, row_type=T.StructType([f for f in layout.row_type.fields
                                                                 if f.name not in fields]))
            _, summary = fold_batch(decoded, undeclared)
            keys = _good_keys(decoded.where(F.col(OP_COLUMN) != TRUNCATE_OP), layout)
            held, latest = self._held(keys, layout, stored, decoded.sparkSession)
            # Versions need each event's document; a fold only each key's last.
            replayed = replayed_events(decoded, layout, held, every=self.current_column is not None).persist()
            try:  # read twice: the rows, the bad events
                if self.current_column is None:
                    rows, replay = fold_batch(replayed, layout)
                    problems = replay.bad_events
                else:
                    rows = to_arrow(history_versions(replayed, layout, latest))
                    problems = bad_events(replayed)
            finally:
                replayed.unpersist()
        finally:
            decoded.unpersist()
        if problems:
            summary = replace(summary, bad_events=tuple(sorted((*summary.bad_events, *problems))))
        return rows, summary

    def _finish(self, rows: pa.Table) -> pa.Table:
        return self.base._finish(rows)

    def merge_plan(self, key_columns: Sequence[str], columns: Sequence[str], quote: Quote,
                   truncation: Truncation | None = None) -> MergePlan:
        return self.base.merge_plan(key_columns, columns, quote, truncation)


def _documents(base: ApplyMode) -> Documents:
    """``Documents`` on ``base``, with the class-level rules of ``base`` that callers read."""
    rules = {"evolves_schema": base.evolves_schema, "current_column": base.current_column,
             "changed_at_column": base.changed_at_column}
    return type(f"{type(base).__name__}Documents", (Documents,), rules)(base)


_MODES: dict[str, ApplyMode] = {mode.name: mode for mode in (Scd1(), SoftDelete(), Scd2())}


def apply_mode(name: str, kind: str = "") -> ApplyMode:
    """The apply mode ``name`` (scd1, soft_delete or scd2) for a connector of ``kind`` (MongoDB: documents)."""
    try:
        mode = _MODES[name]
    except KeyError:
        raise ValueError(f"unknown apply mode '{name}' (expected {', '.join(_MODES)})") from None
    return _documents(mode) if kind in DOCUMENT_KINDS else mode


def _good_keys(decoded: DataFrame, layout: ChangeEventLayout) -> pa.Table:
    """The distinct keys of a batch's good events, as Arrow."""
    return to_arrow(decoded.where(F.col(ERROR_COLUMN).isNull()).select(*layout.key_columns).distinct())


def keep_unavailable(rows: pa.Table, summary: BatchSummary, key_columns: Sequence[str], stored: StoredRows,
                     current_column: str | None = None, key_changes: KeyChanges | None = None,
                     ignored_nulls: Collection[str] = ()) -> tuple[pa.Table, BatchSummary]:
    """Give the values the batch left unavailable (the placeholder: unchanged, and no event of the
    batch knew them) the value the table holds for the key (with ``current_column``: its current
    version's); for a primary-key change's create (``_cdc_origin``), the old key's value, known in the
    batch or held by the table (``key_changes``). Where the table has no row for the key the value was
    never captured and stays null, counted in the summary. The columns ``ignored_nulls`` (an update's
    null left unchanged, never the placeholder) are filled alike, and counted apart: a null written
    where the table had no row is the update's own value, not one lost."""
    if UNAVAILABLE_COLUMN not in rows.column_names:
        return rows, summary
    left = rows[UNAVAILABLE_COLUMN]
    origins = rows[ORIGIN_COLUMN] if ORIGIN_COLUMN in rows.column_names else pa.nulls(rows.num_rows, pa.string())
    pending = pc.fill_null(pc.greater(pc.list_value_length(left), 0), False)
    rows = rows.drop_columns([name for name in (UNAVAILABLE_COLUMN, ORIGIN_COLUMN) if name in rows.column_names])
    if not pc.any(pending).as_py():
        return rows, summary
    filled, lists = rows.filter(pending).to_pylist(), left.filter(pending).to_pylist()
    keys = list(key_columns)
    kept = never_seen = 0
    # Per value still to find: its row, its column and the key whose stored row holds it.
    wanted: list[tuple[dict[str, object], str, tuple[object, ...]]] = []
    for row, unknown, origin in zip(filled, lists, origins.filter(pending).to_pylist(), strict=True):
        for name in unknown:
            if origin is None or key_changes is None:
                wanted.append((row, name, tuple(row[k] for k in keys)))
                continue
            source, found = key_changes.source_of(origin, name)
            if source == "value":
                row[name], kept = found, kept + 1
            elif source == "stored":
                assert isinstance(found, tuple)
                wanted.append((row, name, found))
            else:
                never_seen += name not in ignored_nulls
    if wanted:
        lookup = list(dict.fromkeys(key for _, _, key in wanted))
        names = sorted({name for _, name, _ in wanted})
        key_table = pa.Table.from_pylist([dict(zip(keys, key, strict=True)) for key in lookup],
                                         schema=rows.select(keys).schema)
        stored_rows = stored(key_table, [*keys, *names, *filter(None, [current_column])])
        found_by_key = {tuple(row[k] for k in keys): row for row in (stored_rows.to_pylist() if stored_rows else [])
                        if current_column is None or row[current_column]}
        for row, name, key in wanted:
            stored_row = found_by_key.get(key)
            if stored_row is None:
                never_seen += name not in ignored_nulls
            else:
                row[name], kept = stored_row[name], kept + (name not in ignored_nulls)
    nulls = sum(name in ignored_nulls for unknown in lists for name in unknown)
    rows = pa.concat_tables([rows.filter(pc.invert(pending)), pa.Table.from_pylist(filled, schema=rows.schema)])
    return rows, replace(summary, unavailable_kept=kept, unavailable_never_seen=never_seen,
                         null_updates_from_table=nulls)
