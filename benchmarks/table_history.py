"""What a table's Delta history costs its runs: the delta-rs calls of one table's merge in a run, as the table's
log grows.

Every load of a Delta table replays the JSON commits since its last checkpoint, so a table merged every few
minutes pays, at each load, for the commits since. For each history length (``--commits``: commits the table
has before a measured run), a table of ``--rows`` rows gets, per run, a batch of ``--changes`` changed rows the
way ``cdc_merge_job`` applies it: ``read_progress``, ``table_schema``, ``merge``, ``table_schema`` again (the
materialization's column schema) on one ``DeltaRsWriter``, then the key check's ``key_report`` on another. Two
ways, each on a table of its own, in turns:

- ``project``: as the project does it: tables created with ``NEW_TABLE_PROPERTIES`` (a checkpoint every 10
  commits), one load of the table a writer;
- ``reload``: what it did before: delta-rs's default checkpoint interval (100) and a load at every call;

and the reference, in the same rounds: ``bare``, one ``DeltaTable(path).merge(...)`` of the same batch into a
table of its own with the project's interval: the least a MERGE of the batch costs. Prints the CPU milliseconds
a run of each, the mean over ``--runs`` runs from the history length on (100: a whole checkpoint cycle of either
interval, as a table merged on a schedule is at any point of its cycle), and their ratios to ``bare``.

    python -m benchmarks.table_history [--commits 1,100,300] [--rows 500] [--changes 50] [--runs 100]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from cdc_assets.core.apply_modes import apply_mode
from cdc_assets.io.delta import NEW_TABLE_PROPERTIES, CommitRequest, DeltaRsWriter, DeltaTarget

_MODE = apply_mode("scd1", "postgresql")
_APP = "cdc_assets:history"


def changes(first: int, count: int, position: int) -> pa.Table:
    """``count`` upserts of keys from ``first``, all at source ``position``, as the fold hands them to a writer."""
    return pa.table({"id": pa.array(range(first, first + count), pa.int64()),
                     "name": pa.array([f"name {position} {key}" for key in range(first, first + count)]),
                     "_cdc_op": pa.array(["u"] * count),
                     "_cdc_position": pa.array([f"{position:020d}"] * count),
                     "_cdc_source_ts": pa.array([None] * count, pa.timestamp("us", tz="UTC"))})


class Table:
    """One benchmark table and how its runs go: ``way`` is ``project``, ``reload`` or ``bare``."""

    def __init__(self, root: Path, way: str, rows: int):
        self.target = DeltaTarget(str(root / way))
        self.way, self.rows, self.commits = way, rows, 0
        interval = "100" if way == "reload" else NEW_TABLE_PROPERTIES["delta.checkpointInterval"]
        write_deltalake(self.target.path, changes(0, rows, 0), configuration={"delta.checkpointInterval": interval})

    def run(self, changed: int) -> None:
        """One run's merge of ``changed`` rows (a commit)."""
        self.commits += 1
        batch = changes((self.commits * changed) % max(1, self.rows - changed), changed, self.commits)
        request = CommitRequest(_APP, self.commits, "history", {0: self.commits}, ("id",))
        if self.way == "bare":
            DeltaTable(self.target.path).merge(batch, "s.id = t.id", source_alias="s", target_alias="t") \
                .when_matched_update_all().when_not_matched_insert_all().execute()
            return
        writer = DeltaRsWriter()

        def call() -> DeltaRsWriter:
            return DeltaRsWriter() if self.way == "reload" else writer

        call().read_progress(self.target, _APP)
        call().table_schema(self.target)
        call().merge(self.target, batch, ("id",), request, _MODE)
        call().table_schema(self.target)
        DeltaRsWriter().key_report(self.target, ("id",))


def cpu_ms(action: Callable[[], None]) -> float:
    """This process's CPU milliseconds for ``action``."""
    started = time.process_time()
    action()
    return 1000 * (time.process_time() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commits", default="1,100,300", help="history lengths, comma-separated, ascending")
    parser.add_argument("--rows", type=int, default=500)
    parser.add_argument("--changes", type=int, default=50)
    parser.add_argument("--runs", type=int, default=100, help="measured runs from each history length on")
    args = parser.parse_args()
    ways = ("project", "reload", "bare")
    print("commits | CPU ms a run: project / reload / bare | project / bare | reload / bare")
    with tempfile.TemporaryDirectory(prefix="cdc-bench-history-") as work:
        tables = [Table(Path(work), way, args.rows) for way in ways]
        for length in (int(n) for n in args.commits.split(",")):
            for table in tables:  # grow each history to the length, unmeasured
                while table.commits < length:
                    table.run(args.changes)
            measured: dict[str, list[float]] = {way: [] for way in ways}
            for _ in range(args.runs):  # in turns: each way sees the machine's same moments
                for table in tables:
                    measured[table.way].append(cpu_ms(functools.partial(table.run, args.changes)))
            project, reload, bare = (statistics.mean(measured[way]) for way in ways)
            print(f"{length:7d} | {project:7.1f} / {reload:7.1f} / {bare:7.1f}{'':8s}| {project / bare:14.2f} "
                  f"| {reload / bare:13.2f}", flush=True)


if __name__ == "__main__":
    main()
