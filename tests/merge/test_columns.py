"""Per-table column choices through the real pipeline (broker, Spark, Delta), both writers: the columns a table
keeps (``include_columns`` / ``exclude_columns``) and the update nulls it ignores (``ignore_null_updates``),
compared with a plain-Python reference of what each choice means."""

from __future__ import annotations

import json
from datetime import timezone

import pytest

from cdc_assets.core.columns import ColumnChoices
from cdc_assets.core.layout import LayoutError
from cdc_assets.demo.events import envelope, postgres_source
from cdc_assets.io.delta import DeltaRsWriter
from tests.support.key_changes import scd2_versions
from tests.support.merges import captured_table, read_rows, run_batch, with_merge
from tests.support.topics import new_topic, produce


def change(op: str, key: int, lsn: int, schemas: bool = False, **row) -> list[tuple[bytes, bytes | None]]:
    """A PostgreSQL change of s.t (a delete's before image holds the key only, then its tombstone)."""
    source = postgres_source(lsn, 1_700_000_000_000 + lsn, "s", "t")
    record_key = json.dumps({"id": key}).encode()
    if op == "d":
        return [(record_key, envelope("d", {"id": key}, None, source, 1_700_000_000_000 + lsn)), (record_key, None)]
    return [(record_key, envelope(op, None, {"id": key, **row}, source, 1_700_000_000_000 + lsn,
                                  with_schema=schemas, row_name="t.s.t.Value"))]


def table_columns(spark, writer, table) -> list[str]:
    schema = writer.table_schema(table.target)
    return [name for name in schema.fieldNames() if not name.startswith("_cdc_")]


@pytest.mark.parametrize(("mode", "choices", "kept"), [
    ("scd1", ColumnChoices(exclude=("secret", "token")), ["id", "v", "x"]),
    ("scd2", ColumnChoices(exclude=("secret", "token")), ["id", "v", "x"]),
    ("soft_delete", ColumnChoices(include=("v",)), ["id", "v"]),
])
def test_a_table_keeps_only_the_chosen_columns_whatever_the_events_add(spark, broker, writer, tmp_path, mode,
                                                                        choices, kept):
    """Excluded columns never reach the table, while a value schema adds another one (the MERGE's schema
    evolution, or the writer's before scd2's MERGE); with include_columns, only those and the key."""
    topic = new_topic(broker, "dbserver1.s.t")
    table = with_merge(captured_table(topic, tmp_path / mode), apply_mode=mode, column_choices=choices)
    produce(broker, topic, change("c", 1, 10, schemas=True, v="a", secret="s1", token="t0"))
    run_batch(spark, broker, writer, table)
    produce(broker, topic, [*change("u", 1, 20, schemas=True, v="b", secret="s2", x=7, token="t"),
                            *change("c", 2, 30, schemas=True, v="c", secret="s3", x=8, token="u")])
    run_batch(spark, broker, writer, table)
    assert table_columns(spark, writer, table) == kept
    if mode == "scd2":
        rows = [{k: v[k] for k in kept} for vs in scd2_versions(spark, writer, table).values() for v in vs
                if v["_cdc_current"]]
    else:
        rows = list(read_rows(spark, writer, table).values())
    expected = [{"id": 1, "v": "b", "x": 7}, {"id": 2, "v": "c", "x": 8}]
    assert sorted(rows, key=lambda r: r["id"]) == [{k: r[k] for k in kept} for r in expected]


def test_an_unknown_column_is_named_at_the_first_event_that_shows_the_columns(spark, broker, tmp_path):
    """A choice naming a column the events lack fails the batch, naming the table and the column, and commits
    nothing; a batch whose events show no columns (a TRUNCATE's) cannot tell, and is not refused for it."""
    writer = DeltaRsWriter()
    topic = new_topic(broker, "dbserver1.s.t")
    table = with_merge(captured_table(topic, tmp_path), column_choices=ColumnChoices(include=("v", "nope")))
    produce(broker, topic, change("c", 1, 10, v="a", secret="s"))
    with pytest.raises(LayoutError, match=r"table 's\.t', topic dbserver1\.s\.t.*\['nope'\]"):
        run_batch(spark, broker, writer, table)
    assert writer.table_schema(table.target) is None
    keyed = with_merge(table, column_choices=ColumnChoices(exclude=("id",)))
    with pytest.raises(LayoutError, match=r"exclude_columns names key column\(s\) \['id'\]"):
        run_batch(spark, broker, writer, keyed)


# Batch 1 and batch 2 of the ignore_null_updates history: (op, key, lsn, v, n).
FIRST = [("c", 1, 10, "a", 1), ("c", 2, 20, None, 2), ("c", 4, 30, "x", 4), ("c", 6, 40, "f", 6)]
SECOND = [
    ("u", 1, 100, "b", None), ("u", 1, 110, None, None),  # v from the earlier update of the batch, n stored
    ("u", 2, 120, None, 5),  # the stored null stays null
    ("c", 3, 130, None, None), ("u", 3, 140, None, 7),  # a create writes its nulls
    ("d", 4, 150, None, None),  # a delete still deletes
    ("u", 5, 160, None, 9),  # no stored row: the update's null is written
    ("u", 6, 170, "g", None), ("d", 6, 180, None, None), ("c", 6, 190, None, 60), ("u", 6, 200, None, None),
]


def reference(events, ignored) -> dict[int, dict]:
    """Per key, its row after ``events`` in order: an update's null in an ``ignored`` column keeps the value."""
    rows: dict[int, dict] = {}
    for op, key, _, v, n in events:
        if op == "d":
            rows.pop(key, None)
            continue
        new = {"id": key, "v": v, "n": n}
        if op == "u":
            new = {name: rows.get(key, {}).get(name) if value is None and name in ignored else value
                   for name, value in new.items()}
        rows[key] = new
    return rows


def produce_history(broker, topic, events):
    produce(broker, topic, [record for op, key, lsn, v, n in events for record in change(op, key, lsn, v=v, n=n)])


@pytest.mark.parametrize(("mode", "ignored"), [("soft_delete", ("v",)), ("scd2", True)])
def test_an_update_s_null_keeps_the_value_in_the_batch_else_in_the_table(spark, broker, writer, tmp_path, mode,
                                                                          ignored):
    """Several updates of a key in one batch fold into one row (scd2: one version each): a later update's
    ignored null takes the earlier update's value, else the table's; creates and deletes are unchanged."""
    topic = new_topic(broker, "dbserver1.s.t")
    table = with_merge(captured_table(topic, tmp_path, columns={"id": "bigint", "v": "string", "n": "bigint"}),
                       apply_mode=mode, column_choices=ColumnChoices(ignore_null_updates=ignored))
    names = ("v", "n") if ignored is True else ignored
    produce_history(broker, topic, FIRST)
    run_batch(spark, broker, writer, table)
    produce_history(broker, topic, SECOND)
    report = run_batch(spark, broker, writer, table)
    expected = reference(FIRST + SECOND, names)
    if mode == "scd2":
        versions = scd2_versions(spark, writer, table)
        current = {k: {c: v[c] for c in ("id", "v", "n")} for k, vs in versions.items() for v in vs
                   if v["_cdc_current"]}
        assert current == expected
        # Every version holds its event's values, nulls filled as the reference fills them at that event.
        kept = [e for e in FIRST + SECOND if e[0] != "d"]
        chains = {k: [(v["v"], v["n"]) for v in vs] for k, vs in versions.items()}
        assert chains == {key: [(r[key]["v"], r[key]["n"]) for r in (
            reference((FIRST + SECOND)[:(FIRST + SECOND).index(e) + 1], names) for e in kept if e[1] == key)]
            for key in {e[1] for e in kept}}
    else:
        rows = read_rows(spark, writer, table, visible_only=False)
        live = {k[0]: {c: r[c] for c in ("id", "v", "n")} for k, r in rows.items() if not r.get("_cdc_deleted")}
        assert live == expected
    summary = report.summary
    assert summary.unavailable_never_seen == 0 and summary.unavailable_kept == 0  # no placeholder was involved
    assert summary.null_updates_from_table > 0


# An scd2 history, batch by batch, on columns v (tracked) and n (not): (op, key, lsn, v, n).
TRACKED = [
    [("c", 1, 10, "a", 1), ("u", 1, 20, "a", 2), ("c", 2, 30, "x", 1)],
    [("u", 1, 100, "a", 3), ("u", 1, 110, "b", 3), ("u", 1, 120, "b", 4), ("u", 2, 130, "x", 5)],
    [("r", 2, 125, "x", 1),  # a late incremental-snapshot read: older than the change in place at 130
     ("d", 1, 200, None, None), ("c", 1, 210, "c", 9), ("u", 1, 220, "c", 10),
     ("d", 2, 300, None, None), ("c", 12, 300, "x", 5)],  # a primary-key change: 2 becomes 12
]


def tracked_reference(events, tracked) -> dict[int, list[tuple]]:
    """Per key, its versions ``(v, n, valid from, valid to)`` (source positions): an event not newer than the
    key's latest changes nothing; a change to no ``tracked`` column updates the open version in place."""
    versions: dict[int, list[dict]] = {}
    latest: dict[int, int] = {}
    for op, key, lsn, v, n in events:
        if key in latest and lsn <= latest[key]:
            continue
        latest[key] = lsn
        chain = versions.setdefault(key, [])
        open_version = chain[-1] if chain and chain[-1]["to"] is None else None
        row = {"v": v, "n": n}
        if op != "d" and open_version is not None and all(open_version[c] == row[c] for c in tracked):
            open_version.update(row)
            continue
        if open_version is not None:
            open_version["to"] = lsn
        if op != "d":
            chain.append({**row, "from": lsn, "to": None})
    return {key: [(r["v"], r["n"], r["from"], r["to"]) for r in chain] for key, chain in versions.items()}


def lsn_of(moment) -> int | None:
    """The source position of an event of ``change`` from its source time."""
    if moment is None:
        return None
    utc = moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)
    return round(utc.timestamp() * 1000) - 1_700_000_000_000


def test_scd2_opens_a_version_only_for_a_tracked_column_s_change(spark, broker, writer, tmp_path):
    """A change confined to untracked columns updates the current version in place (its start kept): in the
    batch that opened it and in a later one; a tracked change, a delete and a primary-key change end it as
    without the choice, and a late read older than a change in place changes nothing."""
    topic = new_topic(broker, "dbserver1.s.t")
    table = with_merge(captured_table(topic, tmp_path, columns={"id": "bigint", "v": "string", "n": "bigint"}),
                       apply_mode="scd2", column_choices=ColumnChoices(track_history_except=("n",)))
    for batch in TRACKED:
        produce_history(broker, topic, batch)
        run_batch(spark, broker, writer, table)
    versions = scd2_versions(spark, writer, table)
    assert {k: [(v["v"], v["n"], lsn_of(v["_cdc_valid_from_ts"]), lsn_of(v["_cdc_valid_to_ts"])) for v in vs]
            for k, vs in versions.items()} == tracked_reference([e for b in TRACKED for e in b], ("v",))
    assert all(v["_cdc_current"] == (v["_cdc_valid_to"] is None) for vs in versions.values() for v in vs)
    assert writer.key_report(table.target, ("id",)).duplicate_keys == 0
