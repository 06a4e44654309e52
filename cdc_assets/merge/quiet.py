"""Tables with nothing new: a table whose latest batch commit recorded the offsets its topic ends at now
(``caught_up``, the rule's one place). A run tells them apart before it reads anything else of theirs: from
one look at every topic's end offsets (the caller's) and one at each table's Delta log (``table_states``), its
newest commit. A caught-up table then costs no Spark query, no Kafka read, no shared-plan read and no
second look at its log; a table with something new is merged by the writer that looked (its log not loaded
again).
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from pyspark.sql.types import StructType

from cdc_assets.catalog import CapturedTable
from cdc_assets.io.delta import DeltaRsWriter, TableProgress

K = TypeVar("K", bound=Hashable)

_LOG = logging.getLogger(__name__)
# Delta logs looked at side by side: a look waits on the store (an object store's round trips) more than it
# computes (a few ms of CPU a table on local disk), and delta-rs lets go of the GIL meanwhile.
LOOKS_AT_ONCE = 8


@dataclass(frozen=True)
class TableState:
    """What a table's Delta log told when a run looked at it: its latest batch commit's progress (None: no
    table, or no batch commit yet) and its schema."""

    progress: TableProgress | None
    schema: StructType | None


def caught_up(committed: Mapping[int, int] | None, ends: Mapping[int, int] | None) -> bool:
    """Whether a table whose latest batch commit recorded the offsets ``committed`` (None: none yet) has nothing
    new in its topic, whose partitions end at ``ends`` now (None: no such topic): the commit recorded exactly
    those offsets, for every partition. A partition the commit does not name (added since) makes the table's
    merge look. The merge schedule asks it of the offsets the latest materialization recorded."""
    return committed is not None and ends is not None and dict(committed) == dict(ends)


def table_states(tables: Mapping[K, CapturedTable], logs: Mapping[K, DeltaRsWriter]) -> dict[K, TableState]:
    """Each of ``tables``' ``TableState``, read by its writer in ``logs`` (the Delta log alone: its newest commit,
    no Spark), ``LOOKS_AT_ONCE`` tables at a time. A table whose log cannot be read here is left out: its merge
    reads it and reports what fails."""

    def look(key: K) -> TableState | None:
        table = tables[key]
        try:
            return TableState(*logs[key].read_current(table.target, table.app_id))
        except Exception:  # read again by the table's merge, which reports it
            _LOG.debug("%s: Delta log not read ahead of the merge", table.topic, exc_info=True)
            return None

    with ThreadPoolExecutor(max_workers=LOOKS_AT_ONCE, thread_name_prefix="cdc-table-state") as pool:
        looked = dict(zip(tables, pool.map(look, tables), strict=True))
    return {key: state for key, state in looked.items() if state is not None}
