"""One captured table's settings: its keys and columns, apply mode, bad-event policy and Dagster details."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from cdc_assets.config.base import ConfigModel
from cdc_assets.config.schedules import MergeScheduleConfig
from cdc_assets.core.apply_modes import ApplyModeName
from cdc_assets.core.columns import ColumnChoices
from cdc_assets.core.layout import HIDDEN_PREFIX, MONGODB_DOCUMENT_COLUMN, document_field_type

_IDENTIFIER_PART = r"[^.\s]+"
_TABLE_NAME = re.compile(rf"^{_IDENTIFIER_PART}(\.{_IDENTIFIER_PART})?$")

Automation = Literal["eager", "none"]


class TableConfig(ConfigModel):
    """One captured table (Debezium: data collection), named ``schema.table``."""

    name: str
    key_columns: list[str] | None = None
    columns: dict[str, str] | None = Field(
        default=None, description="column -> Spark SQL type, or a Debezium/Connect logical type name "
                           "(io.debezium.time.MicroTimestamp), used when events carry no schema"
    )
    path: str | None = None
    topic: str | None = None
    on_bad_event: Literal["halt", "dead_letter"] = Field(
        default="halt", description="halt: commit nothing and fail; dead_letter: apply the rest, keep bad events "
                                    "in the pipeline's dead-letter table")
    apply_mode: ApplyModeName = "scd1"
    on_truncate: Literal["halt", "ignore", "apply"] = Field(
        default="halt", description="a TRUNCATE event (op t, skipped.operations=none): halt = stop before it, "
                                    "committing nothing, naming topic/partition/offset; ignore = skip it (counted); "
                                    "apply = remove the rows from before it, as the source did (soft_delete marks "
                                    "them deleted, scd2 ends their versions)")
    owners: list[str] = Field(default_factory=list, description="Dagster asset owners (emails or team:name)")
    tags: dict[str, str] = Field(default_factory=dict, description="Dagster asset tags")
    automation: Automation | None = Field(default=None, description="default: the connector's")
    max_capture_lag_s: float | None = Field(default=None, gt=0, description="capture-lag check bound")
    consistency: Literal["event", "transaction"] | None = Field(
        default=None, description="transaction: apply only whole transactions (default when the connector has "
                                  "transaction metadata on)")
    include_columns: list[str] | None = Field(
        default=None, description="the columns the Delta table keeps besides its key columns (default: every one)")
    exclude_columns: list[str] = Field(
        default_factory=list, description="columns the Delta table never keeps (a key column is always kept); a "
                                          "schema change adding one adds nothing")
    ignore_null_updates: bool | list[str] = Field(
        default=False, description="true (every column) or a list of columns: a null in an update (op u) keeps "
                                   "the value the table holds; a delete still deletes, a create writes its nulls")
    track_history_columns: list[str] | None = Field(
        default=None, description="scd2: the columns whose change opens a new version (default: every one); a "
                                  "change confined to the others updates the current version in place")
    track_history_except_columns: list[str] = Field(
        default_factory=list, description="scd2: the columns whose change alone updates the current version in "
                                          "place (instead of track_history_columns)")
    rows_match_source: MergeScheduleConfig | None = Field(
        default=None, description="this table's rows_match_source check on a cron of its own (cron, running, "
                                  "timezone) instead of its connector's; the other settings are the connector's")
    document_fields: dict[str, str] = Field(
        default_factory=dict, description="MongoDB: top-level field -> Spark SQL type (string, boolean, "
                                          "tinyint, smallint, int, bigint, float, double, decimal(p,s), date, "
                                          "timestamp), kept as a typed column beside the document")

    @field_validator("document_fields")
    @classmethod
    def _document_fields(cls, fields: dict[str, str]) -> dict[str, str]:
        for name, type_text in fields.items():
            if not name or "." in name or "'" in name or name.startswith(("$", HIDDEN_PREFIX)) \
                    or name == MONGODB_DOCUMENT_COLUMN:
                raise ValueError(f"document_fields: '{name}' is not a top-level field name a column can take (no "
                                 f"'.', quote or leading '$', not '{MONGODB_DOCUMENT_COLUMN}' nor {HIDDEN_PREFIX}*)")
            try:
                document_field_type(type_text)
            except ValueError as exc:
                raise ValueError(f"document_fields: field '{name}': {exc}") from None
        return fields

    @field_validator("name")
    @classmethod
    def _schema_dot_table(cls, name: str) -> str:
        if not _TABLE_NAME.match(name):
            raise ValueError(f"table name '{name}' must be '<schema>.<table>' (or '<table>')")
        return name

    @field_validator("key_columns")
    @classmethod
    def _non_empty_keys(cls, keys: list[str] | None) -> list[str] | None:
        if keys is not None and not keys:
            raise ValueError("key_columns must name at least one column")
        return keys

    @field_validator("include_columns", "exclude_columns", "ignore_null_updates", "track_history_columns",
                     "track_history_except_columns")
    @classmethod
    def _named_once(cls, names: Any, info: ValidationInfo) -> Any:
        if isinstance(names, list):
            if not names and info.field_name not in ("exclude_columns", "track_history_except_columns"):
                raise ValueError(f"{info.field_name} must name at least one column")
            duplicates = sorted({name for name in names if names.count(name) > 1})
            if duplicates:
                raise ValueError(f"{info.field_name} names columns more than once: {duplicates}")
        return names

    @model_validator(mode="after")
    def _consistent_column_choices(self) -> TableConfig:
        if self.include_columns is not None and self.exclude_columns:
            raise ValueError("include_columns and exclude_columns exclude each other: name the columns kept, or "
                             "those left out")
        tracking = {"track_history_columns": self.track_history_columns or [],
                    "track_history_except_columns": self.track_history_except_columns}
        if self.track_history_columns is not None and self.track_history_except_columns:
            raise ValueError("track_history_columns and track_history_except_columns exclude each other: name the "
                             "columns whose history is kept, or those whose is not")
        if any(tracking.values()) and self.apply_mode != "scd2":
            raise ValueError(f"track_history_columns / track_history_except_columns are for apply_mode scd2 (this "
                             f"table's is {self.apply_mode})")
        if any(tracking.values()) and self.on_truncate == "apply":
            # The current version a change updates in place may be one that the batch's TRUNCATE ends.
            raise ValueError("track_history_columns / track_history_except_columns do not go with on_truncate: "
                             "apply yet: use halt or ignore")
        choices = self.column_choices
        problem = choices.key_problem(self.key_columns or ())
        if problem:
            raise ValueError(problem)
        nulls = self.ignore_null_updates if isinstance(self.ignore_null_updates, list) else []
        for field, names in {"ignore_null_updates": nulls, **tracking}.items():
            keys = [name for name in names if name in (self.key_columns or ())]
            if keys:
                raise ValueError(f"{field} names key column(s) {keys}: a key never changes in an update")
            dropped = [name for name in names if not choices.keeps(name)]
            if dropped:
                raise ValueError(f"{field} names column(s) {dropped} that the table does not keep "
                                 "(include_columns / exclude_columns)")
        return self

    @property
    def column_choices(self) -> ColumnChoices:
        """The table's column choices (``core.columns``)."""
        nulls = self.ignore_null_updates
        tracked = self.track_history_columns
        return ColumnChoices(tuple(self.include_columns) if self.include_columns is not None else None,
                             tuple(self.exclude_columns), tuple(nulls) if isinstance(nulls, list) else nulls,
                             tuple(tracked) if tracked is not None else None,
                             tuple(self.track_history_except_columns))
