"""The rules both writers follow, written once: where a table's progress is looked up, when a batch is
already applied, and what a merge that changed nothing commits. Each writer supplies the engine's hooks."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from cdc_assets.core.apply_modes import HELPER_PREFIX
from cdc_assets.io.delta.errors import TableMissingError, concurrent_commit_guard
from cdc_assets.io.delta.metadata import CommitRequest, TableProgress, progress_from_history
from cdc_assets.io.delta.outcomes import MergeOutcome
from cdc_assets.io.delta.table import DeltaTarget

# The latest commits read first for a table's progress: its latest batch commit is nearly always among them.
HISTORY_WINDOW = 100


def table_schema_of(rows: pa.Table) -> pa.Schema:
    """The target table's schema for a batch: its columns less the MERGE helpers."""
    return pa.schema([f for f in rows.schema if not f.name.startswith(HELPER_PREFIX)])


def latest_progress(recent: Sequence[Mapping[str, object]], app_id: str,
                    full: Callable[[], Sequence[Mapping[str, object]]]) -> TableProgress | None:
    """What the latest batch commit of ``app_id`` recorded: looked up in ``recent`` (the last
    ``HISTORY_WINDOW`` commit infos, newest first), and in the ``full`` history only where compactions and
    schema changes pushed it out of them (reading the whole log costs each merge that much more)."""
    return progress_from_history(recent, app_id) or progress_from_history(full(), app_id)


class WriterBase(ABC):
    """What both writers do alike around the engine: the already-applied check, and the offsets-only commit
    (after a merge that changed no row, or for a batch of tombstones only)."""

    name: str

    @abstractmethod
    def _exists(self, target: DeltaTarget) -> bool:
        """Whether there is a Delta table at ``target`` (a writer that keeps tables brings its copy up to date)."""

    @abstractmethod
    def _version(self, target: DeltaTarget) -> int:
        """The table's version as of the writer's last look at it."""

    @abstractmethod
    def _recorded_txn_version(self, target: DeltaTarget, app_id: str) -> int | None:
        """The version of ``app_id``'s app transaction the table holds, None if it holds none."""

    @abstractmethod
    def _commit_without_data(self, target: DeltaTarget, commit: CommitRequest) -> None:
        """Commit ``commit``'s app transaction and offsets to the table, with no data change."""

    def commit_progress(self, target: DeltaTarget, commit: CommitRequest) -> MergeOutcome:
        """Commit offsets with no data change (a batch of tombstones only) to an existing table."""
        if not self._exists(target):
            raise TableMissingError(target.path, "to commit offsets to")
        applied = self._if_applied(target, commit)
        if applied is not None:
            return applied
        with concurrent_commit_guard(target, commit):
            self._commit_without_data(target, commit)
        return MergeOutcome(delta_version=self._version(target))

    def _if_applied(self, target: DeltaTarget, commit: CommitRequest) -> MergeOutcome | None:
        """The outcome of a ``commit`` the table already holds (another run made it, or this one before a
        crash), None if it does not hold it: then the batch is to be applied."""
        if commit.applied_by(self._recorded_txn_version(target, commit.app_id)):
            return self._applied_before(target)
        return None

    def _applied_before(self, target: DeltaTarget) -> MergeOutcome:
        """The outcome of a batch found already committed: nothing changed by this writer."""
        return MergeOutcome(delta_version=self._version(target), already_applied=True)

    def _merged(self, target: DeltaTarget, commit: CommitRequest, before: int, metrics: Mapping[str, Any],
                counters: tuple[str, str, str]) -> MergeOutcome:
        """The outcome of a MERGE that started at table version ``before``, with the engine's ``metrics``
        named by ``counters`` (inserted, updated, deleted). A MERGE that changed no row (a replay of applied
        events) made no commit, so its offsets are committed alone: the next batch starts past them."""
        after = self._version(target)
        if after == before:
            return self.commit_progress(target, commit)
        inserted, updated, deleted = (int(metrics.get(name, 0) or 0) for name in counters)
        return MergeOutcome(delta_version=after, inserted=inserted, updated=updated, deleted=deleted)
