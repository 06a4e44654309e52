"""Per-table column choices on real Debezium (PostgreSQL, pgoutput, JSON with schemas, 3 partitions): one
seeded random workload on one source table feeds several Delta tables of one topic, each with its choices, merged
mid-stream and at the end by both writers. The oracle is the source: its rows, and its own change sequence as
an audit table written by a trigger (every row change in commit order, the row as ``to_jsonb``), replayed with
each choice's rule in plain Python.

The workload: rows inserted before capture (the snapshot) and streamed; updates of untracked columns only,
of tracked columns (sometimes to the same value), setting nulls; deletes; primary-key changes; and, between
the merges, ``ALTER TABLE ... ADD COLUMN secret`` (excluded where the choice names it before it exists).

A second table renames a tracked column (``RENAME COLUMN v TO w``) between the merges: PostgreSQL sends no
DDL, its events just carry ``w`` from then on, so the choice ``track_history_columns: [v]`` would apply to
nothing; the table halts at the first batch showing it, naming the table and ``v``, and goes on once the
choice names ``w``.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support import harness as h

pytestmark = pytest.mark.conformance

SEED = 61_2026
WRITERS = ("delta-rs", "delta-spark")
COLUMNS = ("id", "v", "n", "seen_at", "note", "secret")  # secret: added mid-stream


@dataclass(frozen=True)
class Choice:
    """A Delta table of ``cc``'s topic: its choices as the config writes them, and what they mean to the replay."""

    mode: str
    yaml: str
    kept: tuple[str, ...]  # the columns the table holds, key first
    ignored: tuple[str, ...]  # the columns whose nulls in an update keep the value
    tracked: tuple[str, ...] = ()  # scd2: the columns whose change opens a version


# Several choices a table, so that each choice meets every apply mode it applies to, with both forms of
# ignore_null_updates in each mode, in six tables (a table's merge costs CPU). The scd1 and soft_delete tables
# pair up by layout (kept columns, ignored nulls), so that each pair's batches fold in one Spark query (a shared
# plan). No include_columns or ignore_null_updates names secret: a choice naming a column the events lack halts
# its table until the ALTER.
CHOICES = {
    "cc_hist": Choice("scd2", "track_history_columns: [v, n], exclude_columns: [secret], "
                      "ignore_null_updates: [n, note]", ("id", "v", "n", "seen_at", "note"), ("n", "note"),
                      ("v", "n")),
    "cc_except": Choice("scd2", "track_history_except_columns: [seen_at], include_columns: [v, seen_at, note], "
                        "ignore_null_updates: true", ("id", "v", "seen_at", "note"), ("v", "seen_at", "note"),
                        ("v", "note")),
    "cc_nulls": Choice("scd1", "ignore_null_updates: true, exclude_columns: [note]",
                       ("id", "v", "n", "seen_at", "secret"), ("v", "n", "seen_at", "secret")),
    "cc_keep": Choice("scd1", "include_columns: [v, note], ignore_null_updates: [v, note]", ("id", "v", "note"),
                      ("v", "note")),
    "cc_nulls_list": Choice("soft_delete", "ignore_null_updates: [v, note], include_columns: [v, note]",
                            ("id", "v", "note"), ("v", "note")),
    "cc_drop": Choice("soft_delete", "ignore_null_updates: true, exclude_columns: [note]",
                      ("id", "v", "n", "seen_at", "secret"), ("v", "n", "seen_at", "secret")),
}
AUDIT = """
CREATE TABLE cc_audit (seq bigserial PRIMARY KEY, op text, old_id int, row jsonb);
CREATE FUNCTION cc_audited() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'DELETE' THEN
    INSERT INTO cc_audit (op, old_id, row) VALUES ('d', OLD.id, NULL);
  ELSIF TG_OP = 'INSERT' THEN
    INSERT INTO cc_audit (op, old_id, row) VALUES ('c', NULL, to_jsonb(NEW));
  ELSE
    INSERT INTO cc_audit (op, old_id, row) VALUES ('u', OLD.id, to_jsonb(NEW));
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER cc_audited AFTER INSERT OR UPDATE OR DELETE ON cc FOR EACH ROW EXECUTE FUNCTION cc_audited();
"""


@dataclass
class Capture:
    """The captured database and the merges' failures by writer."""

    dsn: str
    bootstrap_servers: str
    root: Path
    prefix: str
    midstream: dict[str, list[str]] = field(default_factory=dict)
    cr_before: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # cr's rows after the first merge
    finals: dict[str, list[str]] = field(default_factory=dict)

    def config(self, writer: str, tables: str) -> str:
        """A pipeline config of one connector's ``tables`` (YAML list), merged by ``writer``."""
        return f"""\
kafka: {{bootstrap_servers: "{self.bootstrap_servers}"}}
delta: {{root: "{self.root / writer}", writer: {writer}}}
batch: {{max_records: 1000, poll_timeout_s: 5, max_batches_per_run: 100}}
connectors:
  - name: k
    kind: postgresql
    topic.prefix: {self.prefix}
    tables:
{tables}"""

    def cc_tables(self) -> str:
        """The Delta tables of ``cc``'s topic, one per entry of ``CHOICES``."""
        return "".join(f"      - {{name: public.{name}, topic: {self.prefix}.public.cc, path: {name}, "
                       f"apply_mode: {choice.mode}, {choice.yaml}}}\n" for name, choice in CHOICES.items())

    def cr_tables(self, tracked: str) -> str:
        """``cr`` in scd2, its history tracked for column ``tracked``."""
        return f"      - {{name: public.cr, apply_mode: scd2, path: cr, track_history_columns: [{tracked}]}}\n"

    def merge(self, writer: str, tables: str) -> list[str]:
        """``cdc_merge_job`` of ``tables`` with ``writer``; its failed steps."""
        return h.failures(h.run_job(self.config(writer, tables)))

    def final(self, writer: str) -> list[str]:
        """The merge after the workload of every table (one run for both tests, to keep the suite short), the
        renamed column's ``cr`` with its choice still naming ``v``; its failed steps."""
        if writer not in self.finals:
            self.finals[writer] = self.merge(writer, self.cc_tables() + self.cr_tables("v"))
        return self.finals[writer]

    def path(self, writer: str, name: str) -> Path:
        """Where ``writer`` keeps Delta table ``name``."""
        return self.root / writer / name


def _maybe(rng: random.Random, value: Any, nulls: float = 0.2) -> Any:
    return None if rng.random() < nulls else value


def _changes(connection: psycopg.Connection, rng: random.Random, ids: list[int], next_id: int, count: int,
             secret: bool) -> int:
    """``count`` random changes of ``cc`` (each its own transaction); returns the next free id."""
    for _ in range(count):
        draw = rng.random()
        if not ids or draw < 0.15:
            connection.execute("INSERT INTO cc (id, v, n, seen_at, note) VALUES (%s, %s, %s, %s, %s)",
                               [next_id, _maybe(rng, f"v{rng.randrange(4)}"), _maybe(rng, rng.randrange(5)),
                                rng.randrange(10**6), _maybe(rng, f"note{rng.randrange(100)}")])
            ids.append(next_id)
            next_id += 1
            continue
        row_id = rng.choice(ids)
        if draw < 0.35:  # a heartbeat: untracked only
            connection.execute("UPDATE cc SET seen_at = seen_at + 1 WHERE id = %s", [row_id])
        elif draw < 0.45:
            connection.execute("UPDATE cc SET note = %s WHERE id = %s", [f"note{rng.randrange(100)}", row_id])
        elif draw < 0.6:  # tracked, at times to the value it has
            connection.execute("UPDATE cc SET v = %s, seen_at = seen_at + 1 WHERE id = %s",
                               [f"v{rng.randrange(4)}", row_id])
        elif draw < 0.67:
            connection.execute("UPDATE cc SET n = %s WHERE id = %s", [rng.randrange(5), row_id])
        elif draw < 0.8:  # nulls in some columns
            nulled = rng.sample(["v", "n", "note", *(["secret"] if secret else [])], rng.randint(1, 2))
            connection.execute(f"UPDATE cc SET {', '.join(f'{c} = NULL' for c in nulled)}, seen_at = seen_at + 1 "
                               "WHERE id = %s", [row_id])
        elif draw < 0.86 and secret:
            connection.execute("UPDATE cc SET secret = %s WHERE id = %s", [f"s{rng.randrange(10**6)}", row_id])
        elif draw < 0.93:
            connection.execute("DELETE FROM cc WHERE id = %s", [row_id])
            ids.remove(row_id)
        else:  # a primary-key change, at times with a null in another column
            connection.execute(f"UPDATE cc SET id = %s{', v = NULL' if rng.random() < 0.4 else ''} WHERE id = %s",
                               [next_id, row_id])
            ids[ids.index(row_id)] = next_id
            next_id += 1
    return next_id


def _rename_changes(connection: psycopg.Connection, rng: random.Random, column: str, count: int) -> None:
    for _ in range(count):
        row_id = rng.randrange(1, 11)
        if rng.random() < 0.5:
            connection.execute(f"UPDATE cr SET {column} = %s WHERE id = %s", [f"{column}{rng.randrange(3)}", row_id])
        else:
            connection.execute("UPDATE cr SET n = n + 1 WHERE id = %s", [row_id])


@pytest.fixture(scope="module")
def capture(broker: Any, postgres: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Capture]:
    """The capture: phase 1, a merge by each writer, the schema changes, phase 2 (merged by the tests)."""
    run_id = uuid.uuid4().hex[:6]
    dsn = postgres.create_database(f"columns_{run_id}")
    work = tmp_path_factory.mktemp("columns")
    captured = Capture(dsn, broker.bootstrap_servers, work / "delta", f"cols{run_id}")
    rng = random.Random(SEED)
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute("CREATE TABLE cdc_marker (id int PRIMARY KEY)")
        connection.execute("CREATE TABLE cc (id int PRIMARY KEY, v text, n int, seen_at int NOT NULL, note text)")
        connection.execute(AUDIT)
        connection.execute("CREATE TABLE cr (id int PRIMARY KEY, v text, n int)")
        connection.execute("INSERT INTO cr SELECT g, 'v0', 0 FROM generate_series(1, 10) g")
        ids = list(range(1, 21))  # inserts only, so the snapshot reads what the audit says
        for row_id in ids:
            connection.execute("INSERT INTO cc (id, v, n, seen_at, note) VALUES (%s, %s, %s, %s, %s)",
                               [row_id, _maybe(rng, f"v{rng.randrange(4)}"), _maybe(rng, rng.randrange(5)),
                                rng.randrange(10**6), _maybe(rng, f"note{rng.randrange(100)}")])
        next_id = 21
        properties = h.connector_properties("k", captured.prefix, h.parse_dsn(dsn),
                                            ["public.cc", "public.cr", "public.cdc_marker"], work)
        runner = h.DebeziumRunner(broker.bootstrap_servers, [properties], work)
        runner.start()
        try:
            h.write_marker(runner, connection, 1)
            next_id = _changes(connection, rng, ids, next_id, 150, secret=False)
            _rename_changes(connection, rng, "v", 20)
            h.write_marker(runner, connection, 2)
            for writer in WRITERS:
                captured.midstream[writer] = captured.merge(writer, captured.cc_tables() + captured.cr_tables("v"))
                captured.cr_before[writer] = h.delta_rows(captured.path(writer, "cr"))
            connection.execute("ALTER TABLE cc ADD COLUMN secret text")
            connection.execute("ALTER TABLE cr RENAME COLUMN v TO w")
            connection.execute("UPDATE cr SET n = n + 1")  # every row's events show w from now on
            next_id = _changes(connection, rng, ids, next_id, 150, secret=True)
            _rename_changes(connection, rng, "w", 20)
            # Nulls in the added column, of rows that held a value in it (the random changes may have none).
            connection.execute("UPDATE cc SET secret = NULL, seen_at = seen_at + 1 WHERE id IN "
                               "(SELECT id FROM cc WHERE secret IS NOT NULL ORDER BY id LIMIT 3)")
            h.write_marker(runner, connection, 3)
        finally:
            runner.stop()
            h.drop_replication_slots(dsn)
    yield captured


# --- the oracle: the audit table's changes as Debezium emits them, replayed with each choice's rule ---

Change = tuple[str, int, dict[str, Any] | None]  # (op, key, row): a delete's row is None


def _audited(dsn: str) -> list[Change]:
    """Every change of ``cc`` in commit order as ``(op, key, row)``: a primary-key change is the delete of the
    old key and the create of the new one, as Debezium emits it; every row has every column (None before the
    column existed)."""
    changes: list[Change] = []
    with psycopg.connect(dsn) as connection:
        for op, old_id, row in connection.execute("SELECT op, old_id, row FROM cc_audit ORDER BY seq"):
            full = {name: row.get(name) for name in COLUMNS} if row is not None else None
            if op == "u" and full is not None and full["id"] != old_id:
                changes += [("d", old_id, None), ("c", full["id"], full)]
            else:
                changes.append((op, full["id"] if full is not None else old_id, full))
    return changes


def _with_nulls_ignored(changes: list[Change], ignored: tuple[str, ...]) -> list[Change]:
    """``changes`` as a table that ignores update nulls in the ``ignored`` columns applies them: such a null holds
    the value the key's row had."""
    rows: dict[int, dict[str, Any]] = {}
    applied: list[Change] = []
    for op, key, row in changes:
        if row is None:
            rows.pop(key, None)
        else:
            if op == "u":
                row = {name: rows[key][name] if value is None and name in ignored else value
                       for name, value in row.items()}
            rows[key] = row
        applied.append((op, key, row))
    return applied


def _rows(changes: list[Change]) -> dict[int, dict[str, Any]]:
    """Per live key, its row after ``changes``."""
    rows: dict[int, dict[str, Any]] = {}
    for _, key, row in changes:
        if row is None:
            rows.pop(key, None)
        else:
            rows[key] = row
    return rows


def _tracked_versions(changes: list[Change], tracked: tuple[str, ...]) -> dict[int, list[tuple[dict[str, Any], bool]]]:
    """Per key, its versions in order as ``(row, current)``: a change confined to columns not ``tracked``
    updates the open version in place; a change to a tracked one, a create and a delete end it."""
    versions: dict[int, list[tuple[dict[str, Any], bool]]] = {}
    for op, key, row in changes:
        chain = versions.setdefault(key, [])
        current = chain[-1][0] if chain and chain[-1][1] else None
        if op == "u" and row is not None and current is not None and all(current[c] == row[c] for c in tracked):
            chain[-1] = (dict(row), True)
            continue
        if current is not None:
            chain[-1] = (current, False)
        if row is not None:
            chain.append((dict(row), True))
    return versions


def _problems(want: dict[int, dict[str, Any]], got: list[dict[str, Any]], columns: tuple[str, ...]) -> list[str]:
    return h.compare([{c: row[c] for c in columns} for row in want.values()], got, ("id",), {}, {})


def _version_problems(path: Path, name: str, choice: Choice, applied: list[Change]) -> list[str]:
    """The keys whose versions in scd2 table ``path`` are not the replay's of ``applied`` (the changes as the
    table sees them), each named with both sides."""
    by_key: dict[int, list[dict[str, Any]]] = {}
    for row in sorted(h.delta_rows(path), key=lambda r: r["_cdc_valid_from"]):
        by_key.setdefault(row["id"], []).append(row)
    kept = choice.kept
    got = {key: [({c: r[c] for c in kept}, r["_cdc_current"]) for r in rows] for key, rows in by_key.items()}
    replayed = _tracked_versions(applied, choice.tracked)
    want = {key: [({c: row[c] for c in kept}, current) for row, current in chain] for key, chain in replayed.items()}
    # The rule shows: many updates went into the open version in place rather than opening one.
    opened = sum(len(chain) for chain in replayed.values()) - sum(1 for op, _, _ in applied if op == "c")
    assert sum(1 for op, _, _ in applied if op == "u") - opened > 50, f"{name}: too few updates in place"
    return [f"key {key}: Delta {got.get(key)}, replay {want.get(key)}"
            for key in sorted(set(got) | set(want)) if got.get(key) != want.get(key)]


@pytest.mark.parametrize("writer", WRITERS)
def test_each_column_choice_ends_as_the_source_replayed_with_its_rule(capture, writer):
    """Every Delta table of the random workload against the source's history replayed with its choices' rules
    (the history itself ends as ``SELECT``): its columns, its rows, and in scd2 every key's versions."""
    assert not capture.midstream[writer], capture.midstream[writer]
    failed = [failure for failure in capture.final(writer) if "'public.cr'" not in failure]  # cr: the next test
    assert not failed, failed
    source = {row["id"]: row for row in h.source_rows(capture.dsn, "SELECT * FROM cc")}
    changes = _audited(capture.dsn)
    assert _rows(changes) == source  # the audit holds the source's history
    kinds = {op for op, _, _ in changes}
    assert kinds == {"c", "u", "d"} and sum(1 for _, _, row in changes if row and row["secret"]) > 3
    problems: dict[str, list[str]] = {}
    for name, choice in CHOICES.items():
        path = capture.path(writer, name)
        # include / exclude: the chosen columns and the keys, whatever the events add (secret, by the ALTER).
        columns = {c for row in h.delta_rows(path) for c in row if not c.startswith("_cdc_")}
        assert columns == set(choice.kept), name
        applied = _with_nulls_ignored(changes, choice.ignored)
        want = _rows(applied)
        problems[name] = _problems(want, h.current_rows(path, choice.mode), choice.kept)
        # ignore_null_updates shows: an ignored null kept a value in some live row, in each column that takes
        # nulls (the added one too).
        shown = {c for key, row in source.items() for c in choice.ignored if want[key][c] != row[c]}
        assert shown == set(choice.ignored) - {"seen_at"}, (name, shown)
        if choice.tracked:
            problems[f"{name} versions"] = _version_problems(path, name, choice, applied)
    found = {name: h.summarise(p) for name, p in problems.items() if p}
    assert not found, found


@pytest.mark.parametrize("writer", WRITERS)
def test_a_tracked_column_renamed_at_the_source_halts_its_table_naming_it(capture, writer):
    """``RENAME COLUMN v TO w`` with ``track_history_columns: [v]``: the events carry ``w``, the Delta table still
    has ``v``; the merge halts at the first batch showing the rename, naming table and column, and commits
    nothing; with ``track_history_columns: [w]`` the table goes on and its current versions equal the source."""
    assert not capture.midstream[writer], capture.midstream[writer]
    path = capture.path(writer, "cr")
    before = capture.cr_before[writer]
    failed = "\n".join(capture.final(writer))
    assert "table 'public.cr'" in failed and "column(s) ['v'] that the table's events do not have" in failed, failed
    assert sorted(h.delta_rows(path), key=repr) == sorted(before, key=repr)
    failed_again = capture.merge(writer, capture.cr_tables("w"))
    assert not failed_again, failed_again
    source = h.source_rows(capture.dsn, "SELECT id, w, n FROM cr")
    current = [{c: row[c] for c in ("id", "w", "n")} for row in h.current_rows(path, "scd2")]
    problems = h.compare(source, current, ("id",), {}, {})
    assert not problems, h.summarise(problems)
    # The versions from before the rename keep their values under the old name (each ended by its key's first
    # change after it: w, from nothing to a value, is a tracked change).
    kept = {(row["id"], row["_cdc_valid_from"]): row["v"] for row in h.delta_rows(path)}
    assert all(kept.get((row["id"], row["_cdc_valid_from"])) == row["v"] is not None for row in before)
    assert not [row for row in h.current_rows(path, "scd2") if row["v"] is not None]
