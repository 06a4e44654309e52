"""What happened to one row: a key's changes in order, from the Delta log (scd1) or its versions (scd2)."""

import pytest

from cdc_assets import TableSpec
from cdc_assets.demo.events import encode_key, envelope, postgres_source
from cdc_assets.io.row_history import row_history
from tests.support.merges import captured_table, run_batch
from tests.support.topics import new_topic, produce


def event(op, key, value, lsn):
    row = {"id": key, "v": value}
    return encode_key({"id": key}), envelope(op, row if op == "d" else None, None if op == "d" else row,
                                             postgres_source(lsn, 1_700_000_000_000 + lsn, "s", "t"), lsn)


BATCHES = [[event("c", 1, "a", 10), event("c", 2, "x", 11)],
           [event("u", 1, "b", 20)],
           [event("u", 2, "y", 30)],  # touches another key only
           [event("u", 1, "c", 40), event("d", 1, None, 41), (encode_key({"id": 1}), None)]]


@pytest.mark.parametrize("apply_mode", ["scd1", "scd2"])
def test_a_keys_changes_come_back_in_order_with_their_commits(spark, broker, writer, tmp_path, apply_mode):
    topic = new_topic(broker, "history.s.t")
    table = captured_table(topic, tmp_path, apply_mode=apply_mode)
    for batch in BATCHES:
        produce(broker, topic, batch)
        run_batch(spark, broker, writer, table)
    # A path, as the README's example passes it: the table's columns tell whether it is scd2.
    history = row_history(table.target.path, {"id": 1})
    if apply_mode == "scd1":
        # created at version 1 (offsets to 2), updated at 2, deleted at 4; version 3 left it alone
        assert [(c.delta_version, c.offsets, c.row and c.row["v"]) for c in history] == [
            (1, {"0": 2}, "a"), (2, {"0": 3}, "b"), (4, {"0": 7}, None)]
        assert all(c.committed_at is not None for c in history)
    else:
        # one version per change; the delete closes the last one and adds none
        assert [(c.row["v"], c.row["_cdc_current"]) for c in history] == [("a", False), ("b", False), ("c", False)]
    spec = TableSpec(kind="postgresql", topic=topic, target=table.target.path, apply_mode=apply_mode)
    assert [c.row["v"] for c in row_history(spec, {"id": 2})][-1] == "y"
    assert row_history(table.target, {"id": 1}, scd2=apply_mode == "scd2") == history
