"""Which captured tables need a backfill, and how: a table whose Delta target is missing or empty gets a
merge, and before it an incremental snapshot at the source only where its topic cannot fill it.

A topic can fill its table when it holds records and every partition is retained from offset 0:
its whole history is there (a compacted topic keeps each key's latest record, which is all the
table needs). Once retention (or a records deletion) has moved a partition's start past 0, changes
of keys that were not written since are gone, and only a snapshot of the source brings them back.
So a first deployment on topics that hold their history does not re-snapshot every table at the
source. No Dagster: ``sensors.backfill`` turns the answer into run requests.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from cdc_assets.catalog import CapturedTable
from cdc_assets.io.delta import open_table
from cdc_assets.io.kafka import SourceError, TopicProbe


def target_is_empty(table: CapturedTable) -> bool:
    """Whether the table's Delta target is missing or holds no rows."""
    target = open_table(table.target)
    return target is None or target.count() == 0


def topic_can_fill(probe: TopicProbe, table: CapturedTable) -> bool:
    """Whether the table's topic holds its whole history: records, every partition retained from offset 0."""
    try:
        offsets = probe.retained_offsets(table.topic)
    except SourceError:
        return False  # no topic yet: nothing to fill the table from
    return any(high > 0 for _, high in offsets.values()) and all(low == 0 for low, _ in offsets.values())


@dataclass(frozen=True)
class Backfill:
    """One table to backfill: a merge, after a snapshot at the source where ``snapshot`` says so."""

    table: CapturedTable
    snapshot: bool  # its topic cannot fill it (``topic_can_fill``)


def backfills(tables: Sequence[CapturedTable], requested: set[str], probe: TopicProbe
              ) -> tuple[list[Backfill], set[str]]:
    """The backfills of ``tables`` whose target is missing or empty and whose topics are not in ``requested``
    (backfilled already), and the new set of requested topics: a table leaves it once it has rows, so
    emptying it again backfills it again."""
    wanted: list[Backfill] = []
    still_requested = set()
    for table in tables:
        if not target_is_empty(table):
            continue
        still_requested.add(table.topic)
        if table.topic in requested:
            continue
        wanted.append(Backfill(table, snapshot=not topic_can_fill(probe, table)))
    return wanted, still_requested
