"""What the writers' operations report back: a merge, a compaction, a table's keys."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MergeOutcome:
    """What a merge did: rows changed and the table version after it."""

    delta_version: int
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    already_applied: bool = False


@dataclass(frozen=True)
class CompactionOutcome:
    """What a compaction did: data files before it, files removed and added, and the table version after."""

    files_before: int
    files_removed: int = 0
    files_added: int = 0
    delta_version: int = -1
    compacted: bool = False  # False: below the threshold, nothing committed


@dataclass(frozen=True)
class KeyReport:
    """What the key checks look at."""

    rows: int
    duplicate_keys: int
    null_keys: int
