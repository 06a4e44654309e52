"""The schema-evolution policy: what a table's Delta target becomes after its schema changes (parsed by
``core.schema_change``). Decisions only, no Delta, Kafka or Dagster: ``cdc_assets.schema_changes`` carries
them out, ``jobs.schema_changes`` runs that in an op.

Changes take effect in source order whatever order their runs finish in: each run records its change,
then brings the table to the registry's latest change of it by source position (``change_order``), so
a change that arrives after a later one only adds to the registry. Each change carries the table's
whole column list, so the latest change alone decides the table's state.

- CREATE: the Delta table is created with the announced columns (wide-type policy) and the hidden
  columns of its apply mode; the registry entry makes it an asset at the next code-location load.
  A CREATE of a table that exists (a snapshot's) is an ALTER to its columns.
- CREATE after a DROP (a table dropped and created again at the source, or any change of it after
  such a DROP, whatever order the runs take): the new incarnation starts empty. The old one's rows
  (its pending events merged first, unless its DROP's run did) are copied to
  ``<table path>__retired_<n>`` (n = 1, 2, ...: the first free one), a retired Delta table of their
  own, listed in the table property ``cdc_assets.earlier_incarnations``; then the table is emptied
  and takes the new incarnation's columns in one commit that keeps its history (time travel reads
  the old rows too) and its offsets, so its next merge reads on from the events after the old
  incarnation's. ``cdc_assets.recreated_after`` holds the position of the DROP it came after.
  Events of the new incarnation already in the topic when the old one's last events are merged go
  with the old rows (both are in one topic, merged up to its end).
- ALTER: added columns are added (nullable; existing rows read null). Widened types need nothing
  (wide-type policy). Dropped columns stay, nullable, listed in the table property
  ``cdc_assets.dropped_columns``. A rename found in the DDL (``RENAME COLUMN a TO b``,
  ``CHANGE a b <type>``) is a drop + add whose new column takes the old one's values in the rows
  last changed before the rename (by source position), so they read as the source does; noted in
  ``cdc_assets.renamed_columns``. A type change the policy cannot absorb (e.g. a decimal scale
  change) fails the run with a clear message: such a table needs a rewrite, or to be recreated and
  backfilled by an incremental snapshot.
- DROP: the table and its data stay. The table's pending change events (all made before the DROP)
  are merged first, then the asset is retired (``cdc_assets.retired`` property, registry status),
  and ``cdc_merge_job`` no longer selects it. A snapshot's ``DROP TABLE IF EXISTS`` never gets here
  (``SchemaChangeEvent.acted_on``). A RENAME TABLE is a DROP of the old name and a change of the
  new one, whose run merges the old name's pending events and copies its rows (a new name that has a
  Delta table already copies nothing: an incremental snapshot backfills it).

Before a DROP, a RENAME TABLE's copy or a RENAME COLUMN's copy, every pending event of the table is
merged, however many batches that takes (``merged_up_to``). A run records its change in the registry
only once the table has been brought to it: a failed run leaves the registry as it was (and the asset
as it was loaded), and its retry does the whole change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import types as T

from cdc_assets.core.apply_modes import ApplyModeName, apply_mode
from cdc_assets.core.columns import EVERY_COLUMN, ColumnChoices
from cdc_assets.core.layout import HIDDEN_PREFIX
from cdc_assets.core.schema_change import SchemaChangeError, TableChange, diff_schema, source_type_changes

RETIRED_PROPERTY = "cdc_assets.retired"
DROPPED_COLUMNS_PROPERTY = "cdc_assets.dropped_columns"
RENAMED_COLUMNS_PROPERTY = "cdc_assets.renamed_columns"
RECREATED_AFTER_PROPERTY = "cdc_assets.recreated_after"
EARLIER_INCARNATIONS_PROPERTY = "cdc_assets.earlier_incarnations"
RETIRED_COPY_SUFFIX = "__retired_"


@dataclass(frozen=True)
class RegistryEntry:
    """The latest announced state of one table, and the change that announced it."""

    connector: str
    table: str
    status: str  # "active" or "retired"
    primary_keys: tuple[str, ...]
    columns: T.StructType
    change: str = "CREATE"
    source_position: str = ""
    topic: str = ""
    partition: int = 0
    offset: int = 0

    @property
    def column_types(self) -> dict[str, str]:
        """``column -> Spark SQL type`` (the config's ``columns`` form)."""
        return {field.name: field.dataType.simpleString() for field in self.columns.fields}

    @property
    def coordinates(self) -> str:
        """Where its schema-change record is: ``<topic>[<partition>]@<offset>``."""
        return f"{self.topic}[{self.partition}]@{self.offset}"


@dataclass(frozen=True)
class AnnouncedChange:
    """One table change as a schema-change run applies it: the change, the connector that announced it,
    where (the DDL's source position, its schema-change record's coordinates) and the table's apply mode."""

    connector: str
    change: TableChange
    source_position: str
    topic: str
    partition: int
    offset: int
    apply_mode: ApplyModeName = "scd1"

    @property
    def coordinates(self) -> str:
        """Where its schema-change record is: ``<topic>[<partition>]@<offset>``."""
        return f"{self.topic}[{self.partition}]@{self.offset}"

    def is_entry(self, entry: RegistryEntry) -> bool:
        """Whether ``entry`` records this change (the same schema-change record)."""
        return (entry.topic, entry.partition, entry.offset) == (self.topic, self.partition, self.offset)


def change_order(row: Mapping[str, Any]) -> tuple:
    """The order of a table's changes: by source position, the schema-change topic's coordinates breaking
    ties (a snapshot's DDL shares one position; a change replayed after a connector restart repeats its
    position at a later offset). Never by when a run applied it: runs finish in any order."""
    return row["source_position"] or "", row["topic"] or "", row["partition"], row["offset"]


def superseded_by(history: Sequence[RegistryEntry], announced: AnnouncedChange) -> str | None:
    """The table's latest change in source order, described, when it is not ``announced`` (which arrived
    after it, and only adds to the registry: the table is brought to the latest); None when it is."""
    latest = history[-1]
    if announced.is_entry(latest):
        return None
    return f"{latest.change} at {latest.source_position} ({latest.coordinates})"


def schema_text(schema: T.StructType | None) -> str:
    """A table's columns as ``name type, ...`` for run metadata; ``(no table)`` when there is none."""
    return ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in schema.fields) if schema else "(no table)"


def last_drop(history: Sequence[RegistryEntry]) -> RegistryEntry | None:
    """The table's latest DROP in source order, None if it was never dropped."""
    return next((entry for entry in reversed(history) if entry.change == "DROP"), None)


def drop_mark(drop: RegistryEntry) -> str:
    """What ``cdc_assets.recreated_after`` holds for a table created again after ``drop``: its source position
    (shared by a replay of it after a connector restart), else its schema-change topic coordinates."""
    return drop.source_position or drop.coordinates


def holds_rows_from_before(properties: Mapping[str, str] | None, drop: RegistryEntry) -> bool:
    """Whether a table whose Delta properties are ``properties`` (None: no Delta table) holds the rows of an
    incarnation from before ``drop``, not started anew since."""
    return properties is not None and properties.get(RECREATED_AFTER_PROPERTY, "") != drop_mark(drop)


def columns_ever(history: Sequence[RegistryEntry]) -> T.StructType:
    """Every column the table's changes since its last DROP announced, in the order they first appeared, each
    with its latest type: what its Delta table holds after them in order, as a dropped column stays in Delta."""
    columns: dict[str, T.StructField] = {}
    drop = last_drop(history)
    for entry in history[history.index(drop) + 1:] if drop is not None else history:
        if entry.change != "DROP":
            columns.update({field.name: field for field in entry.columns.fields})
    return T.StructType(list(columns.values()))


@dataclass(frozen=True)
class Evolution:
    """What a CREATE or ALTER does to the table's Delta target (``plan_evolution``)."""

    columns: T.StructType  # to add: the announced ones new to it, and the hidden ones for a new table
    properties: dict[str, str]  # table properties to set: only those that differ from its current ones
    dropped: list[str]  # columns the latest change no longer lists: they stay, nullable
    renames: list[tuple[str, str]]  # (old, new) columns whose values the rows last changed before it copy
    widened: list[str]  # columns whose type widened at the source: nothing to do (wide-type policy)
    source_type_changes: list[str]  # ``column: old source type -> new``, since the change before

    @property
    def alters_table(self) -> bool:
        """Whether the table needs a commit for its columns or properties (a snapshot's CREATE of a table as it
        is needs none, not even a property)."""
        return bool(self.columns.fields or self.properties)


def plan_evolution(announced: AnnouncedChange, history: Sequence[RegistryEntry], before: T.StructType | None,
                   properties: Mapping[str, str], choices: ColumnChoices = EVERY_COLUMN) -> Evolution:
    """The evolution of a table whose Delta schema is ``before`` (None: no table yet) and properties
    ``properties`` to its changes' columns (``columns_ever``) that it keeps (``choices``: a column it does not
    keep is never added), the latest change (a CREATE or ALTER) deciding which are dropped: the same table
    whatever order the changes' runs took. A ``SchemaChangeError`` when a type changes in a way the wide-type
    policy cannot absorb."""
    latest = history[-1]
    diff = diff_schema(before or T.StructType([]), choices.kept(columns_ever(history), latest.primary_keys))
    if diff.refused:
        raise SchemaChangeError(
            f"{announced.topic} partition {announced.partition} offset {announced.offset}: {announced.change.type} "
            f"of {announced.change.name} changes types the wide-type policy cannot absorb: {list(diff.refused)}; "
            "rewrite the table (or recreate it and request an incremental snapshot)")
    held = [*(before.fieldNames() if before else []), *(field.name for field in diff.added)]
    dropped = [name for name in held if name not in latest.columns.fieldNames() and not name.startswith(HIDDEN_PREFIX)]
    wanted_properties = {DROPPED_COLUMNS_PROPERTY: ",".join(dropped)}
    drop = last_drop(history)
    if drop is not None:  # a table created after a DROP holds only the rows since (``incarnation_properties``)
        wanted_properties[RECREATED_AFTER_PROPERTY] = drop_mark(drop)
    renames = [(old, new) for old, new in announced.change.renames if old in held and new in held]
    if renames:
        noted = [pair for pair in properties.get(RENAMED_COLUMNS_PROPERTY, "").split(",") if pair]
        noted += [f"{old}->{new}" for old, new in renames if f"{old}->{new}" not in noted]
        wanted_properties[RENAMED_COLUMNS_PROPERTY] = ",".join(noted)
    hidden = apply_mode(announced.apply_mode).hidden_fields
    added = T.StructType([*diff.added, *hidden]) if before is None else T.StructType(list(diff.added))
    source_changes = source_type_changes(history[-2].columns, latest.columns) if len(history) > 1 else []
    return Evolution(
        columns=added,
        properties={k: v for k, v in wanted_properties.items() if properties.get(k, "") != v},
        dropped=dropped, renames=renames,
        widened=sorted({*diff.widened, *(change.split(":")[0] for change in source_changes)}),
        source_type_changes=source_changes)


def earlier_incarnations(properties: Mapping[str, str]) -> list[str]:
    """The paths of a table's earlier incarnations' retired copies, oldest first."""
    return [path for path in properties.get(EARLIER_INCARNATIONS_PROPERTY, "").split(",") if path]


def retired_copy_path(path: str, number: int) -> str:
    """Where the ``number``-th earlier incarnation of the table at ``path`` is kept."""
    return f"{path}{RETIRED_COPY_SUFFIX}{number}"


def incarnation_columns(history: Sequence[RegistryEntry], mode: ApplyModeName,
                        choices: ColumnChoices = EVERY_COLUMN) -> T.StructType:
    """The columns of a table created again after a DROP: its changes' since then that it keeps (``choices``),
    and its apply mode's hidden ones."""
    kept = choices.kept(columns_ever(history), history[-1].primary_keys)
    return T.StructType([*kept.fields, *apply_mode(mode).hidden_fields])


def incarnation_properties(drop: RegistryEntry, earlier: Sequence[str], aside: str) -> dict[str, str]:
    """The properties of a table emptied for the incarnation after ``drop``, whose rows from before went to
    ``aside`` (after the copies ``earlier``): live, nothing dropped or renamed yet."""
    return {RETIRED_PROPERTY: "false", DROPPED_COLUMNS_PROPERTY: "", RENAMED_COLUMNS_PROPERTY: "",
            RECREATED_AFTER_PROPERTY: drop_mark(drop), EARLIER_INCARNATIONS_PROPERTY: ",".join([*earlier, aside])}


def is_retired(properties: Mapping[str, str]) -> bool:
    """Whether a Delta table with these properties is retired (its source table dropped)."""
    return properties.get(RETIRED_PROPERTY) == "true"


def merged_up_to(offsets: Mapping[int, int], stop: Mapping[int, int]) -> bool:
    """Whether a table's committed ``offsets`` reach ``stop`` (the topic's end as its first merge round saw it)
    in every partition: every event made before the DDL is merged (the run started after the DDL was read);
    a busy table's later events need not be chased."""
    return all(offsets.get(partition, 0) >= high for partition, high in stop.items())
