"""Per-table column choices (Databricks AUTO CDC's column lists): which columns the Delta table keeps
(``include_columns`` / ``exclude_columns``), which columns an update's null leaves unchanged
(``ignore_null_updates``) and, in scd2, which columns' changes open a new version (``track_history_columns`` /
``track_history_except_columns``).

They act on a table's layout (``core.layout``), once the batch's events show its columns: the columns
not kept leave the row type, so no rule downstream decodes, folds, merges or adds them; a column whose
update nulls are ignored is listed in ``ChangeEventLayout.ignored_nulls``, and the decode marks such a
null as the unavailable-value placeholder is marked, so the fold, scd2's versions and the pipeline
carry the earlier value exactly as they carry a placeholder's (``core.apply_modes.keep_unavailable``); the
columns whose history is not tracked are ``ChangeEventLayout.untracked``, for scd2's versions (``core.history``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, replace

from pyspark.sql import types as T

from cdc_assets.core.layout import ChangeEventLayout, LayoutError


@dataclass(frozen=True)
class ColumnChoices:
    """A table's column choices; the defaults keep every column and apply every null."""

    include: tuple[str, ...] | None = None  # the columns kept besides the keys (None: every one)
    exclude: tuple[str, ...] = ()  # the columns never kept
    ignore_null_updates: bool | tuple[str, ...] = False  # True: every non-key column
    track_history: tuple[str, ...] | None = None  # scd2: the columns whose change opens a version (None: all)
    track_history_except: tuple[str, ...] = ()  # scd2: the columns whose change alone updates the version

    @property
    def named(self) -> tuple[str, ...]:
        """Every column the choices name that the table's events must have, in the order written: not those
        of ``exclude``, which may name a column the source does not have yet (one a later schema change adds
        is then never kept, not even by a batch merged before the choices could name it)."""
        listed = self.ignore_null_updates if isinstance(self.ignore_null_updates, tuple) else ()
        return tuple(dict.fromkeys([*(self.include or ()), *listed, *(self.track_history or ()),
                                    *self.track_history_except]))

    def keeps(self, name: str, key_columns: Iterable[str] = ()) -> bool:
        """Whether the table keeps column ``name`` (a key column always)."""
        if name in key_columns:
            return True
        return name not in self.exclude and (self.include is None or name in self.include)

    def kept(self, columns: T.StructType, key_columns: Iterable[str] = ()) -> T.StructType:
        """``columns`` less those the table does not keep."""
        keys = tuple(key_columns)
        return T.StructType([field for field in columns.fields if self.keeps(field.name, keys)])

    def key_problem(self, key_columns: Sequence[str]) -> str | None:
        """What is wrong with excluding columns of a table whose key is ``key_columns``, None if nothing."""
        excluded = [name for name in self.exclude if name in key_columns]
        if excluded:
            return f"exclude_columns names key column(s) {excluded}: a table always keeps its key"
        return None

    def applied_to(self, layout: ChangeEventLayout, shown: Collection[str] | None = None) -> ChangeEventLayout:
        """``layout`` with only the kept columns and its ignored update nulls. ``shown``: the columns the batch's
        newest event shows (None: it shows none, e.g. a TRUNCATE's); a column the choices name that it lacks is
        unknown, a ``LayoutError`` naming it (as is a key column excluded). The newest event, not the layout,
        which also holds the Delta table's columns: a column renamed or dropped at the source is unknown from
        the first batch that shows it gone, not followed by a choice that would silently apply to nothing."""
        problem = self.key_problem(layout.key_columns)
        if problem:
            raise LayoutError(problem)
        if shown is not None:
            known = {*layout.key_columns, *shown}
            unknown = [name for name in self.named if name not in known]
            if unknown:
                raise LayoutError(f"the column choices name column(s) {unknown} that the table's events do not "
                                  f"have (its columns: {sorted(known)})")
        if self == EVERY_COLUMN:
            return layout
        row_type = self.kept(layout.row_type, layout.key_columns)
        carried = [name for name in row_type.fieldNames() if name not in layout.key_columns]
        if self.ignore_null_updates is True:
            ignored = tuple(carried)
        else:
            ignored = tuple(name for name in self.ignore_null_updates or () if name in carried)
        if self.track_history is not None:
            untracked = tuple(name for name in carried if name not in self.track_history)
        else:
            untracked = tuple(name for name in carried if name in self.track_history_except)
        return replace(layout, row_type=row_type, ignored_nulls=ignored, untracked=untracked,
                       logical_types={name: spec for name, spec in layout.logical_types.items()
                                      if name in row_type.fieldNames() or name in layout.key_columns})


# No choices: every column kept, every null applied.
EVERY_COLUMN = ColumnChoices()
