"""The SQL pieces both writers render: quoted identifiers in each engine's dialect, and the rows a rename's
copy updates."""

from __future__ import annotations

from collections.abc import Callable


def quote_datafusion(name: str) -> str:
    """Quote an identifier for delta-rs (DataFusion SQL)."""
    return '"' + name.replace('"', '""') + '"'


def quote_spark(name: str) -> str:
    """Quote an identifier (or a path inside ``delta.`...```) for Spark SQL."""
    return "`" + name.replace("`", "``") + "`"


def renamed_rows(before_position: str, changed_at: str, quote: Callable[[str], str]) -> str:
    """The rows a rename's copy updates: those whose change (``changed_at``: a row's position, or an scd2
    version's start) came before the rename (a position starts with its event's source position, which sorts
    as the DDL's does); rows changed since hold the new column's own value."""
    position = before_position.replace("'", "''")
    return f"{quote(changed_at)} < '{position}'"
