"""Several tables merged side by side in a thread pool, for a run that merges many.

No Dagster here: the assets hand ``merge_concurrently`` what one table's merge is (``merge``) and how to make
a Spark session, Kafka sources and Delta writers, and get each table's ``TableMerge`` back in their order.
"""

from __future__ import annotations

import collections
import contextlib
import queue
import threading
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from pyspark.sql import SparkSession

from cdc_assets.catalog import CapturedTable
from cdc_assets.config import BatchLimits
from cdc_assets.io.delta import DeltaRsWriter, DeltaWriter
from cdc_assets.io.kafka import KafkaSource
from cdc_assets.merge.quiet import TableState, caught_up, table_states
from cdc_assets.merge.shared import FirstBatch, first_batches, reads_first

K = TypeVar("K", bound=Hashable)
R = TypeVar("R")

# One table's merge: given its key, a Spark session, a Kafka source and a writer of its own, where its log
# lines go, and its first batch if it was read before (``shared.first_batches``); its result is the table's
# ``TableMerge.result``.
MergeOne = Callable[[K, SparkSession, KafkaSource, DeltaWriter, Callable[[str], None], FirstBatch | None], R]


class MergeFailed(Exception):
    """Several tables of a run failed to merge (each error is in the run's log)."""

    def __init__(self, failures: Sequence[tuple[CapturedTable, Exception]]):
        super().__init__(f"{len(failures)} tables failed to merge: " + "; ".join(
            f"{table.topic}: {str(error).splitlines()[0] if str(error) else type(error).__name__}"
            for table, error in failures))
        self.failures = list(failures)
        self.__cause__ = failures[0][1]


@dataclass
class TableMerge(Generic[R]):
    """One table's merge in a run: its result, or the error that stopped it, or ``caught_up`` (nothing new: not
    merged, no result); its log lines; and the writer that merged it, whose loaded table the blocking key check
    reads again (no second load)."""

    result: R | None = None
    error: Exception | None = None
    log: list[str] = field(default_factory=list)
    writer: DeltaWriter | None = None
    caught_up: TableState | None = None


def merge_concurrently(tables: Mapping[K, CapturedTable], merge: MergeOne[K, R], concurrent_tables: int,
                       spark_session: Callable[[], SparkSession], new_source: Callable[[], KafkaSource],
                       writer_for: Callable[[SparkSession], DeltaWriter],
                       shared: BatchLimits | None = None,
                       ends: Mapping[str, Mapping[int, int]] | None = None) -> Iterator[TableMerge[R]]:
    """Merge ``tables`` with up to ``concurrent_tables`` at once, each by ``merge``; yields each table's
    ``TableMerge`` in the order given.

    A small table's merge is mostly fixed costs (its Spark query's planning and scheduling, its Kafka
    read, its Delta commit): merged side by side, one table's Spark query runs while another's Python
    parts run (W2, in performance.md's git log). Each worker reads with a Kafka source of its own
    (``new_source``), kept for the tables it merges (a new client per table cost more than a small table's
    read); each table gets a writer of its own (``writer_for``). The tables cut to whole transactions merge
    one after another in one worker: they share the connector's transaction log and watermark.

    ``shared``: the run's batch limits, to read the tables' first batches before their merges and fold those
    of one layout in shared plans (``shared.first_batches``; none where ``shared_plan_max_records`` is 0).

    ``ends``: the end offsets of the tables' topics now (one look at them all): before any other read, each
    table's Delta log is looked at once (``quiet.table_states``); a table ``caught_up`` with its topic's ends is
    not merged (its ``TableMerge.caught_up`` says what its log told), and a run whose tables are all caught up
    starts no Spark session. With delta-rs, the others' merges (and first batches) go on from that look."""
    logs = {key: DeltaRsWriter() for key in tables} if ends is not None else {}
    states = table_states(tables, logs) if ends is not None else {}
    quiet = {key: state for key, state in states.items() if ends is not None and state.progress is not None
             and caught_up(state.progress.offsets, ends.get(tables[key].topic))}
    busy = {key: table for key, table in tables.items() if key not in quiet}
    if not busy:  # a run of checks alone, or of tables with nothing new, starts no Spark session
        for key in tables:
            yield TableMerge(writer=logs[key], caught_up=quiet[key])
        return
    session = spark_session()  # made once, here: the workers share it

    def writer_of(key: K) -> DeltaWriter:
        """The table's writer: the one that read its log above, where the run merges with delta-rs too."""
        writer = writer_for(session)
        return logs[key] if key in logs and isinstance(writer, DeltaRsWriter) else writer

    transactional = [key for key, table in busy.items() if table.transactions is not None]
    units = collections.deque([[key] for key, table in busy.items() if table.transactions is None])
    if transactional:
        units.appendleft(transactional)
    merges: dict[K, Future[TableMerge[R]]] = {key: Future() for key in busy}
    stopping = threading.Event()
    workers = min(concurrent_tables, len(units))
    sources: queue.SimpleQueue[KafkaSource] = queue.SimpleQueue()
    opened: list[KafkaSource] = []
    writers: dict[K, DeltaWriter] = {}
    firsts: Mapping[K, FirstBatch] = {}
    try:
        if shared is not None and shared.shared_plan_max_records > 0:
            opened = [new_source() for _ in range(workers)]
            writers = {key: writer_of(key) for key, table in busy.items() if reads_first(table)}
            # What the look at a table's log told holds for its first batch where the same writer reads on.
            known = {key: states[key] for key, writer in writers.items() if key in states and writer is logs[key]}
            firsts = first_batches(session, opened, {key: (busy[key], writer) for key, writer in writers.items()},
                                   shared, known)
    except BaseException:
        for source in opened:
            source.close()
        raise
    for source in opened:
        sources.put(source)

    def work() -> None:
        source = sources.get() if opened else new_source()
        with contextlib.closing(source):
            while not stopping.is_set():
                try:
                    unit = units.popleft()
                except IndexError:
                    return
                for key in unit:
                    writer = writers.get(key) or writer_of(key)
                    merged: TableMerge[R] = TableMerge(writer=writer)
                    try:
                        merged.result = merge(key, session, source, writer, merged.log.append, firsts.get(key))
                    except Exception as error:
                        merged.error = error
                    merges[key].set_result(merged)

    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cdc-merge")
    running = [pool.submit(work) for _ in range(workers)]
    try:
        for key in tables:
            yield TableMerge(writer=logs[key], caught_up=quiet[key]) if key in quiet else merges[key].result()
    finally:
        stopping.set()  # a run stopped early starts no more merges
        pool.shutdown(wait=True)
        for worker in running:
            worker.result()  # a worker's own failure (its Kafka source) is the run's
