"""Each batch commit records the greatest source position the table has applied (``source_position`` in its
commit metadata), on both writers and every apply mode: a delete that leaves no row moves it, a late
incremental-snapshot read does not move it back, an offsets-only commit carries it on; rows_match_source reads
it from there (``io.reconcile.recorded_position``) instead of scanning the table."""

from __future__ import annotations

import json

import pytest

from cdc_assets.demo.events import envelope, postgres_source
from cdc_assets.io.reconcile import DeltaSide, recorded_position
from tests.support.merges import captured_table, run_batch, with_merge
from tests.support.topics import new_topic, produce

COLUMNS = {"id": "bigint", "v": "string"}


def change(lsn: int, op: str, key: int) -> list[tuple[bytes, bytes | None]]:
    """A PostgreSQL change event of row ``key`` at ``lsn`` (a delete followed by its tombstone)."""
    row = {"id": key, "v": f"{op}{lsn}"}
    source = postgres_source(lsn, 1_700_000_000_000 + lsn, "s", "t", snapshot="incremental" if op == "r" else "false")
    record = (json.dumps({"id": key}).encode(),
              envelope(op, row if op == "d" else None, None if op == "d" else row, source, 1_700_000_000_000 + lsn,
                       row_name="t.s.t.Value"))
    return [record, (record[0], None)] if op == "d" else [record]


@pytest.mark.parametrize("mode", ["scd1", "soft_delete", "scd2"])
def test_each_commit_records_the_greatest_source_position_applied(spark, broker, writer, tmp_path, mode):
    topic = new_topic(broker, "dbserver1.s.t")
    table = with_merge(captured_table(topic, tmp_path, columns=COLUMNS), apply_mode=mode)
    recorded = recorded_position(table.target, table.app_id)

    def after(*records: tuple[bytes, bytes | None]) -> str:
        produce(broker, topic, list(records))
        run_batch(spark, broker, writer, table)
        progress = writer.read_progress(table.target, table.app_id)
        assert progress is not None and progress.source_position == recorded()
        return progress.source_position[:16]  # the source part: the LSN in 16 hex digits

    assert after(*change(0x100, "c", 1), *change(0x200, "c", 2)) == f"{0x200:016x}"
    assert after(*change(0x300, "d", 2)) == f"{0x300:016x}"  # scd1: no row holds it
    assert after(*change(0x250, "r", 1)) == f"{0x300:016x}"  # an older read: applied, the position stays
    assert after((json.dumps({"id": 9}).encode(), None)) == f"{0x300:016x}"  # tombstone only: carried on

    delta = DeltaSide(spark, table.target.path, table.mode, recorded)
    scanned = DeltaSide(spark, table.target.path, table.mode)
    try:
        assert delta.position()[:16] == f"{0x300:016x}"
        if mode == "scd1":  # the rows alone hold no trace of the delete
            assert scanned.position()[:16] == f"{0x250:016x}"
    finally:
        delta.close()
        scanned.close()


def test_a_table_whose_latest_commit_recorded_no_position_is_scanned(spark, writer, tmp_path):
    """A table last written before commits recorded positions: ``DeltaSide.position`` falls back to the newest
    position its rows hold."""
    from cdc_assets.io.delta import DeltaTarget
    from tests.support.delta import SCD1, batch, commit

    target = DeltaTarget(str(tmp_path / "t"))
    writer.merge(target, batch(spark, (1, "a", "c", "07")), ["My Id"], commit(1, {0: 1}), SCD1)
    writer.commit_progress(target, commit(2, {0: 2}))  # as an older release committed: no source_position
    recorded = recorded_position(target, "cdc_assets:t")
    assert recorded() is None
    delta = DeltaSide(spark, target.path, SCD1, recorded)
    try:
        assert delta.position() == "07"
    finally:
        delta.close()
