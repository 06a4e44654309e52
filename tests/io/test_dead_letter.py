"""The dead-letter table as a merge run's checks read it: once for all their tables, again after a commit."""

from datetime import datetime, timezone

import pyarrow as pa

from cdc_assets.checks import RunReads
from cdc_assets.io.dead_letter import DEAD_LETTER_SCHEMA, write_dead_letters
from cdc_assets.io.delta import DeltaTarget
from cdc_assets.resources import DeltaResource


def _rows(*coordinates: tuple[str, int]) -> pa.Table:
    now = datetime.now(timezone.utc)
    return pa.Table.from_pylist([
        {"topic": topic, "partition": 0, "offset": offset, "key": b"k", "value": b"not json", "error": "bad",
         "table": topic.rsplit(".", 1)[-1], "dead_lettered_at": now} for topic, offset in coordinates],
        schema=DEAD_LETTER_SCHEMA)


def test_run_reads_count_dead_letters_per_topic_and_see_later_commits(tmp_path):
    # A run's checks share one read; a table merged after the first check may add dead letters, and its
    # own check must count them.
    target = DeltaTarget(str(tmp_path / "dead_letter"))
    reads = RunReads(DeltaResource(writer="delta-rs"))
    assert reads.dead_letters(target) == {}
    write_dead_letters(target, _rows(("p.s.a", 0)))
    assert reads.dead_letters(target) == {"p.s.a": 1}
    assert reads.dead_letters(target) == {"p.s.a": 1}  # unchanged: the counts of the first read
    write_dead_letters(target, _rows(("p.s.b", 4), ("p.s.a", 7)))
    assert reads.dead_letters(target) == {"p.s.a": 2, "p.s.b": 1}
